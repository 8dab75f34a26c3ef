"""The clocks a search budget is counted on: wall time, or nominal work.

The daemon's planner has a tick to keep, so cpsat's budget is wall time there. A simulation
compares policies, and a search cut by wall time gives a different plan for every run and
every host load: at 1 s a call, cpsat's deadline misses at load 1.2 spread over 8-19 in
three runs of the same code (docs/benchmarks.md, `overload`). A `WorkClock` advances only by
the work charged to it (a greedy pass by the problem's size, a CP-SAT sub-solve by the
solver's own deterministic time), so the same snapshot and budget give the same plan on
any machine at any load.

The nominal second is calibrated to a quiet core of the 2-core CI machine (measured
2026-12-03 with `greedy_picks` on bench/planner instances of 20-1,000 jobs): a budget of
1 s buys about as much search as 1 s of wall time there.
"""

from __future__ import annotations

import time
from typing import Protocol

import numpy as np

from policies.problem.instance import Problem

# nominal seconds per (job x GPU group x slot) of one greedy pass: 0.0097 s at 200 jobs x
# 8 groups x 192 slots, 0.110 s at 1,000 x 28 x 192 (greedy_picks in EDF order, min of 3)
GREEDY_PASS_S_PER_CELL = 2.5e-8
GREEDY_PASS_MIN_S = 1e-3
# nominal seconds per slot of an interruptible job's window, plus per slot and GPU group, that
# one greedy pass spends planning its segments (`segments.segmented_pick`: bounds per group,
# the batched DP over the window): 13.7 us a slot at 200 jobs x 8 groups, 22.6 at 1,000 x 28,
# 28.0 at 5,000 x 28 (bench/planner instances, every job a checkpoint job, minus the pass
# with none, measured 2026-12-04); without it a pass over 5,000 such jobs was charged 0.7 s
# and took 8 s
SEGMENT_PASS_S_PER_SLOT = 1.0e-5
SEGMENT_PASS_S_PER_SLOT_GROUP = 6.0e-7
# nominal seconds to build one option (a Boolean of a job's (pool, start)) of an LNS
# sub-model, and the least a sub-solve round is charged
SUB_MODEL_S_PER_OPTION = 2e-5
SUB_ROUND_MIN_S = 1e-3


class Clock(Protocol):
    """Where a search's budget is read from and charged to."""

    deterministic: bool

    def now(self) -> float:
        """Seconds on this clock (any origin)."""
        ...

    def charge(self, seconds: float) -> None:
        """Record `seconds` of work done (a wall clock has counted it already)."""
        ...


class WallClock:
    """Wall time (`time.monotonic`): the daemon's ticks have a deadline."""

    deterministic = False

    def now(self) -> float:
        return time.monotonic()

    def charge(self, seconds: float) -> None:
        pass


class WorkClock:
    """Nominal seconds of work: advances only by what is charged, so a budget buys the
    same search on any host at any load (reproducible simulations)."""

    deterministic = True

    def __init__(self) -> None:
        self._t = 0.0

    def now(self) -> float:
        return self._t

    def charge(self, seconds: float) -> None:
        if seconds > 0:
            self._t += seconds


def greedy_pass_work_s(problem: Problem) -> float:
    """Nominal seconds of one greedy pass over every job of `problem`: its slot tables, and
    the segment plans of its interruptible jobs (`segment_window_slots`)."""
    cells = len(problem.jobs) * len(problem.groups) * problem.n_slots
    per_slot = SEGMENT_PASS_S_PER_SLOT + SEGMENT_PASS_S_PER_SLOT_GROUP * len(problem.groups)
    return max(GREEDY_PASS_MIN_S, GREEDY_PASS_S_PER_CELL * cells + per_slot * segment_window_slots(problem))


def segment_window_slots(problem: Problem) -> int:
    """Slots of the windows greedy searches for segments: per interruptible job, from its
    earliest slot to the latest end of a one-piece run by its deadline over the groups it
    fits (to the horizon without a deadline)."""
    from policies.problem.segments import interruptible, window_ends

    rows = [j for j, job in enumerate(problem.jobs) if interruptible(job)]
    if not rows:
        return 0
    idx = np.array(rows)
    ends = np.where(problem.job_fit[idx], window_ends(problem, idx), 0).max(axis=1)
    return int(np.maximum(0, ends - problem.job_earliest[idx]).sum())
