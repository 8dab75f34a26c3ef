"""The SQL on the `jobs` table: the daemon's planner (queue and plan reads and writes), its API
service (submissions, holds, cancellations, the reads behind `queue`, `show` and `health`)
and its keepers (power governor, watchdog, retention), and the node agent's reads of its due
and running jobs (`RunningJob`s), its claim's conditions, what a run that ended writes back
to the queue, and a Slurm node's adopted and observed jobs. One module, so a reader finds here the questions
asked of the jobs table and the writes to it, beside the state changes of
`scheduler.lifecycle` (still the one place that moves a job from one state to another).

A tick reads the plannable queue (`read_queue`: PENDING and PLANNED jobs as `Job`s, with the
reason each job left alone for now waits), the running jobs and recent starts, and the stored
plans it pins or keeps (`current_plans`); it writes plan changes in small batches
(`write_plan`), each row re-checked inside its transaction so a job cancelled or claimed
meanwhile is left alone, and the reasons of the jobs it leaves waiting (`note_waiting`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import (Connection, Row, Select, String, and_, bindparam, case, func, insert, literal, null, or_,
                        select, type_coerce, update)

from policies.types import Assignment, Estimate
from scheduler import interruptible
from scheduler.job_specs import BEGIN_REASON, HELD_REASON, NEVER_SATISFIED_REASON, OPERATOR_HELD_REASON
from scheduler.jobs.job import RAW_JSON, RAW_TIMES, Job, RunningJob, job_from_row
from scheduler.jobs.views import job_select
from scheduler.lifecycle import ACTIVE, TERMINAL, UNPLACED, State, check_allowed, record_events, record_submit
from scheduler.store import Store
from scheduler.store.models import job_dependencies, job_events, jobs, nodes

WRITE_BATCH = 500
# ~100 plan rows and events take ~20-30 ms to write on SQLite, 500 up to ~140 ms: a submission
# waiting behind one write transaction would see that as latency (measured, bench/api_bench.py)
WRITE_BATCH_SQLITE = 100


# -- The planner's queue -----------------------------------------------------------------------

def _waits(now: datetime, *, slices: bool = True) -> list[tuple[Any, Any]]:
    """Each reason a queued job is left alone for now (issue 28), as (SQL condition, the
    REASON `queue` shows), in the order squeue would name them: held by an operator
    (JobHeldAdmin, issue 48) or by its owner (JobHeldUser), before
    its `--begin` time (BeginTime), waiting on a dependency that is not satisfied yet
    (Dependency; afterok: the job COMPLETED; afterany: it ended; afternotok: it ended
    otherwise; one that can never be satisfied, or whose job is gone, keeps the job waiting
    as in Slurm, with REASON DependencyNeverSatisfied), or a
    task of an array beyond its `%N` throttle (JobArrayTaskLimit: only the N lowest-index
    active tasks of an array are plannable, so at most N of them run at once), and last a job
    that asks for a slice of a GPU (`--gpu-fraction`, `--mig`): the planner does not place
    those; a node agent starts each on the first free slice that fits (GpuSlice,
    scheduler.node.slice_claims). `slices=False` leaves that last reason out: the agent's
    read of the slice jobs that wait on nothing else."""
    dep_job = jobs.alias("dep_job")
    ended = [s.value for s in TERMINAL]
    unsatisfied = (select(literal(1)).select_from(job_dependencies.join(dep_job, dep_job.c.id ==
                                                                        job_dependencies.c.on_job_id, isouter=True))
                   .where(job_dependencies.c.job_id == jobs.c.id,
                          or_(dep_job.c.id.is_(None),
                              and_(job_dependencies.c.kind == "afterok", dep_job.c.state != State.COMPLETED.value),
                              and_(job_dependencies.c.kind == "afterany", dep_job.c.state.not_in(ended)),
                              and_(job_dependencies.c.kind == "afternotok",
                                   or_(dep_job.c.state.not_in(ended), dep_job.c.state == State.COMPLETED.value))))
                   .exists())
    never = (select(literal(1)).select_from(job_dependencies.join(dep_job, dep_job.c.id ==
                                                                  job_dependencies.c.on_job_id, isouter=True))
             .where(job_dependencies.c.job_id == jobs.c.id,
                    or_(dep_job.c.id.is_(None),
                        and_(job_dependencies.c.kind == "afterok", dep_job.c.state.in_(ended),
                             dep_job.c.state != State.COMPLETED.value),
                        and_(job_dependencies.c.kind == "afternotok", dep_job.c.state == State.COMPLETED.value)))
             .exists())
    sibling = jobs.alias("sibling")
    ahead = (select(func.count()).select_from(sibling)
             .where(sibling.c.array_job_id == jobs.c.array_job_id, sibling.c.array_task_id < jobs.c.array_task_id,
                    sibling.c.state.in_([s.value for s in ACTIVE]))
             .scalar_subquery())
    # every condition is true or false, never NULL: NOT(NULL) would drop every ordinary job
    waits = [
        (and_(jobs.c.held_at.is_not(None), jobs.c.hold_kind == "operator"), literal(OPERATOR_HELD_REASON)),
        (jobs.c.held_at.is_not(None), literal(HELD_REASON)),
        (and_(jobs.c.begin_at.is_not(None), jobs.c.begin_at > now), literal(BEGIN_REASON)),
        (and_(jobs.c.dependency.is_not(None), never),
         literal("its dependency ") + jobs.c.dependency + literal(" can never be satisfied ")
         + literal(NEVER_SATISFIED_REASON)),
        (and_(jobs.c.dependency.is_not(None), unsatisfied),
         literal("waiting on its dependency ") + jobs.c.dependency + literal(" (Dependency)")),
        (and_(jobs.c.array_max_running.is_not(None), ahead >= jobs.c.array_max_running),
         literal("array throttle: at most ") + type_coerce(jobs.c.array_max_running, String)
         + literal(" tasks at once (JobArrayTaskLimit)")),
    ]
    if slices:
        waits.append((is_slice_job(), literal(SLICE_REASON)))
    return waits


SLICE_REASON = "waits for a free GPU slice: a node agent starts it on the first one that fits (GpuSlice)"


def is_slice_job() -> Any:
    """The condition of a job that asks for a slice of a GPU rather than whole GPUs."""
    return or_(jobs.c.gpu_fraction.is_not(None), jobs.c.mig_profile.is_not(None))


class QueueRead(dict):
    """The plannable queue, id -> Job (what a tick writes back to), and `waiting`: the
    PENDING jobs the planner leaves alone for now (`_waits`), id -> (the reason stored, the
    reason they wait), from the same read."""

    def __init__(self, rows: dict[int, Job], waiting: dict[int, tuple[str | None, str]]) -> None:
        super().__init__(rows)
        self.waiting = waiting


def read_queue(conn: Connection, now: datetime | None = None) -> QueueRead:
    """The queue, read fast: a tick reads thousands of rows, so on SQLite times and JSON come
    back as raw text and are parsed by `job_from_row` with the C parsers instead of
    per-value processors. Jobs not yet plannable (`_waits`) are left out of it, and come back
    in `waiting` with the reason they wait: one pass, each wait's condition evaluated once a row."""
    raw = conn.dialect.name == "sqlite"
    cols = []
    for name in Job._fields:
        col = jobs.c[name]
        if raw and (name in RAW_TIMES or name in RAW_JSON):
            col = type_coerce(col, String).label(name)
        cols.append(col)
    waits = case(*_waits(now or datetime.now(timezone.utc))).label("waits")  # NULL: plannable
    q = (select(*cols, waits).where(jobs.c.state.in_([State.PENDING.value, State.PLANNED.value]))
         .order_by(jobs.c.id))
    out: dict[int, Job] = {}
    waiting: dict[int, tuple[str | None, str]] = {}
    for r in conn.execute(q):
        why = r[-1]
        job = job_from_row(r[:-1], raw)
        if why is None:
            out[job.id] = job
        elif job.state == State.PENDING.value:
            waiting[job.id] = (job.reason, why)
    return QueueRead(out, waiting)


