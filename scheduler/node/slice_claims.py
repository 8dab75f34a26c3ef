"""Starting the jobs that ask for a slice of a GPU (`submit --gpu-fraction F`, `--mig PROFILE`)
on this node's free slices: a simple placement, not a plan.

The planner does not place slice jobs (they wait with REASON GpuSlice, scheduler.jobs.store).
Each agent tick reads the slice jobs that wait on nothing else, oldest first, and gives each
the free slice of its node that fits with the smallest share of a GPU (best fit, so a small
job does not take a big instance another job needs); ties go to the lowest GPU, then the
lowest instance. A slice fits `--mig P` when it is a MIG instance of profile P, `--gpu-fraction
F` when its share of its GPU is at least F (a MIG instance's compute slices over the GPU's, an
AMD compute partition's 1/partitions of its card, a declared share's 1/N), and either when its
memory is at least `--gpu-mem`. The job starts at once, with no carbon-aware choice of time
or place: planning slice jobs for carbon is not done yet.

The claim is one transaction, as for planned jobs: the slice is taken with a conditional
UPDATE (an instance's `job_id`, or an AMD partition's GPU row), and the job goes PENDING ->
PLANNED -> RUNNING at once, so no slice ever holds two jobs and no job runs twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, and_, exists, select, update

from scheduler.jobs.store import claim_values, slice_jobs_ready, slice_placed
from scheduler.lifecycle import State, transition
from scheduler.node.launch import visible_devices_env
from scheduler.store import Store
from scheduler.store.models import gpu_instances, gpus

# How many waiting slice jobs are read per free slice (oldest first).
READ_PER_FREE_SLICE = 8


@dataclass(frozen=True)
class Slice:
    """A free slice of this node: a row of gpu_instances, or an AMD partition's GPU row."""

    gpu_id: int
    index: int  # the GPU's (or AMD partition's) vendor index
    vendor: str
    fraction: float
    memory_gib: float
    kind: str  # mig | share | partition
    profile: str | None
    instance_uuid: str | None
    device: str  # what the visible-devices variable names

    def fits(self, job) -> bool:
        if job.gpu_mem_gib and job.gpu_mem_gib > self.memory_gib + 1e-9:
            return False
        if job.mig_profile is not None:
            return self.kind == "mig" and self.profile == job.mig_profile
        return job.gpu_fraction is not None and self.fraction + 1e-9 >= job.gpu_fraction

    def visible_env(self) -> dict[str, str]:
        """The environment that confines the job to this slice and nothing else: the MIG
        device by its UUID (CUDA_VISIBLE_DEVICES=MIG-<uuid>), else the GPU or AMD partition by
        its index, as for whole GPUs."""
        if self.kind == "mig":
            return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": self.device}
        return visible_devices_env(self.vendor, [self.index])


def free_slices(conn: Connection, node: str) -> list[Slice]:
    """This node's free slices, on healthy GPUs that are not drained."""
    usable = and_(gpus.c.node_name == node, gpus.c.healthy.is_(True), gpus.c.drained.is_(False))
    out = [Slice(r.gpu_id, r.index, r.vendor, r.fraction, r.memory_gib, r.kind, r.profile, r.uuid, r.device)
           for r in conn.execute(
               select(gpu_instances.c.gpu_id, gpus.c.index, gpus.c.vendor, gpu_instances.c.fraction,
                      gpu_instances.c.memory_gib, gpu_instances.c.kind, gpu_instances.c.profile,
                      gpu_instances.c.uuid, gpu_instances.c.device)
               .join(gpus, gpus.c.id == gpu_instances.c.gpu_id)
               .where(usable, gpu_instances.c.healthy.is_(True), gpu_instances.c.job_id.is_(None))
               .order_by(gpus.c.vendor, gpus.c.index, gpu_instances.c.id))]
    shared = exists().where(gpu_instances.c.gpu_id == gpus.c.id)
    out += [Slice(r.id, r.index, r.vendor, 1.0 / max(1, r.partitions), r.memory_gib, "partition",
                  r.partition_mode, None, str(r.index))
            for r in conn.execute(select(gpus).where(usable, gpus.c.partition_mode.is_not(None),
                                                     gpus.c.job_id.is_(None), ~shared)
                                  .order_by(gpus.c.vendor, gpus.c.index))]
    return out


def best_fit(job, slices: list[Slice]) -> Slice | None:
    """The fitting slice with the smallest share of a GPU (the first such in order)."""
    fitting = [s for s in slices if s.fits(job)]
    return min(fitting, key=lambda s: s.fraction) if fitting else None


def ready_placements(store: Store, node: str, now: datetime) -> list[tuple]:
    """(job, slice) for each waiting slice job that fits a free slice of `node` now, each
    slice given once."""
    with store.read() as conn:
        free = free_slices(conn, node)
        if not free:
            return []
        waiting = slice_jobs_ready(conn, now, READ_PER_FREE_SLICE * len(free))
    placements = []
    for job in waiting:
        chosen = best_fit(job, free)
        if chosen is not None:
            free.remove(chosen)
            placements.append((job, chosen))
    return placements


def claim_slice(store: Store, job, chosen: Slice, node: str, now: datetime) -> bool:
    """Take `chosen` for `job` and move it PENDING -> PLANNED -> RUNNING, atomically; False
    (nothing changed) when the slice was taken or the job changed (held, cancelled) meanwhile."""
    what = (f"MIG instance {chosen.profile} {chosen.device}" if chosen.kind == "mig" else
            f"GPU share {chosen.profile} of GPU {chosen.index}" if chosen.kind == "share" else
            f"AMD {chosen.profile} partition {chosen.index}")

    def tx(conn: Connection) -> bool:
        if chosen.instance_uuid is not None:
            taken = conn.execute(update(gpu_instances).where(
                gpu_instances.c.uuid == chosen.instance_uuid, gpu_instances.c.job_id.is_(None),
                gpu_instances.c.healthy.is_(True)).values(job_id=job.id)).rowcount
        else:
            taken = conn.execute(update(gpus).where(
                gpus.c.id == chosen.gpu_id, gpus.c.job_id.is_(None), gpus.c.healthy.is_(True))
                .values(job_id=job.id)).rowcount
        where, placed = slice_placed(node, chosen.gpu_id, now)
        ok = taken == 1 and transition(
            conn, job.id, State.PLANNED, actor_uid=None, expect=State.PENDING, where=where,
            reason=f"placed on {what} of {node}", values=placed)
        ok = ok and transition(
            conn, job.id, State.RUNNING, actor_uid=None, expect=State.PLANNED,
            reason=f"claimed by {node}: {what}",
            values={**claim_values(node, [chosen.gpu_id], [chosen.index], now),
                    "gpu_instance": chosen.instance_uuid})
        if not ok:
            conn.rollback()
        return ok

    return store.transact(tx)
