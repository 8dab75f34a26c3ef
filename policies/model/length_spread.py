"""Pricing a job of uncertain length by its expected grams (issue 31).

A job whose runtime is an estimate with a learned error (`policies.model.runtime_correction`)
carries `QueuedJob.length_spread`: multipliers of its estimated runtime that sample its real
length evenly (quantiles of its class's recent real / estimate ratios, over their median,
which the corrected estimate already is). The planner prices each of its starts by the mean,
over the multipliers, of the grams of a run that long from that start: the expected grams,
the integral of the intensity weighted by the chance that the job is still running.

Why: a point estimate places a job as if it ended where the estimate says. A class whose
lengths spread widely (GAIA's queue means are a median 65 % off per job) is better placed by
where its jobs are likely to run. An idealised per-job replay of pai_1k (each job alone picks
one of 97 quarter-hour starts within 24 h; 2022 carbon; `bench/estimate_replay.py`) with
GAIA's class-mean knowledge: priced at the class mean DE 12.74 % / US-CAL-CISO 27.27 %, at
its median (what a median correction plans with) 12.86 / 25.77 %, by expected grams over the
class's lengths 13.53 / 27.35 % (exact lengths: 15.06 / 29.38 %).

Only the price changes: capacity, deadlines, time limits and the deadline margin keep the
point estimate (`est_runtime_s`) and its spread (`runtime_rel_uncertainty`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")

#: multipliers kept per job: quantiles (i + 0.5) / POINTS of the learned ratios
POINTS = 16
#: a class needs this many runs before its spread is used (fewer: priced at the estimate)
MIN_RUNS = 5


def spread_of(log_ratios: Sequence[float], median: float) -> tuple[float, ...]:
    """The multipliers of a class from its runs' log(real / estimate) and their median:
    exp(quantile - median) at POINTS evenly spaced levels; () below MIN_RUNS runs."""
    values = np.asarray(list(log_ratios), dtype=np.float64)
    if values.size < MIN_RUNS or not np.isfinite(values).all():
        return ()
    levels = (np.arange(POINTS) + 0.5) / POINTS
    return tuple(float(x) for x in np.exp(np.quantile(values, levels) - median))


def expected(grams: Callable[[T], T], runtime_s: T, spread: Sequence[float] | None) -> T:
    """`grams(runtime_s)`, or with `spread` the mean of `grams(runtime_s x m)` over its
    multipliers: one rule for every pricer (a float runtime, or an array of them)."""
    if spread is None or not len(spread):
        return grams(runtime_s)
    return sum(grams(runtime_s * float(m)) for m in spread) / len(spread)


def multipliers(job) -> np.ndarray | None:
    """The job's length multipliers as an array, or None when it is priced at its estimate.
    A job that may be cut into segments is priced at its estimate: its segments are planned
    and priced slot by slot (`policies.problem.segments`), and its one-piece price must compare."""
    spread = getattr(job, "length_spread", ())
    if not spread or getattr(job, "interruptible", None):
        return None
    m = np.asarray(spread, dtype=np.float64)
    return m if m.size and np.isfinite(m).all() and (m > 0).all() else None
