"""Learning how wrong a cluster's runtime estimates are, per estimate class, from finished jobs.

A job whose length the planner knows only as an estimate (a user's request, a queue's mean, a
predictor's guess) runs its real length. Each finished job measures the ratio real / estimate;
the planner corrects the next estimates of the same *class* by the median of the recent ratios
and keeps a deadline margin from their spread (`policies.model.margin`):

    corrected estimate  = estimate x exp(median(log(real_i / estimate_i)))    (last `WINDOW` runs)
    relative spread     = expm1(1.4826 x MAD(log ratios))                      (one run's error)

A class is what is known when the job is submitted: its workload class (or none) and the
round value its estimate falls under (`estimate_class`: up to 30 min, 1 h, 2 h, 4 h, 12 h,
1 d, more), so a user who asks for "4 h" for 40-minute jobs is corrected apart from one whose
one-day jobs run a day. A class with fewer than `MIN_RUNS` runs borrows the pooled ratios of
every class of the same workload (then of all); with no run at all the estimate stands and its
uncertainty is unknown (None: the margin's prior). Why medians: a crashed run (ratio 0.01)
moves a mean a long way and a median not at all, as in `policies.model.learning`.

Pure: the caller (the simulator; the daemon's planner could do the same from its receipts)
keeps the ratios and applies the corrections to the jobs of a snapshot.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies.model.length_spread import spread_of

WINDOW = 25  # recent runs kept per class
SPREAD_WINDOW = 200  # recent runs whose quantiles make a class's length spread
MIN_RUNS = 3  # below this a class borrows the pooled ratios
CLASS_BOUNDS_S = (1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0)
CLASS_NAMES = ("<=30m", "<=1h", "<=2h", "<=4h", "<=12h", "<=1d", ">1d")


@dataclass(frozen=True)
class Correction:
    """What the runs of one class say: multiply estimates by `factor`; one run strays by
    `rel_spread` (relative, one sigma; NaN below two runs); `samples` runs behind it;
    `length_spread`: the corrected estimate's multipliers that sample the real length evenly
    (`policies.model.length_spread`; empty below its MIN_RUNS runs)."""

    factor: float = 1.0
    rel_spread: float = math.nan
    samples: int = 0
    length_spread: tuple[float, ...] = ()


NONE = Correction()


def estimate_class(workload: str | None, estimate_s: float) -> tuple[str, str]:
    """The class of a job by what is known at submit: (workload or '-', estimate bucket)."""
    return (workload or "-", CLASS_NAMES[bisect.bisect_left(CLASS_BOUNDS_S, estimate_s)])


def correction(log_ratios: Sequence[float]) -> Correction:
    """The correction of one class from its runs' log(real / estimate), oldest first."""
    values = list(log_ratios)[-WINDOW:]
    if not values:
        return NONE
    m = statistics.median(values)
    spread = math.nan
    if len(values) >= 2:
        spread = math.expm1(1.4826 * statistics.median(abs(v - m) for v in values))
    # the spread's tails need more runs than its median: the last SPREAD_WINDOW, as multipliers
    # of the corrected estimate (real length quantile = estimate x exp(quantile))
    return Correction(factor=math.exp(m), rel_spread=spread, samples=len(values),
                      length_spread=spread_of(list(log_ratios)[-SPREAD_WINDOW:], m))


def correction_for(key: tuple[str, str], runs: Mapping[tuple[str, str], Sequence[float]]) -> Correction:
    """The correction of class `key` from the runs of every class (`MIN_RUNS` rule above)."""
    own = runs.get(key, ())
    if len(own) >= MIN_RUNS:
        return correction(own)
    same_workload = [v for k, rs in runs.items() if k[0] == key[0] for v in list(rs)[-WINDOW:]]
    if len(same_workload) >= MIN_RUNS:
        return correction(same_workload)
    pooled = [v for rs in runs.values() for v in list(rs)[-WINDOW:]]
    return correction(pooled) if pooled else NONE
