"""What holds the fleet's GPUs and watts before a planner places the queue.

Three things do, and none of them is a decision of the planning problem (`policies.problem.instance`):

* **running jobs**: a GPU busy until `busy_until` is free from the slot after; under a power
  budget with a cap it draws its model's generic power (`energy.generic_power_w`) until then
  (even if it is unhealthy now);
* **pinned jobs** (`QueuedJob.pinned` with a current plan in `Snapshot.pinned`): their GPUs
  are busy until their planned finish, and their watts count against their budget's cap from
  the slot they start in to the slot they end in;
* **kept plans** (`Snapshot.keep`, incremental planning between full re-plans): each one
  that still fits, in start order, holds k GPUs of its node's pool over the slots its run
  touches (start rounded down, end up) and its watts under a cap (`keep_plans`); one that no
  longer fits is planned again like any other job.

`Occupancy` holds the result per pool of the fleet's `policies.problem.topology`: when each GPU is
free (`pools[p].free_slot`), GPUs free per slot (`capacity`), the first slot with k GPUs free
(`kth_free_slot`, per group `group_kth_free_slot`), what holds GPUs past the horizon, and the
watts left per slot under each power budget's cap (`power_cap`). A cap applies to a slot it
overlaps.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import NamedTuple

import numpy as np

from policies.model.energy import ProfileBook, fits, generic_power_w, job_shape
from policies.types import Assignment, Snapshot, budget_of
from policies.problem.slot_grid import SlotGrid
from policies.problem.topology import Group, Pool, Topology, topology


class Kept(NamedTuple):
    """An earlier plan kept as it is: `k` GPUs of `pool` over `duration` slots from `slot`."""

    assignment: Assignment
    pool: int
    slot: int
    duration: int
    k: int


class Occupancy:
    """The fleet's GPUs and watts held before the queue is placed (see the module docstring).

    `capacity` (pools x slots, int32) and `power_cap` (budget -> watts left per slot) are
    what the policies place the queue into; `pool_past_horizon[p]` lists (end slot, GPUs) of
    what holds pool p's GPUs past the horizon (running, pinned and kept): where a job that
    waits for them may start."""

    def __init__(self, snapshot: Snapshot, grid: SlotGrid, book: ProfileBook, pinned: tuple[Assignment, ...],
                 pinned_ids: set[int]) -> None:
        busy_until, pinned_power = _pinned_load(snapshot, grid, book, pinned)
        running_power = _running_power(snapshot, grid)
        self.topology: Topology = topology(snapshot)
        self._free_slots(snapshot, grid, busy_until)
        self.power_cap: dict[str, np.ndarray] = _power_budgets(snapshot, grid, running_power, pinned_power)
        self.kept: list[Kept] = keep_plans(self, snapshot, grid, book, pinned_ids)

    def _free_slots(self, snapshot: Snapshot, grid: SlotGrid, busy_until: dict[int, datetime]) -> None:
        """When each GPU of each pool is free, and from that the pools' free GPUs per slot."""
        topo = self.topology
        gpus = snapshot.gpus
        now, now_s, slot_s, n_slots = grid.now, grid.now.timestamp(), grid.slot_s, grid.n_slots
        # the slot each GPU is free from (as SlotGrid.ceil); the last entry pads the pool rows
        free = np.zeros(len(gpus) + 1, dtype=np.int64)
        free[-1] = n_slots
        past = np.zeros(len(gpus) + 1, dtype=np.int64)  # the same, not cut at the horizon
        for i, g in enumerate(gpus):
            bu = busy_until.get(g.id, g.busy_until) if busy_until else g.busy_until
            if bu is not None and bu > now:
                past[i] = max(0, math.ceil((bu.timestamp() - now_s) / slot_s - 1e-9))
                free[i] = min(n_slots, past[i])
        free_mat = free[topo.gpu_pos]  # pools x widest pool
        # per pool, (end slot, GPUs) of what holds its GPUs past the horizon (running and
        # pinned jobs here, kept plans in keep_plans): where a job that waits for them may start
        self.pool_past_horizon: list[list[tuple[int, int]]] = [
            [(int(e), 1) for e in row[:len(pool.gpu_ids)] if e > n_slots]
            for pool, row in zip(topo.pools, past[topo.gpu_pos].tolist())]
        self.pools: list[Pool] = [pool._replace(free_slot=tuple(row[:len(pool.gpu_ids)]))
                                  for pool, row in zip(topo.pools, free_mat.tolist())]
        self.groups: list[Group] = list(topo.groups)
        n_pools = len(self.pools)
        diff = np.zeros((n_pools, n_slots + 1), dtype=np.int32)
        np.add.at(diff, (np.repeat(np.arange(n_pools), free_mat.shape[1]), free_mat.ravel()), 1)
        self.capacity = np.cumsum(diff[:, :-1], axis=1, dtype=np.int32)
        # kth_free_slot[p, k-1]: first slot with k GPUs of pool p free (n_slots: never)
        self.kth_free_slot = np.sort(free_mat, axis=1)
        # group_kth_free_slot[g, k-1]: first slot with k GPUs free on one pool of group g
        self.group_kth_free_slot = np.minimum.reduceat(self.kth_free_slot[topo.by_group], topo.group_starts, axis=0) \
            if self.groups else np.zeros((0, self.kth_free_slot.shape[1]), dtype=np.int64)


