"""The node's heartbeat: one transaction that says the node is alive (`nodes.last_heartbeat`,
which the head's watchdog reads) and brings its GPUs' rows up to date: the latest reading,
today's energy so far and, when freshly read, the power limits."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, case, update

from scheduler.store import Store
from scheduler.store.models import gpus, nodes


def write_heartbeat(store: Store, node: str, now: datetime, latest: dict, day_j: dict[int, float],
                    limits: dict[str, object], gpu_of: dict[str, int]) -> None:
    """`latest`: the latest reading of each GPU by UUID; `day_j`: joules each GPU (store id)
    drew since the last heartbeat, added to its energy of the local day (restarted on a new
    day); `limits`: the power limits read now by UUID (none: leave them); `gpu_of`: UUID ->
    store GPU id of the node's registered GPUs (readings of others are left out)."""
    day = now.astimezone().date().isoformat()

    def tx(conn: Connection) -> None:
        conn.execute(update(nodes).where(nodes.c.name == node)
                     .values(last_heartbeat=now))
        for uuid, r in latest.items():
            gid = gpu_of.get(uuid)
            if gid is None:
                continue
            inc = day_j.get(gid, 0.0)
            limit = limits.get(uuid)
            extra = {} if limit is None else dict(
                power_limit_w=limit.current_w, power_limit_min_w=limit.min_w,
                power_limit_max_w=limit.max_w)
            conn.execute(update(gpus).where(gpus.c.id == gid).values(
                power_w=r.power_w, energy_j=r.energy_j, utilization_pct=r.utilization_pct,
                energy_day=day,
                energy_day_j=case((gpus.c.energy_day == day, gpus.c.energy_day_j + inc), else_=inc),
                **extra))

    store.transact(tx)
