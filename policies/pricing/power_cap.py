"""How a job responds to a GPU power limit below what it would draw: the cap response.

A board limited to `cap_w` while the job would draw `uncapped_w` (both per GPU) draws the
cap, and its clocks drop until it does; the work takes longer, by less than the power fell,
so the energy falls. The response is modelled per vendor as

    runtime factor = (uncapped_w / cap_w) ** ALPHA[vendor]     (cap_w < uncapped_w)
    power          = cap_w

and a cap at or above the job's uncapped draw changes nothing (memory-bound LLM decode on
an H200 draws 137-300 W of its 700 W, so a 500 W cap never triggers: Ma et al., "The
Illusion of Power Capping in LLM Decode", arXiv:2605.11999).

Sources of the fitted exponents:

- NVIDIA: "From Words to Watts: Benchmarking the Energy Costs of Large Language Model
  Inference" (Samsi et al., IEEE HPEC 2023): capping an A100 from 250 W to 175 W (0.70 of
  its draw) cut inference energy by about 23 % for about 6-7 % more latency. 1.065 =
  (250/175) ** ALPHA gives ALPHA = ln 1.065 / ln(250/175) = 0.177; the energy it implies,
  0.70 x 1.065 = 0.745 (25 % less), is within two points of the 23 % reported.
- AMD: no public cap-response figure for MI300X-class parts was found for this model; the
  cross-vendor study of H100, H200 and MI300X under power caps ("AI Application
  Benchmarking: Power-Aware Performance Analysis for Vision and Language Models",
  arXiv:2603.16164) reports that no single cap is optimal across the three. Until measured
  runs say otherwise the AMD exponent is an ASSUMPTION: 0.25, i.e. a steeper slowdown than
  NVIDIA's, so the planner is more cautious with AMD caps (a flagged guess, not a fit).

Pure functions; no I/O.
"""

from __future__ import annotations

import functools
import math

# Runtime exponent per vendor (see the module docstring for each figure's source).
ALPHA = {"nvidia": math.log(1.065) / math.log(250.0 / 175.0), "amd": 0.25}
DEFAULT_ALPHA = ALPHA["amd"]  # an unknown vendor: the cautious (steeper) response


def alpha_of(vendor: str | None) -> float:
    return ALPHA.get((vendor or "").lower(), DEFAULT_ALPHA)


def capped(uncapped_w: float, cap_w: float | None, vendor: str | None) -> tuple[float, float]:
    """(runtime factor, power per GPU in W) of a job that draws `uncapped_w` per GPU when its
    GPUs are limited to `cap_w` (None: no cap)."""
    if cap_w is None or uncapped_w <= 0 or cap_w >= uncapped_w:
        return 1.0, uncapped_w
    if cap_w <= 0:
        raise ValueError(f"a power cap of {cap_w!r} W is not a power cap")
    return (uncapped_w / cap_w) ** alpha_of(vendor), cap_w


def at_limit(runtime_s: float, power_w: float, gpus: int, cap_w: float | None, model: str) -> tuple[float, float]:
    """(runtime s, power W over all `gpus`) of a run estimated at `runtime_s` and `power_w`
    at the default limit, when its GPUs of `model` are limited to `cap_w` per GPU (None: as
    estimated): what a plan's own limit means for its checks (`placement.plan_violations`)."""
    if cap_w is None:
        return runtime_s, power_w
    from policies.model.catalog import lookup

    try:
        vendor = lookup(model).vendor
    except KeyError:
        vendor = None
    n = max(1, gpus)
    factor, per_gpu_w = capped(power_w / n, cap_w, vendor)
    return runtime_s * factor, per_gpu_w * n


def default_limit_w(tdp_w: float, board_limit_w: float | None) -> float:
    """The limit a GPU runs at when the planner sets none, per GPU: its board's reported
    limit where that is below the TDP, else the TDP. Candidate limits are fractions of it."""
    return min(tdp_w, board_limit_w) if board_limit_w else tdp_w


