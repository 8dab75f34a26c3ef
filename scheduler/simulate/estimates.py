"""How long the planner believes a job runs, as opposed to how long it really runs (`--estimate`).

A real cluster never knows a job's length: the planner plans with an *estimate*, the job runs
its real length. In the simulator the trace's runtime is the real length; an estimate model
decides what the planner is told instead. Only jobs whose length is given as a runtime
(`QueuedJob.est_runtime_s`, no prompt count) get an estimate: a job given as prompts of a
workload class has its work counted exactly, and how fast it runs is the truth's business
(`scheduler.simulate.truth`, `--truth`), which stays independent of the estimate, as does the
forecast (`--forecast`).

    exact           the planner is told the real runtime (what the simulator always did)
    class-mean      GAIA's knowledge: the mean runtime of the job's queue, with GAIA's two
                    queues split at 2 h (umassos/GAIA `src/task.py`: `TwoQueues.Short = 7200 s`,
                    `get_expected_time` returns the queue's `average_length`, the mean length of
                    the trace's jobs <= 2 h and >= 2 h, computed by `load_tasks` over the whole
                    trace, as done here)
    lognormal:SIGMA an independent error per job: real x exp(N(0, SIGMA)), seeded per job (a
                    median-unbiased estimate, e.g. a good runtime predictor)
    user:K          what users request: real x a factor drawn around K (lognormal, median K,
                    sigma `USER_SIGMA`, never below 1: a request under the real runtime would
                    have been killed at its time limit), rounded *up* to the round values people
                    type (`ROUND_VALUES_S`: 30 min, 1 h, 2 h, 4 h, 12 h, 1 d, then whole days).
                    Users' runtime estimates in HPC logs are well known to be inaccurate and to
                    cluster on round values (Lee, Schwartzman, Hardy, Snavely, "Are User Runtime
                    Estimates Inherently Inaccurate?", JSSPP 2004, LNCS 3277,
                    https://link.springer.com/chapter/10.1007/11407522_14; Mu'alem and Feitelson,
                    IEEE TPDS 12(6), 2001).

Draws are seeded by (seed, job id), so a job's estimate is the same whatever else is in the
trace and for every policy of a run. The simulator keeps the real job for execution and hands
the policies only the estimated one (`Simulation`; `tests/simulate/test_simulate_estimates.py`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from policies.types import QueuedJob

GAIA_SHORT_QUEUE_S = 7200.0  # GAIA's short queue: jobs up to 2 h (umassos/GAIA src/task.py)
ROUND_VALUES_S = (1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0)  # 30 min ... 1 d
USER_SIGMA = 0.5  # spread of users' over-request factor around K (log space, one sigma)
KINDS = ("exact", "class-mean", "lognormal", "user")


class EstimateError(ValueError):
    """A --estimate spec that cannot be used; the message says why."""


def round_up_request(runtime_s: float) -> float:
    """The smallest round value people type (30 min, 1 h, 2 h, 4 h, 12 h, 1 d, whole days
    beyond) that is at least `runtime_s`."""
    for value in ROUND_VALUES_S:
        if runtime_s <= value:
            return value
    return math.ceil(runtime_s / 86400.0) * 86400.0


def gaia_queue(runtime_s: float) -> str:
    """GAIA's queue of a job by its length: 'short' (< 2 h) or 'long'."""
    return "short" if runtime_s < GAIA_SHORT_QUEUE_S else "long"


