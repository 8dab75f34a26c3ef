"""A node's registration: its row in `nodes` and its GPUs' rows in `gpus`, as the GPU
backend finds them at the agent's start.

A GPU is known by its UUID; a card that left the node stays in the store, unhealthy, and a
new card in a slot another used to hold frees that slot first. Each GPU is described by its
catalog part where the catalog knows it, else generically from what the driver reports.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import Connection, insert, select, update

from policies.model.catalog import match_device_name, nominal_memory_gib
from scheduler.node.gpu_slices import instance_rows, mark_gone, sync_instances
from scheduler.node.power_limits import PowerLimits
from scheduler.store import Store
from scheduler.store.models import gpus, nodes
from telemetry.gpu import GpuBackend

log = logging.getLogger(__name__)


def register_node(store: Store, backend: GpuBackend, devices: list, node: str, zone: str, now: datetime, *,
                  limits: PowerLimits, warned: set[str], shares: int = 1) -> dict[int, str]:
    """Upsert the node and its GPUs, the backend's `devices` (those that disappeared are
    marked unhealthy), and their slices (scheduler.node.gpu_slices: MIG instances, or
    `shares` declared time-sliced shares per GPU without hardware partitioning); the store
    id -> UUID of each device. `warned`: the GPU names already warned about as not in the
    catalog (each is warned about once per agent)."""

    def tx(conn: Connection) -> None:
        existing = conn.execute(select(nodes.c.name).where(nodes.c.name == node)).first()
        values = dict(zone=zone, backend=backend.name, emulated=backend.emulated, last_heartbeat=now)
        if existing:
            conn.execute(update(nodes).where(nodes.c.name == node).values(**values))
        else:
            conn.execute(insert(nodes).values(name=node, registered_at=now, **values))
        known = {r.uuid: r for r in conn.execute(
            select(gpus.c.id, gpus.c.uuid, gpus.c.node_name).where(gpus.c.node_name == node))}
        seen = set()
        for d in devices:
            seen.add(d.uuid)
            fields = dict(node_name=node, index=d.index, vendor=d.vendor,
                          healthy=True, **describe(d, backend, limits, warned))
            if d.uuid in known:
                conn.execute(update(gpus).where(gpus.c.uuid == d.uuid).values(**fields))
            else:
                # Free the (node, vendor, index) slot if a different card used to sit there.
                conn.execute(update(gpus).where(
                    gpus.c.node_name == node, gpus.c.vendor == d.vendor,
                    gpus.c.index == d.index).values(index=-1 - d.index, healthy=False))
                conn.execute(insert(gpus).values(uuid=d.uuid, **fields))
            gpu_id = conn.execute(select(gpus.c.id).where(gpus.c.uuid == d.uuid)).scalar_one()
            sync_instances(conn, node, gpu_id, instance_rows(d, shares))
        gone = [u for u in known if u not in seen]
        if gone:
            conn.execute(update(gpus).where(gpus.c.uuid.in_(gone)).values(healthy=False))
            mark_gone(conn, [known[u].id for u in gone])

    store.transact(tx)
    with store.read() as conn:
        uuid_of = {r.id: r.uuid for r in conn.execute(
            select(gpus.c.id, gpus.c.uuid).where(gpus.c.node_name == node,
                                                 gpus.c.uuid.in_([d.uuid for d in devices])))}
    return uuid_of


def describe(d, backend: GpuBackend, limits: PowerLimits, warned: set[str]) -> dict:
    """The store's view of one device: its catalog part (or its driver name when the
    catalog does not know it), nominal and reported memory, and power limits. Tells the
    backend the part's rated power so impossible readings are dropped."""
    known = match_device_name(d.model) or match_device_name(d.name)
    if known is None and d.name not in warned:
        warned.add(d.name)
        limit = d.power_limit.current_w if d.power_limit else None
        log.warning("GPU model %r is not in the catalog: it is planned generically from what "
                    "the driver reports (%.1f GiB, power limit %s), never as another part; add "
                    "a row to policies/data/catalog.toml for accurate plans", d.name,
                    d.memory_gib, f"{limit:.0f} W" if limit else "unknown")
    backend.set_rated_power_w(d.uuid, known.tdp_w / max(1, d.partitions) if known else None)
    limit = d.power_limit
    limits.note(d.uuid, limit)
    return dict(model=known.name if known else d.name,
                memory_gib=nominal_memory_gib(known, d.memory_gib, d.partitions),
                memory_reported_gib=d.memory_gib,
                power_limit_w=limit.current_w if limit else None,
                power_limit_min_w=limit.min_w if limit else None,
                power_limit_max_w=limit.max_w if limit else None,
                power_limit_default_w=limit.default_w if limit else None,
                partition_mode=d.partition_mode, partitions=d.partitions,
                memory_partition=d.memory_partition, mig_enabled=d.mig_enabled)
