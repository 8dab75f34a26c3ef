"""The `Job` type: a stored job as the planner reads it, and its one mapping to the policies'
`QueuedJob`; the `RunningJob` type: a running job as its node agent reads it.

A `Job` holds the columns of the `jobs` table a planning tick reads (named as the columns
are, units in the names), built from a row by `job_from_row` alone. It is a NamedTuple, not a
dataclass: a tick builds thousands of them, and a tuple is built several times faster,
while being as immutable and as typed. `queued_job` is the one place a stored job (or a
request about to be stored, `job_from_request`) becomes the policies' `QueuedJob`, so the
API's admission check and the planner judge the same job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import NamedTuple

from policies.types import QueuedJob
from scheduler import interruptible
from scheduler.lifecycle import State
from scheduler.qos import Qos


class Job(NamedTuple):
    """A stored job's queue columns: a PENDING or PLANNED job as the planner reads it each tick."""

    id: int
    state: str
    gpus: int
    gpu_mem_gib: float
    submitted_at: datetime
    est_runtime_s: float | None
    deadline: datetime | None
    latency_slo_ms: float | None
    workload: str | None
    prompts: int | None
    planned_node: str | None
    planned_gpu_ids: list | None
    planned_start: datetime | None
    plan_rev: int
    reason: str | None
    max_delay_s: float | None
    est_gco2: float | None
    deadline_miss: bool | None
    time_limit_s: float | None
    time_limit_factor: float | None  # set: the limit is derived and follows the plan
    est_gco2_if_now: float | None  # the counterfactual fixed when the job was first planned
    ttft_slo_ms: float | None
    tpot_slo_ms: float | None
    planned_max_batch: int | None
    planned_precision: str | None
    planned_tp: int | None
    planned_power_limit_w: float | None
    # Interruptible jobs.
    interruptible: str | None
    min_run_s: float | None
    resume_cost_s: float | None
    max_segments: int | None
    done_fraction: float | None
    resume_count: int | None
    checkpoints_ignored: int | None
    planned_segments: list | None
    # Who it is charged to (fair share) and its QOS (priority, and how far carbon may move it).
    account: str | None
    qos: str | None
    owner_name: str | None


class RunningJob(NamedTuple):
    """A job RUNNING on a node as its agent reads it each tick (`scheduler.jobs.store.running_jobs`):
    what a stop, a power limit, a run's end and an interruptible job's segments need."""

    id: int
    cancel_requested_at: datetime | None
    cancel_requested_by: int | None
    max_retries: int
    attempts: int
    gpu_ids: list | None
    started_at: datetime | None
    gpus: int
    power_limit_w: float | None
    planned_power_limit_w: float | None
    power_limit_note: str | None
    # Interruptible jobs.
    interruptible: str | None
    resume_count: int | None
    done_fraction: float | None
    resume_cost_s: float | None
    est_runtime_planned_s: float | None
    est_runtime_s: float | None
    planned_segments: list | None
    prompts: int | None
    checkpoints_ignored: int | None
    slurm_job_id: int | None  # a Slurm job of its own (adopted from a user's sbatch, or observed)


# The columns SQLite hands back as raw text when the queue is read fast (`job_from_row(raw=True)`).
RAW_TIMES = frozenset({"submitted_at", "deadline", "planned_start"})
RAW_JSON = frozenset({"planned_gpu_ids"})


def job_from_row(r: Sequence, raw: bool = False) -> Job:
    """The `Job` of a row holding `Job._fields` in order. `raw`: the times and JSON came back
    as SQLite's text (read so for speed, `scheduler.jobs.store.read_queue`) and are parsed
    here with the C parsers."""
    if raw:
        return Job(r[0], r[1], r[2], r[3], _utc(r[4]), r[5], _utc(r[6]), r[7], r[8], r[9],
                   r[10], json.loads(r[11]) if r[11] else None, _utc(r[12]), *r[13:])
    return Job(*r)


def job_from_request(row: Mapping) -> Job:
    """A request's job row (`scheduler.daemon.submit_checks.job_row`), not yet stored, as a
    `Job`: id 0, PENDING, never planned; what admission judges."""
    values = {**row, "id": 0, "state": State.PENDING.value, "plan_rev": 0}
    return Job(**{name: values.get(name) for name in Job._fields})


def _utc(text: str | None) -> datetime | None:
    """A stored naive-UTC SQLite timestamp as an aware datetime."""
    return None if text is None else datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


def queued_job(job: Job, default_runtime_s: float, *, now: datetime | None = None, pinned: bool = False,
               as_one_piece: bool = False, priority: float = 0.0, qos: Qos | None = None) -> QueuedJob:
    """The job as the policies see it. Its runtime is the one it is planned with
    (`policies.pricing.feasibility.planning_runtime_s`); an explicit --time-limit binds the plan, a
    derived one follows it. `now`: a job submitted after the tick's clock was read (a loaded
    host, a row committed between the clock and the query) is released now, not at the next
    slot its later submission time would round up to. `as_one_piece`: leave its
    interruptible fields out (admission asks whether any GPU can run the job at all).
    `priority` and `qos`: its standing (`scheduler.standing`) and what its QOS lets carbon do
    with it (`Qos.carbon_bounds`); None: no bounds."""
    from policies.pricing.feasibility import planning_runtime_s

    return QueuedJob(job.id, job.gpus, job.gpu_mem_gib,
                     job.submitted_at if now is None else min(job.submitted_at, now),
                     planning_runtime_s(job.est_runtime_s, job.time_limit_s, default_runtime_s),
                     job.deadline, job.latency_slo_ms, job.workload, job.prompts,
                     max_delay_s=job.max_delay_s, pinned=pinned,
                     time_limit_s=job.time_limit_s if job.time_limit_factor is None else None,
                     time_limit_factor=job.time_limit_factor, gco2_if_now=job.est_gco2_if_now,
                     ttft_slo_ms=job.ttft_slo_ms, tpot_slo_ms=job.tpot_slo_ms, priority=priority,
                     **({} if qos is None else qos.carbon_bounds(job.deadline is not None or job.max_delay_s is not None)),
                     **({} if as_one_piece else _interruptible_fields(job)))


def _interruptible_fields(job: Job) -> dict:
    """The interruptible fields of a queued job as the policy sees them. A job that ignored a
    checkpoint request runs its rest in one piece: asking it again would lose its work again."""
    kind = job.interruptible if not job.checkpoints_ignored else None
    if kind is None:
        return {"done_fraction": float(job.done_fraction or 0.0), "resume_count": int(job.resume_count or 0),
                "resume_cost_s": float(job.resume_cost_s or 0.0) if job.resume_count else 0.0}
    return {"interruptible": kind, "min_run_s": job.min_run_s, "resume_cost_s": float(job.resume_cost_s or 0.0),
            "max_segments": int(job.max_segments or interruptible.DEFAULT_MAX_SEGMENTS),
            "done_fraction": float(job.done_fraction or 0.0), "resume_count": int(job.resume_count or 0)}