def _pinned_load(snap: Snapshot, grid: SlotGrid, book: ProfileBook, pinned: tuple[Assignment, ...]
                 ) -> tuple[dict[int, datetime], list[tuple[str, int, int, float]]]:
    """The end of what each GPU is busy with beyond its own busy_until (pinned jobs; empty
    without any), and the pinned jobs' draws as (budget, from slot, to slot, W)."""
    busy_until: dict[int, datetime] = {}
    pinned_power: list[tuple[str, int, int, float]] = []  # budget, from, to, W
    if pinned:
        budget_of_gpu = {g.id: budget_of(g) for g in snap.gpus}  # for the power caps
        model_of_gpu = {g.id: g.model for g in snap.gpus}
        limit_of_gpu = {g.id: g.power_limit_w for g in snap.gpus}
        jobs_by_id = {j.id: j for j in snap.jobs}
        busy_until = {g.id: g.busy_until for g in snap.gpus if g.busy_until is not None}
    for a in pinned:
        runtime_s = a.estimate.runtime_s
        if runtime_s is None and a.estimate.finish_at is not None:
            runtime_s = (a.estimate.finish_at - a.start_at).total_seconds()
        model = model_of_gpu.get(a.gpu_ids[0], "H100") if a.gpu_ids else "H100"
        cap = limit_of_gpu.get(a.gpu_ids[0]) if a.gpu_ids else None
        shape = job_shape(jobs_by_id[a.job_id], model, book, snap.default_runtime_s, cap)
        if runtime_s is None:
            runtime_s = shape.runtime_s
        end = a.start_at + timedelta(seconds=runtime_s)
        for gid in a.gpu_ids:
            prev = busy_until.get(gid)
            busy_until[gid] = end if prev is None or prev < end else prev
        if a.gpu_ids:
            power_w = (a.estimate.energy_j / runtime_s) if a.estimate.energy_j and runtime_s \
                else shape.power_w
            pinned_power.append((budget_of_gpu.get(a.gpu_ids[0], "?"), grid.floor(a.start_at),
                                 grid.ceil(end), power_w))
    return busy_until, pinned_power


def _running_power(snap: Snapshot, grid: SlotGrid) -> list[tuple[str, int, float]]:
    """(budget, until slot, W) of every GPU running a job under a capped budget, even if it
    is unhealthy now: its model's generic power until its busy_until."""
    running: list[tuple[str, int, float]] = []  # budget, until slot, W
    capped = {c.zone for c in snap.power_caps}
    if capped:
        for g in snap.gpus:
            if budget_of(g) in capped and g.busy_until is not None and g.busy_until > grid.now:
                running.append((budget_of(g), min(grid.n_slots, grid.ceil(g.busy_until)),
                                generic_power_w(g.model, g.power_limit_w)))
    return running


def _power_budgets(snap: Snapshot, grid: SlotGrid, running_power: list[tuple[str, int, float]],
                   pinned_power: list[tuple[str, int, int, float]]) -> dict[str, np.ndarray]:
    """Per capped budget, the watts its cap leaves per slot once running and pinned jobs
    draw theirs (inf where no cap applies)."""
    power_cap: dict[str, np.ndarray] = {}
    starts = grid.offsets_s
    ends = starts + grid.slot_s
    for cap in snap.power_caps:
        arr = power_cap.setdefault(cap.zone, np.full(grid.n_slots, np.inf))
        lo = -np.inf if cap.start is None else (cap.start - grid.now).total_seconds()
        hi = np.inf if cap.end is None else (cap.end - grid.now).total_seconds()
        hit = (ends > lo) & (starts < hi)
        arr[hit] = np.minimum(arr[hit], cap.cap_w)
    for zone, until, power_w in running_power:
        if zone in power_cap:
            power_cap[zone][:until] -= power_w
    for zone, lo, hi, power_w in pinned_power:
        if zone in power_cap:
            power_cap[zone][max(0, lo):max(0, min(hi, grid.n_slots))] -= power_w
    return power_cap