def limit_text(cap_w: float, default_w: float, gco2: float | None, uncapped_gco2: float | None,
               energy_ratio: float, runtime_ratio: float) -> str:
    """What a plan's explanation says of its power limit: "power limit 490 W (70% of 700 W):
    15.1 g vs 17.2 g uncapped, -12% energy, +3% runtime"."""
    return (f"power limit {cap_w:.0f} W ({cap_w / default_w:.0%} of {default_w:.0f} W): "
            + (f"{gco2:.1f} g vs {uncapped_gco2:.1f} g uncapped, " if gco2 is not None and uncapped_gco2 is not None
               else "")
            + f"{energy_ratio - 1:+.0%} energy, {runtime_ratio - 1:+.0%} runtime")


# -- operator bounds and the planner's choice -------------------------------------------------

from collections.abc import Callable, Mapping  # noqa: E402
from dataclasses import dataclass, field, replace  # noqa: E402
from datetime import timedelta  # noqa: E402
from typing import Any  # noqa: E402

# The lowest cap fraction the cited data covers (Words to Watts: 175 of 250 W): the default
# floor, so the model is never extrapolated below what was measured unless an operator asks.
DEFAULT_MIN_CAP_FRACTION = 0.70
MIN_CAP_FRACTION_FLOOR = 0.30  # no driver accepts much less (amdsmi's min_power_cap, NVML's)
CAP_STEP = 0.05  # candidate caps: 100 %, 95 %, ... of the default limit


@dataclass(frozen=True)
class CapBounds:
    """What operators allow (`[power]` in the config): whether the planner may lower GPU power
    limits at all, and the lowest fraction of the default limit, with per-model overrides.

    ```toml
    [power]
    allow_caps = true          # default false: GPU limits stay at their defaults
    min_cap_fraction = 0.7     # never below 70 % of a GPU's default limit (the default)
    [power.models.MI300X]
    allow_caps = false         # per GPU model: its own switch and/or floor
    [power.models.H100]
    min_cap_fraction = 0.6
    ```
    """

    allow: bool = False
    min_fraction: float = DEFAULT_MIN_CAP_FRACTION
    models: Mapping[str, tuple[bool | None, float | None]] = field(default_factory=dict)

    def for_model(self, model: str) -> tuple[bool, float]:
        own_allow, own_min = self.models.get(model, (None, None))
        return (self.allow if own_allow is None else own_allow,
                self.min_fraction if own_min is None else own_min)

    @property
    def any_allowed(self) -> bool:
        return self.allow or any(a for a, _ in self.models.values())

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> CapBounds:
        section = (config or {}).get("power") or {}
        if not isinstance(section, Mapping):
            raise ValueError("config [power]: expected a table")
        unknown = sorted(set(section) - {"allow_caps", "min_cap_fraction", "models"})
        if unknown:
            raise ValueError(f"config [power]: unknown key(s) {', '.join(unknown)} "
                             "(known: allow_caps, min_cap_fraction, models)")

        def flag(v: Any, where: str) -> bool:
            if not isinstance(v, bool):
                raise ValueError(f"config {where}: true or false (got {v!r})")
            return v

        def fraction(v: Any, where: str) -> float:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not \
                    MIN_CAP_FRACTION_FLOOR <= v <= 1.0:
                raise ValueError(f"config {where}: a fraction of the default limit between "
                                 f"{MIN_CAP_FRACTION_FLOOR} and 1 (got {v!r})")
            return float(v)

        allow = flag(section.get("allow_caps", False), "power.allow_caps")
        low = fraction(section.get("min_cap_fraction", DEFAULT_MIN_CAP_FRACTION), "power.min_cap_fraction")
        models: dict[str, tuple[bool | None, float | None]] = {}
        table = section.get("models") or {}
        if not isinstance(table, Mapping):
            raise ValueError("config power.models: expected a table of GPU models, e.g. [power.models.H100]")
        for model, mc in table.items():
            if not isinstance(mc, Mapping):
                raise ValueError(f"config power.models.{model}: expected a table")
            bad = sorted(set(mc) - {"allow_caps", "min_cap_fraction"})
            if bad:
                raise ValueError(f"config power.models.{model}: unknown key(s) {', '.join(bad)} "
                                 "(known: allow_caps, min_cap_fraction)")
            models[str(model)] = (flag(mc["allow_caps"], f"power.models.{model}.allow_caps")
                                  if "allow_caps" in mc else None,
                                  fraction(mc["min_cap_fraction"], f"power.models.{model}.min_cap_fraction")
                                  if "min_cap_fraction" in mc else None)
        return cls(allow=allow, min_fraction=low, models=models)


