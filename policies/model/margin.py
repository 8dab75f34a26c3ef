"""How much longer than estimated a job may run before it misses its deadline: the margin a
plan keeps between a job's estimated end and its deadline.

A plan that starts a job at the last slot its *point* estimate allows misses the deadline
whenever the job runs a little longer than estimated, and carbon-aware plans do start jobs
late in their windows (that is where the clean hours are). So the last start of a job is
computed with its runtime stretched by the estimate's uncertainty:

    planned runtime for the deadline = runtime_s x (1 + Z x u)

where `u` is the relative uncertainty of *one run's* throughput on that GPU model:

* a profile learned from this cluster's runs (`Profile.samples` >= 2, `Profile.rel_spread`
  known): the runs' own spread, pooled with the prior as `PRIOR_RUNS` pseudo-runs, plus the
  standard error of the estimate itself (`Profile.rel_uncertainty`):
  u^2 = (PRIOR_RUNS x PRIOR^2 + n x spread^2) / (PRIOR_RUNS + n) + se^2
* a seed profile (public measurement or roofline scaling, never checked here) or a learned
  one with fewer than two runs: `PRIOR_REL_UNCERTAINTY`;
* a job without a profile (no workload class, or none for the model): no margin. Its runtime
  is the user's own `--est-runtime`, which its time limit already takes as a bound.
* a job whose runtime is an estimate with a learned error (`QueuedJob.runtime_rel_uncertainty`,
  from `policies.model.runtime_correction`: the spread of real / estimate over the runs of its
  class): that spread, combined with the profile's as independent errors,
  u = sqrt(u_profile^2 + u_estimate^2).

Z = 2 leaves about a 2.5 % chance (one-sided, normal in log space) that a job run at its
last start misses. The margin never turns a job that fits by its point estimate into a
flagged miss: at worst the job must start at its earliest slot (`latest_start_slots`).

Pure and vectorised like `policies.model.energy.shape_arrays`; `policies.problem.instance` (slot planners)
and `policies.solvers.short_jobs` (short-job packing) both take their deadlines through here, and the
daemon's planner and the simulator expect a *running* job's GPUs busy until its start +
planned runtime x `job_margin` (so a job planned behind one that overruns keeps its deadline).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from policies.model.learning import WINDOW
from policies.types import Profile, QueuedJob

Z = 2.0
# One run's relative runtime error against a seed profile, one sigma: the spread between
# public measurements and a given cluster's prompts, batch sizes and software (issue 19's
# noisy truth draws its systematic errors with sigma 0.3).
PRIOR_REL_UNCERTAINTY = 0.25
PRIOR_RUNS = 2.0  # the prior's weight against the runs, in runs
# A running job past its expected end is taken to free its GPUs this much later (at least):
# the daemon's planner and the simulator's GPUs (`scheduler.simulate.gpus`) both.
OVERRUN_BUSY_S = 60.0


def run_rel_uncertainty(profile: Profile | None) -> float:
    """The relative uncertainty of one run's runtime under `profile` (0: no profile, no margin)."""
    if profile is None:
        return 0.0
    spread = profile.rel_spread
    if profile.samples < 2 or not math.isfinite(spread):
        return PRIOR_REL_UNCERTAINTY
    n = float(min(profile.samples, WINDOW))
    se = profile.rel_uncertainty if math.isfinite(profile.rel_uncertainty) else 0.0
    return math.sqrt(pooled_variance(spread, n) + se ** 2)


def pooled_variance(spread: float, runs: float) -> float:
    """The variance of one run's relative error: the spread of `runs` runs pooled with the
    prior (PRIOR_REL_UNCERTAINTY) as PRIOR_RUNS pseudo-runs. The rule of the profiles' runs
    here and of the simulator's estimate classes (`scheduler.simulate.knowledge`)."""
    return (PRIOR_RUNS * PRIOR_REL_UNCERTAINTY ** 2 + runs * spread ** 2) / (PRIOR_RUNS + runs)


