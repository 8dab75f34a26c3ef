"""The slot-indexed planning problem that greedy, cpsat, oracle and the LP bound share.

`compile_problem(snapshot)` turns a Snapshot into:

* **pools**: the usable GPUs of one model on one node (same zone, PUE, memory). A job runs on
  k GPUs of one pool (gang on one node, one model). Unhealthy and drained GPUs are left out;
  a GPU busy with a running job (or a pinned job) is free from `free_slot` on.
* **groups**: pools with the same (zone, model, memory, PUE). A job costs the same on every
  pool of a group, so costs are computed per group and shared (128 pools of a 1,024-GPU
  cluster fall into ~24 groups). Which pools and groups there are changes only when a GPU
  does (health, drain), so that layout is built once per fleet state and shared between
  snapshots (`policies.problem.topology`); each compile adds only when each GPU is next free
  (`policies.problem.occupancy`).
* **options** per job: the pools that fit it (memory, latency SLO, at least k usable GPUs
  on the node), each with the job's shape on that model, its duration in slots and its
  start window [earliest_slot, latest_slot].
* **cost(j, o)**: gCO2 per start slot (inf outside the window), from prefix integrals of
  each zone's forecast (one vectorised `numpy.interp` per zone and job; `cost_tables` does
  many jobs at once, one `interp` per zone: `policies.problem.zone_integrals`); past the forecast's
  end, from its `tail` (the zone's typical values, `policies.pricing.carbon_tail`) up to the longest
  run any job can make.
* **job arrays** (jobs x groups), compiled for all jobs at once (`policies.problem.job_arrays`):
  `job_fit`/`job_why`, `job_runtime_s`, `job_power_w`, `job_scale`, `job_duration`,
  `job_latest`; per job `job_earliest` and `job_k`. `job_options(j)` (per-pool options, the
  shapes and the reasons a model is excluded) is built from them on first use, so callers
  that only need arrays (greedy, cpsat) never pay for it: 5,000 jobs compile in 0.03 s
  instead of 1.1 s.
* **capacity(pool)**: GPUs free per slot; **power_cap_w(zone)**: watts left per slot
  (`policies.problem.occupancy`).

Time is discretised into `slot_s` slots from `now` (slot 0 starts now) over `horizon_s`
(`policies.problem.slot_grid`).
Starts fall on slot boundaries; a job holds its GPUs for `duration_slots = ceil(runtime /
slot_s)` whole slots, so per-slot GPU counts are exact: if at most c(s) GPUs of a pool are
used in every slot, a sweep in start order gives every job the same GPUs for its whole run
(interval graphs are perfect), which `assign_gpu_ids` does.

Windows: a job never starts before `max(now, submitted_at)` (the oracle plans future
arrivals); `latest_slot` is the last start that finishes by the deadline, starts within
`max_delay_s` of submission, and lies in the horizon; the deadline is met with a margin for
the estimate's uncertainty (`policies.model.margin`). `latest_slot < earliest_slot` means the
option cannot meet the deadline (policies then place the job as soon as possible, flagged).

A zone without a forecast is priced blind (`policies.pricing.blind`: the highest intensity in the
snapshot, never 0); its estimates carry that price in `Estimate.blind_g_per_kwh`.

Pinned jobs (`QueuedJob.pinned` with a current plan in `Snapshot.pinned`) are not decision
variables: their GPUs are busy until their planned finish, their power counts against the
zone's power cap, and `Problem.pinned` hands their assignments back unchanged.

Kept plans (`Snapshot.keep`, incremental planning between full re-plans) are not decision
variables either: each one that still fits holds k GPUs of its node's pool over the slots its
run touches (and its watts under a cap), `Problem.kept` lists them, and `assign_gpu_ids` gives
them GPUs of that node in the same sweep as the new picks. One that no longer fits is a job
like any other.

Power caps: a cap applies to a slot it overlaps. Running jobs count against it at their GPUs'
generic power (`energy.generic_power_w`) until their expected end.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import NamedTuple

import numpy as np

from policies.pricing.blind import BlindPrice, blind_price, priced_curves
from policies.model.energy import JobShape, ProfileBook, job_shape, seed_profiles
from policies.problem.job_arrays import WHY, JobArrays, compile_job_arrays
from policies.problem.joint_caps import CapVariants
from policies.problem.joint_caps import choose as choose_caps_jointly
from policies.pricing.lateness import STRICT_LATENESS_G_PER_GPU_H
from policies.model.length_spread import multipliers
from policies.types import Assignment, CarbonCurve, QueuedJob, Snapshot
from policies.problem.occupancy import Kept, Occupancy
from policies.problem.slot_grid import SlotGrid
from policies.problem.topology import Group, Pool, Topology
from policies.problem.zone_integrals import ZoneIntegrals

log = logging.getLogger(__name__)


class Option(NamedTuple):
    """Job j on k GPUs of one pool: its shape there and its start window in slots."""

    pool: int
    gpus: int
    shape: JobShape
    duration_slots: int
    earliest_slot: int
    latest_slot: int
    group: int = 0


class JobOptions(NamedTuple):
    """The options of one job as parallel numpy arrays (what the policies iterate)."""

    pool: np.ndarray  # int, pool index per option
    group: np.ndarray  # int, group index per option
    duration: np.ndarray  # int, slots per option
    latest: np.ndarray  # int, last start slot per option (deadline / max delay / horizon)
    earliest: int  # first start slot (release)
    shapes: dict[str, JobShape]  # by model
    excluded: dict[str, str]  # model -> reason it cannot take the job ("memory", "slo", "gang")
    groups: np.ndarray  # int, the distinct groups of the options, ascending
    first: np.ndarray  # int, index of each group's first option
    row_zone: np.ndarray  # int, zone index (into Problem.zones) per group row
    row_runtime_s: np.ndarray  # float, runtime per group row
    row_scale: np.ndarray  # float, power_w x PUE / 3.6e6 per group row


class Problem:
    """A compiled snapshot (see the module docstring)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        n_slots = max(1, int(math.ceil(snapshot.horizon_s / float(snapshot.slot_s))))
        self.grid = grid = SlotGrid(snapshot.now, float(snapshot.slot_s), n_slots)
        self.now: datetime = grid.now
        self.slot_s: float = grid.slot_s
        self.n_slots: int = grid.n_slots
        self.book = ProfileBook(snapshot.profiles) if snapshot.profiles else ProfileBook(seed_profiles())
        self.slot_offsets_s = grid.offsets_s
        self.slot_index = grid.index

        pinned_map = getattr(snapshot, "pinned", None) or {}
        self.pinned: tuple[Assignment, ...] = tuple(
            pinned_map[j.id] for j in snapshot.jobs if j.pinned and j.id in pinned_map)
        pinned_ids = {a.job_id for a in self.pinned}

        self._build_curves()
        occupancy = Occupancy(snapshot, grid, self.book, self.pinned, pinned_ids)
        self._adopt_occupancy(occupancy)
        kept_ids = {k.assignment.job_id for k in self.kept}
        self.jobs: list[QueuedJob] = [j for j in snapshot.jobs if j.id not in pinned_ids and j.id not in kept_ids]
        self.job_index: dict[int, int] = {j.id: i for i, j in enumerate(self.jobs)}
        arrays = compile_job_arrays(snapshot, self.jobs, self.groups, self.pool_size, self.book, grid)
        # jobs priced by their expected grams over a learned length spread (policies.model.length_spread)
        self._spread: dict[int, np.ndarray] = {
            j: m for j, m in ((j, multipliers(job)) for j, job in enumerate(self.jobs)) if m is not None}
        # the power limits operators let the planner choose, priced with the placement
        variants = CapVariants(arrays, self.jobs, self.groups, snapshot.caps, self.book)
        self.zone_integrals = ZoneIntegrals(self.curves, self.zones, grid,
                                            self._priced_until_s(arrays, variants.longest_s))
        choose_caps_jointly(arrays, variants, occupancy, grid, self.zone_integrals)
        self._adopt_jobs(arrays)
        self._job_options: dict[int, JobOptions] = {}
        self.options: Sequence[list[Option]] = _LazyOptions(self)
        self._cost_cache: tuple[int, np.ndarray] | None = None

    # -- construction ------------------------------------------------------------------------

    def _build_curves(self) -> None:
        snap = self.snapshot
        zones = sorted({g.zone for g in snap.gpus})
        self.zones: list[str] = zones
        priced = priced_curves(snap)  # blind zones: flat at the one blind price (policies.pricing.blind)
        self.blind_zones: set[str] = {z for z in zones if priced[z].signal == "blind"}
        self.blind_price: BlindPrice | None = blind_price(snap) if self.blind_zones else None
        self.curves: dict[str, CarbonCurve] = {zone: priced[zone] for zone in zones}

    def _priced_until_s(self, arrays: JobArrays, cap_reach_s: float) -> float:
        """When (epoch s) the zones' integrals must reach to price every run the jobs can
        make: the last slot's start plus the longest runtime of any job on any group (a
        curve with a tail, `policies.pricing.carbon_tail`, is materialised up to there)."""
        fit = arrays.job_fit
        longest = float(arrays.job_runtime_s[fit].max()) if fit.any() else 0.0
        if not math.isfinite(longest):
            longest = 0.0
        longest = max(longest, cap_reach_s)  # a run stretched by a power limit (joint_caps)
        for j, m in self._spread.items():  # a priced run may reach past the job's estimate
            rt = arrays.job_runtime_s[j][fit[j]]
            if rt.size and math.isfinite(float(rt.max())):
                longest = max(longest, max(float(rt.max()), cap_reach_s) * float(m.max()))
        return self.now.timestamp() + self.n_slots * self.slot_s + longest

    def _adopt_occupancy(self, occ: Occupancy) -> None:
        """The fleet's pools and groups, what holds them (`policies.problem.occupancy`), and the
        per-group lookups the policies use."""
        topo: Topology = occ.topology
        self._topology = topo
        self.pools: list[Pool] = occ.pools
        self.groups: list[Group] = occ.groups
        self.kept: list[Kept] = occ.kept
        self.pool_past_horizon = occ.pool_past_horizon
        self._capacity = occ.capacity
        self._power_cap: dict[str, np.ndarray] = occ.power_cap
        self.kth_free_slot = occ.kth_free_slot
        self.group_kth_free_slot = occ.group_kth_free_slot
        # where each run of groups with one (zone, model) starts (groups are sorted by both)
        pairs = [(g.zone, g.model) for g in self.groups]
        self.group_kind_starts = np.array([i for i, pair in enumerate(pairs) if i == 0 or pairs[i - 1] != pair],
                                          dtype=np.int64)
        self.pool_size = topo.pool_size
        self.pool_group = topo.pool_group
        self._group_pools = topo.group_pools
        zone_index = {z: i for i, z in enumerate(self.zones)}
        self._group_zone = np.array([zone_index[g.zone] for g in self.groups], dtype=np.int64)
        self._zone_groups = [np.array([gi for gi, g in enumerate(self.groups) if g.zone == z], dtype=np.int64)
                             for z in self.zones]
        self.group_row_offsets = np.arange(len(self.groups), dtype=np.int64) * (self.n_slots + 1)
        self._members_cache: dict[tuple[int, int], np.ndarray] = {}
        self._cheapest_g: dict[int, float] = {}  # job -> cheapest start from release (cost_tables)

    def _adopt_jobs(self, a: JobArrays) -> None:
        """The jobs' arrays (`policies.problem.job_arrays`, as the joint caps left them) as the
        problem's own `job_*` attributes, which the policies read."""
        self.job_runtime_s, self.job_power_w, self.job_scale = a.job_runtime_s, a.job_power_w, a.job_scale
        self.job_resumed, self.job_k = a.job_resumed, a.job_k
        self.job_why, self.job_fit, self.group_largest_pool = a.job_why, a.job_fit, a.group_largest_pool
        self.job_earliest, self.job_duration, self.job_latest = a.job_earliest, a.job_duration, a.job_latest
        self.job_hard_latest, self.job_on_time_latest = a.job_hard_latest, a.job_on_time_latest
        self._margin, self._deadline_s = a.margin, a.deadline_s
        self.job_cap_w = a.job_cap_w
        self.job_uncapped_runtime_s, self.job_uncapped_power_w = a.job_uncapped_runtime_s, a.job_uncapped_power_w
        # held starts (policies.problem.held_starts): the jobs whose window was cut to a promised
        # start, and the window ends before the cut (None while no job is held)
        self.held_jobs: set[int] = set()
        self.job_latest_unheld: np.ndarray | None = None
        self.job_hard_latest_unheld: np.ndarray | None = None

    def _build_job_options(self, j: int) -> JobOptions:
        job = self.jobs[j]
        k = int(self.job_k[j])
        gis = np.flatnonzero(self.job_fit[j])
        excluded: dict[str, str] = {}
        for gi in np.flatnonzero(~self.job_fit[j]).tolist():
            excluded.setdefault(self.groups[gi].model, WHY[int(self.job_why[j, gi])])
        shapes: dict[str, JobShape] = {}
        for gi in gis.tolist():
            model = self.groups[gi].model
            if model not in shapes:
                shapes[model] = job_shape(job, model, self.book, self.snapshot.default_runtime_s,
                                          self.groups[gi].power_limit_w)
        for model in shapes:
            excluded.pop(model, None)
        earliest = int(self.job_earliest[j])
        if gis.size == 0:
            empty = np.zeros(0, dtype=np.int64)
            return JobOptions(empty, empty, empty, empty, earliest, shapes, excluded, empty, empty, empty,
                              np.zeros(0), np.zeros(0))
        members_l = [self._members(int(gi), k) for gi in gis.tolist()]
        sizes = np.array([m.size for m in members_l], dtype=np.int64)
        first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        return JobOptions(np.concatenate(members_l), np.repeat(gis, sizes),
                          np.repeat(self.job_duration[j, gis], sizes), np.repeat(self.job_latest[j, gis], sizes),
                          earliest, shapes, excluded, gis, first, self._group_zone[gis],
                          self.job_runtime_s[j, gis].copy(), self.job_scale[j, gis].copy())

    def cost_tables(self, js: Sequence[int] | np.ndarray) -> np.ndarray:
        """gCO2 per start slot of many jobs at once: (len(js) x groups x slots), every
        group in `problem.groups` order (inf where the job does not fit the group), window
        ignored. The same arithmetic as `cost_table`, one `numpy.interp` per zone."""
        js = np.asarray(js, dtype=np.int64)
        out = np.empty((js.size, len(self.groups), self.n_slots))
        runtime = self.job_runtime_s[js]
        scale = self.job_scale[js]
        for z, gz in enumerate(self._zone_groups):
            if gz.size == 0:
                continue
            tk, gk = self.zone_integrals.zone_knots[z]
            rows = slice(int(gz[0]), int(gz[-1]) + 1)  # groups are sorted by zone first
            view = out[:, rows, :]
            # (interp - base) * scale written straight into `out`: one pass over the chunk's
            # 11 MB fewer than copying interp's result in first (same operations, same bits)
            np.subtract(np.interp(self.slot_offsets_s[None, None, :] + runtime[:, rows, None], tk, gk),
                        self.zone_integrals.zone_base[z], out=view)
            view *= scale[:, rows, None]
        if self._spread:
            for i, j in enumerate(js.tolist()):
                if j in self._spread:
                    self._expected_rows(out[i], self._spread[j], runtime[i], scale[i], self._group_zone)
        out[~self.job_fit[js]] = np.inf
        self._remember_cheapest(js, out)
        return out

    def cheapest_start_g(self, j: int) -> float | None:
        """Job j's lowest gCO2 over every start from its release on every group it fits, the
        queue, its window and its deadline ignored: what an explanation measures "on time for
        +N g" against. None: released after the horizon. Remembered from every `cost_tables`
        call (the policies compute each job's table anyway), so explaining 5,000 placements
        computes no table twice."""
        if int(self.job_earliest[j]) >= self.n_slots:
            return None
        if j not in self._cheapest_g:
            self.cost_tables([j])
        return self._cheapest_g[j]

    def _remember_cheapest(self, js: np.ndarray, tables: np.ndarray) -> None:
        new = [i for i, j in enumerate(js.tolist()) if j not in self._cheapest_g]
        if not new:
            return
        idx = np.asarray(new, dtype=np.int64)
        if tables.shape[1] == 0 or tables.shape[2] == 0:  # no usable GPU group, no slot
            self._cheapest_g.update((j, math.inf) for j in js[idx].tolist())
            return
        # usually every job of the chunk is new: then no copy of the whole chunk's tables
        # (`tables[idx]`, 11 MB at 256 jobs x 28 groups x 192 slots) before the minimum
        per_slot = (tables if len(new) == js.size else tables[idx]).min(axis=1)  # (jobs x slots): the cheapest group at each start
        per_slot[self.slot_index[None, :] < self.job_earliest[js[idx]][:, None]] = np.inf
        for j, g in zip(js[idx].tolist(), per_slot.min(axis=1).tolist()):
            self._cheapest_g[j] = g

    def _members(self, gi: int, k: int) -> np.ndarray:
        """Pools of group gi with at least k usable GPUs (cached per (group, k))."""
        key = (gi, k)
        hit = self._members_cache.get(key)
        if hit is None:
            members = self._group_pools[gi]
            hit = self._members_cache[key] = members[self.pool_size[members] >= k]
        return hit

    def first_pool_free(self, g: int, k: int, slot: int) -> int:
        """The first pool of group g (in pool order) with k GPUs free at `slot` (-1: none)."""
        members = self._members(g, k)
        hit = np.flatnonzero(self.kth_free_slot[members, k - 1] <= slot)
        return int(members[hit[0]]) if hit.size else -1

    # -- the price of lateness ----------------------------------------------------------------

    #: grams of CO2 one GPU-hour of lateness is worth (policies.pricing.lateness); inf: strict, a
    #: deadline miss is worse than any amount of grams (misses first, then grams)
    lateness_g_per_gpu_h: float = math.inf

    @property
    def strict(self) -> bool:
        return not math.isfinite(self.lateness_g_per_gpu_h)

    def late_slots(self, j: int) -> np.ndarray:
        """(groups x slots): how many slots past its last on-time start job j starts at each
        slot of each group (0 inside the on-time window)."""
        return np.maximum(0.0, self.slot_index[None, :] - self.job_on_time_latest[j][:, None])

    @property
    def effective_lateness_price(self) -> float:
        """The price lateness is charged at: the policy's, or when strict the tie-break price
        among plans with as many misses (`lateness.STRICT_LATENESS_G_PER_GPU_H`)."""
        return STRICT_LATENESS_G_PER_GPU_H if self.strict else self.lateness_g_per_gpu_h

    def late_penalty_at(self, j: int, g: int, slot: int) -> float:
        """`late_penalty(j)[g, slot]` alone (strict: at the tie-break price)."""
        late = max(0.0, slot - float(self.job_on_time_latest[j, g]))
        return late * self.effective_lateness_price * float(self.job_k[j]) * self.slot_s / 3600.0

    def late_penalty(self, j: int) -> np.ndarray:
        """(groups x slots) grams charged for starting job j at each slot of each group: the
        price x k GPUs x the hours it is late by (strict: the tie-break price, misses being
        ranked first anyway)."""
        per_slot_gpu_h = float(self.job_k[j]) * self.slot_s / 3600.0
        return self.late_slots(j) * (self.effective_lateness_price * per_slot_gpu_h)

    @property
    def penalised(self) -> bool:
        """Whether an in-window start can cost more than its grams (a price of lateness)."""
        return not self.strict

    def window_latest(self, j: int) -> np.ndarray:
        """Per group, the last start slot the policies consider for job j: strict, the
        on-time window (deadline with margin, max delay, horizon); priced, the hard window
        only (max delay, horizon): starting later than on time costs `late_penalty`."""
        if self.strict:
            return self.job_latest[j]
        return np.full(len(self.groups), int(self.job_hard_latest[j]), dtype=np.int64)

    # -- queries -----------------------------------------------------------------------------

    def job_options(self, j: int) -> JobOptions:
        """The options of job j as numpy arrays (built on first use, then cached)."""
        hit = self._job_options.get(j)
        if hit is None:
            hit = self._job_options[j] = self._build_job_options(j)
        return hit

    def previous_assignments(self) -> Iterator[tuple[int, int, Assignment]]:
        """(job index, pool, assignment) of the plans in `Snapshot.previous` whose job is
        queued here with as many GPUs, on GPUs of a known pool."""
        previous = getattr(self.snapshot, "previous", None) or {}
        pool_of_gpu = self._topology.pool_of_gpu
        for job_id, a in previous.items():
            j = self.job_index.get(job_id)
            if j is None or not a.gpu_ids or len(a.gpu_ids) != int(self.job_k[j]):
                continue
            pool = pool_of_gpu.get(a.gpu_ids[0])
            if pool is not None:
                yield j, pool, a

    def previous_picks(self) -> list[tuple[int, int, int]]:
        """(job index, pool, slot) of the plans in `Snapshot.previous` that still make sense
        as a start: the job is queued here, its GPUs' pool fits it, and the start (rounded to
        the nearest slot) lies in its window. Capacity is not checked (the caller does)."""
        out: list[tuple[int, int, int]] = []
        now_s = self.now.timestamp()
        for j, pool, a in self.previous_assignments():
            g = int(self.pool_group[pool])
            slot = int(round((a.start_at.timestamp() - now_s) / self.slot_s))
            if self.job_fit[j, g] and self.job_earliest[j] <= slot <= self.job_latest[j, g]:
                out.append((j, pool, slot))
        return out

    def slot_time(self, slot: int) -> datetime:
        return self.grid.time(slot)

    def capacity(self, pool: int) -> np.ndarray:
        """GPUs of the pool free in each slot (before any queued job is placed)."""
        return self._capacity[pool].copy()

    def capacity_matrix(self) -> np.ndarray:
        """A fresh (pools x slots) int32 array of free GPUs per slot."""
        return self._capacity.copy()

    def power_cap_w(self, budget: str) -> np.ndarray | None:
        """Watts left for queued jobs in each slot under a power budget (a zone's or a site's:
        `Pool.budget`), or None when uncapped."""
        arr = self._power_cap.get(budget)
        return None if arr is None else arr.copy()

    @property
    def capped_budgets(self) -> list[str]:
        """The keys of the power budgets with a cap in the horizon (`Pool.budget`)."""
        return sorted(self._power_cap)

    def cost_table(self, j: int) -> np.ndarray:
        """gCO2 of job j per start slot on each of its groups (rows in `job_options(j).groups`
        order), ignoring its window. The last job's table is cached."""
        if self._cost_cache is not None and self._cost_cache[0] == j:
            return self._cost_cache[1]
        jo = self._job_options[j]
        table = np.empty((jo.groups.size, self.n_slots))
        for z in np.unique(jo.row_zone).tolist():
            rows = np.flatnonzero(jo.row_zone == z)
            tk, gk = self.zone_integrals.zone_knots[z]
            ends = np.interp(self.slot_offsets_s[None, :] + jo.row_runtime_s[rows][:, None], tk, gk)
            table[rows] = (ends - self.zone_integrals.zone_base[z][None, :]) * jo.row_scale[rows][:, None]
        if j in self._spread:
            self._expected_rows(table, self._spread[j], jo.row_runtime_s, jo.row_scale, jo.row_zone)
        self._cost_cache = (j, table)
        return table

    def _expected_rows(self, table: np.ndarray, mult: np.ndarray, runtime_s: np.ndarray, scale: np.ndarray,
                       row_zone: np.ndarray) -> None:
        """Overwrite one job's cost rows (`table[r]`: a group of zone `row_zone[r]` where it
        runs `runtime_s[r]` at `scale[r]` grams per g/kWh x s) with its expected grams over its
        length multipliers `mult` (`policies.model.length_spread`)."""
        for z in np.unique(row_zone).tolist():
            rows = np.flatnonzero((row_zone == z) & np.isfinite(runtime_s))
            if rows.size == 0:
                continue
            tk, gk = self.zone_integrals.zone_knots[z]
            x = self.slot_offsets_s[None, None, :] + (runtime_s[rows][:, None] * mult[None, :])[:, :, None]
            ends = np.interp(x, tk, gk).mean(axis=1)
            table[rows] = (ends - self.zone_integrals.zone_base[z][None, :]) * scale[rows][:, None]

    def group_raw_costs(self, j: int) -> dict[int, np.ndarray]:
        """`cost_table(j)` as group index -> row."""
        table = self.cost_table(j)
        return {int(g): table[r] for r, g in enumerate(self._job_options[j].groups.tolist())}

    def cost(self, j: int, o: int) -> np.ndarray:
        """gCO2 of job j, option o, per start slot; inf outside [earliest_slot, latest_slot]."""
        jo = self._job_options[j]
        g = int(jo.group[o])
        raw = self.cost_table(j)[int(np.searchsorted(jo.groups, g))]
        out = np.full(self.n_slots, np.inf)
        lo, hi = jo.earliest, int(jo.latest[o])
        if lo <= hi:
            out[lo:hi + 1] = raw[lo:hi + 1]
        return out

    def slot_integrals(self, zone: str) -> np.ndarray:
        """The zone's forecast intensity integrated over each slot (`ZoneIntegrals.slot_integrals`)."""
        return self.zone_integrals.slot_integrals(zone)

    def gco2_at(self, zone: str, start: datetime, runtime_s: float, power_w: float, pue: float,
                spread: np.ndarray | None = None) -> float:
        """Grams of drawing power_w from `start` in a zone (`ZoneIntegrals.gco2_at`)."""
        return self.zone_integrals.gco2_at(zone, start, runtime_s, power_w, pue, spread)

    def tail_s(self, zone: str, start: datetime, runtime_s: float) -> float:
        """Seconds of a run priced by the zone's tail (`ZoneIntegrals.tail_s`)."""
        return self.zone_integrals.tail_s(zone, start, runtime_s)


