"""Carbon accounting: per-job receipts, fleet reports and the energy disclosure export.

Everything here starts from what was *measured*: a job's energy (`jobs.energy_j`, by the
GPU energy counter or the integral of sampled power, see `telemetry.energy`) and the
*recorded* grid intensity of the zone it ran in (`carbon_intensity` actuals, see
`scheduler.carbon`). A job's carbon is

    gCO2 = sum over the run's pieces of  energy_piece_kWh x intensity(zone, piece) x PUE

where the run is cut wherever the intensity changes, and each piece's energy comes from the
GPUs' own power samples (raw samples, else their minute means), scaled so the pieces add up
to the measured energy. Without samples the energy is spread evenly over time, which is
energy x the time-weighted mean intensity. A piece without a recorded value is a gap: it is
priced at the zone's static yearly mean where there is one (average signal only; basis
"mixed" or "static") and never at zero; with no value at all the job's gCO2 stays unknown
(NULL). Jobs priced with anything but actuals are re-priced by `Accountant.backfill` while
actuals may still arrive (`recheck_days`), because carbon data often lands after a job ends.

The average and marginal signals are never mixed: a job is priced with its zone's signal
(`CarbonSignals.signal_of`), which the receipt names.

Reports and exports aggregate in SQL (GROUP BY over the indexed `jobs.ended_at`), so a year
of a busy fleet answers in well under a second; see bench/report_bench.py.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import (
    Connection,
    String,
    and_,
    case,
    extract,
    func,
    literal,
    literal_column,
    or_,
    select,
    type_coerce,
    update,
)

from policies.counterfactual import RULE_SHORT
from policies.model import sig
from scheduler.job_view import output_truncated_list
from scheduler.lifecycle import TERMINAL, State, utcnow
from scheduler.store import Store
from scheduler.store.carbon_models import carbon_intensity
from scheduler.store.models import UTCDateTime, gpus, job_segments, jobs, nodes
from scheduler.store.telemetry_models import gpu_power_minutes, gpu_samples
from scheduler.timeparse import utc_aware
from telemetry.energy import MODELLED, Sample, clip_window, window_energy
from telemetry.grid.readings import KIND_ACTUAL, SIGNAL_AVERAGE
from telemetry.grid.static import static_intensity

log = logging.getLogger(__name__)

J_PER_KWH = 3.6e6


def intensity_g_per_kwh(gco2: float | None, facility_energy_j: float | None) -> float | None:
    """The one definition of a run's or a group's intensity: grams per kWh of *facility*
    energy (IT energy x PUE), i.e. the energy-weighted grid intensity the grams were priced at.
    Receipts, reports and exports all use this; dividing by IT energy would fold the PUE in."""
    if gco2 is None or not facility_energy_j or facility_energy_j <= 0:
        return None
    return gco2 / (facility_energy_j / J_PER_KWH)


#: The figures of a group that are grams (or derived from grams): they exist per carbon signal
#: only, since average and marginal grams are different quantities and never added.
CARBON_FIGURES = ("kgco2", "intensity_g_per_kwh", "gco2_per_prompt", "gco2_per_1k_tokens",
                  "counterfactual_kgco2", "saving_kgco2", "saving_pct", "jobs_with_gco2")
HOURS_PER_YEAR = 8766.0
MAX_PERIOD_S = 86400               # the longest intensity period looked back over
EDGE_MARGIN_S = 5.0                # readings this far outside a run interpolate its edges
GROUPINGS = ("user", "workload", "model", "zone", "day", "node")
FINISHED = tuple(sorted(s.value for s in TERMINAL))

#: Licences and descriptions of the intensity sources, for the disclosure export.
SOURCE_INFO: dict[str, dict[str, str]] = {
    "electricitymaps": {"provider": "Electricity Maps API", "licence": "Electricity Maps API terms of use"},
    "electricitymaps-csv": {"provider": "Electricity Maps historical data export",
                            "licence": "ODbL 1.0 (Open Database License)"},
    "watttime": {"provider": "WattTime API (marginal operating emissions rate)",
                 "licence": "WattTime API terms of use"},
    "watttime-csv": {"provider": "WattTime historical MOER export", "licence": "WattTime data licence"},
    "ukgrid": {"provider": "National Grid ESO Carbon Intensity API", "licence": "CC BY 4.0"},
    "csv": {"provider": "operator-supplied CSV trace", "licence": "as supplied by the operator"},
    "static": {"provider": "static yearly mean (Electricity Maps 2022 hourly exports, or operator config)",
               "licence": "ODbL 1.0"},
}


def iso(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


# -- configuration --------------------------------------------------------------------------

@dataclass(frozen=True)
class AccountingConfig:
    """The `[accounting]` section of the config file.

    ```toml
    [accounting]
    gpu_lifetime_years = 4            # catalog list price amortized over this
    energy_price_usd_per_kwh = 0.10   # facility energy (IT energy x PUE)
    recheck_days = 7                  # re-price non-actual figures while data may arrive
    [accounting.zone_energy_price_usd_per_kwh]
    DE = 0.25
    ```
    """

    gpu_lifetime_years: float = 4.0
    energy_price_usd_per_kwh: float = 0.10
    zone_energy_price_usd_per_kwh: Mapping[str, float] = field(default_factory=dict)
    recheck_days: float = 7.0

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> AccountingConfig:
        section = (config or {}).get("accounting") or {}
        if not isinstance(section, Mapping):
            raise ValueError("config [accounting]: expected a table")
        known = {"gpu_lifetime_years", "energy_price_usd_per_kwh", "zone_energy_price_usd_per_kwh",
                 "recheck_days"}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"config [accounting]: unknown key(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(known))})")

        def number(value: object, name: str, *, positive: bool) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0 or (positive and value == 0):
                raise ValueError(f"config accounting.{name}: a {'positive' if positive else 'non-negative'} "
                                 f"number (got {value!r})")
            return float(value)

        zones = section.get("zone_energy_price_usd_per_kwh") or {}
        if not isinstance(zones, Mapping):
            raise ValueError("config accounting.zone_energy_price_usd_per_kwh: expected a table of zones")
        return cls(
            gpu_lifetime_years=number(section.get("gpu_lifetime_years", 4.0), "gpu_lifetime_years",
                                      positive=True),
            energy_price_usd_per_kwh=number(section.get("energy_price_usd_per_kwh", 0.10),
                                            "energy_price_usd_per_kwh", positive=False),
            zone_energy_price_usd_per_kwh={str(z): number(v, f"zone_energy_price_usd_per_kwh.{z}", positive=False)
                                           for z, v in zones.items()},
            recheck_days=number(section.get("recheck_days", 7.0), "recheck_days", positive=False),
        )

    def energy_price(self, zone: str | None) -> float:
        return self.zone_energy_price_usd_per_kwh.get(zone or "", self.energy_price_usd_per_kwh)

    def gpu_usd_per_hour(self, list_price_usd: float) -> float:
        return list_price_usd / (self.gpu_lifetime_years * HOURS_PER_YEAR)


# -- the pure part: one run's carbon --------------------------------------------------------

@dataclass(frozen=True)
class IntensitySpan:
    """One intensity value holding over [start, end): `kind` "actual" (recorded) or "static"."""

    start: datetime
    end: datetime
    gco2_per_kwh: float
    kind: str
    source: str


@dataclass(frozen=True)
class CarbonPiece:
    """A part of a run under one intensity value (or in a gap: intensity None)."""

    start: datetime
    end: datetime
    energy_j: float
    gco2_per_kwh: float | None
    kind: str | None
    source: str | None
    gco2: float | None


@dataclass(frozen=True)
class RunCarbon:
    """The carbon of one run: total, how it was weighted, each piece, the gaps."""

    energy_j: float
    pue: float
    weighting: str               # power-samples | minute-means | time
    pieces: tuple[CarbonPiece, ...]
    gco2: float | None           # None when some energy has no intensity at all
    basis: str | None            # actual | mixed | static | None
    coverage: float              # share of the energy priced with recorded (actual) values
    gaps: tuple[tuple[datetime, datetime, str | None], ...]   # (start, end, filled_by)

    @property
    def intensity_g_per_kwh(self) -> float | None:
        """Energy-weighted mean intensity of the run, before PUE."""
        return intensity_g_per_kwh(self.gco2, self.energy_j * self.pue)

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(sorted({p.source for p in self.pieces if p.source}))


def _power_at(points: Sequence[tuple[float, float]], times: Sequence[float], t: float) -> float:
    """Linear interpolation of a power series, held flat beyond its ends."""
    i = bisect.bisect_left(times, t)
    if i < len(times) and times[i] == t:
        return points[i][1]
    if i == 0:
        return points[0][1]
    if i == len(times):
        return points[-1][1]
    (t0, p0), (t1, p1) = points[i - 1], points[i]
    return p0 + (p1 - p0) * (t - t0) / (t1 - t0)


def power_integral_j(points: Sequence[tuple[float, float]], a_s: float, b_s: float) -> float:
    """Integral of a piecewise-linear power series over [a, b] in joules (flat beyond its ends).

    Exact for power that is linear between samples, which is the trapezoid rule the energy
    figures themselves use, so cutting a run into pieces never changes the total.
    """
    if b_s <= a_s or not points:
        return 0.0
    times = [t for t, _ in points]
    knots = [a_s] + [t for t in times[bisect.bisect_right(times, a_s):bisect.bisect_left(times, b_s)]] + [b_s]
    values = [_power_at(points, times, t) for t in knots]
    return sum((t1 - t0) * (v0 + v1) / 2 for t0, t1, v0, v1 in zip(knots, knots[1:], values, values[1:]))


def run_carbon(energy_j: float, start: datetime, end: datetime, intensity: Sequence[IntensitySpan], *,
               pue: float = 1.0, gpu_power: Sequence[Sequence[tuple[float, float]]] = (),
               weighting: str = "power-samples") -> RunCarbon:
    """The gCO2 of a run that used `energy_j` over [start, end] (see the module docstring).

    `intensity`: non-overlapping spans, sorted or not; time outside them is a gap.
    `gpu_power`: per GPU, its (unix seconds, watts) samples; their shape splits the energy
    among the pieces (each piece weighted by its own energy, not the mean power). Empty:
    the energy is spread evenly over time. `weighting` names where the samples came from.
    """
    start, end = utc_aware(start, "start"), utc_aware(end, "end")
    if end < start:
        raise ValueError(f"run ends ({end}) before it starts ({start})")
    if energy_j < 0 or not math.isfinite(energy_j):
        raise ValueError(f"energy must be a finite non-negative number of joules (got {energy_j!r})")
    spans = sorted((s for s in intensity if s.end > start and s.start < end or (start == end and s.start <= start < s.end)),
                   key=lambda s: s.start)
    cuts = sorted({start, end, *(s.start for s in spans if start < s.start < end),
                   *(s.end for s in spans if start < s.end < end)})
    windows = list(zip(cuts, cuts[1:])) or [(start, end)]

    series = [sorted((float(t), float(p)) for t, p in g if p is not None) for g in gpu_power]
    series = [s for s in series if s]
    shares: list[float]
    total_s = (end - start).total_seconds()
    if series:
        raw = [sum(power_integral_j(s, a.timestamp(), b.timestamp()) for s in series) for a, b in windows]
        total = sum(raw)
        if total > 0:
            shares = [r / total for r in raw]
        else:
            series = []
    if not series:
        weighting = "time"
        shares = ([(b - a).total_seconds() / total_s for a, b in windows] if total_s > 0
                  else [1.0 / len(windows)] * len(windows))

    pieces: list[CarbonPiece] = []
    for (a, b), share in zip(windows, shares):
        span = next((s for s in spans if s.start <= a < s.end), None)
        e = energy_j * share
        if span is None:
            pieces.append(CarbonPiece(a, b, e, None, None, None, None))
        else:
            pieces.append(CarbonPiece(a, b, e, span.gco2_per_kwh, span.kind, span.source,
                                      e / J_PER_KWH * span.gco2_per_kwh * pue))

    # merge neighbouring pieces under the same value (a span cut by nothing else)
    merged: list[CarbonPiece] = []
    for p in pieces:
        last = merged[-1] if merged else None
        if last is not None and (last.gco2_per_kwh, last.kind, last.source) == (p.gco2_per_kwh, p.kind, p.source) \
                and last.end == p.start:
            merged[-1] = CarbonPiece(last.start, p.end, last.energy_j + p.energy_j, p.gco2_per_kwh, p.kind,
                                     p.source, None if p.gco2 is None else (last.gco2 or 0.0) + p.gco2)
        else:
            merged.append(p)

    unpriced = any(p.gco2 is None for p in merged)
    actual_j = sum(p.energy_j for p in merged if p.kind == KIND_ACTUAL)
    kinds = {p.kind for p in merged}
    if unpriced:
        gco2, basis = None, None
    else:
        gco2 = sum(p.gco2 for p in merged)  # type: ignore[misc]
        basis = "actual" if kinds == {KIND_ACTUAL} else ("static" if KIND_ACTUAL not in kinds else "mixed")
    if energy_j > 0:
        coverage = actual_j / energy_j
    else:
        coverage = 1.0 if kinds == {KIND_ACTUAL} else 0.0
    gaps = tuple((p.start, p.end, p.kind) for p in merged if p.kind != KIND_ACTUAL)
    return RunCarbon(energy_j=energy_j, pue=pue, weighting=weighting, pieces=tuple(merged), gco2=gco2,
                     basis=basis, coverage=coverage, gaps=gaps)


# -- energy measurement, in words -----------------------------------------------------------

def describe_measurement(method: str | None, note: str | None) -> dict:
    """How a job's energy was measured: the stored method, whether a counter fault forced the
    integral, and one line for people."""
    if not method:
        return {"method": None, "counter_fault": False, "static_share": False, "modelled": False,
                "description": "not measured (no GPU readings for the run)"}
    base, _, extra = method.partition("+")
    fault = base == "integral" and bool(note) and "counter" in note and "no energy counter" not in note
    text = {
        "modelled": MODELLED_DESCRIPTION,
        "counter": "GPU hardware energy counter, cross-checked against integrated power",
        "counter-unverified": "GPU hardware energy counter (too few power samples to cross-check it)",
        "integral": ("integral of sampled GPU power after a counter fault" if fault
                     else "integral of sampled GPU power"),
        "none": "not measured",
    }.get(base, base)
    if fault and note:
        text += f" ({note})"
    if extra == "static":
        text += ", plus the job's share of the node's static power"
    return {"method": method, "counter_fault": fault, "static_share": extra == "static",
            "modelled": is_modelled(method), "description": text}


MODELLED_DESCRIPTION = ("MODELLED, not measured: emulated GPUs, energy from the emulator's power model "
                        "(catalog TDP and idle power, or the --truth the fleet runs by)")


def is_modelled(method: str | None) -> bool:
    """Whether a stored energy method is a model's figure (emulated GPUs), not a measurement."""
    return bool(method) and method.partition("+")[0] == MODELLED


