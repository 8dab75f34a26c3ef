"""A node's GPU slices in the store (`gpu_instances`): the MIG instances its NVIDIA GPUs in MIG
mode report, and the time-sliced shares the operator declares (`gpu_shares`) on GPUs without
hardware partitioning; and the first-fit placement of fractional jobs on them.

AMD compute partitions are not instances: each is a GPU of its own in `gpus` (with its
`partition_mode` and `partitions`), a slice of 1/partitions of its card.

Naming and sizing a MIG instance: NVML gives its GPU instance's compute slices and its memory
(telemetry.gpu.nvml); the profile is the catalogued one of the part with those slices whose
memory share is nearest (policies.model.partitions.profile_from_slices), its share of the GPU
its compute slices over the GPU's. A part the catalog does not know is named from the memory
("2g.24gb") and its share taken as slices / 7 (every MIG part to date has 7 compute slices:
NVIDIA MIG User Guide, Supported GPUs).
"""

from __future__ import annotations

import math

from sqlalchemy import Connection, delete, insert, select, update

from policies.model.catalog import GpuModel, match_device_name, nominal_memory_gib
from policies.model.partitions import mig_parts, mig_profile, profile_from_slices
from scheduler.store.models import gpu_instances
from telemetry.gpu import GpuDevice, MigInstance

DEFAULT_MIG_COMPUTE_SLICES = 7


def instance_rows(d: GpuDevice, shares: int = 1) -> list[dict]:
    """The gpu_instances rows `d` offers: its MIG devices when MIG mode is on, else `shares`
    time-sliced shares when the operator declared more than one, else none (a whole GPU)."""
    model = match_device_name(d.model) or match_device_name(d.name)
    if d.mig_enabled:
        return [_mig_row(model, m, d.memory_gib) for m in d.mig_instances]
    if shares > 1:
        nominal = nominal_memory_gib(model, d.memory_gib, d.partitions)
        return [dict(uuid=f"{d.uuid}/share-{k}", kind="share", profile=f"1/{shares}",
                     fraction=1.0 / shares, memory_gib=round(nominal / shares, 2), slices=None,
                     gpu_instance_id=None, device=str(d.index)) for k in range(shares)]
    return []


def _mig_row(model: GpuModel | None, m: MigInstance, gpu_memory_gib: float) -> dict:
    name = model.name if model else None
    total = mig_parts()[name].compute_slices if name in mig_parts() else DEFAULT_MIG_COMPUTE_SLICES
    memory_mib = m.memory_mib or 0.0
    slices = m.slices
    if slices is None:  # no attributes: the compute slices in proportion to the memory
        slices = max(1, round(total * memory_mib / (gpu_memory_gib * 1024))) if gpu_memory_gib else 1
    profile = profile_from_slices(name, slices, memory_mib, gpu_memory_gib * 1024 or None)
    known = mig_profile(name, profile) if name else None
    if known is not None and model is not None:
        memory_gib = round(model.memory_gib * known.memory_slices / known.gpu_memory_slices, 2)
    else:
        memory_gib = float(math.ceil(memory_mib / 1024))
    return dict(uuid=m.uuid, kind="mig", profile=profile, fraction=round(slices / total, 4),
                memory_gib=memory_gib, slices=slices, gpu_instance_id=m.gpu_instance_id, device=m.uuid)


def sync_instances(conn: Connection, node: str, gpu_id: int, rows: list[dict]) -> None:
    """Make the GPU's stored instances those of `rows` (by UUID): new ones added, present ones
    updated (a running job keeps its hold), gone ones deleted when free, else marked
    unhealthy until their job ends."""
    existing = {r.uuid: r for r in conn.execute(
        select(gpu_instances.c.uuid, gpu_instances.c.job_id).where(gpu_instances.c.gpu_id == gpu_id))}
    for row in rows:
        if row["uuid"] in existing:
            conn.execute(update(gpu_instances).where(gpu_instances.c.uuid == row["uuid"])
                         .values(healthy=True, node_name=node, gpu_id=gpu_id, **row))
        else:
            conn.execute(delete(gpu_instances).where(gpu_instances.c.uuid == row["uuid"],
                                                     gpu_instances.c.job_id.is_(None)))
            conn.execute(insert(gpu_instances).values(gpu_id=gpu_id, node_name=node, healthy=True, **row))
    gone = [u for u in existing if u not in {r["uuid"] for r in rows}]
    if gone:
        conn.execute(delete(gpu_instances).where(gpu_instances.c.uuid.in_(gone),
                                                 gpu_instances.c.job_id.is_(None)))
        conn.execute(update(gpu_instances).where(gpu_instances.c.uuid.in_(gone)).values(healthy=False))


def mark_gone(conn: Connection, gpu_ids: list[int]) -> None:
    """The instances of GPUs that left the node take no new job."""
    if gpu_ids:
        conn.execute(update(gpu_instances).where(gpu_instances.c.gpu_id.in_(gpu_ids)).values(healthy=False))