@dataclass(frozen=True)
class EstimateModel:
    """One estimate model (module docstring); `estimates` maps real runtimes to estimates."""

    spec: str = "exact"
    kind: str = "exact"
    sigma: float = 0.0
    k: float = 1.0
    seed: int = 0

    def _rng(self, job_id: int) -> random.Random:
        return random.Random(f"estimate-{self.kind}-{self.seed}-{job_id}")

    def user_factor(self, job_id: int) -> float:
        """`user:K`'s over-request factor of one job before rounding (>= 1, median K)."""
        return max(1.0, self.k * math.exp(self._rng(job_id).gauss(0.0, USER_SIGMA)))

    def estimates(self, ids: Sequence[int], runtimes_s: Sequence[float]) -> list[float]:
        """The estimated runtime of each job (`ids[i]` with real `runtimes_s[i]`)."""
        if self.kind == "exact":
            return [float(r) for r in runtimes_s]
        if self.kind == "class-mean":
            means = class_means(runtimes_s)
            return [means[gaia_queue(r)] for r in runtimes_s]
        if self.kind == "lognormal":
            return [r * math.exp(self._rng(i).gauss(0.0, self.sigma)) for i, r in zip(ids, runtimes_s)]
        if self.kind == "user":
            return [round_up_request(r * self.user_factor(i)) for i, r in zip(ids, runtimes_s)]
        raise EstimateError(f"unknown estimate kind {self.kind!r}")

    def apply(self, jobs: Sequence[QueuedJob]) -> list[QueuedJob]:
        """The jobs as the planner sees them: each runtime-given job's `est_runtime_s`
        replaced by its estimate (others, and every job under `exact`, unchanged)."""
        if self.kind == "exact":
            return list(jobs)
        rows = [i for i, j in enumerate(jobs) if estimated(j)]
        values = self.estimates([jobs[i].id for i in rows], [float(jobs[i].est_runtime_s) for i in rows])
        out = list(jobs)
        for i, value in zip(rows, values):
            out[i] = replace(jobs[i], est_runtime_s=max(1.0, value))
        return out


def estimated(job: QueuedJob) -> bool:
    """Whether an estimate model applies to `job`: its length is a runtime, not prompts."""
    return job.est_runtime_s is not None and job.est_runtime_s > 0 and not job.prompts


def class_means(runtimes_s: Sequence[float]) -> dict[str, float]:
    """GAIA's queue means over a trace: the mean length of the jobs <= 2 h ('short') and of
    those >= 2 h ('long'), as GAIA's `load_tasks` computes them (a job of exactly 2 h counts
    in both means and is in the long queue). A queue without jobs takes the other's mean."""
    short = [r for r in runtimes_s if r <= GAIA_SHORT_QUEUE_S]
    long = [r for r in runtimes_s if r >= GAIA_SHORT_QUEUE_S]
    means = {"short": sum(short) / len(short) if short else math.nan,
             "long": sum(long) / len(long) if long else math.nan}
    for a, b in (("short", "long"), ("long", "short")):
        if math.isnan(means[a]):
            means[a] = means[b] if not math.isnan(means[b]) else GAIA_SHORT_QUEUE_S
    return means


def parse_estimate(spec: str | None, *, seed: int = 0) -> EstimateModel:
    """`exact`, `class-mean`, `lognormal:SIGMA` or `user:K` (module docstring)."""
    spec = (spec or "exact").strip()
    kind, _, arg = spec.partition(":")
    if kind in ("exact", "class-mean") and not arg:
        return EstimateModel(spec, kind, seed=seed)
    if kind in ("lognormal", "user"):
        try:
            value = float(arg)
        except ValueError:
            example = "lognormal:0.5" if kind == "lognormal" else "user:3"
            raise EstimateError(f"--estimate {kind}:{'SIGMA' if kind == 'lognormal' else 'K'} needs a number, "
                                f"e.g. {example} (got {spec!r})") from None
        if kind == "lognormal":
            if not 0.0 <= value <= 3.0:
                raise EstimateError(f"--estimate lognormal:SIGMA: SIGMA must be between 0 and 3 (got {value:g})")
            return EstimateModel(spec, kind, sigma=value, seed=seed)
        if not 1.0 <= value <= 100.0:
            raise EstimateError(f"--estimate user:K: K must be between 1 and 100 (got {value:g})")
        return EstimateModel(spec, kind, k=value, seed=seed)
    raise EstimateError(f"unknown --estimate {spec!r}: use exact, class-mean, lognormal:SIGMA or user:K")