# -- receipts -------------------------------------------------------------------------------

def _seconds_between(a: datetime | None, b: datetime | None) -> float | None:
    return None if a is None or b is None else (b - a).total_seconds()


def _per(value: float | None, count: float | None, scale: float = 1.0) -> float | None:
    return value / count * scale if value is not None and count else None


def _difference(a: float | None, b: float | None) -> float | None:
    """a - b, with rounding noise (two estimates of the same choice computed along different
    paths) shown as the 0 it is rather than as -2.8e-17 g."""
    if a is None or b is None:
        return None
    d = a - b
    return 0.0 if abs(d) <= 1e-9 * max(abs(a), abs(b)) else d


def _work(reported: int | None, declared: int | None) -> tuple[int | None, str | None]:
    """The count a figure divides by and where it comes from: reported beats declared."""
    if reported is not None:
        return reported, "reported"
    return (declared, "declared") if declared is not None else (None, None)


def _source(reported: int | None, counted: int | None) -> str | None:
    """'reported', 'declared' or 'partly reported' over a group of jobs; None: no counts."""
    reported, counted = int(reported or 0), int(counted or 0)
    if not counted:
        return None
    return "reported" if reported == counted else "partly reported" if reported else "declared"


def build_receipt(job: Mapping[str, Any], run: RunCarbon | None, *, signal: str | None,
                  shift: RunCarbon | None = None, cost_usd: float | None = None) -> dict:
    """The carbon receipt of one finished job, as plain JSON-ready data.

    `job` holds the job's columns (a row mapping); `run` its carbon (None: not computable,
    e.g. energy not measured); `shift`: the same energy priced as if started at submission
    (same zone, recorded intensity), a measured counterfactual of waiting.
    """
    energy_j = job.get("energy_j")
    submitted, started, ended = job.get("submitted_at"), job.get("started_at"), job.get("ended_at")
    deadline = job.get("deadline")
    gco2 = run.gco2 if run is not None else job.get("gco2")
    # The work done: what the job reported in its metrics file, else what was declared at
    # submit (scheduler/node/job_metrics.py); tokens are output tokens.
    prompts, prompts_source = _work(job.get("reported_prompts"), job.get("prompts"))
    tokens, tokens_source = _work(job.get("reported_output_tokens"), job.get("tokens"))
    est, cf_est = job.get("est_gco2"), job.get("est_gco2_if_now")
    # "Had it run at once": the plan compared its choice (est_gco2) with the counterfactual of
    # policies.counterfactual (est_gco2_if_now: the job alone at submission on the earliest free,
    # fastest fitting GPUs, tied zones/models averaged), both by its own model. Measured emissions are scaled
    # by that ratio, so a receipt never compares a measurement with an estimate (energy
    # estimates are off by tens of % for short jobs); without the plan's own estimate the raw
    # if-now estimate is all there is, and the receipt says so.
    if cf_est is not None and gco2 is not None and est:
        counterfactual = gco2 * cf_est / est
        cf_what = (f"the measured gCO2 x the plan's estimate of {RULE_SHORT} over its estimate of "
                   f"the chosen plan ({sig(cf_est)} g / {sig(est)} g)")
    else:
        counterfactual = cf_est
        cf_what = (f"the plan's estimate of {RULE_SHORT} (no estimate of the chosen plan to scale it "
                   "by)") if cf_est is not None \
            else "no plan estimate of running at once was recorded"
    saving = _difference(counterfactual, gco2)
    receipt = {
        "job": job["id"], "name": job.get("name"), "owner": job.get("owner_name"), "state": job.get("state"),
        "workload": job.get("workload"), "gpu_model": job.get("gpu_model"), "gpus": job.get("gpus"),
        "node": job.get("node"), "zone": job.get("zone"),
        "submitted_at": iso(submitted), "started_at": iso(started), "ended_at": iso(ended),
        "wait_s": _seconds_between(submitted, started), "runtime_s": _seconds_between(started, ended),
        "deadline": iso(deadline),
        # met: the work was done in time; a job that ended FAILED/TIMEOUT/... met nothing
        "deadline_met": None if deadline is None or ended is None else (
            ended <= deadline and job.get("state") == State.COMPLETED.value),
        "energy_j": energy_j, "energy_kwh": None if energy_j is None else energy_j / J_PER_KWH,
        "measurement": describe_measurement(job.get("energy_method"), job.get("energy_note")),
        "gco2": gco2,
        "signal": signal,
        "pue": run.pue if run is not None else job.get("pue"),
        "intensity_g_per_kwh": run.intensity_g_per_kwh if run is not None else None,
        "intensity_basis": run.basis if run is not None else job.get("gco2_basis"),
        "intensity_coverage": run.coverage if run is not None else job.get("gco2_coverage"),
        "intensity_sources": list(run.sources) if run is not None else [],
        "intensity_gaps": [{"start": iso(a), "end": iso(b), "filled_by": by} for a, b, by in run.gaps]
        if run is not None else [],
        "weighting": run.weighting if run is not None else None,
        "pieces": [{"start": iso(p.start), "end": iso(p.end), "energy_j": p.energy_j,
                    "gco2_per_kwh": p.gco2_per_kwh, "kind": p.kind, "source": p.source, "gco2": p.gco2}
                   for p in run.pieces] if run is not None else [],
        "prompts": prompts, "tokens": tokens,
        "prompts_source": prompts_source, "tokens_source": tokens_source,
        "declared_prompts": job.get("prompts"), "declared_tokens": job.get("tokens"),
        "reported_prompts": job.get("reported_prompts"),
        "reported_input_tokens": job.get("reported_input_tokens"),
        "reported_output_tokens": job.get("reported_output_tokens"),
        "gco2_per_prompt": _per(gco2, prompts),
        "gco2_per_1k_tokens": _per(gco2, tokens, 1000.0),
        "tokens_per_j": _per(tokens, energy_j),
        "cost_usd": cost_usd,
        "usd_per_mtok": _per(cost_usd, tokens, 1e6),
        "est_energy_j": job.get("est_energy_j"), "est_gco2": est,
        "counterfactual": {
            "gco2": counterfactual,
            "estimate_gco2": cf_est,
            "what": cf_what,
            "explanation": job.get("explanation"),
        },
        "saving_gco2": saving,
        "saving_pct": _per(saving, counterfactual, 100.0) if counterfactual else None,
        "plan_saving_gco2": _difference(cf_est, est),
        "gco2_if_started_at_submit": shift.gco2 if shift is not None else None,
        # The operating point the plan chose (policies.operating_point), and why; null: none.
        "operating_point": operating_point(job),
        # The GPU power limit (issue 29): planned, applied (null: ran at the default) and why
        # not, with the plan's estimate at the default limit beside the capped one.
        "power_limit": power_limit(job),
        # Storage limits (issue 48): the output streams cut at the job's output limit (null:
        # none), and when its command, environment and output were purged (the receipt stays).
        "output_truncated": output_truncated_list(job.get("output_truncated")),
        "purged_at": iso(job.get("purged_at")),
    }
    if job.get("segments"):
        receipt.update(segments_summary(job, job["segments"]))
    return receipt


