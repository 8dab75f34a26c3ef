"""What the simulated planner knows of jobs and GPUs, and learns as jobs finish.

- **Profiles**: the workload profiles the energy model plans with (`policies.model.energy`); with
  `SimSettings.learn` each finished job's measured runtime and energy are folded into them
  (`policies.model.learning`), as the daemon's agents do. The truth stays anchored on the
  scenario's own profiles (`base_book`).
- **Estimate correction** (`SimSettings.correct_estimates`): each finished runtime-given
  job's real / estimated runtime is learned per estimate class
  (`policies.model.runtime_correction`); later estimates of the class are scaled by the median
  ratio and carry its spread (`QueuedJob.runtime_rel_uncertainty`) and the quantiles of its
  ratios (`QueuedJob.length_spread`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from policies.model.energy import ProfileBook, job_shape, seed_profiles
from policies.model.margin import PRIOR_REL_UNCERTAINTY, job_margin, pooled_variance
from policies.types import QueuedJob
from policies.model.runtime_correction import correction_for, estimate_class
from scheduler.simulate.estimates import estimated
from scheduler.simulate.records import JobRecord


class Knowledge:
    """The planner's profiles and estimate corrections over one simulation run."""

    def __init__(self, profiles: tuple, *, default_runtime_s: float, estimate_margin: bool,
                 price_length_spread: bool, correct: bool) -> None:
        self.profiles = tuple(profiles) or seed_profiles()
        self.book = ProfileBook(self.profiles)
        self._seeds = {(p.workload, p.model): p for p in self.profiles}
        self.base_book = self.book  # what the truth is relative to (learning changes self.book)
        self._runs: dict[tuple[str, str], list] = {}  # (workload, model) -> learning.Run, oldest first
        self.learned = 0
        self.default_runtime_s = default_runtime_s
        self.estimate_margin = estimate_margin
        self.price_length_spread = price_length_spread
        self.correct = correct
        self._est_runs: dict[tuple[str, str], list[float]] = {}  # estimate class -> log(real / estimate)
        self._est_version = 0  # bumps when a ratio is learned: seen jobs are corrected again
        self._seen_version: dict[int, int] = {}  # record index -> the version its `job` reflects
        self._shapes: dict[tuple[int, str, float | None], object] = {}

    def margin(self, r: JobRecord) -> float:
        """The deadline margin of a committed job's planned runtime on its GPUs (`policies.model.margin`)."""
        return job_margin(r.job, r.model, self.book, self.estimate_margin)

    def seen(self, idx: int, r: JobRecord) -> QueuedJob:
        """The job of record `r` (index `idx`) as the planner sees it now: its estimate,
        corrected by what the runs of its estimate class taught (`policies.model.runtime_correction`)."""
        if not self.correct or self._seen_version.get(idx) == self._est_version:
            return r.job
        self._seen_version[idx] = self._est_version
        base = r.estimated_job or r.job
        if not estimated(base):
            return r.job
        c = correction_for(estimate_class(base.workload, base.est_runtime_s), self._est_runs)
        spread = c.rel_spread if c.samples >= 2 and math.isfinite(c.rel_spread) else PRIOR_REL_UNCERTAINTY
        # one run's error, pooled with the prior as PRIOR_RUNS pseudo-runs (policies.model.margin's
        # rule; every run of the class counts, no window, and no standard error is added)
        u = math.sqrt(pooled_variance(spread, float(c.samples)))
        r.correction = c.factor
        r.job = replace(base, est_runtime_s=max(1.0, base.est_runtime_s * c.factor), runtime_rel_uncertainty=u,
                        length_spread=c.length_spread if self.price_length_spread else ())
        return r.job

    def shape(self, job: QueuedJob, model: str):
        """The job's planned runtime and power on `model` (`policies.model.energy.job_shape`), cached."""
        key = (job.id, model, job.est_runtime_s)  # a corrected estimate is another shape
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = job_shape(job, model, self.book, self.default_runtime_s)
        return shape

    def longest_runtime(self, job: QueuedJob, models: set[str]) -> float:
        """The job's planned runtime on the slowest of `models`."""
        return max(self.shape(job, m).runtime_s for m in models)

    def learn(self, r: JobRecord, workload_of: Callable[[int], str | None]) -> None:
        """Fold a finished job's measured runtime and energy into the profiles the planner
        uses, as the daemon's agents do (only jobs with a workload class and prompts teach).
        `workload_of(job_id)`: the workload of a job, whose cached shapes a lesson drops."""
        from policies.model.energy import seed_equivalent_run
        from policies.model.learning import Run, learned_by_model

        job = r.job
        run_s = (r.end_s or 0.0) - (r.start_s or 0.0)
        if not job.workload or not job.prompts or run_s < 1.0 or r.model is None:
            return
        if r.power_limit_w is not None:
            return  # runs at a power limit are kept out of the default-limit profiles
        runs = self._runs.setdefault((job.workload, r.model), [])
        runs.append(seed_equivalent_run(job, r.model, Run.of(gpus=max(1, job.gpus), runtime_s=run_s,
                                                             energy_j=r.energy_j, prompts=job.prompts)))
        learned = {(job.workload, m): p for m, p in learned_by_model(
            job.workload, {m: rs for (w, m), rs in self._runs.items() if w == job.workload}, self._seeds).items()}
        self.profiles = tuple(learned.values()) + tuple(p for p in self.profiles
                                                       if (p.workload, p.model) not in learned)
        self.book = ProfileBook(self.profiles)
        self._shapes = {k: v for k, v in self._shapes.items() if workload_of(k[0]) != job.workload}
        self.learned += 1

    def learn_estimate(self, r: JobRecord) -> None:
        """Fold a finished runtime-given job's real / estimated runtime into its estimate class."""
        base = r.estimated_job or r.job
        if not estimated(base) or r.planned_runtime_s <= 0 or r.end_s is None or r.start_s is None:
            return
        # planned_runtime_s is the corrected estimate on the job's GPUs: undo the correction
        ratio = (r.end_s - r.start_s) / r.planned_runtime_s * r.correction
        if ratio <= 0:
            return
        self._est_runs.setdefault(estimate_class(base.workload, base.est_runtime_s), []).append(math.log(ratio))
        self._est_version += 1
