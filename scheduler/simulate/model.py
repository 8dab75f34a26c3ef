"""The SimPy model: a cluster replaying a job trace through one of the daemon's policies.

What happens, in simulated time (float seconds since the Unix epoch, UTC):

- **Arrivals**: each job joins the queue at its submit time. Like the daemon, a submit wakes
  the planner (`wake_on_submit`; arrivals at the same instant share one wake-up).
- **Planner ticks** every `plan_interval_s` (the daemon's `--plan-interval`; 15 min by
  default here). A tick builds a `policies.model.Snapshot` exactly as the daemon's planner
  does: the queued jobs, every GPU with `busy_until` (the end of the work already given to
  it), one forecast `CarbonCurve` per zone issued by the forecast model at the tick time,
  the PUE per zone, the workload profiles and the site power caps. It calls
  `get_policy(name).plan(snapshot)` (the same code the daemon runs) and commits the
  assignments whose start falls before the next tick; the rest stay queued and are planned
  again at the next tick, as in the daemon. A GPU already given to a job that starts later
  in the tick shows as busy from now until that job's end (the daemon pins such jobs; the
  simulator simply never re-plans them). A commit is checked like an agent's claim: the
  GPUs must exist, be healthy, be of one model on one node and be free at the start; an
  assignment that fails the check is counted and its job planned again.
- **Incremental planning** (optional, `full_replan_s`): between full re-plans at most that
  far apart, a tick hands the policy the previous tick's uncommitted plans as
  `Snapshot.keep`; the policy keeps those that still fit (node and start) and places only
  the new jobs around them. Every `full_replan_s` a tick re-plans every queued job. It
  trades plan freshness for planner time (the whole pai-100k year: see bench/README.md).
  A full re-plan is handed those plans as `Snapshot.previous`, as the daemon's is: where
  it starts from (cpsat tries them first), not a constraint.
- **Execution**: a committed job starts at its planned time on its planned GPUs if they are
  free; if a job that overran still holds them (as on a real node) it goes back to the queue
  and the planner places it again at once. It runs for the runtime, at
  the mean power, that the *truth* gives (`scheduler.simulate.truth`: by default the energy
  model the policies plan with, `policies.energy.job_shape`; `noisy:SIGMA` or a profiles file
  make the planner's estimates wrong). The planner sees a GPU busy until the job's *planned*
  end (then, while it overruns, for another minute at a time, as the daemon does); a tick
  that finds a job running past its planned end (with its deadline margin) takes the jobs
  committed behind it on its GPUs back into the queue and plans them again, so they can
  move to free GPUs instead of waiting for it. With
  `learn` each finished job's measured runtime and energy are folded into the profiles it
  plans with (`policies.learning`), as the daemon's agents do.
- **Runtime estimates** (`estimate`, `scheduler.simulate.estimates`): a job whose length is a
  runtime is planned with an *estimate* of it (exact, GAIA's class mean, a per-job lognormal
  error, or a user's rounded-up request) and runs its real length; the policies only ever
  see the estimate. With `correct_estimates` (on whenever the estimate is not exact) each
  finished job's real / estimated runtime is learned per estimate class
  (`policies.runtime_correction`): later estimates of the class are scaled by the median
  ratio and carry its spread as `QueuedJob.runtime_rel_uncertainty`, which widens their
  deadline margin (`policies.margin`), and the quantiles of the class's ratios as
  `QueuedJob.length_spread`, by which the job is priced at its expected grams
  (`policies.length_spread`; `price_length_spread`). The oracle, a bound with perfect knowledge, is
  planned with the real lengths.
- **Metering**: a site meter per zone integrates the simulated power over time;
  emissions are that power x PUE x the zone's *actual* intensity. Decisions only ever see
  the *forecast*.
- **GPU failures** (optional, `gpu_mtbf_s`): each GPU fails after an exponential time
  (seeded), stays down `gpu_repair_s`, and the job on it is stopped and queued again (the
  energy it drew is counted, as it was really spent).
- **oracle** (simulation only): at the first arrival one snapshot holds *every* job, future
  arrivals included, and the actual intensity as its "forecast" over the whole trace; its
  plan is committed in full and then executed. A job it leaves unplaced is planned at the
  following ticks like any other.

The run ends when every job has finished, or `max_overrun_s` after the last arrival (what
is still queued then is reported as unfinished).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any

import simpy

from policies.base import Policy
from policies.energy import job_shape
from policies.margin import PRIOR_REL_UNCERTAINTY, PRIOR_RUNS, job_margin
from policies.model import Assignment, GpuSlot, QueuedJob, Snapshot, budget_of
from policies.runtime_correction import correction_for, estimate_class
from policies.ramp import WINDOW_S as RAMP_WINDOW_S
from policies.ramp import RecentStart, stagger_starts
from policies.segments import horizon_for
from scheduler.power_budget import ZoneBudget, ramps_of
from scheduler.simulate.cluster import ClusterSpec
from scheduler.simulate.estimates import EstimateModel, estimated, parse_estimate
from scheduler.simulate.forecasts import ForecastModel
from scheduler.simulate.intensity import ZoneIntensity
from scheduler.simulate.truth import parse_truth

log = logging.getLogger(__name__)

J_PER_KWH = 3.6e6
EPS_S = 1e-6
OVERRUN_BUSY_S = 60.0  # a job running past its estimate looks busy this much longer (the daemon's rule)


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
    # (policies.learning), as the daemon's agents do.
    learn: bool = True
    # Past the end of each forecast curve, price a zone at its climatology from the trace's
    # past hours (CarbonCurve.tail, as the daemon does); False: the curve's last value holds
    # (the planner before issue 24), for comparisons.
    climatology: bool = True
    # What the planner is told of a runtime-given job's length (scheduler.simulate.estimates):
    # exact, class-mean, lognormal:SIGMA or user:K.
    estimate: str = "exact"
    # Learn real / estimated runtime per estimate class and correct later estimates by it
    # (policies.runtime_correction); None: on unless the estimate is exact.
    correct_estimates: bool | None = None
    # With the correction, widen a corrected estimate's deadline margin by its learned spread
    # (QueuedJob.runtime_rel_uncertainty, policies.margin); False: correct the estimate only.
    estimate_margin: bool = True
    # With the correction, price each corrected job by its expected grams over its class's
    # learned length spread (QueuedJob.length_spread, policies.length_spread); False: at the
    # corrected estimate alone (the planner before this option), for comparisons.
    price_length_spread: bool = True
    # GPU power limits the planner may choose (policies.power_cap.CapBounds); None: none.
    caps: Any = None


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


class Simulation:
    """One policy over one scenario; `run()` returns a PolicyRun. Single use."""

    def __init__(self, *, cluster: ClusterSpec, jobs: list[QueuedJob], carbon: dict[str, ZoneIntensity],
                 policy: str | Policy, forecast: ForecastModel, settings: SimSettings = SimSettings(),
                 policy_params: dict | None = None, profiles: tuple = (),
                 progress: Callable[[float], None] | None = None,
                 estimate_model: EstimateModel | None = None) -> None:
        from policies.base import get_policy
        from policies.energy import ProfileBook, seed_profiles

        self.cluster = cluster
        self.settings = settings
        if isinstance(policy, str):
            # as in the daemon: a policy that raises never fails a tick (policies.guard)
            from policies.guard import fallback_chain, guarded

            self.policy = guarded(get_policy(policy, **(policy_params or {})),
                                  [get_policy(f) for f in fallback_chain(policy)])
        else:
            self.policy = policy  # any object with .name and .plan(snapshot) (tests, experiments)
        self.policy_name = self.policy.name
        self.clairvoyant = self.policy_name == "oracle"  # sees the whole future in one snapshot
        self.forecast = forecast
        self.carbon = carbon
        self.profiles = tuple(profiles) or seed_profiles()
        self.book = ProfileBook(self.profiles)
        self._seeds = {(p.workload, p.model): p for p in self.profiles}
        self._base_book = self.book  # what the truth is relative to (learning changes self.book)
        self.truth = parse_truth(settings.truth, seed=settings.seed)  # execution only: never planned with
        self._runs: dict[tuple[str, str], list] = {}  # (workload, model) -> learning.Run, oldest first
        self.learned = 0
        self.progress = progress
        self.pue = cluster.pue
        self.power_caps = cluster.power_caps
        self.slots: list[GpuSlot] = list(cluster.gpu_slots())
        self._busy_key: list[float | str | None] = [None] * len(self.slots)  # what each cached slot shows
        n = len(self.slots)
        self.free_at = [-math.inf] * n
        self.healthy = [True] * n
        self.reservations: list[list[int]] = [[] for _ in range(n)]  # job indices in commit order
        self.running_on: list[int | None] = [None] * n  # the job really running on each GPU
        # settings.estimate, or any EstimateModel (tests, experiments: a fixed estimate per job)
        self.estimate_model = estimate_model or parse_estimate(settings.estimate, seed=settings.seed)
        # the oracle is a bound with perfect knowledge: it plans with the real lengths
        seen = list(jobs) if self.clairvoyant else self.estimate_model.apply(jobs)
        self.correct = (settings.correct_estimates if settings.correct_estimates is not None
                        else self.estimate_model.kind != "exact") and not self.clairvoyant
        self.records = [JobRecord(job=e, arrival_s=j.submitted_at.timestamp(),
                                  deadline_s=j.deadline.timestamp() if j.deadline else None,
                                  real=j if e is not j else None, estimated_job=e) for j, e in zip(jobs, seen)]
        self._est_runs: dict[tuple[str, str], list[float]] = {}  # estimate class -> log(real / estimate)
        self._est_version = 0  # bumps when a ratio is learned: seen jobs are corrected again
        self._seen_version: dict[int, int] = {}  # record index -> the version its `job` reflects
        self.replanned_behind_overruns = 0
        self.records.sort(key=lambda r: (r.arrival_s, r.job.id))
        self.index = {r.job.id: i for i, r in enumerate(self.records)}
        self.queue: dict[int, int] = {}  # job id -> record index, in arrival order
        caps = {c.zone: c.cap_w for c in cluster.power_caps if c.start is None and c.end is None}
        self.meters = {z: ZoneMeter(zone=z, pue=self.pue.get(z, 1.0), intensity=carbon[z], cap_w=caps.get(z),
                                    budget=cluster.budgets.get(z))
                       for z in cluster.zones}
        # a [sites.S] budget's own meter (its power, cap and time over it; never in the totals:
        # its power and carbon are in its zone's meter)
        self.site_meters = {k: ZoneMeter(zone=k, pue=1.0, intensity=carbon[zone], cap_w=caps.get(k),
                                         budget=cluster.budgets.get(k))
                            for k, zone in cluster.site_zones().items()}
        self._budget_of = [g.budget for g in self.slots]
        self.budgets = cluster.budgets
        self._ramps = ramps_of(cluster.budgets)
        self.ticks: list[TickStat] = []
        self.events = 0
        self.done = 0
        self.rejected = 0
        self.failures = 0
        self.unplaced_reasons: dict[str, int] = {}
        self._shapes: dict[tuple[int, str, float | None], object] = {}
        self._last_plan: tuple[float, int] | None = None
        self._previous: dict[int, Assignment] = {}  # the last plan's uncommitted assignments
        self._last_full_s = -math.inf
        self._changes = 0
        longest = max((j.est_runtime_s or settings.default_runtime_s for j in list(jobs) + seen), default=0.0)
        self._tail_s = min(7 * 86400.0, 2.0 * longest)  # runtimes vary by model: a margin
        self._t0 = self._first_tick()
        self.env = simpy.Environment(initial_time=self._t0)
        self._all_done = self.env.event()

    # -- time helpers -------------------------------------------------------------------------

    def _first_tick(self) -> float:
        first = self.records[0].arrival_s if self.records else 0.0
        step = self.settings.plan_interval_s
        return math.floor(first / step) * step

    def _next_tick(self, now_s: float) -> float:
        step = self.settings.plan_interval_s
        k = math.floor((now_s - self._t0) / step + 1e-9) + 1
        return self._t0 + k * step

    # -- processes ----------------------------------------------------------------------------

    def run(self) -> PolicyRun:
        """Simulate until every job finished (or the overrun limit); return the outcome."""
        wall0 = time.perf_counter()
        env = self.env
        if not self.records:
            return self._result(wall0)
        if self.clairvoyant:
            self._plan_all(env.now)
        env.process(self._arrivals())
        env.process(self._ticker())
        if self.settings.gpu_mtbf_s:
            rng = random.Random(self.settings.seed)
            for g in range(len(self.slots)):
                env.process(self._failures(g, random.Random(rng.getrandbits(64))))
        limit = self.records[-1].arrival_s + self.settings.max_overrun_s
        env.run(until=simpy.AnyOf(env, [self._all_done, env.timeout(limit - env.now)]))
        return self._result(wall0)

    def _arrivals(self):
        env = self.env
        recs = self.records
        i, n = 0, len(recs)
        while i < n:
            t = recs[i].arrival_s
            if t > env.now:
                yield env.timeout(t - env.now)
            while i < n and recs[i].arrival_s <= env.now:
                r = recs[i]
                if r.state == "future":
                    r.state = "queued"
                    self.queue[r.job.id] = i
                    self._changes += 1
                self.events += 1
                i += 1
            if self.settings.wake_on_submit:
                self._plan(env.now)

    def _ticker(self):
        env = self.env
        step = self.settings.plan_interval_s
        while self.done < len(self.records):
            self.events += 1
            self._plan(env.now)
            if self.progress is not None:
                self.progress(env.now)
            yield env.timeout(step)

    def _failures(self, g: int, rng: random.Random):
        env = self.env
        while True:
            yield env.timeout(rng.expovariate(1.0 / self.settings.gpu_mtbf_s))
            if self.done >= len(self.records):
                return
            self.events += 1
            self.failures += 1
            self.healthy[g] = False
            self._busy_key[g] = "x"  # force a fresh GpuSlot
            for idx in list(self.reservations[g]):
                self._evict(idx, env.now, f"GPU {g} failed")
            self._changes += 1
            yield env.timeout(self.settings.gpu_repair_s)
            self.healthy[g] = True
            self._busy_key[g] = "x"
            self._changes += 1

    # -- planning ------------------------------------------------------------------------------

    def _caps_at(self, now_s: float, horizon_s: float) -> tuple:
        """The power caps a tick at `now_s` plans with: the constant ones, and each zone's
        daily windows over the horizon (`scheduler.power_budget`)."""
        if not self.budgets:
            return self.power_caps
        now = _dt(now_s)
        windows = tuple(c for z, b in sorted(self.budgets.items())
                        for c in b.caps_between(z, now, now + timedelta(seconds=horizon_s)) if c.start is not None)
        return self.power_caps + windows

    def _snapshot(self, now_s: float, jobs: tuple[QueuedJob, ...], horizon_s: float,
                  carbon: dict, keep: dict[int, Assignment] | None = None,
                  previous: dict[int, Assignment] | None = None) -> Snapshot:
        slots = self.slots
        for g in range(len(slots)):
            fa = self.free_at[g]
            planned_end = fa
            if self.running_on[g] is not None:  # expected to run by its estimate + deadline margin
                r = self.records[self.running_on[g]]
                planned_end = r.start_s + r.planned_runtime_s * job_margin(r.job, r.model, self.book,
                                                                       self.settings.estimate_margin)
                fa = max(fa, planned_end)
            if self.running_on[g] is not None and fa <= now_s + EPS_S:
                # running past its estimate: "ends soon", as the daemon says, or, once it has
                # overrun by more than that, as long again as it has overrun so far (a job's
                # remaining time grows with its overrun when estimates err by factors)
                fa = now_s + max(OVERRUN_BUSY_S, now_s - planned_end)
            key = fa if fa > now_s + EPS_S else None
            if not self.healthy[g]:
                key = "down"
            if key != self._busy_key[g]:
                s = slots[g]
                slots[g] = replace(s, healthy=self.healthy[g],
                                   busy_until=_dt(fa) if (key is not None and key != "down") else None)
                self._busy_key[g] = key
        return Snapshot(now=_dt(now_s), jobs=jobs, gpus=tuple(slots),
                        default_runtime_s=self.settings.default_runtime_s, carbon=carbon, pue=self.pue,
                        profiles=self.profiles, power_caps=self._caps_at(now_s, horizon_s), slot_s=self.settings.slot_s,
                        horizon_s=horizon_s, keep=keep or {}, previous=previous or {},
                        estimate_margin=self.settings.estimate_margin,
                        caps=self.settings.caps)

    def _plan(self, now_s: float) -> None:
        if not self.queue:
            return
        state = (now_s, self._changes)
        if self._last_plan == state:
            return  # a wake-up and a tick at the same instant with nothing new: one plan
        self._last_plan = state
        self._replan_behind_overruns(now_s)
        jobs = tuple(self._seen(i) for i in self.queue.values())
        # interruptible jobs' windows may stretch it (policies.segments.horizon_for)
        horizon = horizon_for(jobs, _dt(now_s), self.settings.horizon_s, self.settings.slot_s)
        # the forecast also covers the runs of jobs that start near the horizon's end
        carbon = {z: self.forecast.curve(z, now_s, horizon + self._tail_s) for z in self.meters}
        full = self.settings.full_replan_s
        # the last plan of each job still queued: kept between full re-plans, else (as the
        # daemon's full re-plan) where this one starts from (cpsat tries it first)
        last = {i: a for i, a in self._previous.items() if i in self.queue}
        incremental = full is not None and now_s - self._last_full_s < full - EPS_S
        if not incremental:
            self._last_full_s = now_s
        keep = last if incremental else {}
        snap = self._snapshot(now_s, jobs, horizon, carbon, keep, {} if incremental else last)
        t = time.perf_counter()
        plan = self.policy.plan(snap)
        if self.settings.caps is not None:  # the daemon's step after the policy (planner._with_points)
            from policies.power_cap import choose_caps

            plan = choose_caps(snap, plan)
        if self._ramps:  # the daemon's step after that (policies.ramp)
            plan = self._ramped(snap, plan, now_s)
        plan_s = time.perf_counter() - t
        self._previous = {a.job_id: a for a in plan.assignments}
        for why in plan.unplaced.values():
            key = why.split(":")[0][:60]
            self.unplaced_reasons[key] = self.unplaced_reasons.get(key, 0) + 1
        cutoff = self._next_tick(now_s)
        committed = 0
        for a in sorted(plan.assignments, key=lambda a: a.start_at):
            start_s = max(now_s, a.start_at.timestamp())
            if start_s >= cutoff - EPS_S:
                continue
            committed += self._commit(a, start_s)
        self.ticks.append(TickStat(at_s=now_s, queued=len(jobs), planned=len(plan.assignments),
                                   committed=committed, plan_s=plan_s, full=not incremental,
                                   kept=len(keep)))

    def _seen(self, idx: int) -> QueuedJob:
        """The job of record `idx` as the planner sees it now: its estimate, corrected by what
        the runs of its estimate class taught (`policies.runtime_correction`)."""
        r = self.records[idx]
        if not self.correct or self._seen_version.get(idx) == self._est_version:
            return r.job
        self._seen_version[idx] = self._est_version
        base = r.estimated_job or r.job
        if not estimated(base):
            return r.job
        c = correction_for(estimate_class(base.workload, base.est_runtime_s), self._est_runs)
        spread = c.rel_spread if c.samples >= 2 and math.isfinite(c.rel_spread) else PRIOR_REL_UNCERTAINTY
        # one run's error, pooled with the prior as PRIOR_RUNS pseudo-runs (policies.margin's rule)
        n = float(c.samples)
        u = math.sqrt((PRIOR_RUNS * PRIOR_REL_UNCERTAINTY ** 2 + n * spread ** 2) / (PRIOR_RUNS + n))
        r.correction = c.factor
        r.job = replace(base, est_runtime_s=max(1.0, base.est_runtime_s * c.factor), runtime_rel_uncertainty=u,
                        length_spread=c.length_spread if self.settings.price_length_spread else ())
        return r.job

    def _meter(self, r: JobRecord, now_s: float, delta_w: float, pue: float) -> None:
        """A change of `r`'s power: on its zone's meter, and on its site's where its site has a
        budget of its own (then not against its zone's)."""
        site = self._budget_of[r.gpu_ids[0]] if r.gpu_ids else None
        self.meters[r.zone].change(now_s, delta_w, pue, budgeted=site is None)
        if site is not None:
            self.site_meters[site].change(now_s, delta_w, pue)

    def _ramped(self, snap: Snapshot, plan, now_s: float):
        """The plan with starts held back by the zones' ramp limits (`policies.ramp`), counting
        the jobs that started in the last minute, as the daemon's planner does."""
        recent = [RecentStart(self._budget_of[r.gpu_ids[0]] or r.zone if r.gpu_ids else r.zone,
                              _dt(r.run_start_s), r.planned_power_w) for r in self.records
                  if r.state == "running" and r.run_start_s is not None and now_s - r.run_start_s < RAMP_WINDOW_S]
        return stagger_starts(plan, snap.now, {g.id: budget_of(g) for g in snap.gpus}, self._ramps, recent,
                              pinned=snap.pinned)

    def _replan_behind_overruns(self, now_s: float) -> None:
        """Take back into the queue every committed job waiting behind a job that runs past
        its planned end (with its deadline margin): the plan it was given assumed GPUs that
        are not free, so this tick plans it again, on those GPUs or others."""
        behind: set[int] = set()
        for g, ridx in enumerate(self.running_on):
            if ridx is None or not self.reservations[g]:
                continue
            rr = self.records[ridx]
            margin = job_margin(rr.job, rr.model, self.book, self.settings.estimate_margin)
            planned_end = rr.start_s + rr.planned_runtime_s * margin
            if now_s <= planned_end + EPS_S:
                continue
            behind.update(i for i in self.reservations[g] if i != ridx and self.records[i].state == "committed")
        for idx in sorted(behind):
            self.replanned_behind_overruns += 1
            self._evict(idx, now_s, "the job before it on its GPUs overran its plan")

    def _plan_all(self, now_s: float) -> None:
        """The oracle's single look at the whole future: all jobs, actual intensity throughout."""
        from scheduler.simulate.forecasts import ForecastModel

        perfect = ForecastModel(kind="perfect", zones=self.carbon, name="perfect")
        last_arrival = self.records[-1].arrival_s
        longest = max(self._longest_runtime(r.job) for r in self.records)
        latest_deadline = max((r.deadline_s or r.arrival_s) for r in self.records)
        end = max(last_arrival + self.settings.horizon_s, latest_deadline) + longest
        horizon = math.ceil((end - now_s) / self.settings.slot_s) * self.settings.slot_s
        carbon = {z: perfect.curve(z, now_s, horizon) for z in self.meters}
        jobs = tuple(r.job for r in self.records)
        snap = self._snapshot(now_s, jobs, horizon, carbon)
        t = time.perf_counter()
        plan = self.policy.plan(snap)
        plan_s = time.perf_counter() - t
        committed = 0
        for a in sorted(plan.assignments, key=lambda a: a.start_at):
            r = self.records[self.index[a.job_id]]
            committed += self._commit(a, max(now_s, r.arrival_s, a.start_at.timestamp()))
        self.ticks.append(TickStat(at_s=now_s, queued=len(jobs), planned=len(plan.assignments),
                                   committed=committed, plan_s=plan_s))
        self.forecast = perfect  # later ticks (unplaced jobs only) also know the actual future
        log.info("oracle planned %d of %d jobs in one pass over %.0f h (%.1f s)",
                 committed, len(jobs), horizon / 3600, plan_s)

    def _longest_runtime(self, job: QueuedJob) -> float:
        models = {s.model for s in self.slots}
        return max(self._shape(job, m).runtime_s for m in models)

    def _shape(self, job: QueuedJob, model: str):
        key = (job.id, model, job.est_runtime_s)  # a corrected estimate is another shape
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = job_shape(job, model, self.book, self.settings.default_runtime_s)
        return shape

    def _commit(self, a: Assignment, start_s: float) -> int:
        """Reserve the GPUs and schedule the start, if the assignment is valid (1) else 0."""
        idx = self.index.get(a.job_id)
        if idx is None:
            return self._reject(a, "unknown job")
        r = self.records[idx]
        if r.state not in ("queued", "future"):
            return self._reject(a, f"job is {r.state}")
        job = r.job
        ids = a.gpu_ids
        if len(ids) != job.gpus or len(set(ids)) != len(ids) or any(not 0 <= g < len(self.slots) for g in ids):
            return self._reject(a, f"needs {job.gpus} distinct known GPUs, got {ids}")
        first = self.slots[ids[0]]
        for g in ids:
            s = self.slots[g]
            if s.node != first.node or s.model != first.model:
                return self._reject(a, "GPUs span nodes or models")
            if not self.healthy[g]:
                return self._reject(a, f"GPU {g} is down")
            if self.free_at[g] > start_s + EPS_S:
                return self._reject(a, f"GPU {g} busy until {_dt(self.free_at[g]).isoformat()}")
            if s.memory_gib < job.gpu_mem_gib:
                return self._reject(a, f"GPU {g} has too little memory")
        if start_s < r.arrival_s - EPS_S:
            return self._reject(a, "starts before the job is submitted")
        shape = self._shape(job, first.model)
        r.state = "committed"
        r.node, r.zone, r.model, r.gpu_ids = first.node, first.zone, first.model, tuple(ids)
        r.planned_runtime_s, r.planned_power_w = shape.runtime_s, shape.power_w
        r.committed_s = self.env.now
        # the truth is anchored on the real job and the scenario's own profiles, never on the
        # estimate or on what was learned since
        real = r.real or job
        base = shape if not self.learned and real is job else job_shape(real, first.model, self._base_book,
                                                                         self.settings.default_runtime_s)
        r.runtime_s, r.power_w = self.truth.actual(real, first.model, base, self.settings.default_runtime_s)
        r.power_limit_w = a.estimate.power_limit_w
        if r.power_limit_w is not None:
            # the agent sets the limit; the job runs by the cap response, as planned
            from policies.catalog import lookup
            from policies.power_cap import capped

            vendor = lookup(first.model).vendor
            n = max(1, len(ids))
            plan_factor, plan_w = capped(shape.power_w / n, r.power_limit_w, vendor)
            r.planned_runtime_s, r.planned_power_w = shape.runtime_s * plan_factor, plan_w * n
            factor, per_gpu_w = capped(r.power_w / n, r.power_limit_w, vendor)
            r.runtime_s, r.power_w = r.runtime_s * factor, per_gpu_w * n
        r.pue = self._gpu_pue(first)
        # an interrupted job has only the rest of its work left, plus one resume (issue 30)
        resumed = job.done_fraction > 0 or job.resume_count > 0
        if resumed:
            left = max(0.0, 1.0 - job.done_fraction)
            r.planned_runtime_s = r.planned_runtime_s * left + job.resume_cost_s
            # its progress is a share of the work: on other GPUs, of their runtime
            r.work_done_s = job.done_fraction * r.runtime_s
        r.segments = []
        r.seg_index = 0
        if len(a.segments) > 1 and job.interruptible in ("checkpoint", "pause"):
            segs = [(x.timestamp(), y.timestamp()) for x, y in a.segments]
            segs[0] = (start_s, max(start_s + EPS_S, segs[0][1]))
            r.segments = segs if job.interruptible == "pause" else segs[:1]
            # the planner sees the GPUs held to the first segment's end (checkpoint) or the
            # last one's (pause)
            r.planned_runtime_s = r.segments[-1][1] - start_s
            if job.interruptible == "pause":
                from policies.segments import idle_power_w

                r.idle_w = idle_power_w(first.model, len(ids))
        r.start_s = start_s
        r.est_gco2 = a.estimate.gco2
        r.explanation = a.explanation
        r.token += 1
        end_s = start_s + r.planned_runtime_s
        for g in ids:
            self.free_at[g] = end_s
            self.reservations[g].append(idx)
        self.queue.pop(job.id, None)
        self._changes += 1
        token = r.token
        ev = self.env.timeout(max(0.0, start_s - self.env.now))
        ev.callbacks.append(lambda _e, idx=idx, token=token: self._start(idx, token))
        return 1

    def _gpu_pue(self, gpu: GpuSlot) -> float:
        """The PUE of the site of a GPU's node (its zone's default when it has none)."""
        return float(gpu.pue) if gpu.pue is not None else float(self.pue.get(gpu.zone, 1.0))

    def _reject(self, a: Assignment, why: str) -> int:
        self.rejected += 1
        log.debug("assignment of job %s rejected: %s", a.job_id, why)
        return 0

    # -- execution ----------------------------------------------------------------------------

    def _start(self, idx: int, token: int) -> None:
        r = self.records[idx]
        if r.token != token or r.state != "committed":
            return
        blocked = next((g for g in r.gpu_ids if self.running_on[g] not in (None, idx)), None)
        if blocked is not None:
            before = self.records[self.running_on[blocked]]
            before_end = before.start_s + before.runtime_s
            if before_end <= self.env.now + EPS_S:
                # it ends at this very instant (its end is simply processed after this start, or
                # a float hair later): start right after it, as planned. Waiting 0 s where its end
                # lies a hair ahead would spin at this instant for ever.
                ev = self.env.timeout(max(0.0, before_end - self.env.now))
                ev.callbacks.append(lambda _e, idx=idx, token=token: self._start(idx, token))
                return
            # the job before it overran: its plan assumed GPUs that are not free. Like an agent
            # that cannot claim them, hand it back; the planner places it again at once.
            self.replanned_behind_overruns += 1
            self._evict(idx, self.env.now, f"GPU {blocked} is still running the job before it")
            self._changes += 1
            self._plan(self.env.now)
            return
        self.events += 1
        now = self.env.now
        for g in r.gpu_ids:
            self.running_on[g] = idx
            if now > r.start_s + EPS_S:  # started late: the planner's view moves with it
                self.free_at[g] = max(self.free_at[g], now + r.planned_runtime_s)
        r.start_s = now
        if r.first_start_s is None:
            r.first_start_s = now
        r.state = "running"
        if not r.work_done_s:
            r.attempts += 1
        self._meter(r, self.env.now, r.power_w, r.pue)
        self._run_segment(idx, token)

    def _run_segment(self, idx: int, token: int) -> None:
        """Run the job's next stretch of work: to its end, or (issue 30) to the end of its
        planned segment, paying the resume cost first when it resumes."""
        r = self.records[idx]
        now = self.env.now
        r.run_start_s = now
        resumed = r.work_done_s > 0 or r.job.resume_count > 0
        r.resume_paid_s = r.job.resume_cost_s if resumed else 0.0
        run_s = r.resume_paid_s + max(0.0, r.runtime_s - r.work_done_s)
        if r.segments:
            run_s = min(run_s, max(0.0, r.segments[r.seg_index][1] - now))
        ev = self.env.timeout(run_s)
        ev.callbacks.append(lambda _e, idx=idx, token=token: self._segment_end(idx, token))

    def _segment_end(self, idx: int, token: int) -> None:
        """A stretch of work ends: the job is done, or it is interrupted (issue 30): a
        checkpoint job frees its GPUs and goes back to the queue with its progress; a pause job
        idles on its GPUs until its next segment."""
        r = self.records[idx]
        if r.token != token or r.state != "running":
            return
        now = self.env.now
        ran = now - r.run_start_s
        r.work_done_s += max(0.0, ran - r.resume_paid_s)
        if r.work_done_s >= r.runtime_s - 1e-6 or not r.segments:
            self._finish(idx, token)
            return
        self.events += 1
        self._log_segment(r, now)
        self._meter(r, now, -r.power_w, r.pue)
        job = r.job
        progress = dict(done_fraction=min(1.0, r.work_done_s / r.runtime_s), resume_count=job.resume_count + 1)
        if job.interruptible == "pause" and r.seg_index + 1 < len(r.segments):
            r.seg_index += 1
            r.job = replace(job, **progress)
            self._meter(r, now, r.idle_w, r.pue)
            r.run_start_s = None  # paused
            gap_end = r.segments[r.seg_index][0]
            ev = self.env.timeout(max(0.0, gap_end - now))
            ev.callbacks.append(lambda _e, idx=idx, token=token, t0=now: self._resume_in_place(idx, token, t0))
            return
        # checkpointed: back to the queue with its progress, planned again like any job
        r.job = replace(job, **progress)
        if r.estimated_job is not None:
            r.estimated_job = replace(r.estimated_job, **progress)
        self._release(idx, now)
        r.state = "queued"
        r.token += 1
        r.segments = []
        self.queue[r.job.id] = idx
        self.queue = dict(sorted(self.queue.items(), key=lambda kv: kv[1]))
        self._changes += 1
        # back to PENDING is planned at once: the daemon's planner ticks every 15 s, so a
        # checkpointed job waits seconds, not the simulator's (often hourly) tick, for its plan
        self._plan(now)

    def _resume_in_place(self, idx: int, token: int, paused_s: float) -> None:
        """A paused job's next segment begins on the GPUs it held: its idle energy counted."""
        r = self.records[idx]
        if r.token != token or r.state != "running":
            return
        self.events += 1
        now = self.env.now
        r.idle_energy_j += r.idle_w * (now - paused_s)
        r.idle_gco2 += r.idle_w * r.pue * self.carbon[r.zone].integral_g_per_kwh_s(paused_s, now) / J_PER_KWH
        self._meter(r, now, r.power_w - r.idle_w, r.pue)
        self._run_segment(idx, token)

    def _log_segment(self, r: JobRecord, now: float) -> None:
        """Account the segment that ends now: its energy and grams, beside the others."""
        e = r.power_w * (now - r.run_start_s)
        g = r.power_w * r.pue * self.carbon[r.zone].integral_g_per_kwh_s(r.run_start_s, now) / J_PER_KWH
        r.segment_log.append((r.run_start_s, now, e, g))
        r.energy_j += e
        r.gco2 += g

    def _finish(self, idx: int, token: int) -> None:
        r = self.records[idx]
        if r.token != token or r.state != "running":
            return
        self.events += 1
        now = self.env.now
        self._meter(r, now, -r.power_w, r.pue)
        r.state = "done"
        r.end_s = now
        segmented = bool(r.segment_log)
        self._log_segment(r, now)  # one piece: its whole run; else its last segment
        if segmented:
            r.energy_j += r.idle_energy_j
            r.gco2 += r.idle_gco2
        self._release(idx, now)
        if r.first_start_s is not None:
            r.start_s = r.first_start_s  # its wait ends at its first start
        if self.settings.learn and not segmented:
            self._learn(r)
        if self.correct and not segmented:
            self._learn_estimate(r)
        self.done += 1
        if self.done == len(self.records) and not self._all_done.triggered:
            self._all_done.succeed()

    def _release(self, idx: int, now_s: float) -> None:
        """Free a job's GPUs (done or evicted): the planner's view goes back to the planned
        ends of the jobs still reserved there."""
        r = self.records[idx]
        for g in r.gpu_ids:
            res = self.reservations[g]
            if idx in res:
                res.remove(idx)
            ends = [self.records[i].start_s + self.records[i].planned_runtime_s for i in res
                    if self.records[i].start_s is not None]
            self.free_at[g] = max(ends + [now_s])
            if self.running_on[g] == idx:
                self.running_on[g] = None

    def _learn(self, r: JobRecord) -> None:
        """Fold a finished job's measured runtime and energy into the profiles the planner
        uses, as the daemon's agents do (only jobs with a workload class and prompts teach)."""
        from policies.energy import ProfileBook, seed_equivalent_run
        from policies.learning import Run, learned_by_model

        job = r.job
        run_s = (r.end_s or 0.0) - (r.start_s or 0.0)
        if not job.workload or not job.prompts or run_s < 1.0 or r.model is None:
            return
        if r.power_limit_w is not None:
            return  # runs at a power limit are kept out of the default-limit profiles (issue 29)
        runs = self._runs.setdefault((job.workload, r.model), [])
        runs.append(seed_equivalent_run(job, r.model, Run.of(gpus=max(1, job.gpus), runtime_s=run_s,
                                                             energy_j=r.energy_j, prompts=job.prompts)))
        learned = {(job.workload, m): p for m, p in learned_by_model(
            job.workload, {m: rs for (w, m), rs in self._runs.items() if w == job.workload}, self._seeds).items()}
        self.profiles = tuple(learned.values()) + tuple(p for p in self.profiles
                                                       if (p.workload, p.model) not in learned)
        self.book = ProfileBook(self.profiles)
        self._shapes = {k: v for k, v in self._shapes.items() if self.index_job(k[0]).workload != job.workload}
        self.learned += 1

    def _learn_estimate(self, r: JobRecord) -> None:
        """Fold a finished runtime-given job's real / estimated runtime into its estimate class."""
        base = r.estimated_job or r.job
        if not estimated(base) or r.planned_runtime_s <= 0 or r.end_s is None or r.start_s is None:
            return
        # planned_runtime_s is the corrected estimate on the job's GPUs: undo the correction
        ratio = (r.end_s - r.start_s) / r.planned_runtime_s * r.correction
        if ratio <= 0:
            return
        self._est_runs.setdefault(estimate_class(base.workload, base.est_runtime_s), []).append(math.log(ratio))
        self._est_version += 1

    def index_job(self, job_id: int) -> QueuedJob:
        return self.records[self.index[job_id]].job

    def _evict(self, idx: int, now_s: float, why: str) -> None:
        """Stop or un-commit a job whose GPU failed; it goes back to the queue."""
        r = self.records[idx]
        if r.state == "running":
            paused = r.run_start_s is None
            t0 = r.start_s if paused else r.run_start_s
            self._meter(r, now_s, -(r.idle_w if paused else r.power_w), r.pue)
            if paused:  # its idle time so far was spent holding the GPUs
                since = r.segment_log[-1][1] if r.segment_log else now_s
                r.lost_energy_j += r.idle_w * (now_s - since)
                r.lost_gco2 += r.idle_w * r.pue * self.carbon[r.zone].integral_g_per_kwh_s(since, now_s) / J_PER_KWH
            else:
                ran = now_s - t0
                r.lost_energy_j += r.power_w * ran
                r.lost_gco2 += r.power_w * r.pue * self.carbon[r.zone].integral_g_per_kwh_s(t0, now_s) / J_PER_KWH
            # work since the last checkpoint is lost; a pause job's progress was never saved
            if r.job.interruptible != "checkpoint":
                r.work_done_s = 0.0
                r.job = replace(r.job, done_fraction=0.0, resume_count=0)
            r.segments = []
        self._release(idx, now_s)
        log.debug("job %s back to the queue: %s", r.job.id, why)
        r.state = "queued"
        r.token += 1
        r.start_s = None
        r.gpu_ids = ()
        self.queue[r.job.id] = idx
        # keep the queue in arrival order
        self.queue = dict(sorted(self.queue.items(), key=lambda kv: kv[1]))

    def _result(self, wall0: float) -> PolicyRun:
        end = self.env.now
        for m in (*self.meters.values(), *self.site_meters.values()):
            m.advance(end)
        for r in self.records:  # cut off by the overrun limit: what they drew so far was spent
            if r.state == "running" and r.run_start_s is not None:
                r.lost_energy_j += r.power_w * (end - r.run_start_s)
                r.lost_gco2 += r.power_w * r.pue * self.carbon[r.zone].integral_g_per_kwh_s(r.run_start_s, end) / J_PER_KWH
        return PolicyRun(policy=self.policy_name, forecast=self.forecast.name or self.forecast.kind,
                         records=self.records, meters=self.meters, site_meters=self.site_meters,
                         ticks=self.ticks, start_s=self._t0,
                         end_s=end, events=self.events, wall_s=time.perf_counter() - wall0,
                         rejected_assignments=self.rejected, gpu_failures=self.failures,
                         unplaced_reasons=self.unplaced_reasons, truth=self.truth.name,
                         estimate=self.estimate_model.spec,
                         replanned_behind_overruns=self.replanned_behind_overruns,
                         planner_failures=int(getattr(self.policy, "failures", 0)))


def _dt(t_s: float) -> datetime:
    return datetime.fromtimestamp(t_s, timezone.utc)
