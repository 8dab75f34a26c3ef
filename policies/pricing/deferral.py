"""A job that is late either way waits for faster GPUs past the planning horizon.

A job that no start inside its window meets is placed where it finishes soonest
(`greedy._as_soon_as_possible`). The slot model sees only the starts inside the horizon
(48 h), so when every fast GPU is planned full for that long, the soonest finish it sees can
be a slow GPU free now: in an overload replay an 8-GPU job of 47 h on B200 went to eight
A100s, ran 251 h and finished 203 h late (docs/benchmarks.md, "A paced promise", the contended
gate). So the fallback also asks when each group's GPUs come free after the horizon (what
runs, is pinned or kept, and what this plan has placed so far, past its end) and, where
waiting for them finishes the job at least a slot sooner, leaves it queued with a
`Deferral`: the reason says what it waits for, and the plan's score counts it as the
deadline miss it is, at its expected lateness, so a plan that waits is not ranked below one
that runs the job on the slow GPUs now. Each plan asks again; once the faster GPUs' start
comes inside the horizon the job is placed there.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime


class Deferral(str):
    """An unplaced job's reason (a str, as every reason is) that also carries when the job is
    expected to finish once the GPUs it waits for are free: it counts as a deadline miss at
    that lateness (`placement.deferred_misses`), not as an unplaced job."""

    finish_at: datetime

    def __new__(cls, text: str, finish_at: datetime) -> "Deferral":
        obj = super().__new__(cls, text)
        obj.finish_at = finish_at
        return obj

    def __reduce__(self):  # pickled plans (the daemon's planner process) keep the finish
        return (Deferral, (str(self), self.finish_at))


def past_horizon_start(n_gpus: int, k: int, holds: Iterable[tuple[int, int]], horizon_slots: int) -> int:
    """The first slot at or after the horizon's end at which `k` of a pool's `n_gpus` GPUs are
    free, given what holds them past the horizon (`holds`: (end slot, GPUs); a negative count
    gives GPUs back). GPUs are counted, not named: an estimate, as any start past the
    horizon is."""
    ends = sorted((e, c) for e, c in holds if e > horizon_slots)
    busy = sum(c for _, c in ends)
    t = horizon_slots
    i = 0
    while n_gpus - busy < k and i < len(ends):
        t = ends[i][0]
        while i < len(ends) and ends[i][0] <= t:
            busy -= ends[i][1]
            i += 1
    return t