class _LazyOptions(Sequence):
    """`problem.options[j]`: Option objects built on first access (most callers use arrays)."""

    def __init__(self, problem: Problem) -> None:
        self._p = problem
        self._cache: dict[int, list[Option]] = {}

    def __len__(self) -> int:
        return len(self._p.jobs)

    def __getitem__(self, j):  # type: ignore[override]
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        if j < 0:
            j += len(self)
        hit = self._cache.get(j)
        if hit is None:
            p = self._p
            jo = p.job_options(j)
            k = max(1, p.jobs[j].gpus)
            hit = [Option(pool=int(pool), gpus=k, shape=jo.shapes[p.pools[int(pool)].model],
                          duration_slots=int(d), earliest_slot=jo.earliest, latest_slot=int(lt), group=int(g))
                   for pool, g, d, lt in zip(jo.pool, jo.group, jo.duration, jo.latest)]
            self._cache[j] = hit
        return hit


def compile_problem(snapshot: Snapshot, lateness_g_per_gpu_h: float = math.inf) -> Problem:
    """Compile a snapshot into the slot-indexed problem (see the module docstring), with the
    price of lateness its policy plans with (`policies.pricing.lateness`; inf: strict)."""
    problem = Problem(snapshot)
    problem.lateness_g_per_gpu_h = float(lateness_g_per_gpu_h)
    return problem