def read_running(conn: Connection) -> dict[int, Row]:
    """The RUNNING jobs by id, with what says when their GPUs are free again."""
    return {r.id: r for r in conn.execute(
        select(jobs.c.id, jobs.c.started_at, jobs.c.est_runtime_s, jobs.c.time_limit_s,
               jobs.c.est_runtime_planned_s, jobs.c.workload, jobs.c.power_limit_w,
               jobs.c.interruptible, jobs.c.planned_segments, jobs.c.planned_interrupt_at,
               jobs.c.checkpoint_grace_s)
        .where(jobs.c.state == State.RUNNING.value))}


def recent_starts(conn: Connection, since: datetime) -> list[Row]:
    """The jobs RUNNING that started at or after `since`: their node, its zone, the start and
    the planned energy and runtime (what a ramp limit counts)."""
    return list(conn.execute(
        select(nodes.c.name, nodes.c.zone, jobs.c.started_at, jobs.c.est_energy_j, jobs.c.est_runtime_planned_s)
        .join(nodes, nodes.c.name == jobs.c.node)
        .where(jobs.c.state == State.RUNNING.value, jobs.c.started_at >= since)))


_PLAN_COLUMNS = (jobs.c.id, jobs.c.planned_node, jobs.c.planned_gpu_ids, jobs.c.planned_start,
                 jobs.c.est_energy_j, jobs.c.est_gco2, jobs.c.est_gco2_if_now,
                 jobs.c.est_runtime_planned_s, jobs.c.prompts, jobs.c.binding, jobs.c.deadline_miss,
                 jobs.c.explanation, jobs.c.planned_max_batch, jobs.c.planned_precision, jobs.c.planned_tp,
                 jobs.c.planned_power_limit_w, jobs.c.est_uncapped_energy_j, jobs.c.est_uncapped_gco2,
                 jobs.c.est_uncapped_runtime_s, jobs.c.planned_segments)
