"""Admission of a job that asks for a slice of a GPU (`submit --gpu-fraction F`, `--mig
PROFILE`): refused (400) when no GPU of the registered fleet offers such a slice, busy or
free, in service or drained; one line naming what the fleet does offer.

A slice is offered by a MIG instance (its share of its GPU: compute slices over the GPU's),
an AMD compute partition (1/partitions of its card) or a share the operator declared
(`gpu_shares`: 1/N); it must also have the memory of `--gpu-mem`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, exists, select

from scheduler.daemon.access import RequestError
from scheduler.store import Store
from scheduler.store.models import gpu_instances, gpus


@dataclass(frozen=True)
class Offer:
    kind: str  # mig | share | partition
    profile: str  # the MIG profile, "1/N", or the AMD partition mode
    fraction: float
    memory_gib: float
    model: str


def fleet_offers(conn: Connection) -> list[Offer]:
    """Every kind of slice a healthy registered GPU offers (one per distinct kind)."""
    rows = conn.execute(
        select(gpu_instances.c.kind, gpu_instances.c.profile, gpu_instances.c.fraction,
               gpu_instances.c.memory_gib, gpus.c.model).distinct()
        .join(gpus, gpus.c.id == gpu_instances.c.gpu_id)
        .where(gpus.c.healthy.is_(True), gpu_instances.c.healthy.is_(True)))
    offers = [Offer(r.kind, r.profile, r.fraction, r.memory_gib, r.model) for r in rows]
    shared = exists().where(gpu_instances.c.gpu_id == gpus.c.id)
    rows = conn.execute(
        select(gpus.c.partition_mode, gpus.c.partitions, gpus.c.memory_gib, gpus.c.model).distinct()
        .where(gpus.c.healthy.is_(True), gpus.c.partition_mode.is_not(None), ~shared))
    offers += [Offer("partition", r.partition_mode, 1.0 / max(1, r.partitions), r.memory_gib, r.model)
               for r in rows]
    return offers


def fits(offer: Offer, fraction: float | None, profile: str | None, memory_gib: float) -> bool:
    if memory_gib and memory_gib > offer.memory_gib + 1e-9:
        return False
    if profile is not None:
        return offer.kind == "mig" and offer.profile == profile
    return fraction is not None and offer.fraction + 1e-9 >= fraction


def check_slice(store: Store, fraction: float | None, profile: str | None, memory_gib: float) -> None:
    """RequestError(400) unless some GPU of the fleet offers the slice asked for."""
    with store.read() as conn:
        offers = fleet_offers(conn)
    if any(fits(o, fraction, profile, memory_gib) for o in offers):
        return
    asked = f"a {profile} MIG instance" if profile is not None else f"{fraction:g} of a GPU"
    if memory_gib:
        asked += f" with {memory_gib:g} GiB"
    if not offers:
        have = "no GPU of the fleet is shared (MIG mode, AMD compute partitions or declared gpu_shares)"
    else:
        kinds = sorted({f"{o.model} {o.profile} ({o.fraction:.3g}, {o.memory_gib:g} GiB)" for o in offers})
        have = "the fleet offers " + ", ".join(kinds[:8]) + (" and more" if len(kinds) > 8 else "")
    raise RequestError(400, f"no GPU of the fleet offers {asked}: {have}")
