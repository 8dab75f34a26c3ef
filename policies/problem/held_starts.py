"""Held starts: a queued job whose last plan left it little slack keeps that plan's start.

Conservative backfilling's promise, given only where it is needed. A carbon-aware plan
defers work to cleaner hours inside each job's window; under load, later plans (new
arrivals, a reshuffled fleet, a running job that ends a slot later on the new plan's grid)
then push a deferred job past its deadline. So a re-plan may move such a job's start
earlier, never later than the start an on-time plan promised it, once that plan left the
job less slack after its planned finish than `gate` times its own runtime there. A job with
plenty of slack is free to follow the cleaner hours that later forecasts show.

The promise is remembered (`Promises`) and not re-read from each plan's start: slots count
from each plan's moment, so no slot starts at the promised moment exactly. Cut at the slot
before it, a plan at every submit pulled a held job a slot earlier each time (into dirtier
hours, soon to "now"); so a held job may start in the slot that holds its promise (up to
a slot later than promised, as the slot model places every start), and a promise tightens
only when a plan starts the job more than a slot earlier.

A paced promise (`Promises(pace_h_per_h)`) also moves earlier as time passes: a held job is
pulled towards "now" at a pace set by the clock, so it starts within 1 / (1 + pace) of the
time that was left to its promise when it was held, and it stays held until it starts.
Under a sustained overload that is what keeps deferred work from piling up at the end of
the windows; where the fleet has room it only costs grams.

Which jobs get promises (`min_node_share`): cpsat's default holds only jobs whose GPUs fill
their group's largest node. Such a gang starts only when every GPU of one node is free at
once, and under load a deferred one is the first to lose its on-time start (the overload
replays' extra misses over edf were these); a narrower job finds a later gap, so it keeps
following the cleaner hours and the fleet with room keeps its saving.

Measured in `docs/benchmarks.md` (section `overload`, "Whole-node gangs only").
"""

from __future__ import annotations

import math

import numpy as np

from policies.problem.instance import Problem
from policies.problem.segments import interruptible

#: the binding constraint an explanation names for a held job ("held start binds")
HELD = "held start"


class Promises:
    """The latest start promised to each held job (by job id), kept across plans.

    With `pace_h_per_h` > 0 a promise moves earlier as time passes, by that many hours per
    hour since it was given (never before "now"): a held job is pulled towards "now" at a
    pace set by the clock, whatever the number of plans in between."""

    def __init__(self, pace_h_per_h: float = 0.0) -> None:
        self.pace_h_per_h = pace_h_per_h
        self._by_job: dict[int, tuple[float, float]] = {}  # job id -> (promised start, given at), epoch s

    def promised(self, job_id: int, start_s: float, slot_s: float, now_s: float) -> float:
        """The start a job's last plan gave it (`start_s`, epoch s) as a promise: the one
        given before (pulled by the pace), unless that plan started it more than a slot
        earlier, which tightens it. A job without a promise yet gets none here (`keep`
        gives it)."""
        before = self._by_job.get(job_id)
        if before is None:
            return start_s
        promise_s = max(now_s, before[0] - self.pace_h_per_h * max(0.0, now_s - before[1]))
        if start_s < promise_s - slot_s:
            self._by_job[job_id] = (start_s, now_s)
            return start_s
        return promise_s

    def pulls(self, job_id: int) -> bool:
        """Whether a paced promise is being pulled for this job: it stays held until it
        starts (pulled earlier, its slack grows, and it must not fall back to the end of its
        window for the cleaner hours there)."""
        return self.pace_h_per_h > 0 and job_id in self._by_job

    def keep(self, job_id: int, start_s: float, now_s: float) -> None:
        """Give a job its first promise, `start_s`, at `now_s` (one given before stays)."""
        self._by_job.setdefault(job_id, (start_s, now_s))

    def forget_all_but(self, job_ids: set[int]) -> None:
        """Drop the promises of jobs no longer queued (started, cancelled)."""
        for job_id in [i for i in self._by_job if i not in job_ids]:
            del self._by_job[job_id]


