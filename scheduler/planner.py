"""The planner: store -> Snapshot -> policy -> store.

A tick reads the queue and the GPUs, asks the policy for a plan, and writes back only
what changed, in small transactions so submissions are never held up behind a big plan.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, select, update

from policies import Plan, Policy, QueuedJob, Snapshot
from policies.model import GpuSlot
from scheduler.lifecycle import State, transition, utcnow
from scheduler.store import Store
from scheduler.store.models import gpus, jobs, nodes

log = logging.getLogger(__name__)

WRITE_BATCH = 200
REPLAN_TOLERANCE_S = 1.0


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
        queued = {r.id: r for r in conn.execute(
            select(jobs.c.id, jobs.c.state, jobs.c.gpus, jobs.c.gpu_mem_gib, jobs.c.submitted_at,
                   jobs.c.est_runtime_s, jobs.c.deadline, jobs.c.latency_slo_ms, jobs.c.workload,
                   jobs.c.prompts, jobs.c.planned_node, jobs.c.planned_gpu_ids,
                   jobs.c.planned_start, jobs.c.plan_rev, jobs.c.reason)
            .where(jobs.c.state.in_([State.PENDING.value, State.PLANNED.value]))
            .order_by(jobs.c.id))}
        snapshot = Snapshot(
            now=now,
            jobs=tuple(QueuedJob(id=r.id, gpus=r.gpus, gpu_mem_gib=r.gpu_mem_gib,
                                 submitted_at=r.submitted_at, est_runtime_s=r.est_runtime_s,
                                 deadline=r.deadline, latency_slo_ms=r.latency_slo_ms,
                                 workload=r.workload, prompts=r.prompts)
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
            elif (row.planned_node != a.node or list(row.planned_gpu_ids or []) != list(a.gpu_ids)
                  or row.planned_start is None
                  or abs((row.planned_start - a.start_at).total_seconds()) > REPLAN_TOLERANCE_S):
                writes.append(("move", row, a, a.explanation))
        counts = {"plan": 0, "move": 0, "withdraw": 0, "reason": 0}
        for i in range(0, len(writes), WRITE_BATCH):
            batch = writes[i:i + WRITE_BATCH]
            for kind, n in self.store.transact(lambda conn: _apply(conn, batch)).items():
                counts[kind] += n
        stats = TickStats(jobs=len(queued), planned=counts["plan"], moved=counts["move"],
                          withdrawn=counts["withdraw"], duration_s=time.perf_counter() - started)
        if stats.planned or stats.moved or stats.withdrawn:
            log.info("planner (%s): %d queued, %d newly planned, %d moved, %d withdrawn in %.3fs",
                     self.policy.name, stats.jobs, stats.planned, stats.moved, stats.withdrawn,
                     stats.duration_s)
        return stats


def _apply(conn: Connection, batch: list) -> dict[str, int]:
    done = {"plan": 0, "move": 0, "withdraw": 0, "reason": 0}
    for kind, row, a, why in batch:
        if kind == "plan":
            ok = transition(conn, row.id, State.PLANNED, actor_uid=None, reason=why,
                            expect=State.PENDING, values=_plan_values(a, row))
        elif kind == "move":
            ok = conn.execute(
                update(jobs).where(jobs.c.id == row.id, jobs.c.state == State.PLANNED.value,
                                   jobs.c.plan_rev == row.plan_rev)
                .values(reason=why, **_plan_values(a, row))).rowcount == 1
        elif kind == "withdraw":
            ok = transition(conn, row.id, State.PENDING, actor_uid=None, reason=why,
                            expect=State.PLANNED, where=(jobs.c.plan_rev == row.plan_rev,),
                            values=dict(planned_node=None, planned_gpu_ids=None,
                                        planned_start=None, explanation=None,
                                        plan_rev=row.plan_rev + 1))
        else:
            ok = conn.execute(update(jobs).where(jobs.c.id == row.id,
                                                 jobs.c.state == State.PENDING.value)
                              .values(reason=why)).rowcount == 1
        done[kind] += int(ok)
    return done


def _plan_values(a, row) -> dict:
    return dict(planned_node=a.node, planned_gpu_ids=list(a.gpu_ids), planned_start=a.start_at,
                plan_rev=row.plan_rev + 1, explanation=a.explanation,
                est_energy_j=a.estimate.energy_j, est_gco2=a.estimate.gco2)