def runtime_margin(profile: Profile | None) -> float:
    """The factor (>= 1) a runtime estimated from `profile` is stretched by for its deadline."""
    return 1.0 + Z * run_rel_uncertainty(profile)


def estimate_rel_uncertainty(job: QueuedJob) -> float:
    """The learned relative error of `job`'s runtime estimate (0: none known)."""
    u = getattr(job, "runtime_rel_uncertainty", None)  # also the daemon's job rows
    return float(u) if u is not None and math.isfinite(u) and u > 0 else 0.0


def _combined(u_profile: float, u_estimate: float) -> float:
    if not u_estimate:
        return 1.0 + Z * u_profile
    return 1.0 + Z * math.sqrt(u_profile ** 2 + u_estimate ** 2)


def job_margin(job: QueuedJob, model: str, book, estimates: bool = True) -> float:
    """`runtime_margin` of `job` on `model` by the planner's `ProfileBook` (1: no profile),
    widened by the job's learned estimate error (`estimate_rel_uncertainty`) unless
    `estimates` is False (`Snapshot.estimate_margin`)."""
    profile = book.get(job.workload, model, seed=getattr(job, "seed_profile", None) is not None)
    u = run_rel_uncertainty(profile) if profile is not None and profile.prompts_per_s > 0 else 0.0
    return _combined(u, estimate_rel_uncertainty(job) if estimates else 0.0)


def latest_start_s(deadline_s: float, runtime_s: float, margin: float, earliest_s: float) -> float:
    """`latest_start_slots` for one job and option in continuous time (epoch seconds)."""
    return max(deadline_s - runtime_s * margin, min(earliest_s, deadline_s - runtime_s))


def margin_arrays(jobs: Sequence[QueuedJob], models: Sequence[str], book, estimates: bool = True) -> np.ndarray:
    """`job_margin` of every (job, model) pair, shape (jobs, models); `book` is the
    planner's `policies.model.energy.ProfileBook`."""
    out = np.ones((len(jobs), len(models)))
    by_workload: dict[tuple[str | None, bool], list[int]] = {}  # (workload, planned with its seed)
    for i, j in enumerate(jobs):
        by_workload.setdefault((j.workload, j.seed_profile is not None), []).append(i)
    learned = [i for i, j in enumerate(jobs) if estimate_rel_uncertainty(j)] if estimates else []
    for c, model in enumerate(models):
        for rows in by_workload.values():
            out[rows, c] = job_margin(replace(jobs[rows[0]], runtime_rel_uncertainty=None), model, book)
        for i in learned:
            out[i, c] = job_margin(jobs[i], model, book)
    return out


def duration_slots(runtime_s: np.ndarray, slot_s: float) -> np.ndarray:
    """Whole slots a run of `runtime_s` holds its GPUs for (at least one; a run that ends
    inside a slot holds all of it): the one rule for `Problem.job_duration` and the runs a
    power limit stretches (`policies.problem.joint_caps`)."""
    return np.maximum(1, np.ceil(np.asarray(runtime_s) / slot_s - 1e-9)).astype(np.int64)


def latest_start_slots(deadline_s: np.ndarray, runtime_s: np.ndarray, margin: np.ndarray,
                       earliest_slot: np.ndarray, slot_s: float) -> np.ndarray:
    """The last start slot (floats, floored) that ends by the deadline with the margin, per
    (job, option); `deadline_s` is seconds from the planning origin per job (NaN: none, the
    caller bounds those). Where the margin empties a window that the point estimate leaves
    open, the earliest slot: start as soon as possible, not a flagged miss."""
    d = np.where(np.isnan(deadline_s), 0.0, deadline_s)[:, None]
    plain = np.floor((d - runtime_s) / slot_s + 1e-9)
    kept = np.floor((d - runtime_s * margin) / slot_s + 1e-9)
    return np.maximum(kept, np.minimum(earliest_slot[:, None].astype(np.float64), plain))
