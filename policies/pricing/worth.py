"""When carbon may move a job's start, and when moving it is worth it.

Two settings of a job (`QueuedJob.max_defer_s`, `min_saving_gco2`, `min_saving_frac`) bound
what a carbon-aware policy may do with it, beside its deadline and maximum delay:

* **how far**: at most `max_defer_s` past the earliest start the job could have on fitting
  GPUs (given running work and what jobs of higher priority hold); 0 is the urgent lane,
  started on the first free fitting GPUs and never held for carbon;
* **whether at all**: a later start is worth it only where it saves at least
  `min_saving_gco2` grams AND `min_saving_frac` of the grams of that earliest start
  (a 5 s job with idle GPUs is not held 79 minutes to save 0.08 g).

The defaults (None, 0, 0) leave every policy as it was: `bounded` is False and nothing here
is asked. The policies apply the rules where they choose a start: greedy's slot search
(`policies.solvers.greedy.place_job`), the short-job packer (`policies.solvers.short_jobs`), edf's
pool choice, and cpsat, which places bounded jobs with greedy's rule before its search
(`policies.solvers.priority`).
"""

from __future__ import annotations

from policies.types import QueuedJob


def bounded(job: QueuedJob) -> bool:
    """Whether the job limits carbon's freedom at all (a deferral bound or a saving threshold)."""
    return job.max_defer_s is not None or job.min_saving_gco2 > 0 or job.min_saving_frac > 0


def has_threshold(job: QueuedJob) -> bool:
    """Whether a later start must save a least amount to be taken."""
    return job.min_saving_gco2 > 0 or job.min_saving_frac > 0


def latest_deferred_s(job: QueuedJob, earliest_s: float) -> float:
    """The last start carbon may choose, given the job's earliest start `earliest_s` (any
    clock, seconds): unbounded (inf) without `max_defer_s`."""
    if job.max_defer_s is None:
        return float("inf")
    return earliest_s + max(0.0, float(job.max_defer_s))


def worth_deferring(job: QueuedJob, gco2_earliest: float | None, gco2_later: float | None) -> bool:
    """Whether starting later for `gco2_later` grams instead of `gco2_earliest` at the
    earliest start saves enough (both thresholds met). Unknown grams: the later start stands
    (nothing to compare, the policy's own choice)."""
    if not has_threshold(job) or gco2_earliest is None or gco2_later is None:
        return True
    saving = gco2_earliest - gco2_later
    return saving > 0 and saving >= job.min_saving_gco2 and saving >= job.min_saving_frac * gco2_earliest
