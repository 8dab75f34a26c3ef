"""The pools and groups of a fleet: what a job can run on, apart from when.

A **pool** is the usable GPUs of one model (and one board power limit) on one node: a job
runs on k GPUs of one pool (gang on one node, one model). Unhealthy and drained GPUs are left
out. A **group** is the pools with the same (zone, model, memory, PUE, power limit, power
budget): a job costs the same on every pool of a group, so the planning problem
(`policies.problem.instance`) prices per group and shares the price (128 pools of a 1,024-GPU cluster
fall into ~24 groups).

Which pools and groups there are changes only when a GPU does (health, drain, model), not
from tick to tick, so `topology` builds that layout once per fleet state and shares it
between snapshots; each compile of a snapshot adds only when each GPU is next free
(`policies.problem.occupancy`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import numpy as np

from policies.types import Snapshot, budget_of


class Pool(NamedTuple):
    """Usable GPUs of one model on one node; `free_slot[i]` is when `gpu_ids[i]` is free."""

    node: str
    zone: str
    model: str
    memory_gib: float
    gpu_ids: tuple[int, ...]
    pue: float
    free_slot: tuple[int, ...]
    group: int = 0  # index into Problem.groups
    power_limit_w: float | None = None  # its GPUs' board power limit (None: not reported)
    budget: str = ""  # the power budget its GPUs draw against (policies.types.budget_of)


class Group(NamedTuple):
    """Pools a job costs the same on."""

    zone: str
    model: str
    memory_gib: float
    pue: float
    pools: tuple[int, ...]
    power_limit_w: float | None = None  # its GPUs' board power limit: estimates never exceed it
    budget: str = ""  # the power budget its pools draw against (one per group)


class Topology(NamedTuple):
    """The pools and groups of a fleet, apart from when each GPU is next free (`free_slot`
    is empty here). It changes only when a GPU does (health, drain, model), not from tick to
    tick, so it is built once per fleet state and shared (`topology`)."""

    pools: tuple[Pool, ...]
    groups: tuple[Group, ...]
    gpu_pos: np.ndarray  # (pools x widest pool) index into Snapshot.gpus; len(gpus) pads
    pool_size: np.ndarray
    pool_group: np.ndarray
    group_pools: list[np.ndarray]  # per group, its pools
    by_group: np.ndarray  # pools ordered by group (for reductions per group)
    group_starts: np.ndarray  # where each group starts in `by_group`
    pool_of_gpu: dict[int, int]  # GPU id -> the pool of its node and model (also for a GPU left out)


_TOPOLOGIES: dict[tuple, Topology] = {}


def topology(snap: Snapshot) -> Topology:
    """The snapshot's `Topology`, from a small cache keyed by everything it depends on."""
    gpus = snap.gpus
    key = (tuple((g.id, g.node, g.zone, g.model, g.index, float(g.memory_gib), g.healthy and not g.drained,
                  g.pue, g.power_limit_w, g.budget) for g in gpus), tuple(sorted(snap.pue.items())))
    hit = _TOPOLOGIES.get(key)
    if hit is not None:
        return hit
    # GPUs with different power limits are different pools (0.0: no limit reported)
    by_key: dict[tuple[str, str, str, float, float], list[tuple[int, int, int]]] = defaultdict(list)
    pue_of: dict[str, float] = {}  # node -> the PUE of its site (one per node)
    budget_of_node: dict[str, str] = {}  # node -> the power budget of its site (one per node)
    for i, g in enumerate(gpus):
        if g.healthy and not g.drained:
            budget_of_node.setdefault(g.node, budget_of(g))
            by_key[(g.node, g.zone, g.model, float(g.memory_gib), float(g.power_limit_w or 0.0))].append(
                (g.index, g.id, i))
            pue_of.setdefault(g.node, snap.gpu_pue(g))
    groups: dict[tuple[str, str, float, float, float, str], list[int]] = defaultdict(list)
    pools: list[Pool] = []
    positions: list[list[int]] = []
    for (node, zone, model, mem, cap), gs in sorted(by_key.items()):
        gs.sort()
        pue, budget = pue_of[node], budget_of_node[node]
        groups[(zone, model, mem, pue, cap, budget)].append(len(pools))
        pools.append(Pool(node=node, zone=zone, model=model, memory_gib=mem, gpu_ids=tuple(g[1] for g in gs),
                          pue=pue, free_slot=(), power_limit_w=cap or None, budget=budget))
        positions.append([g[2] for g in gs])
    group_list: list[Group] = []
    for gkey, members in sorted(groups.items()):
        for p in members:
            pools[p] = pools[p]._replace(group=len(group_list))
        group_list.append(Group(zone=gkey[0], model=gkey[1], memory_gib=gkey[2], pue=gkey[3], pools=tuple(members),
                                power_limit_w=gkey[4] or None, budget=gkey[5]))
    width = max((len(p) for p in positions), default=1)
    gpu_pos = np.full((len(pools), width), len(gpus), dtype=np.int64)
    for r, pos in enumerate(positions):
        gpu_pos[r, :len(pos)] = pos
    by_group = np.array([p for g in group_list for p in g.pools], dtype=np.int64)
    sizes = [len(g.pools) for g in group_list]
    pool_index = {(p.node, p.model): i for i, p in enumerate(pools)}
    pool_of_gpu = {g.id: pool_index[(g.node, g.model)] for g in gpus if (g.node, g.model) in pool_index}
    pool_of_gpu.update({gid: r for r, p in enumerate(pools) for gid in p.gpu_ids})  # split by power limit
    topo = Topology(pools=tuple(pools), groups=tuple(group_list), gpu_pos=gpu_pos,
                     pool_size=np.array([len(p.gpu_ids) for p in pools], dtype=np.int64),
                     pool_group=np.array([p.group for p in pools], dtype=np.int64),
                     group_pools=[np.array(g.pools, dtype=np.int64) for g in group_list],
                     by_group=by_group, group_starts=np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64),
                     pool_of_gpu=pool_of_gpu)
    for a in (topo.gpu_pos, topo.pool_size, topo.pool_group, topo.by_group, topo.group_starts, *topo.group_pools):
        a.flags.writeable = False  # shared by every Problem of this fleet state
    if len(_TOPOLOGIES) >= 8:
        _TOPOLOGIES.clear()
    _TOPOLOGIES[key] = topo
    return topo
