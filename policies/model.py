"""Plain, frozen data that flows into and out of a policy.

A policy sees only these types. Times are timezone-aware UTC datetimes; durations are
seconds in fields named `*_s`; memory is GiB in fields named `*_gib`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting for GPUs (PENDING, or PLANNED but not yet started)."""

    id: int
    gpus: int
    gpu_mem_gib: float
    submitted_at: datetime
    est_runtime_s: float | None = None
    deadline: datetime | None = None
    latency_slo_ms: float | None = None
    workload: str | None = None
    prompts: int | None = None


@dataclass(frozen=True)
class GpuSlot:
    """One GPU as the planner sees it: where it is, what it is, and when it is next free."""

    id: int
    node: str
    zone: str
    index: int
    model: str
    memory_gib: float
    healthy: bool = True
    busy_until: datetime | None = None  # None: free now


@dataclass(frozen=True)
class Estimate:
    """What a policy expects an assignment to cost; None where it cannot tell yet."""

    finish_at: datetime | None = None
    energy_j: float | None = None
    gco2: float | None = None
    gco2_if_now: float | None = None


@dataclass(frozen=True)
class Assignment:
    """One job placed on a set of GPUs of one node, to start at `start_at`."""

    job_id: int
    node: str
    gpu_ids: tuple[int, ...]
    start_at: datetime
    estimate: Estimate = field(default_factory=Estimate)
    explanation: str = ""


@dataclass(frozen=True)
class Snapshot:
    """Everything a policy may look at: the queue, the GPUs and the current time."""

    now: datetime
    jobs: tuple[QueuedJob, ...]
    gpus: tuple[GpuSlot, ...]
    default_runtime_s: float = 3600.0


@dataclass(frozen=True)
class Plan:
    """A policy's answer: assignments for the jobs it could place, reasons for the rest."""

    assignments: tuple[Assignment, ...] = ()
    unplaced: dict[int, str] = field(default_factory=dict)

    def by_job(self) -> dict[int, Assignment]:
        return {a.job_id: a for a in self.assignments}
