"""The planner's SQL on the cluster: the nodes and GPUs a tick reads, and why nodes short of
disk take no jobs. The SQL on the jobs themselves (the queue, the running jobs, the stored
plans and their writes) is `scheduler.jobs.store`'s.
"""

from __future__ import annotations

from sqlalchemy import Connection, Row, exists, select

from scheduler.store.models import gpu_instances, gpus, nodes


def read_nodes(conn: Connection) -> dict[str, Row]:
    """Every node's row by name (zone, last heartbeat)."""
    return {r.name: r for r in conn.execute(select(nodes))}


def read_gpus(conn: Connection) -> list[Row]:
    """Every GPU that runs whole-GPU jobs, by node, vendor and index (the order of the
    snapshot's slots). A shared GPU (in MIG mode, or split into declared time-sliced shares)
    is left out: its slices go to slice jobs, which the node agents place themselves
    (scheduler.node.slice_claims), and CUDA never sees a GPU in MIG mode whole."""
    shared = exists().where(gpu_instances.c.gpu_id == gpus.c.id)
    return list(conn.execute(select(gpus).where(gpus.c.mig_enabled.is_(False), ~shared)
                             .order_by(gpus.c.node_name, gpus.c.vendor, gpus.c.index)))


def disk_full_notes(conn: Connection, most: int = 3) -> str | None:
    """Why nodes take no jobs for want of disk space (their agents' words: how much is free
    where), for the REASON of the jobs left waiting; None when no node is short."""
    rows = conn.execute(select(gpus.c.node_name, gpus.c.unhealthy_reason).distinct()
                        .where(gpus.c.healthy.is_(False), gpus.c.unhealthy_reason.like("disk full:%"))
                        .order_by(gpus.c.node_name)).all()
    if not rows:
        return None
    by_node = {node: why for node, why in rows}
    named = [f"node {node} takes no jobs: {why}" for node, why in list(by_node.items())[:most]]
    more = f" (and {len(by_node) - most} more nodes)" if len(by_node) > most else ""
    return "; ".join(named) + more
