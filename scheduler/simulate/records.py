"""What one simulated policy run records: each job's way through it, the planner's ticks,
and the run's outcome (`PolicyRun`, read by `metrics` and `report`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from policies.model import QueuedJob

if TYPE_CHECKING:
    from scheduler.simulate.power import ZoneMeter

EPS_S = 1e-6


def at(t_s: float) -> datetime:
    """Epoch seconds (the simulator's clock) as an aware UTC datetime (the policies')."""
    return datetime.fromtimestamp(t_s, timezone.utc)


@dataclass(slots=True)
class JobRecord:
    """One job through the simulation; times are epoch seconds, None where it never got there."""

    job: QueuedJob  # the job as the planner last saw it (its estimate, corrected)
    arrival_s: float
    deadline_s: float | None
    real: QueuedJob | None = None  # the job as it really is (None: as `job`); only the truth reads it
    estimated_job: QueuedJob | None = None  # the job with its estimate, before any correction
    state: str = "future"  # future, queued, committed, running, done
    start_s: float | None = None
    end_s: float | None = None
    node: str | None = None
    zone: str | None = None
    model: str | None = None
    gpu_ids: tuple[int, ...] = ()
    runtime_s: float = 0.0  # how long it really runs (the truth)
    power_w: float = 0.0  # what it really draws
    planned_runtime_s: float = 0.0  # what the planner expected when it was committed
    committed_s: float | None = None  # when it was last committed (its estimate's moment)
    planned_power_w: float = 0.0
    power_limit_w: float | None = None  # the GPU power limit it runs at (None: the default)
    pue: float = 1.0
    energy_j: float = 0.0
    gco2: float = 0.0
    est_gco2: float | None = None
    explanation: str = ""
    attempts: int = 0
    lost_energy_j: float = 0.0
    lost_gco2: float = 0.0
    token: int = 0
    correction: float = 1.0  # the estimate correction factor the planner used at the last commit
    # Interruptible jobs (issue 30): the planned segments of the current commit (epoch s; a
    # checkpoint job's first one, a pause job's whole list), real seconds of work done by
    # earlier segments, the segments run so far (start, end, energy J, gCO2) and a pause
    # job's idle energy and grams while held.
    segments: list[tuple[float, float]] = field(default_factory=list)
    seg_index: int = 0
    work_done_s: float = 0.0
    run_start_s: float | None = None  # when the running segment began
    resume_paid_s: float = 0.0  # the resume cost the running segment pays first
    first_start_s: float | None = None
    segment_log: list[tuple[float, float, float, float]] = field(default_factory=list)
    idle_energy_j: float = 0.0
    idle_gco2: float = 0.0
    idle_w: float = 0.0


@dataclass
class TickStat:
    """One planner call: when, the jobs it was given, placed and committed, and its time."""

    at_s: float
    queued: int
    planned: int
    committed: int
    plan_s: float
    full: bool = True  # every queued job re-planned (False: incremental, `kept` plans kept)
    kept: int = 0


@dataclass
class PolicyRun:
    """Everything one policy's simulation produced, for metrics and the report."""

    policy: str
    forecast: str
    records: list[JobRecord]
    meters: dict[str, ZoneMeter]
    site_meters: dict[str, ZoneMeter]  # [sites.S] budgets by key (`site:NAME`): power against their caps
    ticks: list[TickStat]
    start_s: float
    end_s: float
    events: int
    wall_s: float
    rejected_assignments: int = 0
    gpu_failures: int = 0
    unplaced_reasons: dict[str, int] = field(default_factory=dict)
    planner_failures: int = 0  # planner calls in which the policy raised (policies.guard)
    truth: str = "perfect"
    estimate: str = "exact"
    replanned_behind_overruns: int = 0  # committed jobs taken back because the job before them overran
