"""Held starts: a queued job whose last plan left it little slack keeps that plan's start.

Conservative backfilling's promise, given only where it is needed. A carbon-aware plan
defers work to cleaner hours inside each job's window; under load, later plans (new
arrivals, a reshuffled fleet, a running job that ends a slot later on the new plan's grid)
then push a deferred job past its deadline. So a re-plan may move such a job's start
earlier, never later than the start its last on-time plan gave it, once that plan left the
job less slack after its planned finish than `gate` times its own runtime there. A job with
plenty of slack is free to follow the cleaner hours that later forecasts show.

Measured in `bench/README.md` (section `overload`): held starts without a gate cut misses
under overload but cost grams at every load, because a start is then fixed at the job's
first plan.
"""

from __future__ import annotations

import math

import numpy as np

from policies.problem import Problem
from policies.segments import interruptible

#: the binding constraint an explanation names for a held job ("held start binds")
HELD = "held start"


def hold_starts(problem: Problem, gate: float = 1.0) -> int:
    """Cut the windows of the jobs whose previous plan (`Snapshot.previous`) was on time and
    left them less than `gate` x their runtime of slack after their planned finish: their
    last start slot becomes that plan's start, floored to this plan's slot grid (never
    before their earliest slot). `gate` inf holds every on-time start. The uncut windows
    stay in `problem.job_latest_unheld`, which tells a forced start inside the real window
    from a deadline miss, and the held jobs' indices in `problem.held_jobs` (their
    explanations say so). Returns how many jobs were held."""
    previous = getattr(problem.snapshot, "previous", None) or {}
    if not previous:
        return 0
    unheld = problem.job_latest.copy()
    hard = problem.job_hard_latest.copy()
    pool_of_gpu = problem._topology.pool_of_gpu
    now_s = problem.now.timestamp()
    held_jobs: set[int] = set()
    for job_id, a in previous.items():
        j = problem.job_index.get(job_id)
        if j is None or not a.gpu_ids or interruptible(problem.jobs[j]):
            continue
        pool = pool_of_gpu.get(a.gpu_ids[0])
        if pool is None:
            continue
        g = int(problem.pool_group[pool])
        start = (a.start_at.timestamp() - now_s) / problem.slot_s  # in this plan's slots
        on_time_latest = float(problem.job_on_time_latest[j, g])
        if math.isnan(problem._deadline_s[j]) or start > on_time_latest + 1e-9:
            continue  # no deadline, or that plan was late already: nothing to promise
        slack = on_time_latest - start
        if slack >= gate * float(problem.job_duration[j, g]):
            continue
        cut = max(int(problem.job_earliest[j]), math.floor(start + 1e-9))
        problem.job_latest[j] = np.minimum(problem.job_latest[j], cut)
        hard[j] = min(int(hard[j]), cut)
        problem._job_options.pop(j, None)  # built from the uncut window
        held_jobs.add(j)
    if held_jobs:
        problem.job_latest_unheld = unheld
        problem.job_hard_latest = hard
        problem.held_jobs = held_jobs
    return len(held_jobs)


def unheld_latest(problem: Problem, j: int, g: int) -> int:
    """Job j's last on-time start slot on group g before any hold (`hold_starts`)."""
    unheld = getattr(problem, "job_latest_unheld", None)
    return int((unheld if unheld is not None else problem.job_latest)[j, g])


def is_held(problem: Problem, j: int) -> bool:
    """Whether job j's window was cut to its last plan's start (`hold_starts`)."""
    return j in getattr(problem, "held_jobs", ())
