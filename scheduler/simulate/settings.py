"""How the simulated daemon behaves (`SimSettings`): its planner's tick and horizon, GPU
failures, how jobs really run and what the planner is told of them, and what it learns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SimSettings:
    """How the simulated daemon behaves; the defaults are what an operator would run."""

    plan_interval_s: float = 900.0
    wake_on_submit: bool = True
    slot_s: float = 900.0
    horizon_s: float = 48 * 3600.0
    default_runtime_s: float = 3600.0
    gpu_mtbf_s: float | None = None
    gpu_repair_s: float = 4 * 3600.0
    seed: int = 0
    max_overrun_s: float = 30 * 86400.0
    # Incremental planning: between full re-plans at most this far apart, a tick keeps the
    # previous tick's plans that still fit (node and start) and plans only the other jobs
    # (`Snapshot.keep`). None: every tick re-plans every queued job (the daemon's way).
    full_replan_s: float | None = None
    # How jobs really run (scheduler.simulate.truth): perfect, noisy:SIGMA or profiles:FILE.
    truth: str = "perfect"
    # Fold each finished job's measured runtime and energy into the profiles the planner uses
    # (policies.model.learning), as the daemon's agents do.
    learn: bool = True
    # Past the end of each forecast curve, price a zone at its climatology from the trace's
    # past hours (CarbonCurve.tail, as the daemon does); False: the curve's last value holds
    # (the planner before issue 24), for comparisons.
    climatology: bool = True
    # What the planner is told of a runtime-given job's length (scheduler.simulate.estimates):
    # exact, class-mean, lognormal:SIGMA or user:K.
    estimate: str = "exact"
    # Learn real / estimated runtime per estimate class and correct later estimates by it
    # (policies.model.runtime_correction); None: on unless the estimate is exact.
    correct_estimates: bool | None = None
    # With the correction, widen a corrected estimate's deadline margin by its learned spread
    # (QueuedJob.runtime_rel_uncertainty, policies.model.margin); False: correct the estimate only.
    estimate_margin: bool = True
    # With the correction, price each corrected job by its expected grams over its class's
    # learned length spread (QueuedJob.length_spread, policies.model.length_spread); False: at the
    # corrected estimate alone (the planner before this option), for comparisons.
    price_length_spread: bool = True
    # GPU power limits the planner may choose (policies.pricing.power_cap.CapBounds); None: none.
    caps: Any = None
    # Job priority from the trace's accounts (scheduler.simulate.priorities): fair share of
    # their decayed usage (`simulate --no-fair-share`: off, QOS alone orders the queue).
    fair_share: bool = True