def keep_plans(occ: Occupancy, snapshot: Snapshot, grid: SlotGrid, book: ProfileBook,
               pinned_ids: set[int]) -> list[Kept]:
    """Reserve capacity (and watts) in `occ` for the earlier plans in `Snapshot.keep` that
    still fit, in start order, and return them; the rest are planned again. A kept plan holds
    k GPUs of its node's pool over the slots its run touches (start rounded down, end up), so
    the sweep of `assign_gpu_ids` can give it GPUs alongside the new picks."""
    keep = getattr(snapshot, "keep", None) or {}
    if not keep:
        return []
    jobs_by_id = {j.id: j for j in snapshot.jobs}
    pool_of_gpu = occ.topology.pool_of_gpu
    now, now_s, slot_s, n_slots = grid.now, grid.now.timestamp(), grid.slot_s, grid.n_slots
    found: list[tuple[float, int, Assignment, int, int, int, int, float]] = []  # t, id, a, pool, lo, hi, k, W
    for a in keep.values():
        job = jobs_by_id.get(a.job_id)
        gpu_ids = a.gpu_ids
        if job is None or not gpu_ids or a.start_at < now or a.job_id in pinned_ids:
            continue
        pool_i = pool_of_gpu.get(gpu_ids[0])
        k = job.gpus if job.gpus > 1 else 1
        if pool_i is None or len(gpu_ids) != k:
            continue
        est = a.estimate
        runtime_s = est.runtime_s
        if runtime_s and est.energy_j:  # the plan's own shape (what fifo, greedy and cpsat estimate)
            power_w = est.energy_j / runtime_s
        else:
            pool = occ.pools[pool_i]
            if fits(job, pool.model, pool.memory_gib, book) is not None:
                continue
            shape = job_shape(job, pool.model, book, snapshot.default_runtime_s, pool.power_limit_w)
            runtime_s, power_w = shape.runtime_s, shape.power_w
        t = a.start_at.timestamp()
        start = (t - now_s) / slot_s
        lo = math.floor(start + 1e-9)
        end = math.ceil(start + runtime_s / slot_s - 1e-9)
        hi = min(n_slots, end)
        if lo < n_slots and hi > lo:
            found.append((t, a.job_id, a, pool_i, lo, hi, k, power_w, end))
    found.sort()  # start order (job ids are unique: the comparison never reaches the plan)
    ends = [c[-1] for c in found]
    cands = [c[2:-1] for c in found]
    if not cands:
        return []
    keep_it = _reserve(occ, cands, n_slots)
    kept = [Kept(a, pool_i, lo, hi - lo, k) for (a, pool_i, lo, hi, k, _), ok in zip(cands, keep_it) if ok]
    for (_, pool_i, _, _, k, _), end, ok in zip(cands, ends, keep_it):
        if ok and end > n_slots:
            occ.pool_past_horizon[pool_i].append((int(end), int(k)))
    return kept


def _reserve(occ: Occupancy, cands: list, n_slots: int) -> list[bool]:
    """Take the capacity (and watts) of the candidates (assignment, pool, lo, hi, k, W), in
    order, out of `occ`; which of them fit."""
    # usually they all fit (they did last tick): check them at once, one by one only if not
    arr = np.array([c[1:] for c in cands], dtype=np.float64)
    pools_i, lo_i, hi_i = arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64), arr[:, 2].astype(np.int64)
    diff = np.zeros((len(occ.pools), n_slots + 1), dtype=np.int32)
    np.add.at(diff, (pools_i, lo_i), arr[:, 3].astype(np.int32))
    np.add.at(diff, (pools_i, hi_i), -arr[:, 3].astype(np.int32))
    used = np.cumsum(diff[:, :-1], axis=1, dtype=np.int32)
    # a pool whose kept plans all fit together (and no power cap in its zone) keeps them
    # all: every prefix in start order fits too; the others are checked one by one
    crowded = (used > occ.capacity).any(axis=1)
    for z in occ.power_cap:
        crowded[[i for i, p in enumerate(occ.pools) if p.budget == z]] = True
    bulk = ~crowded[pools_i]
    if bulk.any():
        occ.capacity -= np.where(crowded[:, None], 0, used)
    keep_it = bulk.tolist()
    for i in np.flatnonzero(~bulk).tolist():
        a, pool_i, lo, hi, k, power_w = cands[i]
        if occ.capacity[pool_i, lo:hi].min() < k:
            continue
        cap = occ.power_cap.get(occ.pools[pool_i].budget)
        if cap is not None and cap[lo:hi].min() < power_w - 1e-9:
            continue
        occ.capacity[pool_i, lo:hi] -= k
        if cap is not None:
            cap[lo:hi] -= power_w
        keep_it[i] = True
    return keep_it
