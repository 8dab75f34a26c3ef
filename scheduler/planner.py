"""The planner: store -> Snapshot -> policy -> store.

A tick reads the queue and the GPUs, asks the policy for a plan, and writes back only
what changed, in small transactions so submissions are never held up behind a big plan.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
import json
from datetime import datetime, timedelta, timezone
from typing import NamedTuple

from sqlalchemy import Connection, String, bindparam, select, type_coerce, update

from policies import Plan, Policy, QueuedJob, Snapshot
from policies.model import GpuSlot
from scheduler.lifecycle import State, check_allowed, record_events, utcnow
from scheduler.store import Store
from scheduler.store.models import gpus, jobs, nodes

log = logging.getLogger(__name__)

WRITE_BATCH = 500
# A planned start that moves earlier is written at once (the job may start sooner); one that
# slips later only when it slips by more than this share of its lead time (and 60 s): a
# queue behind a job running over its estimate would otherwise be rewritten every tick.
EARLIER_TOLERANCE_S = 1.0
LATER_TOLERANCE_S = 60.0
LATER_TOLERANCE_SHARE = 0.1


@dataclass(frozen=True)
class TickStats:
    jobs: int
    planned: int
    moved: int
    withdrawn: int
    duration_s: float


class Planner:
    def __init__(self, store: Store, policy: Policy, *, node_timeout_s: float = 60.0,
                 default_runtime_s: float = 3600.0, clock=utcnow) -> None:
        self.store = store
        self.policy = policy
        self.node_timeout_s = node_timeout_s
        self.default_runtime_s = default_runtime_s
        self._clock = clock

    def snapshot(self, conn: Connection) -> tuple[Snapshot, dict[int, object]]:
        """The world as the policy sees it, and the queued rows by id (for the write-back)."""
        now = self._clock()
        fresh_after = now - timedelta(seconds=self.node_timeout_s)
        node_rows = {r.name: r for r in conn.execute(select(nodes))}
        running = {r.id: r for r in conn.execute(
            select(jobs.c.id, jobs.c.started_at, jobs.c.est_runtime_s, jobs.c.time_limit_s)
            .where(jobs.c.state == State.RUNNING.value))}
        slots = []
        for g in conn.execute(select(gpus).order_by(gpus.c.node_name, gpus.c.vendor, gpus.c.index)):
            node = node_rows.get(g.node_name)
            alive = node is not None and node.last_heartbeat is not None and node.last_heartbeat >= fresh_after
            busy_until = None
            if g.job_id is not None:
                busy_until = self._expected_end(running.get(g.job_id), now)
            slots.append(GpuSlot(id=g.id, node=g.node_name, zone=node.zone if node else "?",
                                 index=g.index, model=g.model, memory_gib=g.memory_gib,
                                 healthy=bool(g.healthy) and alive, busy_until=busy_until))
        queued = _read_queue(conn)
        snapshot = Snapshot(
            now=now,
            jobs=tuple(QueuedJob(r.id, r.gpus, r.gpu_mem_gib, r.submitted_at, r.est_runtime_s,
                                 r.deadline, r.latency_slo_ms, r.workload, r.prompts)
                       for r in queued.values()),
            gpus=tuple(slots),
            default_runtime_s=self.default_runtime_s,
        )
        return snapshot, queued

    def _expected_end(self, job, now: datetime) -> datetime:
        if job is None or job.started_at is None:
            return now + timedelta(seconds=60)
        runtime = job.est_runtime_s or job.time_limit_s or self.default_runtime_s
        end = job.started_at + timedelta(seconds=runtime)
        # Running past its estimate: it is still busy; assume it ends soon.
        return end if end > now else now + timedelta(seconds=60)

    def preview(self) -> tuple[Snapshot, Plan]:
        """What the policy would do now, without writing anything."""
        with self.store.read() as conn:
            snapshot, _ = self.snapshot(conn)
        return snapshot, self.policy.plan(snapshot)

    def tick(self) -> TickStats:
        started = time.perf_counter()
        with self.store.read() as conn:
            snapshot, queued = self.snapshot(conn)
        plan = self.policy.plan(snapshot)
        placed = plan.by_job()
        writes = []
        for job_id, row in queued.items():
            a = placed.get(job_id)
            if a is None:
                why = plan.unplaced.get(job_id, "not placed by the policy")
                if row.state == State.PLANNED.value:
                    writes.append(("withdraw", row, None, why))
                elif row.reason != why:
                    writes.append(("reason", row, None, why))
                continue
            if row.state == State.PENDING.value:
                writes.append(("plan", row, a, a.explanation))
            elif _plan_changed(row, a, snapshot.now):
                writes.append(("move", row, a, a.explanation))
        counts = {"plan": 0, "move": 0, "withdraw": 0, "reason": 0}
        for i in range(0, len(writes), WRITE_BATCH):
            batch = writes[i:i + WRITE_BATCH]
            for kind, n in self.store.transact(lambda conn: _apply(conn, batch, self._clock())).items():
                counts[kind] += n
        stats = TickStats(jobs=len(queued), planned=counts["plan"], moved=counts["move"],
                          withdrawn=counts["withdraw"], duration_s=time.perf_counter() - started)
        if stats.planned or stats.moved or stats.withdrawn:
            log.info("planner (%s): %d queued, %d newly planned, %d moved, %d withdrawn in %.3fs",
                     self.policy.name, stats.jobs, stats.planned, stats.moved, stats.withdrawn,
                     stats.duration_s)
        return stats


class QueuedRow(NamedTuple):
    """A PENDING or PLANNED job as the planner reads it each tick."""

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


_QUEUE_TIMES = {"submitted_at", "deadline", "planned_start"}


def _read_queue(conn: Connection) -> dict[int, QueuedRow]:
    """The queue, read fast: a tick reads thousands of rows, so on SQLite times and JSON come
    back as raw text and are parsed here with the C parsers instead of per-value processors."""
    raw = conn.dialect.name == "sqlite"
    cols = []
    for name in QueuedRow._fields:
        col = jobs.c[name]
        if raw and (name in _QUEUE_TIMES or name == "planned_gpu_ids"):
            col = type_coerce(col, String).label(name)
        cols.append(col)
    q = (select(*cols).where(jobs.c.state.in_([State.PENDING.value, State.PLANNED.value]))
         .order_by(jobs.c.id))
    out: dict[int, QueuedRow] = {}
    for r in conn.execute(q):
        if raw:
            r = QueuedRow(r[0], r[1], r[2], r[3], _utc(r[4]), r[5], _utc(r[6]), r[7], r[8], r[9],
                          r[10], json.loads(r[11]) if r[11] else None, _utc(r[12]), r[13], r[14])
        else:
            r = QueuedRow(*r)
        out[r.id] = r
    return out


def _utc(text: str | None) -> datetime | None:
    """A stored naive-UTC SQLite timestamp as an aware datetime."""
    return None if text is None else datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


def _plan_changed(row, a, now: datetime) -> bool:
    if row.planned_node != a.node or list(row.planned_gpu_ids or []) != list(a.gpu_ids):
        return True
    if row.planned_start is None:
        return True
    shift_s = (a.start_at - row.planned_start).total_seconds()
    if shift_s < -EARLIER_TOLERANCE_S:
        return True
    lead_s = max(0.0, (row.planned_start - now).total_seconds())
    return shift_s > max(LATER_TOLERANCE_S, LATER_TOLERANCE_SHARE * lead_s)


_PLAN_FIELDS = ("planned_node", "planned_gpu_ids", "planned_start", "plan_rev", "explanation",
                "est_energy_j", "est_gco2", "state", "reason")
_UPDATE_PLAN = (update(jobs).where(jobs.c.id == bindparam("b_id"))
                .values({f: bindparam(f"b_{f}") for f in _PLAN_FIELDS}))
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
    updates, reasons, events = [], [], []
    done = {"plan": 0, "move": 0, "withdraw": 0, "reason": 0}
    for kind, row, a, why in batch:
        if current.get(row.id) != (row.state, row.plan_rev):
            continue
        if kind == "reason":
            reasons.append({"b_id": row.id, "b_reason": why})
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
    record_events(conn, events)
    return done


def _plan_row(row, a, state: State, why: str) -> dict:
    return {"b_id": row.id, "b_state": state.value, "b_reason": why, "b_plan_rev": row.plan_rev + 1,
            "b_planned_node": a.node if a else None,
            "b_planned_gpu_ids": list(a.gpu_ids) if a else None,
            "b_planned_start": a.start_at if a else None,
            "b_explanation": a.explanation if a else None,
            "b_est_energy_j": a.estimate.energy_j if a else None,
            "b_est_gco2": a.estimate.gco2 if a else None}


def _event(job_id: int, src: State, dst: State, why: str, now) -> dict:
    return {"job_id": job_id, "from_state": src.value, "to_state": dst.value, "actor_uid": None,
            "reason": why, "at": now}
