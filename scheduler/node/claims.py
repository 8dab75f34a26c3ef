"""Claiming: a node takes a PLANNED job whose start has come, and its GPUs, in one atomic
transaction (PLANNED -> RUNNING at the plan's revision, every GPU still free and healthy),
so that no job ever runs twice nor two jobs on one GPU, whatever other agents do."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, select, update

from scheduler.jobs.store import at_plan_rev, claim_values, due_on
from scheduler.lifecycle import State, transition
from scheduler.store import Store
from scheduler.store.models import gpu_instances, gpus

# How many due jobs are read per free GPU (earliest first).
DUE_PER_FREE_GPU = 8


def due_jobs(store: Store, node: str, now: datetime) -> tuple[dict, set[int], list]:
    """The node's GPU rows (by id), the ids of those that cannot take a whole-GPU job now
    (busy, unhealthy, drained, or shared: in MIG mode or split into declared shares, whose
    slices go to slice jobs only, scheduler.node.slice_claims), and the PLANNED jobs on the
    node whose start has come.

    Only as many due jobs are read as the free GPUs could possibly take (a few per free
    GPU, earliest first): a long queue stuck behind a job that overran its estimate is all
    "due", and reading it whole every tick would cost the daemon dearly.
    """
    with store.read() as conn:
        gpu_rows = {r.id: r for r in conn.execute(select(gpus).where(gpus.c.node_name == node))}
        shared = set(conn.execute(select(gpu_instances.c.gpu_id).distinct()
                                  .where(gpu_instances.c.node_name == node)).scalars())
        busy = {i for i, g in gpu_rows.items()
                if g.job_id is not None or not g.healthy or g.drained or g.mig_enabled or i in shared}
        free = len(gpu_rows) - len(busy)
        if free == 0:
            return gpu_rows, busy, []
        due = due_on(conn, node, now, DUE_PER_FREE_GPU * free)
    return gpu_rows, busy, due


def claim(store: Store, job, gpu_ids: list[int], indices: list[int], node: str, now: datetime) -> bool:
    """PLANNED -> RUNNING on `node` and take the GPUs `gpu_ids` (the driver's `indices`),
    atomically; False (nothing changed) when a GPU was taken or the plan changed meanwhile."""

    def tx(conn: Connection) -> bool:
        taken = conn.execute(
            update(gpus).where(gpus.c.id.in_(gpu_ids), gpus.c.job_id.is_(None),
                               gpus.c.healthy.is_(True)).values(job_id=job.id)).rowcount
        if taken != len(gpu_ids):
            conn.rollback()
            return False
        ok = transition(conn, job.id, State.RUNNING, actor_uid=None, expect=State.PLANNED,
                        where=at_plan_rev(job.plan_rev),
                        reason=f"claimed by {node}",
                        values=claim_values(node, gpu_ids, indices, now))
        if not ok:
            conn.rollback()
        return ok

    return store.transact(tx)