# Ids per IN (...) query: a kept queue holds thousands of plans, and SQLite caps bound parameters.
READ_BATCH = 900


def current_plans(conn: Connection, job_ids: set[int]) -> dict[int, Assignment]:
    """The stored plans of `job_ids` as Assignments (pinned jobs, and kept plans)."""
    if not job_ids:
        return {}
    out = {}
    ids = sorted(job_ids)
    rows = (r for i in range(0, len(ids), READ_BATCH)
            for r in conn.execute(select(*_PLAN_COLUMNS).where(jobs.c.id.in_(ids[i:i + READ_BATCH]))))
    for r in rows:
        finish = (r.planned_start + timedelta(seconds=r.est_runtime_planned_s)
                  if r.est_runtime_planned_s else None)
        out[r.id] = Assignment(
            job_id=r.id, node=r.planned_node, gpu_ids=tuple(r.planned_gpu_ids), start_at=r.planned_start,
            estimate=Estimate(finish_at=finish, energy_j=r.est_energy_j, gco2=r.est_gco2,
                              gco2_if_now=r.est_gco2_if_now, runtime_s=r.est_runtime_planned_s,
                              prompts=r.prompts, binding=r.binding, deadline_miss=bool(r.deadline_miss),
                              max_batch=r.planned_max_batch, precision=r.planned_precision, tp=r.planned_tp,
                              power_limit_w=r.planned_power_limit_w, uncapped_energy_j=r.est_uncapped_energy_j,
                              uncapped_gco2=r.est_uncapped_gco2, uncapped_runtime_s=r.est_uncapped_runtime_s),
            explanation=r.explanation or "",
            segments=tuple(interruptible.segments_from_json(r.planned_segments)))
    return out



# -- The planner's writes -------------------------------------------------------------------

def write_plan(store: Store, writes: list[tuple], clock: Callable[[], datetime]) -> dict[str, int]:
    """Write a tick's plan changes, each `(kind, row, assignment, why)` with kind one of
    plan, move, withdraw, reason, refresh, in batches; how many of each were written.

    SQLite has one writer at a time: smaller batches let submissions in between them."""
    counts = {"plan": 0, "move": 0, "withdraw": 0, "reason": 0, "refresh": 0}
    size = WRITE_BATCH_SQLITE if store.dialect == "sqlite" else WRITE_BATCH
    for i in range(0, len(writes), size):
        batch = writes[i:i + size]
        for kind, n in store.transact(lambda conn: _apply(conn, batch, clock())).items():
            counts[kind] += n
    return counts


def note_waiting(store: Store, waiting: dict[int, tuple[str | None, str]]) -> None:
    """Store why each job the planner leaves alone waits (held, --begin, a dependency,
    an array throttle), so `queue`'s REASON says it as squeue does."""
    changed = [{"b_id": job_id, "b_reason": why} for job_id, (stored, why) in waiting.items() if stored != why]
    if not changed:
        return
    stmt = (update(jobs).where(jobs.c.id == bindparam("b_id"), jobs.c.state == State.PENDING.value)
            .values(reason=bindparam("b_reason")))
    store.transact(lambda conn: conn.execute(stmt, changed))


_ESTIMATE_FIELDS = ("explanation", "est_energy_j", "est_gco2", "est_gco2_if_now",
                    "est_runtime_planned_s", "binding", "deadline_miss", "reason", "time_limit_s",
                    "planned_max_batch", "planned_precision", "planned_tp", "planned_power_limit_w",
                    "est_uncapped_energy_j", "est_uncapped_gco2", "est_uncapped_runtime_s",
                    "planned_segments", "planned_interrupt_at", "planned_resume_at")
_PLAN_FIELDS = ("planned_node", "planned_gpu_ids", "planned_start", "plan_rev", "state") + _ESTIMATE_FIELDS
_UPDATE_PLAN = (update(jobs).where(jobs.c.id == bindparam("b_id"))
                .values({f: bindparam(f"b_{f}") for f in _PLAN_FIELDS}))
_UPDATE_ESTIMATE = (update(jobs).where(jobs.c.id == bindparam("b_id"))
                    .values({f: bindparam(f"b_{f}") for f in _ESTIMATE_FIELDS}))
_UPDATE_REASON = update(jobs).where(jobs.c.id == bindparam("b_id")).values(reason=bindparam("b_reason"))


