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
from dataclasses import dataclass
from typing import Any

import simpy

from policies.base import Policy
from policies.model import QueuedJob
from scheduler.simulate.cluster import ClusterSpec
from scheduler.simulate.dispatch import Dispatcher
from scheduler.simulate.estimates import EstimateModel, parse_estimate
from scheduler.simulate.execution import Execution
from scheduler.simulate.forecasts import ForecastModel
from scheduler.simulate.gpus import GpuLedger
from scheduler.simulate.intensity import ZoneIntensity
from scheduler.simulate.knowledge import Knowledge
from scheduler.simulate.planning import TickPlanner
from scheduler.simulate.power import SitePower, grams
from scheduler.simulate.records import JobRecord, PolicyRun
from scheduler.simulate.truth import parse_truth

log = logging.getLogger(__name__)


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


class Simulation:
    """One policy over one scenario; `run()` returns a PolicyRun. Single use.

    It holds the jobs (`records`, the `queue` in arrival order), the simulated clock (`env`)
    and the counters, runs the arrivals, the planner's ticks and the GPU failures as SimPy
    processes, and composes the parts that do the rest: `gpus` (GpuLedger: health,
    reservations, the planner's view), `power` (SitePower: meters, budgets, ramps),
    `knowledge` (profiles and estimate corrections, learned), `planner` (TickPlanner),
    `dispatch` (Dispatcher: commits, the truth) and `execution` (starts, segments, ends,
    evictions).
    """

    def __init__(self, *, cluster: ClusterSpec, jobs: list[QueuedJob], carbon: dict[str, ZoneIntensity],
                 policy: str | Policy, forecast: ForecastModel, settings: SimSettings = SimSettings(),
                 policy_params: dict | None = None, profiles: tuple = (),
                 progress: Callable[[float], None] | None = None,
                 estimate_model: EstimateModel | None = None) -> None:
        from policies.base import get_policy

        self.cluster = cluster
        self.settings = settings
        if isinstance(policy, str):
            # as in the daemon: a policy that raises never fails a tick (policies.guard)
            from policies.guard import fallback_chain, guarded

            policy = guarded(get_policy(policy, **(policy_params or {})),
                             [get_policy(f) for f in fallback_chain(policy)])
        # else any object with .name and .plan(snapshot) (tests, experiments)
        self.policy_name = policy.name
        self.clairvoyant = self.policy_name == "oracle"  # sees the whole future in one snapshot
        self.carbon = carbon
        truth = parse_truth(settings.truth, seed=settings.seed)  # execution only: never planned with
        self.progress = progress
        self.pue = cluster.pue
        # settings.estimate, or any EstimateModel (tests, experiments: a fixed estimate per job)
        self.estimate_model = estimate_model or parse_estimate(settings.estimate, seed=settings.seed)
        # the oracle is a bound with perfect knowledge: it plans with the real lengths
        seen = list(jobs) if self.clairvoyant else self.estimate_model.apply(jobs)
        correct = (settings.correct_estimates if settings.correct_estimates is not None
                   else self.estimate_model.kind != "exact") and not self.clairvoyant
        self.knowledge = Knowledge(profiles, default_runtime_s=settings.default_runtime_s,
                                   estimate_margin=settings.estimate_margin,
                                   price_length_spread=settings.price_length_spread, correct=correct)
        self.records = [JobRecord(job=e, arrival_s=j.submitted_at.timestamp(),
                                  deadline_s=j.deadline.timestamp() if j.deadline else None,
                                  real=j if e is not j else None, estimated_job=e) for j, e in zip(jobs, seen)]
        self.records.sort(key=lambda r: (r.arrival_s, r.job.id))
        self.index = {r.job.id: i for i, r in enumerate(self.records)}
        self.queue: dict[int, int] = {}  # job id -> record index, in arrival order
        self.gpus = GpuLedger(cluster, self.records, self.knowledge.margin)
        self.power = SitePower(cluster, carbon, [g.budget for g in self.gpus.slots])
        self.events = 0
        self.done = 0
        self.failures = 0
        self.replanned_behind_overruns = 0
        self.changes = 0  # bumps with every change a plan depends on (a plan per state)
        longest = max((j.est_runtime_s or settings.default_runtime_s for j in list(jobs) + seen), default=0.0)
        tail_s = min(7 * 86400.0, 2.0 * longest)  # runtimes vary by model: a margin
        self.planner = TickPlanner(self, policy, forecast, tail_s)
        self.dispatch = Dispatcher(self, truth)
        self.execution = Execution(self)
        self._t0 = self._first_tick()
        self.env = simpy.Environment(initial_time=self._t0)
        self._all_done = self.env.event()

    # -- time helpers -------------------------------------------------------------------------

    def _first_tick(self) -> float:
        first = self.records[0].arrival_s if self.records else 0.0
        step = self.settings.plan_interval_s
        return math.floor(first / step) * step

    def next_tick(self, now_s: float) -> float:
        """The time of the first planner tick after `now_s`."""
        step = self.settings.plan_interval_s
        k = math.floor((now_s - self._t0) / step + 1e-9) + 1
        return self._t0 + k * step

    # -- the queue ----------------------------------------------------------------------------

    def requeue(self, idx: int) -> None:
        """Put record `idx` back in the queue, which stays in arrival order."""
        self.queue[self.records[idx].job.id] = idx
        self.queue = dict(sorted(self.queue.items(), key=lambda kv: kv[1]))

    def workload_of(self, job_id: int) -> str | None:
        """The workload class of a job, as the planner last saw it."""
        return self.records[self.index[job_id]].job.workload

    def job_done(self) -> None:
        """One more job finished; the run ends when all have."""
        self.done += 1
        if self.done == len(self.records) and not self._all_done.triggered:
            self._all_done.succeed()

    # -- processes ----------------------------------------------------------------------------

    def run(self) -> PolicyRun:
        """Simulate until every job finished (or the overrun limit); return the outcome."""
        wall0 = time.perf_counter()
        env = self.env
        if not self.records:
            return self._result(wall0)
        if self.clairvoyant:
            self.planner.plan_all(env.now)
        env.process(self._arrivals())
        env.process(self._ticker())
        if self.settings.gpu_mtbf_s:
            rng = random.Random(self.settings.seed)
            for g in range(len(self.gpus)):
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
                    self.changes += 1
                self.events += 1
                i += 1
            if self.settings.wake_on_submit:
                self.planner.plan(env.now)

    def _ticker(self):
        env = self.env
        step = self.settings.plan_interval_s
        while self.done < len(self.records):
            self.events += 1
            self.planner.plan(env.now)
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
            self.gpus.set_health(g, False)
            for idx in list(self.gpus.reservations[g]):
                self.execution.evict(idx, env.now, f"GPU {g} failed")
            self.changes += 1
            yield env.timeout(self.settings.gpu_repair_s)
            self.gpus.set_health(g, True)
            self.changes += 1

    # -- the outcome --------------------------------------------------------------------------

    def _result(self, wall0: float) -> PolicyRun:
        end = self.env.now
        self.power.close(end)
        for r in self.records:  # cut off by the overrun limit: what they drew so far was spent
            if r.state == "running" and r.run_start_s is not None:
                r.lost_energy_j += r.power_w * (end - r.run_start_s)
                r.lost_gco2 += grams(r.power_w, r.pue, self.carbon[r.zone], r.run_start_s, end)
        planner = self.planner
        return PolicyRun(policy=self.policy_name, forecast=planner.forecast.name or planner.forecast.kind,
                         records=self.records, meters=self.power.meters, site_meters=self.power.site_meters,
                         ticks=planner.ticks, start_s=self._t0,
                         end_s=end, events=self.events, wall_s=time.perf_counter() - wall0,
                         rejected_assignments=self.dispatch.rejected, gpu_failures=self.failures,
                         unplaced_reasons=planner.unplaced_reasons, truth=self.dispatch.truth.name,
                         estimate=self.estimate_model.spec,
                         replanned_behind_overruns=self.replanned_behind_overruns,
                         planner_failures=int(getattr(planner.policy, "failures", 0)))
