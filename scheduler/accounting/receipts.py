"""Receipts: what one finished job used and emitted, how it was measured and priced, and
what waiting (or not) saved, as plain JSON-ready data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from policies.pricing.counterfactual import RULE_SHORT
from policies.types import J_PER_KWH, sig
from scheduler.accounting.embodied import embodied_receipt, sci_per_prompt
from scheduler.accounting.figures import difference, iso
from scheduler.accounting.ledger import FINISHED, Ledger
from scheduler.accounting.measurement import describe_measurement
from scheduler.accounting.run_carbon import RunCarbon, run_carbon
from scheduler.job_view import output_truncated_list, segment_rows
from scheduler.lifecycle import State
from telemetry.grid.readings import SIGNALS


def _seconds_between(a: datetime | None, b: datetime | None) -> float | None:
    return None if a is None or b is None else (b - a).total_seconds()


def _per(value: float | None, count: float | None, scale: float = 1.0) -> float | None:
    return value / count * scale if value is not None and count else None


def _work(reported: int | None, declared: int | None) -> tuple[int | None, str | None]:
    """The count a figure divides by and where it comes from: reported beats declared."""
    if reported is not None:
        return reported, "reported"
    return (declared, "declared") if declared is not None else (None, None)


def build_receipt(job: Mapping[str, Any], run: RunCarbon | None, *, signal: str | None,
                  shift: RunCarbon | None = None, cost_usd: float | None = None,
                  other_signal_gco2: float | None = None) -> dict:
    """The carbon receipt of one finished job, as plain JSON-ready data.

    `job` holds the job's columns (a row mapping); `run` its carbon (None: not computable,
    e.g. energy not measured); `shift`: the same energy priced as if started at submission
    (same zone, recorded intensity), a measured counterfactual of waiting;
    `other_signal_gco2`: the run priced with the other signal (average or marginal) where
    recorded data of it covers the run, shown beside `gco2`, never added to it.
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
    # policies.pricing.counterfactual (est_gco2_if_now: the job alone at submission on the earliest free,
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
    saving = difference(counterfactual, gco2)
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
        "plan_saving_gco2": difference(cf_est, est),
        "gco2_if_started_at_submit": shift.gco2 if shift is not None else None,
        # The operating point the plan chose (policies.model.operating_point), and why; null: none.
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
    receipt.update(carbon_beside(receipt, signal, other_signal_gco2))
    return receipt


def carbon_beside(receipt: Mapping[str, Any], signal: str | None, other_signal_gco2: float | None) -> dict:
    """What a receipt shows beside its operational `gco2`, never added into it: the grams per
    signal (its own and the other's where known), the embodied carbon (the run's GPU-hours'
    share of making its GPUs and host) and the SCI-style total per prompt, labelled as such,
    with both parts."""
    embodied = embodied_receipt(receipt["gpu_model"], receipt["gpus"], receipt["runtime_s"])
    return {"operational_gco2_by_signal": by_signal(signal, receipt["gco2"], other_signal_gco2),
            "embodied": embodied,
            "sci": sci_per_prompt(receipt["gco2"], embodied["gco2"], receipt["prompts"], signal=signal,
                                  prompts_source=receipt["prompts_source"])}


def by_signal(signal: str | None, gco2: float | None, other_gco2: float | None) -> dict[str, float | None]:
    """The operational grams per signal: the job's own signal's (`gco2`) and the other's where
    known (None: not known); two different quantities, never added."""
    out: dict[str, float | None] = dict.fromkeys(SIGNALS)
    if signal in out:
        out[signal] = gco2
        other = next(s for s in SIGNALS if s != signal)
        out[other] = other_gco2
    return out


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


class Receipts:
    """The receipts of one store's jobs, priced by `ledger` (recorded on a finished job
    whose figure changed)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def receipt(self, job_id: int) -> dict:
        """The receipt of one job, priced now from the store (recorded on the job if it is
        finished and its figure changed)."""
        with self.ledger.store.read() as conn:
            job = self.ledger.job_row(conn, job_id)
            run, values = self.ledger.price_job(conn, job)
            shift = None
            zone = values["zone"]
            if run is not None and job.get("submitted_at") and zone is not None:
                runtime = job["ended_at"] - job["started_at"]
                s0 = job["submitted_at"]
                shift_spans = self.ledger.intensity_spans(conn, zone, values["gco2_signal"], s0, s0 + runtime)
                shift = run_carbon(run.energy_j, s0, s0 + runtime, shift_spans, pue=run.pue)
                if shift.basis != "actual" or run.basis != "actual":
                    shift = None  # a static-priced "what if" says nothing about timing
            own = values["gco2_signal"]
            other_gco2 = None
            if own in SIGNALS and not job.get("interruptible") and job["state"] in FINISHED:
                other = next(s for s in SIGNALS if s != own)
                other_gco2 = self.ledger.price_other_signal(conn, {**job, **values}, other)
        stale = job["state"] in FINISHED and job.get("ended_at") is not None and (
            job.get("accounted_at") is None or job.get("gco2") != values["gco2"]
            or job.get("gco2_basis") != values.get("gco2_basis"))
        job.update({k: v for k, v in values.items() if k != "gco2"})
        cost = None
        if job.get("energy_j") is not None and job.get("started_at") and job.get("ended_at"):
            cost = self.cost_usd(job)
        if stale:
            self.ledger.account(job_id)
        if job.get("interruptible"):
            with self.ledger.store.read() as conn:
                job["segments"] = segment_rows(conn, job_id)
        return build_receipt(job, run, signal=values["gco2_signal"], shift=shift, cost_usd=cost,
                             other_signal_gco2=other_gco2)

    def cost_usd(self, job: dict) -> float | None:
        from policies.model.catalog import catalog

        spec = catalog().get(job.get("gpu_model") or "")
        hours = (job["ended_at"] - job["started_at"]).total_seconds() / 3600 * (job.get("gpus") or 0)
        hw = self.ledger.config.gpu_usd_per_hour(spec.list_price_usd) * hours if spec else 0.0
        kwh = job["energy_j"] / J_PER_KWH * (job.get("pue") or 1.0)
        return hw + kwh * self.ledger.config.energy_price(job.get("zone"))