def _apply(conn: Connection, batch: list, now) -> dict[str, int]:
    """Write one batch of plan changes in bulk: a few statements, not a few per job.

    The batch's rows are re-read inside the write transaction (locked FOR UPDATE on
    PostgreSQL; SQLite write transactions are exclusive), and only rows still in the state
    and plan revision the plan was made from are written, so a job cancelled or claimed
    meanwhile is left alone.
    """
    check_allowed(State.PENDING, State.PLANNED)
    check_allowed(State.PLANNED, State.PENDING)
    ids = [row.id for _, row, _, _ in batch]
    q = select(jobs.c.id, jobs.c.state, jobs.c.plan_rev).where(jobs.c.id.in_(ids))
    if conn.dialect.name == "postgresql":
        q = q.with_for_update()
    current = {r.id: (r.state, r.plan_rev) for r in conn.execute(q)}
    updates, reasons, estimates, events = [], [], [], []
    done = {"plan": 0, "move": 0, "withdraw": 0, "reason": 0, "refresh": 0}
    for kind, row, a, why in batch:
        if current.get(row.id) != (row.state, row.plan_rev):
            continue
        if kind == "reason":
            reasons.append({"b_id": row.id, "b_reason": why})
        elif kind == "refresh":
            row_values = _plan_row(row, a, State.PLANNED, why)
            estimates.append({k: row_values[k] for k in ("b_id", *(f"b_{f}" for f in _ESTIMATE_FIELDS))})
        elif kind == "withdraw":
            updates.append(_plan_row(row, None, State.PENDING, why))
            events.append(_event(row.id, State.PLANNED, State.PENDING, why, now))
        else:
            updates.append(_plan_row(row, a, State.PLANNED, why))
            if kind == "plan":
                events.append(_event(row.id, State.PENDING, State.PLANNED, why, now))
        done[kind] += 1
    if updates:
        conn.execute(_UPDATE_PLAN, updates)
    if reasons:
        conn.execute(_UPDATE_REASON, reasons)
    if estimates:
        conn.execute(_UPDATE_ESTIMATE, estimates)
    record_events(conn, events)
    return done


def _plan_row(row, a, state: State, why: str) -> dict:
    """The columns a plan (or its withdrawal, `a` None) writes. The "if run now" counterfactual,
    once set, is kept (the policy hands it back; a withdrawn job keeps it for its next plan),
    and a derived time limit follows the plan's runtime on its chosen GPUs."""
    limit = a.estimate.time_limit_s if a is not None and a.estimate.time_limit_s is not None else row.time_limit_s
    if_now = a.estimate.gco2_if_now if a is not None and row.est_gco2_if_now is None else row.est_gco2_if_now
    return {"b_id": row.id, "b_state": state.value, "b_reason": why, "b_plan_rev": row.plan_rev + 1,
            "b_time_limit_s": limit,
            "b_planned_node": a.node if a else None,
            "b_planned_gpu_ids": list(a.gpu_ids) if a else None,
            "b_planned_start": a.start_at if a else None,
            "b_explanation": a.explanation if a else None,
            "b_est_energy_j": a.estimate.energy_j if a else None,
            "b_est_gco2": a.estimate.gco2 if a else None,
            "b_est_gco2_if_now": if_now,
            "b_est_runtime_planned_s": a.estimate.runtime_s if a else None,
            "b_binding": a.estimate.binding if a else None,
            "b_deadline_miss": bool(a.estimate.deadline_miss) if a else False,
            "b_planned_max_batch": a.estimate.max_batch if a else None,
            "b_planned_precision": a.estimate.precision if a else None,
            "b_planned_tp": a.estimate.tp if a else None,
            "b_planned_power_limit_w": a.estimate.power_limit_w if a else None,
            "b_est_uncapped_energy_j": a.estimate.uncapped_energy_j if a else None,
            "b_est_uncapped_gco2": a.estimate.uncapped_gco2 if a else None,
            "b_est_uncapped_runtime_s": a.estimate.uncapped_runtime_s if a else None,
            # An interruptible job's segments (issue 30): the agent asks it to checkpoint at
            # planned_interrupt_at; a pause job is stopped and continued by planned_segments.
            "b_planned_segments": interruptible.segments_to_json(a.segments) if a else None,
            "b_planned_interrupt_at": a.interrupt_at if a else None,
            "b_planned_resume_at": a.resume_at if a else None}


def _event(job_id: int, src: State, dst: State, why: str, now) -> dict:
    return {"job_id": job_id, "from_state": src.value, "to_state": dst.value, "actor_uid": None,
            "reason": why, "at": now}


# -- Submissions -------------------------------------------------------------------------------

_INSERT_JOB = insert(jobs).returning(jobs.c.id)


