"""Job states and the one table of allowed transitions.

Every state change goes through `transition`, which is a conditional UPDATE (so two
processes racing for the same job cannot both win) plus its `job_events` row, in the
caller's transaction.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update

from scheduler.clock import utcnow
from scheduler.store.models import gpu_instances, gpus, job_events, jobs


class State(enum.StrEnum):
    PENDING = "PENDING"
    PLANNED = "PLANNED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    LOST = "LOST"


TERMINAL = frozenset({State.COMPLETED, State.FAILED, State.CANCELLED, State.TIMEOUT, State.LOST})
ACTIVE = frozenset({State.PENDING, State.PLANNED, State.RUNNING})

# from-state -> the states it may move to. Nothing leaves a terminal state.
TRANSITIONS: dict[State, frozenset[State]] = {
    State.PENDING: frozenset({State.PLANNED, State.CANCELLED, State.FAILED}),
    # PLANNED -> PENDING: the planner withdrew the plan (GPU gone, node down).
    State.PLANNED: frozenset({State.PENDING, State.RUNNING, State.CANCELLED, State.FAILED}),
    # RUNNING -> PENDING: never launched (the daemon died between claim and launch), or the
    # job was lost and its owner allowed retries.
    State.RUNNING: frozenset(
        {State.COMPLETED, State.FAILED, State.CANCELLED, State.TIMEOUT, State.LOST, State.PENDING}
    ),
    **{s: frozenset() for s in TERMINAL},
}


class TransitionError(ValueError):
    """A transition the lifecycle table does not allow."""


def check_allowed(src: State, dst: State) -> None:
    """Raise TransitionError unless the table allows src -> dst (for bulk writers)."""
    if dst not in TRANSITIONS[src]:
        raise TransitionError(f"{src} -> {dst} is not an allowed transition")


def allowed_sources(to: State) -> list[State]:
    return [src for src, dests in TRANSITIONS.items() if to in dests]


def transition(
    conn: Connection,
    job_id: int,
    to: State,
    *,
    actor_uid: int | None,
    reason: str,
    expect: State | tuple[State, ...] | None = None,
    where: tuple = (),
    values: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> bool:
    """Move one job to `to` if its current state allows it; record the event.

    `expect` narrows the accepted source states; `where` adds conditions (e.g. a plan
    revision). Returns False, changing nothing, when the job is not in an accepted state.
    """
    sources = allowed_sources(to)
    if expect is not None:
        wanted = (expect,) if isinstance(expect, State) else tuple(expect)
        bad = [s for s in wanted if s not in sources]
        if bad:
            raise TransitionError(f"{'/'.join(bad)} -> {to} is not an allowed transition")
        sources = list(wanted)
    if not sources:
        raise TransitionError(f"nothing may move to {to}")
    at = at or utcnow()
    # Read the current state inside the same transaction to record where the job came from.
    # Another transaction may move the job between that read and the update (PostgreSQL's read
    # committed: the planner turning PENDING into PLANNED under a cancel); then read again, and
    # go on while the job is still in an accepted state.
    for _ in range(3):
        current = conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar_one_or_none()
        if current is None or current not in sources:
            return False
        result = conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.state == current, *where)
            .values(state=to.value, reason=reason, **(values or {}))
        )
        if result.rowcount == 1:
            break
    else:
        return False
    conn.execute(
        insert(job_events).values(
            job_id=job_id, from_state=current, to_state=to.value, actor_uid=actor_uid,
            reason=reason, at=at,
        )
    )
    return True


# Where a job ran or was planned to run: cleared when it goes back to the queue.
UNPLACED: dict[str, None] = dict(node=None, gpu_ids=None, gpu_indices=None, planned_node=None,
                                 planned_gpu_ids=None, planned_start=None, gpu_instance=None)


def end_run(conn: Connection, job_id: int, to: State, *, actor_uid: int | None, reason: str,
            values: dict[str, Any] | None = None) -> bool:
    """Move a RUNNING job on (to an end state, or back to the queue) and free its GPUs and
    the GPU slice it held."""
    ok = transition(conn, job_id, to, actor_uid=actor_uid, reason=reason, expect=State.RUNNING,
                    values=values)
    if ok:
        conn.execute(update(gpus).where(gpus.c.job_id == job_id).values(job_id=None))
        conn.execute(update(gpu_instances).where(gpu_instances.c.job_id == job_id).values(job_id=None))
    return ok


def retry_or_end(conn: Connection, job, why: str, *, end: State, values: dict[str, Any]) -> bool:
    """A RUNNING job that did not finish on its own: back to the queue while its owner's
    retries last (`job` has `id`, `attempts`, `max_retries`), else to `end` with `values`."""
    if job.attempts <= job.max_retries:
        return end_run(conn, job.id, State.PENDING, actor_uid=None, values=UNPLACED,
                       reason=f"{why}; retrying (attempt {job.attempts + 1} of {job.max_retries + 1})")
    return end_run(conn, job.id, end, actor_uid=None, reason=why, values=values)


_INSERT_EVENT = insert(job_events)


def record_submit(conn: Connection, job_id: int, actor_uid: int, at: datetime) -> None:
    """The first event of every job: it entered the queue."""
    conn.execute(_INSERT_EVENT, {"job_id": job_id, "from_state": None,
                                 "to_state": State.PENDING.value, "actor_uid": actor_uid,
                                 "reason": "submitted", "at": at})


def record_events(conn: Connection, events: list[dict]) -> None:
    """Many events in one statement (the planner's bulk transitions)."""
    if events:
        conn.execute(_INSERT_EVENT, events)