def hold_starts(problem: Problem, gate: float = 1.0, max_slack_h: float = math.inf,
                promises: Promises | None = None, min_node_share: float = 0.0) -> int:
    """Cut the windows of the jobs whose previous plan (`Snapshot.previous`) was on time and
    left them less than `gate` x their runtime of slack after their planned finish (and
    less than `max_slack_h` hours): their last start slot becomes that plan's start (the
    promise in `promises` where one was given), rounded up to this plan's slot grid (never
    before their earliest slot). `gate` inf holds every on-time start. Only jobs whose GPUs
    fill at least `min_node_share` of their group's largest node are held. The uncut windows
    stay in `problem.job_latest_unheld`, which tells a forced start inside the real window
    from a deadline miss, and the held jobs' indices in `problem.held_jobs` (their
    explanations say so). Returns how many jobs were held."""
    unheld = problem.job_latest.copy()
    hard = problem.job_hard_latest.copy()
    now_s = problem.now.timestamp()
    held_jobs: set[int] = set()
    for j, pool, a in problem.previous_assignments():
        if interruptible(problem.jobs[j]):
            continue
        g = int(problem.pool_group[pool])
        if problem.job_k[j] < min_node_share * problem.group_largest_pool[g]:
            continue  # a narrow job finds a later gap; only gangs that need most of a node are held
        start_s = a.start_at.timestamp()
        if promises is not None:
            start_s = promises.promised(a.job_id, start_s, problem.slot_s, now_s)
        start = (start_s - now_s) / problem.slot_s  # in this plan's slots
        on_time_latest = float(problem.job_on_time_latest[j, g])
        if math.isnan(problem._deadline_s[j]) or start > on_time_latest + 1e-9:
            continue  # no deadline, or that plan was late already: nothing to promise
        slack = on_time_latest - start
        if (promises is None or not promises.pulls(a.job_id)) and \
                slack >= min(gate * float(problem.job_duration[j, g]), max_slack_h * 3600.0 / problem.slot_s):
            continue
        if promises is not None:
            promises.keep(a.job_id, start_s, now_s)
        # the slot that holds the promised moment: up to a slot later than promised, where the
        # last plan's start still fits (a running job's end, rounded up to this plan's grid,
        # may lie past the slot before it); the promise itself stays, so nothing accumulates
        cut = max(int(problem.job_earliest[j]), math.ceil(start - 1e-9))
        problem.job_latest[j] = np.minimum(problem.job_latest[j], cut)
        hard[j] = min(int(hard[j]), cut)
        problem._job_options.pop(j, None)  # built from the uncut window
        held_jobs.add(j)
    if held_jobs:
        problem.job_latest_unheld = unheld
        problem.job_hard_latest_unheld = problem.job_hard_latest
        problem.job_hard_latest = hard
        problem.held_jobs = held_jobs
    return len(held_jobs)


def unheld_latest(problem: Problem, j: int, g: int) -> int:
    """Job j's last on-time start slot on group g before any hold (`hold_starts`)."""
    unheld = problem.job_latest_unheld
    return int((unheld if unheld is not None else problem.job_latest)[j, g])


def unheld_window_latest(problem: Problem, j: int) -> np.ndarray:
    """`Problem.window_latest(j)` before any hold: where a held job goes, cheapest first,
    when no start at or before its promise fits any more."""
    if problem.strict:
        unheld = problem.job_latest_unheld
        return (unheld if unheld is not None else problem.job_latest)[j]
    hard = problem.job_hard_latest_unheld
    hard = hard if hard is not None else problem.job_hard_latest
    return np.full(len(problem.groups), int(hard[j]), dtype=np.int64)


def is_held(problem: Problem, j: int) -> bool:
    """Whether job j's window was cut to its last plan's start (`hold_starts`)."""
    return j in problem.held_jobs
