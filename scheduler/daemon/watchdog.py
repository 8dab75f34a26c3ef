"""Node liveness: a node whose agent stops heartbeating is down; after a grace period its
RUNNING jobs are declared LOST (or re-queued when their owner allowed retries).

The grace period must be longer than any agent restart, because a job declared lost may be
re-queued and start elsewhere; an agent that comes back stops the leftover process of every
job it no longer owns, so a job never runs twice.

Silence is measured on this process's monotonic clock, by watching each node's heartbeat
value change, never by comparing the agent's wall-clock stamp with ours: agents on other
hosts have their own clocks (skew), and wall clocks jump (NTP steps, a wrong RTC at boot).
A clock jump must not declare a whole healthy cluster lost, and a jump backwards must not
hide a dead node. After a daemon restart every node gets the full grace period again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Connection, select

from scheduler.clock import utcnow
from scheduler.jobs.store import running_on
from scheduler.lifecycle import State, retry_or_end
from scheduler.store import Store
from scheduler.store.models import nodes

log = logging.getLogger(__name__)

DEFAULT_NODE_LOST_AFTER_S = 300.0


class NodeReaper:
    """Declares the RUNNING jobs of nodes that fell silent lost; call `reap()` periodically."""

    def __init__(self, store: Store, *, lost_after_s: float = DEFAULT_NODE_LOST_AFTER_S,
                 monotonic: Callable[[], float] = time.monotonic,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.store = store
        self.lost_after_s = lost_after_s
        self._monotonic = monotonic
        self._clock = clock
        # node -> (the heartbeat value last seen, monotonic time it was first seen)
        self._seen: dict[str, tuple[datetime | None, float]] = {}

    def silent_nodes(self, conn: Connection) -> list[str]:
        """Nodes whose heartbeat has not changed for `lost_after_s` of our monotonic time."""
        now = self._monotonic()
        rows = conn.execute(select(nodes.c.name, nodes.c.last_heartbeat)).all()
        seen = {}
        dead = []
        for name, beat in rows:
            prev = self._seen.get(name)
            since = prev[1] if prev is not None and prev[0] == beat else now
            seen[name] = (beat, since)
            if now - since >= self.lost_after_s:
                dead.append(name)
        self._seen = seen
        return dead

    def reap(self) -> list[int]:
        """Declare the RUNNING jobs of silent nodes lost (or re-queue them); their ids."""
        with self.store.read() as conn:
            dead = self.silent_nodes(conn)
            if not dead:
                return []
            victims = running_on(conn, dead)
        out = []
        ended_at = self._clock()
        for job in victims:
            why = f"node {job.node} stopped heartbeating for more than {self.lost_after_s:g}s"

            def tx(conn: Connection, job=job, why=why) -> bool:
                return retry_or_end(conn, job, why, end=State.LOST, values=dict(ended_at=ended_at))

            if self.store.transact(tx):
                out.append(job.id)
                log.error("job %s lost: %s", job.id, why)
        return out