def candidate_fractions(min_fraction: float) -> list[float]:
    out, f = [], 1.0 - CAP_STEP
    while f >= min_fraction - 1e-9:
        out.append(round(f, 4))
        f -= CAP_STEP
    return out


def choose_caps(snapshot, plan):
    """`plan` with a GPU power limit chosen for each placed job where operators allow one
    (`snapshot.caps`), a lower limit cuts the job's grams, and the slower run still meets
    its deadline, its explicit time limit, its latency SLOs (every p95 latency stretches by
    the runtime factor) and ends before the next job planned on any of its GPUs. A job
    whose plan already misses its deadline gets none, nor does a plan in segments. A limit
    the policy already planned with (`policies.problem.joint_caps`) is weighed again from the
    uncapped figures: kept, lowered where the plan leaves room, or dropped if it no longer
    holds. The estimate is then at the limit,
    with the uncapped figures beside it, and the explanation says so."""
    bounds = snapshot.caps
    if bounds is None or not bounds.any_allowed or not plan.assignments:
        return plan
    from policies.model.catalog import lookup

    jobs = {j.id: j for j in snapshot.jobs}
    slots = {g.id: g for g in snapshot.gpus}
    starts: dict[int, list] = {}
    for a in plan.assignments:
        for g in a.gpu_ids:
            starts.setdefault(g, []).append(a.start_at)

    @functools.cache
    def book():  # the profile book, made on first use
        from policies.model.energy import ProfileBook, seed_profiles

        return ProfileBook(snapshot.profiles) if snapshot.profiles else ProfileBook(seed_profiles())

    out = []
    for a in plan.assignments:
        job, est = jobs.get(a.job_id), a.estimate
        capped_before = est.power_limit_w is not None
        runtime = est.uncapped_runtime_s if capped_before else est.runtime_s
        energy = est.uncapped_energy_j if capped_before else est.energy_j
        gco2 = est.uncapped_gco2 if capped_before else est.gco2
        gpu = slots.get(a.gpu_ids[0]) if a.gpu_ids else None
        # a plan in segments is priced by its own rules: its GPUs stay at the default
        if job is None or gpu is None or not runtime or not energy or runtime <= 0 or est.deadline_miss \
                or a.segments:
            out.append(a)
            continue
        allow, low = bounds.for_model(gpu.model)
        try:
            spec = lookup(gpu.model)
        except KeyError:
            spec = None
        if not allow or spec is None:
            out.append(a)
            continue
        default_w = default_limit_w(spec.tdp_w, gpu.power_limit_w)
        nxt = min((s for g in a.gpu_ids for s in starts.get(g, ()) if s > a.start_at), default=None)
        best = _best_limit(snapshot, a, job, gpu, spec.vendor, default_w, low, (runtime, energy, gco2), nxt, book)
        if best is None:
            if capped_before:  # a kept plan's limit no longer holds: back to the uncapped figures
                est = replace(est, runtime_s=runtime, energy_j=energy, gco2=gco2,
                              finish_at=a.start_at + timedelta(seconds=runtime), power_limit_w=None,
                              uncapped_runtime_s=None, uncapped_energy_j=None, uncapped_gco2=None)
                out.append(replace(a, estimate=est))
            else:
                out.append(a)
            continue
        out.append(_at_best_limit(a, best, default_w, (runtime, energy, gco2), capped_before))
    return replace(plan, assignments=tuple(out))