@functools.cache
def _submit_statement(columns: tuple[str, ...]):
    """INSERT the job and its "submitted" event in one statement (PostgreSQL)."""
    new_job = (insert(jobs).values({c: bindparam(c, type_=jobs.c[c].type) for c in columns})
               .returning(jobs.c.id, jobs.c.submitted_at).cte("new_job"))
    first_event = select(new_job.c.id, null(), literal(State.PENDING.value), bindparam("actor_uid"),
                         literal("submitted"), new_job.c.submitted_at)
    return (insert(job_events)
            .from_select(["job_id", "from_state", "to_state", "actor_uid", "reason", "at"], first_event)
            .returning(job_events.c.job_id))


def store_job(store: Store, row: dict, actor_uid: int, clock: Callable[[], datetime]) -> int:
    """Store one job's row and its "submitted" event in one transaction; its id. The row's
    `submitted_at` is stamped here, as late as can be (inside the write transaction on SQLite,
    so queue order follows commit order even when many clients submit at once)."""
    if store.dialect == "postgresql":
        # One statement, one round trip: the job row and its first event are inserted
        # together by a data-modifying CTE, atomic as any single statement.
        row["submitted_at"] = clock()
        return store.execute_once(_submit_statement(tuple(row)), {**row, "actor_uid": actor_uid}).scalar_one()

    def tx(conn: Connection) -> int:
        row["submitted_at"] = at = clock()
        job_id = conn.execute(_INSERT_JOB, row).scalar_one()
        record_submit(conn, job_id, actor_uid, at)
        return job_id

    return store.transact(tx)


def insert_job(conn: Connection, row: dict, actor_uid: int, at: datetime) -> int:
    """Insert one job's row and its "submitted" event in the caller's transaction; its id."""
    job_id = conn.execute(_INSERT_JOB, row).scalar_one()
    record_submit(conn, job_id, actor_uid, at)
    return job_id


def name_array(conn: Connection, job_id: int, env: dict) -> None:
    """Make a job array's first task the array (its id is the array's) with its environment."""
    conn.execute(update(jobs).where(jobs.c.id == job_id).values(array_job_id=job_id, env=env))


def add_dependencies(conn: Connection, job_ids: Iterable[int], deps: Sequence[tuple[int, str]]) -> None:
    """Make each of `job_ids` wait on each `(on_job_id, kind)` of `deps`."""
    conn.execute(insert(job_dependencies), [{"job_id": j, "on_job_id": on, "kind": kind}
                                            for j in job_ids for on, kind in deps])


def waiting_and_stored(conn: Connection, uid: int) -> tuple[int, int]:
    """What `uid` has in the store: its jobs waiting (PENDING or PLANNED) and the bytes its jobs
    not yet purged store (`stored_bytes`)."""
    waiting = case((jobs.c.state.in_([State.PENDING.value, State.PLANNED.value]), 1), else_=0)
    n, stored = conn.execute(select(func.coalesce(func.sum(waiting), 0),
                                    func.coalesce(func.sum(jobs.c.stored_bytes), 0))
                             .where(jobs.c.owner_uid == uid, jobs.c.purged_at.is_(None))).one()
    return int(n), int(stored)


# -- The service's reads -----------------------------------------------------------------------

def read_job(conn: Connection, job_id: int) -> Row | None:
    """One job's whole row; None: no such job."""
    return conn.execute(select(jobs).where(jobs.c.id == job_id)).first()


def job_state(conn: Connection, job_id: int) -> str:
    """One job's state as stored now."""
    return conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar_one()


def list_views(conn: Connection, dialect: str, *, uids: Sequence[int] = (), user_names: Sequence[str] = (),
               names: Sequence[str] = (), since: datetime | None = None, until: datetime | None = None,
               array_job_id: int | None = None, states: Sequence[str] | None = None,
               owner_uid: int | None = None, limit: int | None = None):
    """The jobs `queue`/`sacct` list, as `scheduler.jobs.views.job_select` reads them, by id:
    owned by one of `uids`/`user_names` (when either is given), named one of `names` (exact,
    or globs with * and ?), submitted in [since, until), tasks of `array_job_id`, in one of
    `states`, owned by `owner_uid`; at most `limit`."""
    q = job_select(dialect).order_by(jobs.c.id)
    if uids or user_names:
        q = q.where(jobs.c.owner_name.in_(list(user_names)) | jobs.c.owner_uid.in_(list(uids)))
    if names:
        conds = []
        for n in names:
            if "*" in n or "?" in n:
                like = n.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
                conds.append(jobs.c.name.like(like.replace("*", "%").replace("?", "_"), escape="\\"))
            else:
                conds.append(jobs.c.name == n)
        q = q.where(or_(*conds))
    if since is not None:
        q = q.where(jobs.c.submitted_at >= since)
    if until is not None:
        q = q.where(jobs.c.submitted_at < until)
    if array_job_id is not None:
        q = q.where(jobs.c.array_job_id == array_job_id)
    if states is not None:
        q = q.where(jobs.c.state.in_(list(states)))
    if owner_uid is not None:
        q = q.where(jobs.c.owner_uid == owner_uid)
    if limit is not None:
        q = q.limit(limit)
    return conn.execute(q)