def combine_runs(runs: Sequence[RunCarbon]) -> RunCarbon:
    """One RunCarbon for several runs (an interruptible job's segments): energies and gCO2
    summed (None when any is unpriced), pieces and gaps in order, the basis "actual" only
    when every run's is, coverage weighted by energy."""
    energy = sum(r.energy_j for r in runs)
    gco2 = None if any(r.gco2 is None for r in runs) else sum(r.gco2 for r in runs)  # type: ignore[misc]
    bases = {r.basis for r in runs}
    basis = None if None in bases else (bases.pop() if len(bases) == 1 else "mixed")
    coverage = (sum(r.coverage * r.energy_j for r in runs) / energy) if energy > 0 else min(r.coverage for r in runs)
    weightings = {r.weighting for r in runs}
    return RunCarbon(energy_j=energy, pue=runs[0].pue,
                     weighting=weightings.pop() if len(weightings) == 1 else "mixed",
                     pieces=tuple(p for r in runs for p in r.pieces), gco2=gco2, basis=basis, coverage=coverage,
                     gaps=tuple(g for r in runs for g in r.gaps))


def segments_summary(job: Mapping[str, Any], segments: Sequence[Mapping[str, Any]]) -> dict:
    """The receipt's part for an interruptible job (issue 30): each segment with what it
    cost, the time run, paused and lost (work run after the last checkpoint of a job killed
    for ignoring its request), and the wait until its first segment."""
    run_s = sum(s["duration_s"] for s in segments if s["kind"] == "run")
    first = job.get("first_started_at")
    return {"interruptible": job.get("interruptible"), "resume_count": job.get("resume_count"),
            "segments": [dict(s) for s in segments],
            "runtime_s": run_s,
            "paused_s": sum(s["duration_s"] for s in segments if s["kind"] == "pause"),
            "lost_work_s": sum(s.get("lost_s") or 0.0 for s in segments),
            "checkpoints_ignored": job.get("checkpoints_ignored") or 0,
            "wait_s": _seconds_between(job.get("submitted_at"), first) if first else None,
            "first_started_at": iso(first)}


def power_limit(job: Mapping[str, Any]) -> dict | None:
    """What the plan chose for the job's GPU power limit and what the run got; None when the
    plan chose none."""
    if job.get("planned_power_limit_w") is None and job.get("power_limit_w") is None:
        return None
    return {"planned_w": job.get("planned_power_limit_w"), "applied_w": job.get("power_limit_w"),
            "note": job.get("power_limit_note"),
            "estimate_uncapped": {"energy_j": job.get("est_uncapped_energy_j"),
                                  "gco2": job.get("est_uncapped_gco2"),
                                  "runtime_s": job.get("est_uncapped_runtime_s")},
            "estimate_capped": {"energy_j": job.get("est_energy_j"), "gco2": job.get("est_gco2"),
                                "runtime_s": job.get("est_runtime_planned_s")}}