def _best_limit(snapshot, a, job, gpu, vendor: str | None, default_w: float, low: float,
                uncapped: tuple, nxt, book: Callable[[], Any]) -> tuple | None:
    """The limit of `candidate_fractions(low)` x `default_w` with the fewest grams (else
    joules) for assignment `a` on `gpu`, of those its slower run still keeps (deadline, next
    start `nxt` on its GPUs, explicit time limit, latency SLOs), as (score, cap_w, factor,
    energy, gco2, runtime, finish); None if no limit cuts anything. `uncapped`: (runtime,
    energy, gco2) at the default limit; `book()` the profile book."""
    from policies.model.energy import job_gco2, model_choice
    from policies.model.operating_point import Choice

    runtime, energy, gco2 = uncapped
    n = len(a.gpu_ids)
    per_gpu_w = energy / runtime / n
    curve = snapshot.carbon.get(gpu.zone)
    pue = snapshot.gpu_pue(gpu)
    base_g = job_gco2(curve, a.start_at, runtime, per_gpu_w * n, pue)
    choice = None
    if job.workload is not None:
        c = model_choice(job, gpu.model, book())
        choice = c if isinstance(c, Choice) and c.inference else None
    best = None  # (score, cap_w, factor, energy, gco2, runtime, finish)
    for f in candidate_fractions(low):
        cap_w = f * default_w
        factor, power_w = capped(per_gpu_w, cap_w, vendor)
        if factor == 1.0:
            continue  # the job never reaches this limit: nothing to gain
        new_runtime = runtime * factor
        finish = a.start_at + timedelta(seconds=new_runtime)
        if job.deadline is not None and finish > job.deadline:
            continue
        if nxt is not None and finish > nxt:
            continue
        if job.time_limit_s is not None and job.time_limit_factor is None and new_runtime > job.time_limit_s:
            continue
        if choice is not None and any(limit is not None and value * factor > limit for value, limit in (
                (choice.ttft_p95_ms, choice.slos.ttft_ms), (choice.tpot_p95_ms, choice.slos.tpot_ms),
                (choice.latency_p95_ms, choice.slos.latency_ms))):
            continue
        new_energy = power_w * n * new_runtime
        if base_g and gco2 is not None:
            new_g = gco2 * job_gco2(curve, a.start_at, new_runtime, power_w * n, pue) / base_g
        else:
            new_g = None if gco2 is None else gco2 * new_energy / energy
        score = new_g if new_g is not None else new_energy
        if best is None or score < best[0] - 1e-9:
            best = (score, cap_w, factor, new_energy, new_g, new_runtime, finish)
    return best


def _at_best_limit(a, best: tuple, default_w: float, uncapped: tuple, capped_before: bool):
    """Assignment `a` at the limit `_best_limit` chose: its estimate at the limit with the
    uncapped figures beside it, and the explanation saying so."""
    runtime, energy, gco2 = uncapped
    est = a.estimate
    _, cap_w, factor, new_energy, new_g, new_runtime, finish = best
    limit_s = est.time_limit_s
    if limit_s is not None and not capped_before:
        limit_s = limit_s * factor
    new_est = replace(est, runtime_s=new_runtime, energy_j=new_energy, gco2=new_g, finish_at=finish,
                      time_limit_s=limit_s, power_limit_w=round(cap_w, 1), uncapped_runtime_s=runtime,
                      uncapped_energy_j=energy, uncapped_gco2=gco2)
    why = limit_text(cap_w, default_w, new_g, gco2, new_energy / energy, factor)
    text = a.explanation.split("; power limit ")[0] if capped_before else a.explanation
    return replace(a, estimate=new_est, explanation=f"{text}; {why}" if text else why)