def view_of(conn: Connection, dialect: str, job_id: int):
    """One job as `scheduler.jobs.views.job_select` reads it (`show`)."""
    return conn.execute(job_select(dialect).where(jobs.c.id == job_id))


def running_owners(conn: Connection) -> dict[int, int]:
    """The RUNNING jobs' owners, by job id."""
    return {r.id: r.owner_uid for r in conn.execute(
        select(jobs.c.id, jobs.c.owner_uid).where(jobs.c.state == State.RUNNING.value))}


def owner_names_known(conn: Connection, names: Sequence[str]) -> set[str]:
    """Which of `names` own some job in the store (users since removed, or seen through Slurm)."""
    return set(conn.execute(select(jobs.c.owner_name).where(jobs.c.owner_name.in_(list(names))).distinct())
               .scalars())


def count_by_state(conn: Connection) -> dict[str, int]:
    """How many jobs are in each state."""
    return dict(conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state)).all())


# -- Cancel, hold, release ---------------------------------------------------------------------

def request_cancel(conn: Connection, job_id: int, uid: int, now: datetime) -> bool:
    """Ask a RUNNING job's agent to stop it (the job shows CANCELLING); False: it is not running."""
    return bool(conn.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.state == State.RUNNING.value)
                             .values(cancel_requested_at=now, cancel_requested_by=uid,
                                     reason=f"cancel requested by uid {uid}")).rowcount)


def release_hold(conn: Connection, job_id: int, *, operator_hold_stays: bool) -> bool:
    """Release a held job (a new plan revision: a tick planned before writes nothing);
    `operator_hold_stays`: an operator's hold is left alone. Whether one was released."""
    where = [jobs.c.id == job_id, jobs.c.held_at.is_not(None)]
    if operator_hold_stays:
        where.append(or_(jobs.c.hold_kind.is_(None), jobs.c.hold_kind != "operator"))
    return bool(conn.execute(update(jobs).where(*where)
                             .values(held_at=None, held_by=None, hold_kind=None, plan_rev=jobs.c.plan_rev + 1,
                                     reason="released; waiting for the planner")).rowcount)


def hold_kind(conn: Connection, job_id: int) -> str | None:
    """Who holds a job as stored now: "operator", "user", or None."""
    return conn.execute(select(jobs.c.hold_kind).where(jobs.c.id == job_id)).scalar_one()


def hold_values(uid: int, kind: str, now: datetime) -> dict[str, Any]:
    """The columns a hold by `uid` writes; bumping plan_rev makes a tick planned from before
    the hold write nothing. (`WITHDRAWN_PLAN` beside them withdraws a PLANNED job's plan.)"""
    return dict(held_at=now, held_by=uid, hold_kind=kind, plan_rev=jobs.c.plan_rev + 1)


WITHDRAWN_PLAN = {"planned_node": None, "planned_gpu_ids": None, "planned_start": None}


def set_reason(conn: Connection, job_id: int, why: str) -> None:
    """Store the REASON `queue` shows for one job."""
    conn.execute(update(jobs).where(jobs.c.id == job_id).values(reason=why))


def hold_pending(conn: Connection, job_id: int, values: dict, why: str, *, operator_hold_stays: bool) -> bool:
    """Hold a PENDING job with `hold_values`; `operator_hold_stays`: never turn an operator's
    hold (placed since the caller's read) into this one. Whether it was held."""
    where = [jobs.c.id == job_id, jobs.c.state == State.PENDING.value]
    if operator_hold_stays:
        where.append(or_(jobs.c.hold_kind.is_(None), jobs.c.hold_kind != "operator"))
    return bool(conn.execute(update(jobs).where(*where).values(**values, reason=why)).rowcount)


def state_and_hold(conn: Connection, job_id: int) -> Row:
    """One job's state and hold kind as stored now."""
    return conn.execute(select(jobs.c.state, jobs.c.hold_kind).where(jobs.c.id == job_id)).one()


# -- The daemon's keepers: power governor, watchdog, retention ---------------------------------

def running_power_limits(conn: Connection, job_ids: Sequence[int]) -> dict[int, Row]:
    """The RUNNING jobs among `job_ids` with their deadline and power limits (planned, in
    force, and the note on it), by id."""
    if not job_ids:
        return {}
    return {j.id: j for j in conn.execute(
        select(jobs.c.id, jobs.c.deadline, jobs.c.planned_power_limit_w, jobs.c.power_limit_w,
               jobs.c.power_limit_note)
        .where(jobs.c.id.in_(job_ids), jobs.c.state == State.RUNNING.value))}