def operating_point(job: Mapping[str, Any]) -> dict | None:
    """The planned operating point of a job row, with the plan's reason for it (the part of
    the explanation that names the batch limit); None when the plan had none."""
    if job.get("planned_max_batch") is None:
        return None
    why = next((part.strip() for part in (job.get("explanation") or "").split("; ") if " at batch " in part), None)
    return {"max_batch": job["planned_max_batch"], "precision": job.get("planned_precision"),
            "tp": job.get("planned_tp"), "why": why}


# -- the store-facing part ------------------------------------------------------------------

_JOB_COLUMNS = ("id", "name", "state", "owner_uid", "owner_name", "workload", "gpus", "gpu_ids", "node",
                "zone", "gpu_model", "submitted_at", "started_at", "ended_at", "deadline", "prompts", "tokens",
                "reported_prompts", "reported_input_tokens", "reported_output_tokens",
                "energy_j", "energy_method", "energy_note", "gco2", "pue", "gco2_signal", "gco2_basis",
                "gco2_coverage", "est_energy_j", "est_gco2", "est_gco2_if_now", "explanation", "accounted_at",
                "planned_max_batch", "planned_precision", "planned_tp", "planned_power_limit_w",
                "power_limit_w", "power_limit_note", "est_uncapped_energy_j", "est_uncapped_gco2",
                "est_uncapped_runtime_s", "est_runtime_planned_s", "interruptible", "first_started_at",
                "resume_count", "done_fraction", "checkpoints_ignored", "output_truncated", "purged_at")


class NotFound(LookupError):
    """No such job."""


