"""Node liveness: a node whose agent stops heartbeating is down; after a grace period its
RUNNING jobs are declared LOST (or re-queued when their owner allowed retries).

The grace period must be longer than any agent restart, because a job declared lost may be
re-queued and start elsewhere; an agent that comes back stops the leftover process of every
job it no longer owns, so a job never runs twice.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import Connection, or_, select

from scheduler.lifecycle import State, retry_or_end, utcnow
from scheduler.store import Store
from scheduler.store.models import jobs, nodes

log = logging.getLogger(__name__)

DEFAULT_NODE_LOST_AFTER_S = 300.0


def reap_dead_nodes(store: Store, *, lost_after_s: float = DEFAULT_NODE_LOST_AFTER_S,
                    now: datetime | None = None) -> list[int]:
    """Declare the RUNNING jobs of silent nodes lost; return their ids."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=lost_after_s)
    with store.read() as conn:
        dead = [r.name for r in conn.execute(
            select(nodes.c.name).where(or_(nodes.c.last_heartbeat.is_(None),
                                           nodes.c.last_heartbeat < cutoff)))]
        if not dead:
            return []
        victims = list(conn.execute(
            select(jobs.c.id, jobs.c.node, jobs.c.attempts, jobs.c.max_retries)
            .where(jobs.c.state == State.RUNNING.value, jobs.c.node.in_(dead))))
    out = []
    for job in victims:
        why = f"node {job.node} stopped heartbeating for more than {lost_after_s:g}s"

        def tx(conn: Connection, job=job, why=why) -> bool:
            return retry_or_end(conn, job, why, end=State.LOST, values=dict(ended_at=now))

        if store.transact(tx):
            out.append(job.id)
            log.error("job %s lost: %s", job.id, why)
    return out