def set_planned_power_limit(conn: Connection, job_id: int, limit_w: float | None) -> None:
    """Set a RUNNING job's planned power limit per GPU (None: the GPUs' default); its agent applies it."""
    conn.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.state == State.RUNNING.value)
                 .values(planned_power_limit_w=limit_w))


def running_on(conn: Connection, node_names: Sequence[str]) -> list[Row]:
    """The RUNNING jobs on `node_names`, with their node and their attempts and retries."""
    return list(conn.execute(select(jobs.c.id, jobs.c.node, jobs.c.attempts, jobs.c.max_retries)
                             .where(jobs.c.state == State.RUNNING.value, jobs.c.node.in_(node_names))))


def purgeable(conn: Connection, ended_before: datetime, limit: int) -> list[int]:
    """Up to `limit` ids, lowest first, of the jobs that ended before `ended_before` and are not purged yet."""
    return list(conn.execute(
        select(jobs.c.id).where(jobs.c.state.in_([s.value for s in TERMINAL]),
                                jobs.c.purged_at.is_(None), jobs.c.ended_at.is_not(None),
                                jobs.c.ended_at < ended_before)
        .order_by(jobs.c.id).limit(limit)).scalars())


def purge(conn: Connection, job_ids: Sequence[int], at: Callable[[], datetime]) -> None:
    """Forget what `job_ids` stored beyond their record: their environment, and their command
    but its program's name (cut to 255 characters); each marked purged at `at()`."""
    argv0 = dict(conn.execute(select(jobs.c.id, jobs.c.argv).where(jobs.c.id.in_(job_ids))).all())
    for job_id in job_ids:
        first = argv0[job_id][:1] if isinstance(argv0[job_id], list) else []
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(
            argv=[str(a)[:255] for a in first], env={}, stored_bytes=0, purged_at=at()))


# -- The node agent: due jobs and its claim, its running jobs ----------------------------------

def due_on(conn: Connection, node: str, now: datetime, limit: int) -> list[Row]:
    """Up to `limit` PLANNED jobs on `node` whose start has come, earliest first (whole rows)."""
    return list(conn.execute(
        select(jobs).where(jobs.c.state == State.PLANNED.value,
                           jobs.c.planned_node == node,
                           jobs.c.planned_start <= now)
        .order_by(jobs.c.planned_start, jobs.c.id).limit(limit)))


def slice_jobs_ready(conn: Connection, now: datetime, limit: int) -> list[Row]:
    """Up to `limit` PENDING jobs that ask for a GPU slice and wait on nothing else (not
    held, past --begin, dependencies met, within their array's throttle), oldest first."""
    waits = case(*_waits(now, slices=False))
    return list(conn.execute(
        select(jobs).where(jobs.c.state == State.PENDING.value, is_slice_job(), waits.is_(None))
        .order_by(jobs.c.id).limit(limit)))


def slice_placed(node: str, gpu_id: int, now: datetime) -> tuple[tuple, dict[str, Any]]:
    """The condition and the columns of a slice job's PENDING -> PLANNED at its claim: still
    not held; planned on `node`'s GPU `gpu_id` from now, at a new plan revision."""
    return ((jobs.c.held_at.is_(None),),
            dict(planned_node=node, planned_gpu_ids=[gpu_id], planned_start=now, plan_rev=jobs.c.plan_rev + 1))


def at_plan_rev(plan_rev: int) -> tuple:
    """The condition of a claim: the job is still at the plan revision it was read at."""
    return (jobs.c.plan_rev == plan_rev,)


def claim_values(node: str, gpu_ids: list[int], indices: list[int], now: datetime) -> dict[str, Any]:
    """The columns a claim writes with PLANNED -> RUNNING: the node and GPUs, the start (the
    first start kept), one more attempt."""
    return dict(node=node, gpu_ids=gpu_ids, gpu_indices=indices, started_at=now,
                first_started_at=func.coalesce(jobs.c.first_started_at, now), attempts=jobs.c.attempts + 1)


def planned_on(conn: Connection, node: str, limit: int) -> list[Row]:
    """The first `limit` PLANNED jobs on `node` by start: id, start, GPUs, plan revision."""
    return list(conn.execute(select(jobs.c.id, jobs.c.planned_start, jobs.c.planned_gpu_ids, jobs.c.plan_rev)
                             .where(jobs.c.state == State.PLANNED.value, jobs.c.planned_node == node)
                             .order_by(jobs.c.planned_start).limit(limit)))


