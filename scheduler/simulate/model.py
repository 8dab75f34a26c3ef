"""The SimPy model: a cluster replaying a job trace through one of the daemon's policies.

What happens, in simulated time (float seconds since the Unix epoch, UTC):

- **Arrivals**: each job joins the queue at its submit time. Like the daemon, a submit wakes
  the planner (`wake_on_submit`; arrivals at the same instant share one wake-up).
- **Planner ticks** every `plan_interval_s` (the daemon's `--plan-interval`; 15 min by
  default here). A tick builds a `policies.types.Snapshot` exactly as the daemon's planner
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
  trades plan freshness for planner time (the whole pai-100k year: see docs/benchmarks.md).
  A full re-plan is handed those plans as `Snapshot.previous`, as the daemon's is: where
  it starts from (cpsat tries them first), not a constraint.
- **Execution**: a committed job starts at its planned time on its planned GPUs if they are
  free; if a job that overran still holds them (as on a real node) it goes back to the queue
  and the planner places it again at once. It runs for the runtime, at
  the mean power, that the *truth* gives (`scheduler.simulate.truth`: by default the energy
  model the policies plan with, `policies.model.energy.job_shape`; `noisy:SIGMA` or a profiles file
  make the planner's estimates wrong). The planner sees a GPU busy until the job's *planned*
  end (then, while it overruns, for another minute at a time, as the daemon does); a tick
  that finds a job running past its planned end (with its deadline margin) takes the jobs
  committed behind it on its GPUs back into the queue and plans them again, so they can
  move to free GPUs instead of waiting for it. With
  `learn` each finished job's measured runtime and energy are folded into the profiles it
  plans with (`policies.model.learning`), as the daemon's agents do.
- **Runtime estimates** (`estimate`, `scheduler.simulate.estimates`): a job whose length is a
  runtime is planned with an *estimate* of it (exact, GAIA's class mean, a per-job lognormal
  error, or a user's rounded-up request) and runs its real length; the policies only ever
  see the estimate. With `correct_estimates` (on whenever the estimate is not exact) each
  finished job's real / estimated runtime is learned per estimate class
  (`policies.model.runtime_correction`): later estimates of the class are scaled by the median
  ratio and carry its spread as `QueuedJob.runtime_rel_uncertainty`, which widens their
  deadline margin (`policies.model.margin`), and the quantiles of the class's ratios as
  `QueuedJob.length_spread`, by which the job is priced at its expected grams
  (`policies.model.length_spread`; `price_length_spread`). The oracle, a bound with perfect knowledge, is
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
import random
import time
from collections.abc import Callable

import simpy

from policies.base import Policy
from policies.types import QueuedJob
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
from scheduler.simulate.priorities import SimPriorities
from scheduler.simulate.records import JobRecord, PolicyRun
from scheduler.simulate.settings import SimSettings
from scheduler.simulate.state import SimState
from scheduler.simulate.truth import parse_truth

log = logging.getLogger(__name__)


class Simulation:
    """One policy over one scenario; `run()` returns a PolicyRun. Single use.

    It runs the arrivals, the planner's ticks and the GPU failures as SimPy processes over
    the shared `state` (`SimState`: clock, jobs, queue, GPUs, meters, counters) and composes
    the parts that do the rest: `planner` (TickPlanner), `dispatch` (Dispatcher: commits,
    the truth) and `execution` (starts, segments, ends, evictions).
    """

    def __init__(self, *, cluster: ClusterSpec, jobs: list[QueuedJob], carbon: dict[str, ZoneIntensity],
                 policy: str | Policy, forecast: ForecastModel, settings: SimSettings = SimSettings(),
                 policy_params: dict | None = None, profiles: tuple = (),
                 progress: Callable[[float], None] | None = None,
                 estimate_model: EstimateModel | None = None, priorities: SimPriorities | None = None) -> None:
        self.cluster = cluster
        self.settings = settings
        if isinstance(policy, str):
            # as in the daemon: a policy that raises never fails a tick (policies.solvers.guard)
            from policies.solvers.guard import guarded_policy

            policy = guarded_policy(policy, policy_params)
        # else any object with .name and .plan(snapshot) (tests, experiments)
        self.policy_name = policy.name
        self.clairvoyant = self.policy_name == "oracle"  # sees the whole future in one snapshot
        truth = parse_truth(settings.truth, seed=settings.seed)  # execution only: never planned with
        self.progress = progress
        # settings.estimate, or any EstimateModel (tests, experiments: a fixed estimate per job)
        self.estimate_model = estimate_model or parse_estimate(settings.estimate, seed=settings.seed)
        # the oracle is a bound with perfect knowledge: it plans with the real lengths
        seen = list(jobs) if self.clairvoyant else self.estimate_model.apply(jobs)
        correct = (settings.correct_estimates if settings.correct_estimates is not None
                   else self.estimate_model.kind != "exact") and not self.clairvoyant
        knowledge = Knowledge(profiles, default_runtime_s=settings.default_runtime_s,
                              estimate_margin=settings.estimate_margin,
                              price_length_spread=settings.price_length_spread, correct=correct)
        records = [JobRecord(job=e, arrival_s=j.submitted_at.timestamp(),
                             deadline_s=j.deadline.timestamp() if j.deadline else None,
                             real=j if e is not j else None, estimated_job=e) for j, e in zip(jobs, seen)]
        records.sort(key=lambda r: (r.arrival_s, r.job.id))
        gpus = GpuLedger(cluster, records, knowledge.margin)
        power = SitePower(cluster, carbon, [g.budget for g in gpus.slots])
        self.state = state = SimState(settings, records, carbon, cluster.pue, gpus, power, knowledge)
        state.priorities = priorities  # each job's standing (fair share, QOS); None: all equal
        self.records = records
        longest = max((j.est_runtime_s or settings.default_runtime_s for j in list(jobs) + seen), default=0.0)
        tail_s = min(7 * 86400.0, 2.0 * longest)  # runtimes vary by model: a margin
        self.execution = Execution(state, self._replan)
        self.dispatch = Dispatcher(state, truth, self.execution)
        self.planner = TickPlanner(state, policy, forecast, tail_s, self.dispatch, self.execution)

    def _replan(self, now_s: float) -> None:
        """Plan at once (a job came back to the queue between ticks)."""
        self.planner.plan(now_s)

    # -- processes ----------------------------------------------------------------------------

    def run(self) -> PolicyRun:
        """Simulate until every job finished (or the overrun limit); return the outcome."""
        wall0 = time.perf_counter()
        state = self.state
        env = state.env
        if not self.records:
            return self._result(wall0)
        if self.clairvoyant:
            self.planner.plan_all(env.now)
        env.process(self._arrivals())
        env.process(self._ticker())
        if self.settings.gpu_mtbf_s:
            rng = random.Random(self.settings.seed)
            for g in range(len(state.gpus)):
                env.process(self._failures(g, random.Random(rng.getrandbits(64))))
        limit = self.records[-1].arrival_s + self.settings.max_overrun_s
        env.run(until=simpy.AnyOf(env, [state.all_done, env.timeout(limit - env.now)]))
        return self._result(wall0)

    def _arrivals(self):
        state = self.state
        env = state.env
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
                    state.queue[r.job.id] = i
                    state.changes += 1
                state.events += 1
                i += 1
            if self.settings.wake_on_submit:
                self.planner.plan(env.now)

    def _ticker(self):
        state = self.state
        env = state.env
        step = self.settings.plan_interval_s
        while state.done < len(self.records):
            state.events += 1
            self.planner.plan(env.now)
            if self.progress is not None:
                self.progress(env.now)
            yield env.timeout(step)

    def _failures(self, g: int, rng: random.Random):
        state = self.state
        env = state.env
        while True:
            yield env.timeout(rng.expovariate(1.0 / self.settings.gpu_mtbf_s))
            if state.done >= len(self.records):
                return
            state.events += 1
            state.failures += 1
            state.gpus.set_health(g, False)
            for idx in list(state.gpus.reservations[g]):
                self.execution.evict(idx, env.now, f"GPU {g} failed")
            state.changes += 1
            yield env.timeout(self.settings.gpu_repair_s)
            state.gpus.set_health(g, True)
            state.changes += 1

    # -- the outcome --------------------------------------------------------------------------

    def _result(self, wall0: float) -> PolicyRun:
        state = self.state
        end = state.env.now
        state.power.close(end)
        for r in self.records:  # cut off by the overrun limit: what they drew so far was spent
            if r.state == "running" and r.run_start_s is not None:
                r.lost_energy_j += r.power_w * (end - r.run_start_s)
                r.lost_gco2 += grams(r.power_w, r.pue, state.carbon[r.zone], r.run_start_s, end)
        planner = self.planner
        return PolicyRun(policy=self.policy_name, forecast=planner.forecast.name or planner.forecast.kind,
                         records=self.records, meters=state.power.meters, site_meters=state.power.site_meters,
                         ticks=planner.ticks, start_s=state.t0,
                         end_s=end, events=state.events, wall_s=time.perf_counter() - wall0,
                         rejected_assignments=self.dispatch.rejected, gpu_failures=state.failures,
                         unplaced_reasons=planner.unplaced_reasons, truth=self.dispatch.truth.name,
                         estimate=self.estimate_model.spec,
                         replanned_behind_overruns=state.replanned_behind_overruns,
                         planner_failures=int(getattr(planner.policy, "failures", 0)))
