"""greedy's slot search for a job that bounds carbon's freedom (`policies.pricing.worth`): a
deferral bound (`QueuedJob.max_defer_s`) and the smallest saving worth waiting for.

The earliest start is the first slot where some pool of a fitting group holds the job's k
GPUs over its whole run (and its budget's cap has the watts), given what is placed already
(running jobs, pinned and kept plans, the jobs placed before it: higher priority first). The
job's window then ends `max_defer_s` after it; and a start later than the earliest is kept
only where it saves enough against the cheapest pick at the earliest slot.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from policies.pricing.worth import has_threshold, worth_deferring
from policies.problem.instance import Problem

# (problem, state, j, table, lo, latest per group) -> Pick | None: greedy's `_cheapest_in_window`
Cheapest = Callable[..., object]
# (problem, j, lo, hi) -> flat run ends: greedy's `run_ends` (greedy imports this module)
RunEnds = Callable[..., np.ndarray]


def earliest_slot(problem: Problem, state, j: int, lo: int, run_ends: RunEnds) -> int | None:
    """The first slot from `lo` at which job j fits on some pool now (None: nowhere in the
    horizon)."""
    S = problem.n_slots
    if lo >= S:
        return None
    ok = state.upper_feasible(j, run_ends(problem, j, lo, S), lo, S)
    ok &= problem.job_fit[j][:, None]
    for s in np.flatnonzero(ok.any(axis=0)).tolist():
        for g in np.flatnonzero(ok[:, s]).tolist():
            if state.free_pool(j, g, lo + s, upper_checked=True) is not None:
                return lo + s
    return None


def bounded_pick(problem: Problem, state, j: int, table: np.ndarray, lo: int, latest: np.ndarray,
                 cheapest: Cheapest, run_ends: RunEnds):
    """The cheapest pick of job j within its window cut to its deferral bound, or its cheapest
    pick at the earliest slot where the later one does not save enough; None where nothing
    fits the window (the caller's late path then places it)."""
    job = problem.jobs[j]
    first = earliest_slot(problem, state, j, lo, run_ends)
    if first is None:
        return cheapest(problem, state, j, table, lo, latest)
    if job.max_defer_s is not None:
        latest = np.minimum(latest, first + int(float(job.max_defer_s) // problem.slot_s))
    pick = cheapest(problem, state, j, table, lo, latest)
    if pick is None or pick.slot <= first or not has_threshold(job):
        return pick
    at_first = cheapest(problem, state, j, table, first, np.full_like(latest, first))
    if at_first is None:
        return pick
    g_first = float(table[int(problem.pool_group[at_first.pool]), first])
    g_pick = float(table[int(problem.pool_group[pick.pool]), pick.slot])
    return pick if worth_deferring(job, g_first, g_pick) else at_first