def still_active(conn: Connection, job_ids: Sequence[int]) -> set[int]:
    """Which of `job_ids` are still PENDING, PLANNED or RUNNING."""
    return set(conn.execute(select(jobs.c.id).where(
        jobs.c.id.in_(job_ids), jobs.c.state.in_([s.value for s in (State.PENDING, State.PLANNED,
                                                                   State.RUNNING)]))).scalars())


# What the agent reads of its running jobs each tick, in `RunningJob`'s order.
RUNNING_COLUMNS = tuple(jobs.c[name] for name in RunningJob._fields)


def running_jobs(store: Store, node: str) -> list[RunningJob]:
    """The jobs RUNNING on `node`, as the agent reconciles them each tick."""
    with store.read() as conn:
        return [RunningJob(*r) for r in conn.execute(
            select(*RUNNING_COLUMNS).where(jobs.c.state == State.RUNNING.value, jobs.c.node == node))]


def running_ids() -> Select:
    """SELECT of the ids of every RUNNING job (a subquery)."""
    return select(jobs.c.id).where(jobs.c.state == State.RUNNING.value)


def rows_of(conn: Connection, job_ids: Sequence[int]) -> list[Row]:
    """The whole rows of `job_ids`."""
    return conn.execute(select(jobs).where(jobs.c.id.in_(job_ids))).all()


def set_power_limit(conn: Connection, job_id: int, limit_w: float | None, note: str | None) -> None:
    """Record the power limit per GPU in force for a job (None: the default) and the note on it."""
    conn.execute(update(jobs).where(jobs.c.id == job_id).values(power_limit_w=limit_w, power_limit_note=note))


# -- The node agent: a run that ended goes back to the queue -----------------------------------

def resumed_values(*, done_fraction: float | None = None, ignored_checkpoint: bool = False) -> dict[str, Any]:
    """The columns an interruptible job back in the queue to resume writes (with RUNNING ->
    PENDING, `scheduler.lifecycle.end_run`): unplaced, its segment plan and power limit
    dropped, one more resume and the attempt not counted (a resume is not a retry).
    `done_fraction`: its new done share (None: kept); `ignored_checkpoint`: it was killed
    after ignoring a checkpoint request (counted, so its rest is planned in one piece)."""
    values = dict(UNPLACED, planned_segments=None, planned_interrupt_at=None, planned_resume_at=None,
                  attempts=jobs.c.attempts - 1, resume_count=jobs.c.resume_count + 1,
                  power_limit_w=None, power_limit_note=None)
    if done_fraction is not None:
        values["done_fraction"] = done_fraction
    if ignored_checkpoint:
        values["checkpoints_ignored"] = jobs.c.checkpoints_ignored + 1
    return values


def unlaunched_values() -> dict[str, Any]:
    """The columns a claimed job whose command never started writes back in the queue: unplaced,
    never started, the attempt not counted, no power limit."""
    return dict(UNPLACED, started_at=None, attempts=jobs.c.attempts - 1, power_limit_w=None, power_limit_note=None)


# -- Slurm nodes: adopted and observed jobs ----------------------------------------------------

def known_slurm_ids(conn: Connection, slurm_job_ids: Sequence[int]) -> set[int]:
    """Which of `slurm_job_ids` some job already stands for (adopted or observed)."""
    return set(conn.execute(select(jobs.c.slurm_job_id).where(jobs.c.slurm_job_id.in_(list(slurm_job_ids))))
               .scalars())


def record_slurm_start(conn: Connection, job_id: int, started_at: datetime, gpu_ids: list[int],
                       gpu_indices: list[int | None], reason: str) -> None:
    """Record where and when Slurm really started a RUNNING job: its start, its GPUs (store ids
    and the driver's indices) and the REASON `queue` shows."""
    conn.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.state == State.RUNNING.value)
                 .values(started_at=started_at, gpu_ids=gpu_ids, gpu_indices=gpu_indices, reason=reason))


def adopted_waiting(conn: Connection) -> list[tuple[int, int]]:
    """(job id, Slurm job id) of the jobs with a Slurm job of their own that are not placed
    yet (PENDING or PLANNED)."""
    return [tuple(r) for r in conn.execute(select(jobs.c.id, jobs.c.slurm_job_id).where(
        jobs.c.slurm_job_id.is_not(None), jobs.c.state.in_([State.PENDING.value, State.PLANNED.value])))]


def ended_here(conn: Connection, slurm_job_ids: Sequence[int]) -> list[tuple[int, int]]:
    """(job id, Slurm job id) of the jobs standing for one of `slurm_job_ids` that were
    CANCELLED or FAILED here."""
    if not slurm_job_ids:
        return []
    return [tuple(r) for r in conn.execute(select(jobs.c.id, jobs.c.slurm_job_id).where(
        jobs.c.slurm_job_id.in_(list(slurm_job_ids)),
        jobs.c.state.in_([State.CANCELLED.value, State.FAILED.value])))]