class Accountant:
    """Prices finished jobs, builds receipts, reports and exports over one store.

    `site` gives the PUE of a job's node (scheduler.daemon.planner.SiteConfig, anything with
    `.pue(zone, node)`: the node's site, else its zone's default);
    `carbon` the signal per zone (scheduler.carbon.CarbonSignals, anything with
    `.signal_of(zone)` and `.config.static`), else one is built on first use from
    `carbon_config` (a CarbonConfig, or the parsed config file); all optional (PUE 1.0,
    the data's signal).
    """

    def __init__(self, store: Store, *, site: Any = None, carbon: Any = None, carbon_config: Any = None,
                 config: AccountingConfig | None = None, clock: Callable[[], datetime] = utcnow) -> None:
        self.store = store
        self.site = site
        self._carbon = carbon
        self._carbon_config = carbon_config
        self.config = config or AccountingConfig()
        self._clock = clock

    @property
    def carbon(self) -> Any:
        """The signal store, built on first use (a report over priced jobs never needs it)."""
        if self._carbon is None:
            from scheduler.carbon import CarbonSignals
            from scheduler.carbon_config import CarbonConfig

            cfg = self._carbon_config
            if isinstance(cfg, Mapping):
                cfg = CarbonConfig.from_config(cfg)
            self._carbon = CarbonSignals(self.store, cfg, track_status=False)
        return self._carbon

    def _emission_factor(self) -> str:
        cfg = self._carbon_config
        if isinstance(cfg, Mapping):
            return str((cfg.get("carbon") or {}).get("emission_factor", "direct"))
        return getattr(cfg or getattr(self._carbon, "config", None), "emission_factor", "direct")

    # -- one job ----------------------------------------------------------------------------

    def _job_row(self, conn: Connection, job_id: int) -> dict:
        row = conn.execute(select(*(jobs.c[c] for c in _JOB_COLUMNS)).where(jobs.c.id == job_id)).mappings().first()
        if row is None:
            raise NotFound(f"no job {job_id}")
        return dict(row)

    def _placement(self, conn: Connection, job: dict) -> tuple[str | None, str | None]:
        zone, model = job.get("zone"), job.get("gpu_model")
        if zone is None and job.get("node"):
            zone = conn.execute(select(nodes.c.zone).where(nodes.c.name == job["node"])).scalar()
        if model is None and job.get("gpu_ids"):
            model = conn.execute(select(gpus.c.model).where(gpus.c.id == int(job["gpu_ids"][0]))).scalar()
        return zone, model

    def _pue(self, zone: str | None, node: str | None = None) -> float:
        """The PUE of the site of the job's node (its zone's default when the site has none)."""
        if self.site is None:
            return 1.0
        return float(self.site.pue(zone, node))

    def _signal(self, zone: str | None) -> str | None:
        if zone is None:
            return None
        sig = self.carbon.signal_of(zone)
        if sig is None and static_intensity(zone, self._static_overrides()) is not None:
            sig = SIGNAL_AVERAGE
        return sig

    def _static_overrides(self) -> dict[str, float]:
        cfg = getattr(self.carbon, "config", None)
        return dict(getattr(cfg, "static", {}) or {})

    def intensity_spans(self, conn: Connection, zone: str, signal: str | None, start: datetime,
                        end: datetime) -> list[IntensitySpan]:
        """Recorded values of `zone` over [start, end) (newest issue of each period; a later
        period cuts an earlier one short), with the gaps between them filled by the static
        yearly mean where the signal is average and a static value exists."""
        spans: list[IntensitySpan] = []
        if signal is not None:
            ci = carbon_intensity.c
            rows = conn.execute(
                select(ci.at, ci.duration_s, ci.gco2_per_kwh, ci.source, ci.issued_at)
                .where(ci.zone == zone, ci.signal == signal, ci.kind == KIND_ACTUAL,
                       ci.at <= end, ci.at > start - timedelta(seconds=MAX_PERIOD_S))
                .order_by(ci.at, ci.issued_at)).all()
            newest: dict[datetime, Any] = {}
            for r in rows:
                newest[r.at] = r
            ordered = sorted(newest.values(), key=lambda r: r.at)
            for i, r in enumerate(ordered):
                stop = r.at + timedelta(seconds=r.duration_s)
                if i + 1 < len(ordered):
                    stop = min(stop, ordered[i + 1].at)
                if stop > start and r.at <= end and stop > r.at:
                    spans.append(IntensitySpan(r.at, stop, r.gco2_per_kwh, KIND_ACTUAL, r.source))
        static = static_intensity(zone, self._static_overrides()) if signal in (None, SIGNAL_AVERAGE) else None
        if static is not None:
            cur = start
            filled: list[IntensitySpan] = []
            for s in spans:
                if s.start > cur:
                    filled.append(IntensitySpan(cur, s.start, static.gco2_per_kwh, "static", "static"))
                cur = max(cur, s.end)
            if cur < end or start == end and not spans:
                filled.append(IntensitySpan(cur, max(end, cur + timedelta(seconds=1)), static.gco2_per_kwh,
                                            "static", "static"))
            spans = sorted(spans + filled, key=lambda s: s.start)
        return spans

    def _power_series(self, conn: Connection, gpu_ids: Sequence[int], start_s: float,
                      end_s: float) -> tuple[list[list[tuple[float, float]]], str]:
        """Per GPU, (t, W) over the run: raw samples, else minute means at mid-minute."""
        series: list[list[tuple[float, float]]] = []
        weighting = "power-samples"
        lo, hi = start_s - EDGE_MARGIN_S, end_s + EDGE_MARGIN_S
        for gid in gpu_ids:
            s = gpu_samples.c
            raw = conn.execute(select(s.t_s, s.power_w).where(
                s.minute_s >= int(lo // 60) * 60, s.minute_s <= int(hi // 60) * 60, s.gpu_id == gid,
                s.t_s >= lo, s.t_s <= hi, s.power_w.is_not(None)).order_by(s.t_s)).all()
            if len(raw) >= 2:
                series.append([(t, p) for t, p in raw])
                continue
            m = gpu_power_minutes.c
            minutes = conn.execute(select(m.minute_s, m.mean_w).where(
                m.gpu_id == gid, m.minute_s >= int(start_s // 60) * 60, m.minute_s <= end_s,
                m.mean_w.is_not(None)).order_by(m.minute_s)).all()
            if minutes:
                series.append([(ms + 30.0, w) for ms, w in minutes])
                weighting = "minute-means"
            else:
                return [], "time"
        return series, weighting

    def _counter_note(self, conn: Connection, gpu_ids: Sequence[int], start_s: float, end_s: float) -> str | None:
        """Why the counter was not used, re-derived from the raw samples while they are kept."""
        notes = []
        for gid in gpu_ids:
            s = gpu_samples.c
            pts = [Sample(t, p, e) for t, p, e in conn.execute(select(s.t_s, s.power_w, s.energy_j).where(
                s.minute_s >= int((start_s - EDGE_MARGIN_S) // 60) * 60,
                s.minute_s <= int((end_s + EDGE_MARGIN_S) // 60) * 60, s.gpu_id == gid,
                s.t_s >= start_s - EDGE_MARGIN_S, s.t_s <= end_s + EDGE_MARGIN_S).order_by(s.t_s))]
            if len(pts) < 2:
                continue
            est = window_energy(clip_window(pts, start_s, end_s))
            if est.note and est.method != "counter":
                notes.append(f"GPU {gid}: {est.note}")
        return "; ".join(notes) or None

    def _segments(self, conn: Connection, job: dict) -> list:
        if not job.get("interruptible"):
            return []
        return list(conn.execute(select(job_segments).where(job_segments.c.job_id == job["id"])
                                 .order_by(job_segments.c.seq)))

    def price_segments(self, conn: Connection, job: dict, rows: list) -> tuple[RunCarbon | None, dict, list[dict]]:
        """The carbon of an interruptible job: each segment priced over its own window,
        on its own node's zone and GPUs (a checkpoint job may move), and the sums. Returns
        the job's carbon, its column values and each segment's gCO2 ({id, gco2})."""
        zone, model = self._placement(conn, job)
        pue = self._pue(zone, job.get("node"))
        signal = self._signal(zone)
        values: dict[str, Any] = {"zone": zone, "gpu_model": model, "pue": pue, "gco2_signal": signal}
        runs: list[RunCarbon] = []
        updates: list[dict] = []
        for seg in rows:
            seg_zone = zone
            if seg.node and seg.node != job.get("node"):
                seg_zone = conn.execute(select(nodes.c.zone).where(nodes.c.name == seg.node)).scalar() or zone
            if seg.energy_j is None or seg_zone is None:
                updates.append({"id": seg.id, "gco2": None})
                continue
            gpu_ids = [int(g) for g in (seg.gpu_ids or [])]
            series, weighting = self._power_series(conn, gpu_ids, seg.started_at.timestamp(), seg.ended_at.timestamp())
            spans = self.intensity_spans(conn, seg_zone, self._signal(seg_zone), seg.started_at, seg.ended_at)
            run = run_carbon(float(seg.energy_j), seg.started_at, seg.ended_at, spans,
                             pue=self._pue(seg_zone, seg.node), gpu_power=series, weighting=weighting)
            runs.append(run)
            updates.append({"id": seg.id, "gco2": run.gco2})
        if not runs:
            values.update(gco2=None, gco2_basis=None, gco2_coverage=None)
            return None, values, updates
        total = combine_runs(runs)
        values.update(gco2=total.gco2, gco2_basis=total.basis, gco2_coverage=total.coverage)
        return total, values, updates

    def price_job(self, conn: Connection, job: dict) -> tuple[RunCarbon | None, dict]:
        """The carbon of a job's run and the column values that record it (an interruptible
        job's: the sum over its segments, `price_segments`)."""
        rows = self._segments(conn, job)
        if rows:
            run, values, _ = self.price_segments(conn, job, rows)
            return run, values
        zone, model = self._placement(conn, job)
        pue = self._pue(zone, job.get("node"))
        signal = self._signal(zone)
        values: dict[str, Any] = {"zone": zone, "gpu_model": model, "pue": pue, "gco2_signal": signal}
        started, ended, energy_j = job.get("started_at"), job.get("ended_at"), job.get("energy_j")
        if started is None or ended is None or energy_j is None or zone is None:
            values.update(gco2=None, gco2_basis=None, gco2_coverage=None)
            return None, values
        gpu_ids = [int(g) for g in (job.get("gpu_ids") or [])]
        series, weighting = self._power_series(conn, gpu_ids, started.timestamp(), ended.timestamp())
        spans = self.intensity_spans(conn, zone, signal, started, ended)
        run = run_carbon(float(energy_j), started, ended, spans, pue=pue, gpu_power=series, weighting=weighting)
        values.update(gco2=run.gco2, gco2_basis=run.basis, gco2_coverage=run.coverage)
        if job.get("energy_note") is None and (job.get("energy_method") or "").startswith("integral"):
            note = self._counter_note(conn, gpu_ids, started.timestamp(), ended.timestamp())
            if note:
                values["energy_note"] = note
        return run, values

    def account(self, job_id: int, *, energy_note: str | None = None, tokens: int | None = None) -> RunCarbon | None:
        """Price a finished job and record it on the job (gco2, zone, model, PUE, signal,
        basis, coverage, accounted_at). Safe to repeat; returns the run's carbon (None if it
        cannot be priced: not measured, never ran)."""
        def tx(conn: Connection) -> RunCarbon | None:
            job = self._job_row(conn, job_id)
            if job["state"] not in FINISHED:
                raise ValueError(f"job {job_id} is {job['state']}: only finished jobs are accounted")
            if energy_note is not None:
                job["energy_note"] = energy_note
            rows = self._segments(conn, job)
            if rows:
                run, values, seg_gco2 = self.price_segments(conn, job, rows)
                for u in seg_gco2:
                    conn.execute(update(job_segments).where(job_segments.c.id == u["id"]).values(gco2=u["gco2"]))
            else:
                run, values = self.price_job(conn, job)
            if energy_note is not None:
                values["energy_note"] = energy_note
            if tokens is not None:
                values["tokens"] = int(tokens)
            values["accounted_at"] = self._clock()
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))
            return run

        run = self.store.transact(tx)
        log.debug("job %s accounted: %s gCO2 (%s)", job_id, None if run is None else run.gco2,
                  None if run is None else run.basis)
        return run

    def backfill(self, *, limit: int = 500, ids: Iterable[int] | None = None) -> int:
        """Price finished jobs that were never priced, and re-price those priced without
        full actuals (ended within `recheck_days`) once more data may be in; returns how many
        were priced. For the daemon's periodic job and for reports."""
        now = self._clock()
        recheck_from = now - timedelta(days=self.config.recheck_days)
        retry_before = now - timedelta(hours=1)
        j = jobs.c
        with self.store.read() as conn:
            if ids is not None:
                todo = list(ids)
            else:
                todo = list(conn.execute(select(j.id).where(
                    j.accounted_at.is_(None), j.ended_at.is_not(None), j.state.in_(FINISHED))
                    .order_by(j.ended_at).limit(limit)).scalars())
                if len(todo) < limit:
                    todo += list(conn.execute(select(j.id).where(
                        j.ended_at >= recheck_from, j.state.in_(FINISHED), j.energy_j.is_not(None),
                        j.accounted_at < retry_before,
                        or_(j.gco2_basis.is_(None), j.gco2_basis != "actual"))
                        .order_by(j.ended_at).limit(limit - len(todo))).scalars())
        done = 0
        for job_id in todo:
            try:
                self.account(job_id)
                done += 1
            except (NotFound, ValueError) as e:  # deleted or re-queued meanwhile
                log.info("job %s not accounted: %s", job_id, e)
        if done:
            log.info("accounted the carbon of %d finished job(s)", done)
        return done

    def receipt(self, job_id: int) -> dict:
        """The receipt of one job, priced now from the store (recorded on the job if it is
        finished and its figure changed)."""
        with self.store.read() as conn:
            job = self._job_row(conn, job_id)
            run, values = self.price_job(conn, job)
            shift = None
            zone = values["zone"]
            if run is not None and job.get("submitted_at") and zone is not None:
                runtime = job["ended_at"] - job["started_at"]
                s0 = job["submitted_at"]
                shift_spans = self.intensity_spans(conn, zone, values["gco2_signal"], s0, s0 + runtime)
                shift = run_carbon(run.energy_j, s0, s0 + runtime, shift_spans, pue=run.pue)
                if shift.basis != "actual" or run.basis != "actual":
                    shift = None  # a static-priced "what if" says nothing about timing
        stale = job["state"] in FINISHED and job.get("ended_at") is not None and (
            job.get("accounted_at") is None or job.get("gco2") != values["gco2"]
            or job.get("gco2_basis") != values.get("gco2_basis"))
        job.update({k: v for k, v in values.items() if k != "gco2"})
        cost = None
        if job.get("energy_j") is not None and job.get("started_at") and job.get("ended_at"):
            cost = self._cost_usd(job)
        if stale:
            self.account(job_id)
        if job.get("interruptible"):
            from scheduler.job_view import segment_rows

            with self.store.read() as conn:
                job["segments"] = segment_rows(conn, job_id)
        return build_receipt(job, run, signal=values["gco2_signal"], shift=shift, cost_usd=cost)

    def _cost_usd(self, job: dict) -> float | None:
        from policies.catalog import catalog

        spec = catalog().get(job.get("gpu_model") or "")
        hours = (job["ended_at"] - job["started_at"]).total_seconds() / 3600 * (job.get("gpus") or 0)
        hw = self.config.gpu_usd_per_hour(spec.list_price_usd) * hours if spec else 0.0
        kwh = job["energy_j"] / J_PER_KWH * (job.get("pue") or 1.0)
        return hw + kwh * self.config.energy_price(job.get("zone"))

    # -- fleet reports ----------------------------------------------------------------------

    def _runtime_s(self):
        j = jobs.c
        if self.store.dialect == "sqlite":
            return (func.julianday(j.ended_at) - func.julianday(j.started_at)) * 86400.0
        return extract("epoch", j.ended_at - j.started_at)

    def _day(self):
        j = jobs.c
        if self.store.dialect == "sqlite":
            return func.substr(type_coerce(j.ended_at, String), 1, 10, type_=String)
        return func.to_char(func.timezone("UTC", j.ended_at), "YYYY-MM-DD", type_=String)

    def _group_key(self, by: str):
        j = jobs.c
        return {"user": j.owner_name, "workload": j.workload, "model": j.gpu_model, "zone": j.zone,
                "node": j.node, "day": self._day()}[by]

    def _cost_expr(self, runtime_s):
        from policies.catalog import catalog

        j = jobs.c
        rates = [(j.gpu_model == name, self.config.gpu_usd_per_hour(spec.list_price_usd))
                 for name, spec in sorted(catalog().items())]
        rate = case(*rates, else_=0.0) if rates else literal(0.0)
        prices = [(j.zone == z, p) for z, p in sorted(self.config.zone_energy_price_usd_per_kwh.items())]
        price = case(*prices, else_=self.config.energy_price_usd_per_kwh) if prices \
            else literal(self.config.energy_price_usd_per_kwh)
        return (rate * j.gpus * runtime_s / 3600.0
                + func.coalesce(j.energy_j, 0.0) / J_PER_KWH * func.coalesce(j.pue, 1.0) * price)

    def _period_filter(self, since: datetime, until: datetime, owner_uid: int | None):
        j = jobs.c
        ended = j.ended_at
        if self.store.dialect == "sqlite" and owner_uid is None and self._mostly_covered(since, until):
            # SQLite's planner takes ix_jobs_ended_at even for a range holding most rows, and
            # 100,000 index lookups are ~8x slower than one scan; `+col` makes it scan.
            ended = literal_column("+jobs.ended_at", UTCDateTime())
        cond = [ended >= utc_aware(since, "since"), ended < utc_aware(until, "until"),
                j.started_at.is_not(None), j.state.in_(FINISHED)]
        if owner_uid is not None:
            cond.append(j.owner_uid == owner_uid)
        return and_(*cond)

    def _mostly_covered(self, since: datetime, until: datetime) -> bool:
        """Whether [since, until) spans over a quarter of the time the finished jobs span."""
        with self.store.read() as conn:
            first, last = conn.execute(select(func.min(jobs.c.ended_at), func.max(jobs.c.ended_at))).one()
        if first is None or last is None or last <= first:
            return True
        overlap = (min(until, last) - max(since, first)).total_seconds()
        return overlap > 0.25 * (last - first).total_seconds()

    def report(self, since: datetime, until: datetime, *, by: str = "user", owner_uid: int | None = None,
               account_missing: int = 200) -> dict:
        """Fleet figures over jobs that ended in [since, until), grouped `by` one of GROUPINGS;
        only `owner_uid`'s jobs when given. Up to `account_missing` jobs of the period that
        were never priced are priced first (carbon data may arrive after a job ends)."""
        if by not in GROUPINGS:
            raise ValueError(f"unknown grouping {by!r}; use one of {', '.join(GROUPINGS)}")
        if until <= since:
            raise ValueError("the report period is empty: --since must be before --until")
        where = self._period_filter(since, until, owner_uid)
        j = jobs.c
        if account_missing:
            with self.store.read() as conn:
                missing = list(conn.execute(select(j.id).where(where, j.accounted_at.is_(None))
                                            .limit(account_missing)).scalars())
            if missing:
                self.backfill(ids=missing)
        rows = self._aggregate(where, self._group_key(by).label("key"), _signal_key().label("signal"))
        unaccounted = sum(int(r["unpriced"] or 0) for r in rows)
        by_key: dict[Any, list[dict]] = {}
        for r in rows:
            by_key.setdefault(r["key"], []).append(r)
        groups = [self._signal_figures(parts) | {"group": key} for key, parts in by_key.items()]
        groups.sort(key=lambda g: (g["group"] is None, str(g["group"])))
        total = self._signal_figures(rows)
        return {"since": iso(since), "until": iso(until), "by": by, "generated_at": iso(self._clock()),
                "scope": "all users" if owner_uid is None else f"uid {owner_uid}",
                "groups": groups, "total": total, "jobs_without_gco2": unaccounted,
                "unpriced": self._unpriced(where) if unaccounted else [],
                "assumptions": {"gpu_lifetime_years": self.config.gpu_lifetime_years,
                                "energy_price_usd_per_kwh": self.config.energy_price_usd_per_kwh,
                                "zone_energy_price_usd_per_kwh": dict(self.config.zone_energy_price_usd_per_kwh)}}

    def _unpriced(self, where) -> list[dict]:
        """Why jobs of the period have no gCO2: per zone, how many, and whether the zone has
        any carbon data at all (none: it never will be priced until data is imported)."""
        from telemetry.grid.static import static_intensity

        j, ci = jobs.c, carbon_intensity.c
        with self.store.read() as conn:
            rows = conn.execute(select(j.zone, func.count(), func.sum(case((j.energy_j.is_(None), 1), else_=0)))
                                .where(where, j.gco2.is_(None)).group_by(j.zone)).all()
            with_data = set(conn.execute(select(ci.zone).distinct()
                                         .where(ci.zone.in_([r[0] for r in rows if r[0]]))).scalars())
        static = getattr(getattr(self.carbon, "config", None), "static", None)
        out = []
        for zone, count, unmeasured in sorted(rows, key=lambda r: str(r[0])):
            has_data = zone in with_data or (zone is not None and static_intensity(zone, static) is not None)
            out.append({"zone": zone, "jobs": int(count), "jobs_unmeasured": int(unmeasured or 0),
                        "zone_has_data": has_data,
                        "why": ("no energy measured" if count == unmeasured else
                                f"zone {zone} has no carbon data (import it: carbonsched carbon import FILE "
                                f"--zone {zone})" if not has_data else
                                "no intensity data for the run's hours yet")})
        return out

    def _aggregate(self, where, *keys) -> list[dict]:
        j = jobs.c
        runtime = self._runtime_s()
        cost = self._cost_expr(runtime)
        priced = j.gco2.is_not(None)
        # the work done: reported by the job, else declared at submit (receipts say the same)
        prompts = func.coalesce(j.reported_prompts, j.prompts)
        tokens = func.coalesce(j.reported_output_tokens, j.tokens)
        with_prompts = and_(priced, prompts > 0)
        with_tokens = and_(tokens > 0, j.energy_j.is_not(None))
        both = and_(priced, j.est_gco2_if_now.is_not(None))
        modelled = or_(j.energy_method == MODELLED, j.energy_method.like(MODELLED + "+%"))
        # the counterfactual of each job as its receipt has it: measured x (if-now / planned
        # estimate), or the raw if-now estimate where the plan's own estimate is missing
        scaled_cf = case((j.est_gco2 > 0, j.gco2 * j.est_gco2_if_now / j.est_gco2), else_=j.est_gco2_if_now)

        def when(cond, value):
            return func.sum(case((cond, value), else_=None))

        stmt = select(
            *keys,
            func.count().label("jobs"),
            func.sum(case((j.state == State.COMPLETED.value, 1), else_=0)).label("completed"),
            func.sum(j.gpus * runtime).label("gpu_s"),
            func.sum(j.energy_j).label("energy_j"),
            func.count(j.energy_j).label("measured"),
            when(modelled, j.energy_j).label("modelled_j"), when(modelled, 1).label("modelled"),
            func.sum(j.energy_j * func.coalesce(j.pue, 1.0)).label("facility_j"),
            func.sum(j.gco2).label("gco2"),
            func.count(j.gco2).label("priced"),
            func.sum(case((and_(priced, j.energy_j.is_not(None)), j.energy_j), else_=None)).label("priced_j"),
            func.sum(case((and_(priced, j.energy_j.is_not(None)), j.energy_j * func.coalesce(j.pue, 1.0)),
                          else_=None)).label("priced_facility_j"),
            when(with_prompts, j.gco2).label("gco2_p"), when(with_prompts, prompts).label("prompts_p"),
            func.sum(prompts).label("prompts"), func.sum(tokens).label("tokens"),
            func.sum(case((j.reported_prompts.is_not(None), 1), else_=0)).label("prompts_reported"),
            func.count(prompts).label("prompts_counted"),
            func.sum(case((j.reported_output_tokens.is_not(None), 1), else_=0)).label("tokens_reported"),
            func.count(tokens).label("tokens_counted"),
            when(with_tokens, j.energy_j).label("energy_t"), when(with_tokens, tokens).label("tokens_e"),
            func.sum(cost).label("usd"), when(tokens > 0, cost).label("usd_t"),
            when(tokens > 0, tokens).label("tokens_c"),
            when(and_(priced, tokens > 0), j.gco2).label("gco2_t"),
            when(and_(priced, tokens > 0), tokens).label("tokens_g"),
            when(both, scaled_cf).label("cf"), when(both, j.gco2).label("cf_actual"),
            func.sum(case((and_(j.deadline.is_not(None), j.ended_at > j.deadline), 1), else_=0)).label("late"),
            func.sum(case((or_(j.accounted_at.is_(None), and_(j.energy_j.is_not(None), j.gco2.is_(None))), 1),
                          else_=0)).label("unpriced"),
        ).where(where)
        if keys:
            stmt = stmt.group_by(*keys)
        with self.store.read() as conn:
            return [dict(r) for r in conn.execute(stmt).mappings()]

    def _signal_figures(self, rows: Sequence[Mapping[str, Any]]) -> dict:
        """The figures of aggregate rows (each of one carbon signal, `signal`), with the
        grams split by signal: `by_signal` holds CARBON_FIGURES per signal, and the group's own
        CARBON_FIGURES are that signal's, or None where the group mixes both (the
        issue-25 example: 1 kWh at 100 g average plus 1 kWh at 800 g marginal is not
        "0.9 kg at 450 g/kWh"). `signal` names it: average, marginal, mixed or None."""
        fig = self._figures(_sum_rows(rows))
        per: dict[str, dict] = {}
        for sig in sorted({r.get("signal") for r in rows if r.get("priced")} - {None}):
            part = self._figures(_sum_rows([r for r in rows if r.get("signal") == sig]))
            per[sig] = {k: part[k] for k in CARBON_FIGURES}
        fig["by_signal"] = per
        fig["signal"] = next(iter(per)) if len(per) == 1 else ("mixed" if per else None)
        if len(per) > 1:
            for k in CARBON_FIGURES:
                if k != "jobs_with_gco2":
                    fig[k] = None
        return fig

    @staticmethod
    def _figures(r: Mapping[str, Any]) -> dict:
        def f(name: str) -> float:
            return float(r.get(name) or 0.0)

        cf, cf_actual = r.get("cf"), r.get("cf_actual")
        saving = _difference(cf, cf_actual)
        return {
            "jobs": int(r.get("jobs") or 0), "completed": int(r.get("completed") or 0),
            "deadline_misses": int(r.get("late") or 0),
            "gpu_hours": f("gpu_s") / 3600.0,
            "energy_kwh": f("energy_j") / J_PER_KWH,
            "facility_energy_kwh": f("facility_j") / J_PER_KWH,
            # None, never 0, where no job of the group could be priced (issue 28): an unknown
            # emission is not a zero one; partly priced groups sum the priced jobs only
            "kgco2": f("gco2") / 1000.0 if r.get("priced") else None,
            "jobs_measured": int(r.get("measured") or 0), "jobs_with_gco2": int(r.get("priced") or 0),
            # energy from emulated GPUs' power model: included in the figures, but not measured
            "jobs_modelled": int(r.get("modelled") or 0), "modelled_energy_kwh": f("modelled_j") / J_PER_KWH,
            "intensity_g_per_kwh": intensity_g_per_kwh(f("gco2"), r.get("priced_facility_j")),
            "prompts": int(r["prompts"]) if r.get("prompts") is not None else None,
            "tokens": int(r["tokens"]) if r.get("tokens") is not None else None,
            # how many of the jobs with a prompt / token count reported it themselves
            "prompts_source": _source(r.get("prompts_reported"), r.get("prompts_counted")),
            "tokens_source": _source(r.get("tokens_reported"), r.get("tokens_counted")),
            "gco2_per_prompt": f("gco2_p") / f("prompts_p") if r.get("prompts_p") else None,
            "gco2_per_1k_tokens": f("gco2_t") / f("tokens_g") * 1000.0 if r.get("tokens_g") else None,
            "tokens_per_j": f("tokens_e") / f("energy_t") if r.get("energy_t") else None,
            "usd": f("usd"),
            "usd_per_mtok": f("usd_t") / f("tokens_c") * 1e6 if r.get("tokens_c") else None,
            "counterfactual_kgco2": None if cf is None else cf / 1000.0,
            "saving_kgco2": None if saving is None else saving / 1000.0,
            "saving_pct": saving / cf * 100.0 if saving is not None and cf else None,
        }

    # -- the disclosure export --------------------------------------------------------------

    def export(self, since: datetime, until: datetime, *, owner_uid: int | None = None) -> dict:
        """The period's energy and emissions per system (node x GPU model x zone), with the
        methodology: how energy was measured, which signal and PUE priced it, the data
        sources and their licences. For sustainability and regulatory reporting."""
        from importlib.metadata import PackageNotFoundError, version

        if until <= since:
            raise ValueError("the export period is empty: --since must be before --until")
        where = self._period_filter(since, until, owner_uid)
        j = jobs.c
        with self.store.read() as conn:
            missing = list(conn.execute(select(j.id).where(where, j.accounted_at.is_(None)).limit(200)).scalars())
        if missing:
            self.backfill(ids=missing)
        rows = self._aggregate(where, j.node.label("node"), j.gpu_model.label("gpu_model"), j.zone.label("zone"),
                               j.energy_method.label("method"), _signal_key().label("signal"),
                               j.gco2_basis.label("basis"), j.pue.label("pue"))
        systems: dict[tuple, list[dict]] = {}
        for r in rows:
            systems.setdefault((r["node"], r["gpu_model"], r["zone"]), []).append(r)
        out_systems = []
        for (node, model, zone), parts in sorted(systems.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
            fig = self._signal_figures(parts)
            out_systems.append({
                "node": node, "gpu_model": model, "zone": zone,
                "jobs": fig["jobs"], "gpu_hours": fig["gpu_hours"],
                "it_energy_kwh": fig["energy_kwh"], "facility_energy_kwh": fig["facility_energy_kwh"],
                "emissions_kgco2e": fig["kgco2"],
                "emissions_kgco2e_by_signal": _kg_by_signal(fig),
                "intensity_g_per_kwh": fig["intensity_g_per_kwh"],
                "pue": sorted({p["pue"] for p in parts if p["pue"] is not None}),
                "signal": sorted(fig["by_signal"]),
                "measurement_shares": _shares(parts, "method", "energy_j"),
                "intensity_basis_shares": _shares(parts, "basis", "energy_j"),
                "jobs_without_measurement": fig["jobs"] - fig["jobs_measured"],
                "jobs_without_emissions": fig["jobs"] - fig["jobs_with_gco2"],
                "jobs_modelled": fig["jobs_modelled"], "modelled_energy_kwh": fig["modelled_energy_kwh"],
                "energy": "modelled" if fig["jobs_modelled"] == fig["jobs_measured"] and fig["jobs_modelled"]
                else "partly modelled" if fig["jobs_modelled"] else "measured",
                **_work_figures(fig),
            })
        total = self._signal_figures(rows)
        zones = sorted({s["zone"] for s in out_systems if s["zone"]})
        try:
            ver = version("carbonsched")
        except PackageNotFoundError:
            ver = "unknown"
        return {
            "document": "carbonsched energy and emissions disclosure",
            "schema_version": 1,
            "period": {"start": iso(since), "end": iso(until)},
            "generated_at": iso(self._clock()),
            "generator": {"name": "carbonsched", "version": ver},
            "scope": "all users" if owner_uid is None else f"jobs of uid {owner_uid}",
            "systems": out_systems,
            "totals": {"jobs": total["jobs"], "gpu_hours": total["gpu_hours"],
                       "it_energy_kwh": total["energy_kwh"], "facility_energy_kwh": total["facility_energy_kwh"],
                       "emissions_kgco2e": total["kgco2"],  # None where the period mixes signals
                       "emissions_kgco2e_by_signal": _kg_by_signal(total),
                       "signal": total["signal"],
                       "jobs_without_measurement": total["jobs"] - total["jobs_measured"],
                       "jobs_without_emissions": total["jobs"] - total["jobs_with_gco2"],
                       "jobs_modelled": total["jobs_modelled"], "modelled_energy_kwh": total["modelled_energy_kwh"],
                       "measurement_shares": _shares(rows, "method", "energy_j"),
                       "intensity_basis_shares": _shares(rows, "basis", "energy_j"),
                       **_work_figures(total)},
            "methodology": {
                "boundary": "GPU energy of batch jobs scheduled by carbonsched (scope 2, operational, "
                            "location-based); facility overhead by PUE; embodied emissions excluded",
                "work": "prompts and output tokens as each job reported them in its metrics file, else as "
                        "declared at submit (prompts_source / tokens_source: reported, declared or partly "
                        "reported); per-prompt and per-token figures count only jobs with that count",
                "energy_measurement": {
                    "counter": "GPU hardware energy counter (NVML total energy / AMD SMI accumulator), "
                               "used when it moves forward and agrees with integrated power within 10%",
                    "counter-unverified": "GPU energy counter without enough power samples to cross-check",
                    "integral": "trapezoid integral of sampled GPU power (default 1 Hz); also used after a "
                                "counter fault",
                    "+static": "plus the job's share of the node's configured static power",
                    "modelled": "NOT MEASURED: emulated GPUs (no GPU hardware), energy from the emulator's "
                                "power model; systems with modelled_energy_kwh > 0 include such figures",
                },
                "emissions": "sum over the run of energy x grid carbon intensity of the zone at that time "
                             "x PUE; each part of a run weighted by its own measured energy",
                "signal": "average (consumption-based) or marginal, per zone, as named per system; never "
                          "added together: where a system or the totals hold both, emissions_kgco2e and "
                          "intensity_g_per_kwh are null and emissions_kgco2e_by_signal gives each",
                "intensity": "grams per kWh of facility energy (IT energy x PUE): the energy-weighted grid "
                             "intensity, as on receipts",
                "emission_factor": self._emission_factor(),
                "saving_counterfactual": f"measured gCO2 x the plan's estimate of {RULE_SHORT} / its "
                                         "estimate of the chosen plan",
                "pue": "per node's site from the configuration: [nodes.NODE] pue, else the [sites.SITE] "
                       "listing the node, else [zones.ZONE] pue, else [site] pue, else 1.0",
                "gaps": "periods without recorded intensity are priced at the zone's static yearly mean "
                        "(basis mixed/static) or left unpriced (jobs_without_emissions); never zero",
                "data_sources": self._sources(zones, since, until),
            },
        }

    def _sources(self, zones: list[str], since: datetime, until: datetime) -> list[dict]:
        ci = carbon_intensity.c
        out = []
        if zones:
            with self.store.read() as conn:
                rows = conn.execute(select(ci.source, ci.zone, ci.signal, func.count()).where(
                    ci.zone.in_(zones), ci.kind == KIND_ACTUAL, ci.at < until,
                    ci.at >= since - timedelta(seconds=MAX_PERIOD_S))
                    .group_by(ci.source, ci.zone, ci.signal)).all()
            by_source: dict[str, dict] = {}
            for source, zone, signal, n in rows:
                e = by_source.setdefault(source, {"source": source, "zones": [], "signals": [], "rows": 0,
                                                  **SOURCE_INFO.get(source, {"provider": source, "licence": "unknown"})})
                e["zones"] = sorted(set(e["zones"]) | {zone})
                e["signals"] = sorted(set(e["signals"]) | {signal})
                e["rows"] += n
            out = sorted(by_source.values(), key=lambda e: e["source"])
        out.append({"source": "static", "zones": zones, "signals": [SIGNAL_AVERAGE], "rows": None,
                    **SOURCE_INFO["static"]})
        out.append({"source": "gpu-telemetry", "provider": "carbonsched agents (NVML / AMD SMI / emulated)",
                    "licence": "own measurement", "zones": zones, "signals": [], "rows": None})
        return out


def _work_figures(fig: Mapping[str, Any]) -> dict:
    """The per-prompt and per-token figures of a group, for the export."""
    return {k: fig[k] for k in ("prompts", "prompts_source", "gco2_per_prompt", "tokens", "tokens_source",
                                "gco2_per_1k_tokens", "tokens_per_j", "usd_per_mtok")}


def _signal_key():
    """The carbon signal a job was priced with; NULL (priced before signals were recorded, at
    the zone's static yearly mean) is the average signal."""
    return func.coalesce(jobs.c.gco2_signal, SIGNAL_AVERAGE)


def _kg_by_signal(fig: Mapping[str, Any]) -> dict[str, float | None]:
    return {sig: part["kgco2"] for sig, part in fig["by_signal"].items()}


def _sum_rows(rows: Sequence[Mapping[str, Any]]) -> dict:
    """Add up aggregate rows (sums stay sums; None where every part is None)."""
    out: dict[str, Any] = {}
    for r in rows:
        for k, v in r.items():
            if k in ("key", "node", "gpu_model", "zone", "method", "signal", "basis", "pue"):
                continue
            if v is None:
                out.setdefault(k, None)
            else:
                out[k] = (out.get(k) or 0) + v
    return out


def _shares(rows: Sequence[Mapping[str, Any]], key: str, weight: str) -> dict[str, float]:
    """Share of `weight` (e.g. energy) per value of `key`, over the rows."""
    totals: dict[str, float] = {}
    for r in rows:
        w = r.get(weight)
        if w:
            name = r.get(key) or "none"
            totals[name] = totals.get(name, 0.0) + float(w)
    whole = sum(totals.values())
    return {k: v / whole for k, v in sorted(totals.items())} if whole else {}


# -- entry points for the agent, the daemon and the API -------------------------------------

def record_actual_carbon(store: Store, job_id: int, *, site: Any = None, carbon: Any = None,
                         config: AccountingConfig | None = None, energy_note: str | None = None,
                         tokens: int | None = None) -> RunCarbon | None:
    """Price a job that just finished and record its gCO2 (the agent's completion path).

    `energy_note`: why the energy method was chosen (e.g. the counter fault the sampler
    saw), kept for the receipt. A job priced without full actuals is re-priced later by
    `Accountant.backfill`.
    """
    return Accountant(store, site=site, carbon=carbon, config=config).account(
        job_id, energy_note=energy_note, tokens=tokens)


def energy_note_of(per_gpu: Mapping[int, Any]) -> str | None:
    """One line from `scheduler.node.samples.JobEnergy.per_gpu`: why GPUs were not measured by
    their counter (for `record_actual_carbon(energy_note=...)`)."""
    notes = [f"GPU {gid}: {e.note}" for gid, e in sorted(per_gpu.items())
             if getattr(e, "note", "") and getattr(e, "method", "") != "counter"]
    return "; ".join(notes) or None


def parse_period(since: str | None, until: str | None, now: datetime, *,
                 default_days: float = 30.0) -> tuple[datetime, datetime]:
    """--since/--until: an ISO time or date (UTC if no offset), or a duration back from now
    (`7d`); defaults: the last `default_days` days up to now."""
    def one(text: str | None, default: datetime) -> datetime:
        if not text:
            return default
        from scheduler.timeparse import parse_duration

        try:
            return now - timedelta(seconds=parse_duration(text))
        except ValueError:
            pass
        try:
            t = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"bad time {text!r}: use an ISO date/time (2026-01-31, 2026-01-31T12:00Z) "
                             "or a duration back from now (7d, 12h)") from None
        return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)

    end = one(until, now)
    start = one(since, end - timedelta(days=default_days))
    if end <= start:
        raise ValueError(f"the period is empty: since {iso(start)} is not before until {iso(end)}")
    return start, end
