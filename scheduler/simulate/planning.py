"""The simulated daemon's planner: ticks that build a `Snapshot` as the daemon's planner does,
call the policy and commit the assignments that start before the next tick; and the
oracle's single look at the whole future (the model: `scheduler.simulate.model`)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace

from policies.solvers.finish import finish_plan
from policies.types import Assignment, QueuedJob, Snapshot
from policies.problem.segments import horizon_for
from scheduler.simulate.dispatch import Dispatcher
from scheduler.simulate.execution import Execution
from scheduler.simulate.forecasts import ForecastModel
from scheduler.simulate.records import EPS_S, TickStat, at
from scheduler.simulate.state import SimState

log = logging.getLogger(__name__)


class TickPlanner:
    """Plans the queue of one simulation run with its policy and forecast, tick by tick; its
    assignments go to `dispatch`, jobs taken back to `execution`."""

    def __init__(self, state: SimState, policy, forecast: ForecastModel, tail_s: float, dispatch: Dispatcher,
                 execution: Execution) -> None:
        self.state = state
        self.settings = state.settings
        self.dispatch = dispatch
        self.execution = execution
        self.policy = policy
        self.forecast = forecast
        self._tail_s = tail_s  # the forecast also covers the runs of jobs starting near the horizon's end
        self.ticks: list[TickStat] = []
        self.unplaced_reasons: dict[str, int] = {}
        self._last_plan: tuple[float, int] | None = None
        self._previous: dict[int, Assignment] = {}  # the last plan's uncommitted assignments
        self._last_full_s = -math.inf

    def snapshot(self, now_s: float, jobs: tuple[QueuedJob, ...], horizon_s: float,
                 carbon: dict, keep: dict[int, Assignment] | None = None,
                 previous: dict[int, Assignment] | None = None) -> Snapshot:
        """What the policy is given at `now_s`, as the daemon's planner builds it."""
        state = self.state
        gpus = state.gpus.view(now_s)
        return Snapshot(now=at(now_s), jobs=jobs, gpus=gpus,
                        default_runtime_s=self.settings.default_runtime_s, carbon=carbon, pue=state.pue,
                        profiles=state.knowledge.profiles, power_caps=state.power.caps_at(now_s, horizon_s),
                        slot_s=self.settings.slot_s, horizon_s=horizon_s, keep=keep or {}, previous=previous or {},
                        estimate_margin=self.settings.estimate_margin,
                        caps=self.settings.caps)

    def plan(self, now_s: float) -> None:
        """One tick (or wake-up): plan every queued job, commit what starts before the next tick."""
        state = self.state
        if not state.queue:
            return
        moment = (now_s, state.changes)
        if self._last_plan == moment:
            return  # a wake-up and a tick at the same instant with nothing new: one plan
        self._last_plan = moment
        self.replan_behind_overruns(now_s)
        jobs = tuple(state.knowledge.seen(i, state.records[i]) for i in state.queue.values())
        if state.priorities is not None:
            jobs = self._with_priorities(now_s, jobs)
        # interruptible jobs' windows may stretch it (policies.problem.segments.horizon_for)
        horizon = horizon_for(jobs, at(now_s), self.settings.horizon_s, self.settings.slot_s)
        # the forecast also covers the runs of jobs that start near the horizon's end
        carbon = {z: self.forecast.curve(z, now_s, horizon + self._tail_s) for z in state.power.meters}
        full = self.settings.full_replan_s
        # the last plan of each job still queued: kept between full re-plans, else (as the
        # daemon's full re-plan) where this one starts from (cpsat tries it first)
        last = {i: a for i, a in self._previous.items() if i in state.queue}
        incremental = full is not None and now_s - self._last_full_s < full - EPS_S
        if not incremental:
            self._last_full_s = now_s
        keep = last if incremental else {}
        snap = self.snapshot(now_s, jobs, horizon, carbon, keep, {} if incremental else last)
        t = time.perf_counter()
        # the daemon's step after the policy (power limits, ramps), without the operating
        # points in the explanations that only the daemon's readers see
        plan = finish_plan(snap, self.policy.plan(snap), points=False, ramps_w_per_min=state.power.ramps,
                           recent=lambda: state.power.recent_starts(now_s, state.records))
        plan_s = time.perf_counter() - t
        self._previous = {a.job_id: a for a in plan.assignments}
        for why in plan.unplaced.values():
            key = why.split(":")[0][:60]
            self.unplaced_reasons[key] = self.unplaced_reasons.get(key, 0) + 1
        cutoff = state.next_tick(now_s)
        committed = 0
        for a in sorted(plan.assignments, key=lambda a: a.start_at):
            start_s = max(now_s, a.start_at.timestamp())
            if start_s >= cutoff - EPS_S:
                continue
            committed += self.dispatch.commit(a, start_s)
        self.ticks.append(TickStat(at_s=now_s, queued=len(jobs), planned=len(plan.assignments),
                                   committed=committed, plan_s=plan_s, full=not incremental,
                                   kept=len(keep)))

    def _with_priorities(self, now_s: float, jobs: tuple[QueuedJob, ...]) -> tuple[QueuedJob, ...]:
        """The queued jobs with their priorities at `now_s` (fair share of the usage so far)."""
        state = self.state
        records = state.records
        running = [records[i] for i in {i for i in state.gpus.running_on if i is not None}]
        ranked = state.priorities.priorities(now_s, [records[i] for i in state.queue.values()], running)
        if not ranked:
            return jobs
        return tuple(replace(j, priority=ranked[j.id]) if j.priority != ranked[j.id] else j for j in jobs)

    def replan_behind_overruns(self, now_s: float) -> None:
        """Take back into the queue every committed job waiting behind a job that runs past
        its planned end (with its deadline margin): the plan it was given assumed GPUs that
        are not free, so this tick plans it again, on those GPUs or others."""
        state = self.state
        for idx in sorted(state.gpus.behind_overruns(now_s)):
            state.replanned_behind_overruns += 1
            self.execution.evict(idx, now_s, "the job before it on its GPUs overran its plan")

    def plan_all(self, now_s: float) -> None:
        """The oracle's single look at the whole future: all jobs, actual intensity throughout."""
        state = self.state
        perfect = ForecastModel(kind="perfect", zones=state.carbon, name="perfect")
        records = state.records
        last_arrival = records[-1].arrival_s
        models = {s.model for s in state.gpus.slots}
        longest = max(state.knowledge.longest_runtime(r.job, models) for r in records)
        latest_deadline = max((r.deadline_s or r.arrival_s) for r in records)
        end = max(last_arrival + self.settings.horizon_s, latest_deadline) + longest
        horizon = math.ceil((end - now_s) / self.settings.slot_s) * self.settings.slot_s
        carbon = {z: perfect.curve(z, now_s, horizon) for z in state.power.meters}
        jobs = tuple(r.job for r in records)
        snap = self.snapshot(now_s, jobs, horizon, carbon)
        t = time.perf_counter()
        plan = self.policy.plan(snap)
        plan_s = time.perf_counter() - t
        committed = 0
        for a in sorted(plan.assignments, key=lambda a: a.start_at):
            r = records[state.index[a.job_id]]
            committed += self.dispatch.commit(a, max(now_s, r.arrival_s, a.start_at.timestamp()))
        self.ticks.append(TickStat(at_s=now_s, queued=len(jobs), planned=len(plan.assignments),
                                   committed=committed, plan_s=plan_s))
        self.forecast = perfect  # later ticks (unplaced jobs only) also know the actual future
        log.info("oracle planned %d of %d jobs in one pass over %.0f h (%.1f s)",
                 committed, len(jobs), horizon / 3600, plan_s)
