"""Multifactor job priority: who gets contested GPUs first, before carbon chooses when and where.

Slurm-like (its priority/multifactor plugin): each pending job's priority is a weighted sum
of factors between 0 and 1,

    priority = w_fair_share * F  +  w_qos * Q  +  w_age * A  +  w_job_size * Z

- F, fair share: the job's (account, user) factor from `scheduler.fair_share` (2^(-U_E/S)).
- Q, QOS: the job's QOS priority / the highest QOS priority configured (0 if all are 0).
- A, age: time waited since the job became eligible / max age, capped at 1 (max age 7 days
  by default, Slurm's PriorityMaxAge default).
- Z, job size: GPUs asked / GPUs in the fleet, capped at 1: larger jobs rank higher, Slurm's
  default (PriorityFavorSmall=NO), because a job that needs many GPUs free at once is the one
  that small jobs would otherwise pass for ever. `favor_small=True` gives 1 - (gpus-1)/fleet.

The default weights (`PriorityWeights`) put the QOS factor above the whole fair-share range,
then fair share; age and size weigh nothing unless the operator says so:

- **QOS 20000 above fair share 10000**: with the built-in QOS priorities (`scheduler.qos`:
  urgent 100, normal 10, flexible 0, factors 1, 0.1 and 0) an `urgent` job's QOS component
  alone (20000) is above any `normal` job's whole priority (at most 2000 + 10000): the urgent
  lane ranks above all other work whatever the accounts' usage, and fair share orders the
  jobs inside it. Slurm sites give a high-priority lane a QOS weight above the fair-share
  weight for the same reason: a lane that is never deferred for carbon must also not queue
  behind normal work, or its latency depends on who else floods the queue. The lane cannot
  be abused to take another account's share: urgent jobs are charged 1.5x their usage (the
  account's fair share falls faster, so its urgent jobs come after the other accounts'
  urgent jobs, and all its jobs of the other levels after theirs), and the QOS's own limits (queued jobs per user; GPUs running per user where the
  site sets it) keep the lane short. The 8000 points to spare keep it so when an operator
  gives age and size weights below 8000 together.
- **Fair share 10000** orders the accounts within a QOS level, and between `normal` and
  `flexible` (a QOS step of 0.1, 2000 points, worth a fair-share gap of 0.2): a flooding
  account never delays another account's job of its own level beyond what its share allows,
  and its `normal` jobs do not starve another account's `flexible` ones (flexible is the
  lane carbon may move; ranking it strictly last would punish the work that accepts
  deferral). An account that has used twice its share or more (F <= 0.25) never outranks an
  account with no usage (F = 1) at the same QOS, and its `normal` jobs come after the other
  account's `flexible` ones (4500 against 10000; so while age and size weigh under 5500).
- **Age 0 and job size 0** (as in Slurm, whose weights all default to 0): the planner treats
  each distinct priority as a tier that no lower tier may delay, and carbon chooses only
  within a tier. Age and size would make every job a tier of its own: a job could then
  never be moved behind a later one for carbon, and the planner would plan thousands of
  tiers one by one. A job's wait is bounded by its deadline and its QOS's deferral limit
  instead. A site that wants first come, first served among equals sets `age` (a full week
  of waiting is worth `age` points).

Carbon then chooses GPU model, zone, start and power limit within what this order allows.
Times are seconds since the epoch; nothing here reads a clock, the store or a file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

DEFAULT_MAX_AGE_S = 7 * 86400.0

FactorOf = Callable[[str, str], float]  # (account, user) -> fair-share factor, e.g. FairShare.factor


@dataclass(frozen=True)
class PriorityWeights:
    """The weight of each factor, and how the age and size factors are measured (defaults
    and why: the module's docstring)."""

    fair_share: float = 10000.0
    qos: float = 20000.0
    age: float = 0.0
    job_size: float = 0.0
    max_age_s: float = DEFAULT_MAX_AGE_S
    favor_small: bool = False

    def __post_init__(self) -> None:
        for name in ("fair_share", "qos", "age", "job_size"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"priority weight {name} must be a finite number >= 0, got {value!r}")
        if not (isinstance(self.max_age_s, (int, float)) and self.max_age_s > 0 and math.isfinite(self.max_age_s)):
            raise ValueError(f"priority max age must be a finite number of seconds > 0, got {self.max_age_s!r}")


@dataclass(frozen=True)
class PriorityJob:
    """What priority needs of one pending job: who is charged, at which QOS, how many GPUs,
    and since when it has been eligible to start (its submit time, or a later begin time)."""

    job_id: int | str
    account: str
    user: str
    qos: str
    gpus: int
    eligible_at_s: float


@dataclass(frozen=True)
class PriorityBreakdown:
    """One job's priority and its components, like a line of sprio: the weighted components
    (which sum to `priority`) and the factors (0..1) they come from."""

    job_id: int | str
    account: str
    user: str
    qos: str
    priority: float
    fair_share: float
    qos_component: float
    age: float
    job_size: float
    fair_share_factor: float
    qos_factor: float
    age_factor: float
    job_size_factor: float
    eligible_at_s: float

    def to_dict(self) -> dict[str, object]:
        """JSON-ready; `qos` is the QOS name, its weighted component is `qos_priority`."""
        return {"job_id": self.job_id, "account": self.account, "user": self.user, "qos": self.qos,
                "priority": self.priority, "fair_share": self.fair_share, "qos_priority": self.qos_component,
                "age": self.age, "job_size": self.job_size, "fair_share_factor": self.fair_share_factor,
                "qos_factor": self.qos_factor, "age_factor": self.age_factor,
                "job_size_factor": self.job_size_factor}

    def order_key(self) -> tuple[float, float, str]:
        """Sorts the queue as Slurm does: higher priority first, then the earlier eligible,
        then the lower job id (as text, zero-padded when numeric)."""
        job = f"{self.job_id:020d}" if isinstance(self.job_id, int) else str(self.job_id)
        return (-self.priority, self.eligible_at_s, job)


def age_factor(waited_s: float, max_age_s: float = DEFAULT_MAX_AGE_S) -> float:
    """Time waited / max age, capped at 1; 0 for a job not yet eligible."""
    return min(1.0, max(0.0, waited_s) / max_age_s)


def job_size_factor(gpus: int, fleet_gpus: int, favor_small: bool = False) -> float:
    """GPUs / fleet GPUs, capped at 1 (larger first, Slurm's default); with `favor_small`,
    1 - (gpus - 1) / fleet GPUs, so a 1-GPU job gets 1. 0 where the fleet has no GPUs."""
    if gpus < 1:
        raise ValueError(f"a job asks for at least 1 GPU, got {gpus!r}")
    if fleet_gpus <= 0:
        return 0.0
    if favor_small:
        return max(0.0, 1.0 - (gpus - 1) / fleet_gpus)
    return min(1.0, gpus / fleet_gpus)


class QosFactors:
    """QOS priority / the highest QOS priority, from the configured levels' priorities."""

    def __init__(self, qos_priority: Mapping[str, float]) -> None:
        for name, p in qos_priority.items():
            if not isinstance(p, (int, float)) or not math.isfinite(p) or p < 0:
                raise ValueError(f"QOS {name!r}: priority must be a finite number >= 0, got {p!r}")
        top = max(qos_priority.values(), default=0)
        self._factors = {name: (p / top if top > 0 else 0.0) for name, p in qos_priority.items()}

    def __call__(self, qos: str) -> float:
        try:
            return self._factors[qos]
        except KeyError:
            raise ValueError(f"unknown QOS {qos!r}; known: {', '.join(sorted(self._factors)) or 'none'}") from None


def _breakdown(job: PriorityJob, fs: float, q: float, now_s: float, fleet_gpus: int,
               w: PriorityWeights) -> PriorityBreakdown:
    a = age_factor(now_s - job.eligible_at_s, w.max_age_s)
    z = job_size_factor(job.gpus, fleet_gpus, w.favor_small)
    parts = (w.fair_share * fs, w.qos * q, w.age * a, w.job_size * z)
    return PriorityBreakdown(job.job_id, job.account, job.user, job.qos, sum(parts), *parts, fs, q, a, z,
                             job.eligible_at_s)


def priority_of(job: PriorityJob, *, now_s: float, fair_share_factor: float, qos_priority: Mapping[str, float],
                fleet_gpus: int, weights: PriorityWeights = PriorityWeights()) -> PriorityBreakdown:
    """One job's priority and components (for a `priority` view like sprio)."""
    if not 0.0 <= fair_share_factor <= 1.0:
        raise ValueError(f"a fair-share factor lies in [0, 1], got {fair_share_factor!r}")
    return _breakdown(job, fair_share_factor, QosFactors(qos_priority)(job.qos), now_s, fleet_gpus, weights)


def queue_priorities(jobs: Iterable[PriorityJob], *, now_s: float, fair_share: FactorOf | None,
                     qos_priority: Mapping[str, float], fleet_gpus: int,
                     weights: PriorityWeights = PriorityWeights()) -> list[PriorityBreakdown]:
    """Every pending job's priority, highest first (`PriorityBreakdown.order_key`).

    `fair_share` maps (account, user) to a factor, e.g. `FairShare(tree, usage).factor` built
    once per tick; each association is asked once, however many jobs it has queued. None:
    fair share off, every job's fair-share factor 0 (order by QOS, age, size).
    """
    qos = QosFactors(qos_priority)
    factors: dict[tuple[str, str], float] = {}
    out = []
    for job in jobs:
        key = (job.account, job.user)
        fs = factors.get(key)
        if fs is None:
            fs = factors[key] = 0.0 if fair_share is None else fair_share(*key)
        out.append(_breakdown(job, fs, qos(job.qos), now_s, fleet_gpus, weights))
    out.sort(key=PriorityBreakdown.order_key)
    return out
