"""What one simulated policy run records: each job's way through it, the meters of power
and carbon (`ZoneMeter`), the planner's ticks, and the run's outcome (`PolicyRun`, read by
`metrics` and `report`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from policies.types import J_PER_KWH, QueuedJob
from scheduler.power_budget import ZoneBudget
from scheduler.simulate.intensity import ZoneIntensity

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
class ZoneMeter:
    """Integrates a zone's simulated GPU power over time, and its emissions at actual intensity.

    The nodes of one zone may sit in sites with different PUEs: each change of power carries
    its node's PUE, and the meter integrates the facility power (GPU power x PUE) beside the
    GPU power. `pue` is the zone's default, for changes that name none.
    """

    zone: str
    pue: float
    intensity: ZoneIntensity
    power_w: float = 0.0
    facility_w: float = 0.0
    last_s: float = 0.0
    energy_j: float = 0.0
    facility_j: float = 0.0
    gco2: float = 0.0
    peak_w: float = 0.0
    over_cap_s: float = 0.0
    cap_w: float | None = None
    budget: ZoneBudget | None = None  # with daily windows: the cap in force changes with the time
    # (time, GPU power after the change, facility power after the change)
    timeline: list[tuple[float, float, float]] = field(default_factory=list)
    # GPU power under this meter's budget: all of it, but in a zone that holds budgeted sites
    # only its nodes outside them (the sites' power is held to their own budgets)
    budget_w: float = 0.0

    def advance(self, now_s: float) -> None:
        dt = now_s - self.last_s
        if dt > 0 and self.power_w:
            self.energy_j += self.power_w * dt
            self.facility_j += self.facility_w * dt
            self.gco2 += self.facility_w * self.intensity.integral_g_per_kwh_s(self.last_s, now_s) / J_PER_KWH
        if dt > 0 and self.budget_w:
            if self.budget is not None:
                self.over_cap_s += self._over_budget_s(self.last_s, now_s)
            elif self.cap_w is not None and self.budget_w > self.cap_w + EPS_S:
                self.over_cap_s += dt
        self.last_s = now_s

    def _over_budget_s(self, start_s: float, end_s: float) -> float:
        """Seconds of [start, end) at constant power over the cap in force, piece by piece
        between the windows' edges."""
        start, end = (datetime.fromtimestamp(t, timezone.utc) for t in (start_s, end_s))
        edges = [start, *self.budget.changes_between(start, end), end]
        over = 0.0
        for a, b in zip(edges, edges[1:]):
            cap = self.budget.gpu_cap_at(a)  # the site's cap less its static power
            if cap is not None and self.budget_w > cap + EPS_S:
                over += (b - a).total_seconds()
        return over

    def change(self, now_s: float, delta_w: float, pue: float | None = None, budgeted: bool = True) -> None:
        """`delta_w` more GPU power from `now_s` (`budgeted`: under this meter's budget)."""
        self.advance(now_s)
        self.power_w += delta_w
        self.facility_w += delta_w * (self.pue if pue is None else pue)
        if budgeted:
            self.budget_w += delta_w
            if abs(self.budget_w) < 1e-6:
                self.budget_w = 0.0
        if abs(self.power_w) < 1e-6:
            self.power_w = self.facility_w = 0.0
        self.peak_w = max(self.peak_w, self.power_w)
        self.timeline.append((now_s, self.power_w, self.facility_w))


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
    planner_failures: int = 0  # planner calls in which the policy raised (policies.solvers.guard)
    truth: str = "perfect"
    estimate: str = "exact"
    replanned_behind_overruns: int = 0  # committed jobs taken back because the job before them overran
