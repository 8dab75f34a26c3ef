"""The slot-indexed planning problem that greedy, cpsat, oracle and the LP bound share.

`compile_problem(snapshot)` turns a Snapshot into:

* **pools**: the usable GPUs of one model on one node (same zone, PUE, memory). A job runs on
  k GPUs of one pool (gang on one node, one model). Unhealthy and drained GPUs are left out;
  a GPU busy with a running job (or a pinned job) is free from `free_slot` on.
* **groups**: pools with the same (zone, model, memory, PUE). A job costs the same on every
  pool of a group, so costs are computed per group and shared (128 pools of a 1,024-GPU
  cluster fall into ~24 groups). Which pools and groups there are changes only when a GPU
  does (health, drain), so that layout is built once per fleet state and shared between
  snapshots (`_topology`); each compile adds only when each GPU is next free.
* **options** per job: the pools that fit it (memory, latency SLO, at least k usable GPUs
  on the node), each with the job's shape on that model, its duration in slots and its
  start window [earliest_slot, latest_slot].
* **cost(j, o)**: gCO2 per start slot (inf outside the window), from prefix integrals of
  each zone's forecast (one vectorised `numpy.interp` per zone and job; `cost_tables` does
  many jobs at once, one `interp` per zone); past the forecast's end, from its `tail` (the
  zone's typical values, `policies.carbon_tail`) up to the longest run any job can make.
* **job arrays** (jobs x groups), compiled for all jobs at once (`energy.shape_arrays`):
  `job_fit`/`job_why`, `job_runtime_s`, `job_power_w`, `job_scale`, `job_duration`,
  `job_latest`; per job `job_earliest` and `job_k`. `job_options(j)` (per-pool options, the
  shapes and the reasons a model is excluded) is built from them on first use, so callers
  that only need arrays (greedy, cpsat) never pay for it: 5,000 jobs compile in 0.03 s
  instead of 1.1 s.
* **capacity(pool)**: GPUs free per slot; **power_cap_w(zone)**: watts left per slot.


Time is discretised into `slot_s` slots from `now` (slot 0 starts now) over `horizon_s`.
Starts fall on slot boundaries; a job holds its GPUs for `duration_slots = ceil(runtime /
slot_s)` whole slots, so per-slot GPU counts are exact: if at most c(s) GPUs of a pool are
used in every slot, a sweep in start order gives every job the same GPUs for its whole run
(interval graphs are perfect), which `assign_gpu_ids` does.

Windows: a job never starts before `max(now, submitted_at)` (the oracle plans future
arrivals); `latest_slot` is the last start that finishes by the deadline, starts within
`max_delay_s` of submission, and lies in the horizon; the deadline is met with a margin for
the estimate's uncertainty (`policies.margin`). `latest_slot < earliest_slot` means the
option cannot meet the deadline (policies then place the job as soon as possible, flagged).

A zone without a forecast is priced blind (`policies.blind`: the highest intensity in the
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
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

import numpy as np

from policies.blind import BlindPrice, blind_price, priced_curves
from policies.carbon_tail import extended
from policies.energy import (J_PER_KWH, JobShape, ProfileBook, curve_integral_g_per_kwh_s, fits, generic_power_w, job_shape,
                             seed_profiles, shape_arrays)
from policies.joint_caps import CapVariants
from policies.joint_caps import choose as choose_caps_jointly
from policies.lateness import STRICT_LATENESS_G_PER_GPU_H
from policies.length_spread import expected, multipliers
from policies.margin import duration_slots, latest_start_slots, margin_arrays
from policies.model import Assignment, CarbonCurve, QueuedJob, Snapshot, budget_of

log = logging.getLogger(__name__)

_FAR_S = 1e9  # flat extension of a forecast beyond its ends, in seconds
_WHY = {1: "memory", 2: "slo", 3: "gang", 4: "time limit"}  # Problem.job_why codes


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
    budget: str = ""  # the power budget its GPUs draw against (policies.model.budget_of)


class Option(NamedTuple):
    """Job j on k GPUs of one pool: its shape there and its start window in slots."""

    pool: int
    gpus: int
    shape: JobShape
    duration_slots: int
    earliest_slot: int
    latest_slot: int
    group: int = 0


class Group(NamedTuple):
    """Pools a job costs the same on."""

    zone: str
    model: str
    memory_gib: float
    pue: float
    pools: tuple[int, ...]
    power_limit_w: float | None = None  # its GPUs' board power limit: estimates never exceed it
    budget: str = ""  # the power budget its pools draw against (one per group)


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


class Kept(NamedTuple):
    """An earlier plan kept as it is: `k` GPUs of `pool` over `duration` slots from `slot`."""

    assignment: Assignment
    pool: int
    slot: int
    duration: int
    k: int


class Problem:
    """A compiled snapshot (see the module docstring)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.now: datetime = snapshot.now
        self.slot_s: float = float(snapshot.slot_s)
        self.n_slots: int = max(1, int(math.ceil(snapshot.horizon_s / self.slot_s)))
        self.book = ProfileBook(snapshot.profiles) if snapshot.profiles else ProfileBook(seed_profiles())
        self.slot_offsets_s = np.arange(self.n_slots, dtype=np.float64) * self.slot_s
        self.slot_index = np.arange(self.n_slots, dtype=np.int64)

        pinned_map = getattr(snapshot, "pinned", None) or {}
        self.pinned: tuple[Assignment, ...] = tuple(
            pinned_map[j.id] for j in snapshot.jobs if j.pinned and j.id in pinned_map)
        pinned_ids = {a.job_id for a in self.pinned}

        self._build_curves()
        self._build_pools()
        self._build_power_caps()
        self._apply_keep(pinned_ids)
        kept_ids = {k.assignment.job_id for k in self.kept}
        self.jobs: list[QueuedJob] = [j for j in snapshot.jobs if j.id not in pinned_ids and j.id not in kept_ids]
        self.job_index: dict[int, int] = {j.id: i for i, j in enumerate(self.jobs)}
        self._compile_jobs()
        # jobs priced by their expected grams over a learned length spread (policies.length_spread)
        self._spread: dict[int, np.ndarray] = {
            j: m for j, m in ((j, multipliers(job)) for j, job in enumerate(self.jobs)) if m is not None}
        # the power limits operators let the planner choose, priced with the placement (issue 29)
        variants = CapVariants(self)
        self._cap_reach_s = variants.longest_s
        self._build_knots()
        choose_caps_jointly(self, variants, self._margin, self._deadline_s)
        self._job_options: dict[int, JobOptions] = {}
        self.options: Sequence[list[Option]] = _LazyOptions(self)
        self._cost_cache: tuple[int, np.ndarray] | None = None

    # -- construction ------------------------------------------------------------------------

    def _build_curves(self) -> None:
        snap = self.snapshot
        zones = sorted({g.zone for g in snap.gpus})
        self.zones: list[str] = zones
        priced = priced_curves(snap)  # blind zones: flat at the one blind price (policies.blind)
        self.blind_zones: set[str] = {z for z in zones if priced[z].signal == "blind"}
        self.blind_price: BlindPrice | None = blind_price(snap) if self.blind_zones else None
        self.curves: dict[str, CarbonCurve] = {zone: priced[zone] for zone in zones}

    def _build_knots(self) -> None:
        """Each zone's cumulative knots, covering every run the jobs can make: a curve with a
        tail (`policies.carbon_tail`) is materialised up to the last slot's start plus the
        longest runtime of any job on any group."""
        zones = self.zones
        fit = self.job_fit
        longest = float(self.job_runtime_s[fit].max()) if fit.any() else 0.0
        if not math.isfinite(longest):
            longest = 0.0
        longest = max(longest, self._cap_reach_s)  # a run stretched by a power limit (joint_caps)
        for j, m in self._spread.items():  # a priced run may reach past the job's estimate
            rt = self.job_runtime_s[j][fit[j]]
            if rt.size and math.isfinite(float(rt.max())):
                longest = max(longest, max(float(rt.max()), self._cap_reach_s) * float(m.max()))
        self._until_s = self.now.timestamp() + self.n_slots * self.slot_s + longest
        self._knots: dict[str, tuple[np.ndarray, np.ndarray]] = {
            zone: _cumulative_knots(self.curves[zone], self.now, self._until_s) for zone in zones}
        self._base_integral = {z: np.interp(self.slot_offsets_s, *self._knots[z]) for z in zones}
        self._zone_knots = [self._knots[z] for z in zones]
        self._zone_base = [self._base_integral[z] for z in zones]

    def _build_pools(self) -> None:
        snap = self.snapshot
        # the end of what each GPU is busy with beyond its own busy_until: pinned jobs
        busy_until: dict[int, datetime] = {}
        self._pinned_power: list[tuple[str, int, int, float]] = []  # budget, from, to, W
        if self.pinned:
            budget_of_gpu = {g.id: budget_of(g) for g in snap.gpus}  # for the power caps
            model_of_gpu = {g.id: g.model for g in snap.gpus}
            limit_of_gpu = {g.id: g.power_limit_w for g in snap.gpus}
            jobs_by_id = {j.id: j for j in snap.jobs}
            busy_until = {g.id: g.busy_until for g in snap.gpus if g.busy_until is not None}
        for a in self.pinned:
            runtime_s = a.estimate.runtime_s
            if runtime_s is None and a.estimate.finish_at is not None:
                runtime_s = (a.estimate.finish_at - a.start_at).total_seconds()
            model = model_of_gpu.get(a.gpu_ids[0], "H100") if a.gpu_ids else "H100"
            cap = limit_of_gpu.get(a.gpu_ids[0]) if a.gpu_ids else None
            shape = job_shape(jobs_by_id[a.job_id], model, self.book, snap.default_runtime_s, cap)
            if runtime_s is None:
                runtime_s = shape.runtime_s
            end = a.start_at + timedelta(seconds=runtime_s)
            for gid in a.gpu_ids:
                prev = busy_until.get(gid)
                busy_until[gid] = end if prev is None or prev < end else prev
            if a.gpu_ids:
                power_w = (a.estimate.energy_j / runtime_s) if a.estimate.energy_j and runtime_s \
                    else shape.power_w
                self._pinned_power.append((budget_of_gpu.get(a.gpu_ids[0], "?"), self._slot_floor(a.start_at),
                                           self._slot_ceil(end), power_w))

        self._running_power: list[tuple[str, int, float]] = []  # budget, until slot, W
        capped = {c.zone for c in snap.power_caps}
        now, now_s, slot_s, n_slots = self.now, self.now.timestamp(), self.slot_s, self.n_slots
        gpus = snap.gpus
        if capped:
            for g in gpus:
                if budget_of(g) in capped and g.busy_until is not None and g.busy_until > now:  # running, even if unhealthy now
                    self._running_power.append((budget_of(g), min(n_slots, self._slot_ceil(g.busy_until)),
                                                generic_power_w(g.model, g.power_limit_w)))
        topo = self._topology = _topology(snap)
        # the slot each GPU is free from (as _slot_ceil); the last entry pads the pool rows
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
        # pinned jobs here, kept plans in _apply_keep): where a job that waits for them may start
        self.pool_past_horizon: list[list[tuple[int, int]]] = [
            [(int(e), 1) for e in row[:len(pool.gpu_ids)] if e > n_slots]
            for pool, row in zip(topo.pools, past[topo.gpu_pos].tolist())]
        self.pools: list[Pool] = [pool._replace(free_slot=tuple(row[:len(pool.gpu_ids)]))
                                  for pool, row in zip(topo.pools, free_mat.tolist())]
        self.groups: list[Group] = list(topo.groups)
        # where each run of groups with one (zone, model) starts (groups are sorted by both)
        pairs = [(g.zone, g.model) for g in self.groups]
        self.group_kind_starts = np.array([i for i, pair in enumerate(pairs) if i == 0 or pairs[i - 1] != pair],
                                          dtype=np.int64)
        self.pool_size = topo.pool_size
        self.pool_group = topo.pool_group
        n_pools = len(self.pools)
        diff = np.zeros((n_pools, n_slots + 1), dtype=np.int32)
        np.add.at(diff, (np.repeat(np.arange(n_pools), free_mat.shape[1]), free_mat.ravel()), 1)
        self._capacity = np.cumsum(diff[:, :-1], axis=1, dtype=np.int32)
        # kth_free_slot[p, k-1]: first slot with k GPUs of pool p free (n_slots: never)
        self.kth_free_slot = np.sort(free_mat, axis=1)
        # group_kth_free_slot[g, k-1]: first slot with k GPUs free on one pool of group g
        self.group_kth_free_slot = np.minimum.reduceat(self.kth_free_slot[topo.by_group], topo.group_starts, axis=0) \
            if self.groups else np.zeros((0, self.kth_free_slot.shape[1]), dtype=np.int64)
        self._group_pools = topo.group_pools
        zone_index = {z: i for i, z in enumerate(self.zones)}
        self._group_zone = np.array([zone_index[g.zone] for g in self.groups], dtype=np.int64)
        self._members_cache: dict[tuple[int, int], np.ndarray] = {}
        self._cheapest_g: dict[int, float] = {}  # job -> cheapest start from release (cost_tables)

    def _build_power_caps(self) -> None:
        snap = self.snapshot
        self._power_cap: dict[str, np.ndarray] = {}
        starts = self.slot_offsets_s
        ends = starts + self.slot_s
        for cap in snap.power_caps:
            arr = self._power_cap.setdefault(cap.zone, np.full(self.n_slots, np.inf))
            lo = -np.inf if cap.start is None else (cap.start - self.now).total_seconds()
            hi = np.inf if cap.end is None else (cap.end - self.now).total_seconds()
            hit = (ends > lo) & (starts < hi)
            arr[hit] = np.minimum(arr[hit], cap.cap_w)
        for zone, until, power_w in self._running_power:
            if zone in self._power_cap:
                self._power_cap[zone][:until] -= power_w
        for zone, lo, hi, power_w in self._pinned_power:
            if zone in self._power_cap:
                self._power_cap[zone][max(0, lo):max(0, min(hi, self.n_slots))] -= power_w

    def _apply_keep(self, pinned_ids: set[int]) -> None:
        """Reserve capacity (and watts) for the earlier plans in `Snapshot.keep` that still
        fit, in start order; the rest are planned again. A kept plan holds k GPUs of its
        node's pool over the slots its run touches (start rounded down, end up), so the
        sweep of `assign_gpu_ids` can give it GPUs alongside the new picks."""
        self.kept: list[Kept] = []
        keep = getattr(self.snapshot, "keep", None) or {}
        if not keep:
            return
        jobs_by_id = {j.id: j for j in self.snapshot.jobs}
        pool_of_gpu = self._topology.pool_of_gpu
        now, now_s, slot_s, n_slots = self.now, self.now.timestamp(), self.slot_s, self.n_slots
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
                pool = self.pools[pool_i]
                if fits(job, pool.model, pool.memory_gib, self.book) is not None:
                    continue
                shape = job_shape(job, pool.model, self.book, self.snapshot.default_runtime_s,
                                  pool.power_limit_w)
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
            return
        # usually they all fit (they did last tick): check them at once, one by one only if not
        arr = np.array([c[1:] for c in cands], dtype=np.float64)
        pools_i, lo_i, hi_i = arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64), arr[:, 2].astype(np.int64)
        diff = np.zeros((len(self.pools), n_slots + 1), dtype=np.int32)
        np.add.at(diff, (pools_i, lo_i), arr[:, 3].astype(np.int32))
        np.add.at(diff, (pools_i, hi_i), -arr[:, 3].astype(np.int32))
        used = np.cumsum(diff[:, :-1], axis=1, dtype=np.int32)
        # a pool whose kept plans all fit together (and no power cap in its zone) keeps them
        # all: every prefix in start order fits too; the others are checked one by one
        crowded = (used > self._capacity).any(axis=1)
        for z in self._power_cap:
            crowded[[i for i, p in enumerate(self.pools) if p.budget == z]] = True
        bulk = ~crowded[pools_i]
        if bulk.any():
            self._capacity -= np.where(crowded[:, None], 0, used)
        keep_it = bulk.tolist()
        for i in np.flatnonzero(~bulk).tolist():
            a, pool_i, lo, hi, k, power_w = cands[i]
            if self._capacity[pool_i, lo:hi].min() < k:
                continue
            cap = self._power_cap.get(self.pools[pool_i].budget)
            if cap is not None and cap[lo:hi].min() < power_w - 1e-9:
                continue
            self._capacity[pool_i, lo:hi] -= k
            if cap is not None:
                cap[lo:hi] -= power_w
            keep_it[i] = True
        self.kept = [Kept(a, pool_i, lo, hi - lo, k) for (a, pool_i, lo, hi, k, _), ok in zip(cands, keep_it) if ok]
        for (_, pool_i, _, _, k, _), end, ok in zip(cands, ends, keep_it):
            if ok and end > n_slots:
                self.pool_past_horizon[pool_i].append((int(end), int(k)))

    def _compile_jobs(self) -> None:
        """Every job against every group at once, as (jobs x groups) arrays.

        `job_fit[j, g]`: the job can run on pools of group g (memory, its operating point's
        memory and latency SLOs (`energy.shape_arrays`), its
        explicit time limit, and some pool with at least k usable GPUs); `job_why` says why
        not (1 memory, 2 slo, 3 gang, 4 time limit).
        `job_runtime_s`, `job_power_w` (IT, k GPUs), `job_scale` (power x PUE / 3.6e6),
        `job_duration` (slots) and `job_latest` (last start slot) hold for every pair, fit or
        not; `job_earliest` and `job_k` are per job.
        """
        jobs, groups = self.jobs, self.groups
        n_jobs, n_groups = len(jobs), len(groups)
        # one column per (model, power limit): a capped GPU never draws more than its cap
        kinds = sorted({(g.model, g.power_limit_w or 0.0) for g in groups})
        kind_index = {m: i for i, m in enumerate(kinds)}
        gm = np.array([kind_index[(g.model, g.power_limit_w or 0.0)] for g in groups], dtype=np.int64)
        shapes = shape_arrays(jobs, [m for m, _ in kinds], self.book, self.snapshot.default_runtime_s,
                              [cap or None for _, cap in kinds])
        self.job_runtime_s: np.ndarray = shapes.runtime_s[:, gm].reshape(n_jobs, n_groups)
        self.job_power_w: np.ndarray = shapes.power_w[:, gm].reshape(n_jobs, n_groups)
        # an interrupted job (issue 30) has only the rest of its work left, plus one resume
        self.job_resumed: np.ndarray = np.array([j.done_fraction > 0 or j.resume_count > 0 for j in jobs], dtype=bool)
        if self.job_resumed.any():
            left = np.array([max(0.0, 1.0 - j.done_fraction) for j in jobs])
            resume = np.array([j.resume_cost_s if r else 0.0 for j, r in zip(jobs, self.job_resumed)])
            self.job_runtime_s = np.maximum(1.0, self.job_runtime_s * left[:, None] + resume[:, None])
        pue = np.array([g.pue for g in groups], dtype=np.float64)
        self.job_scale: np.ndarray = self.job_power_w * pue[None, :] / J_PER_KWH
        self.job_k: np.ndarray = np.array([max(1, j.gpus) for j in jobs], dtype=np.int64)

        mem = np.array([j.gpu_mem_gib for j in jobs], dtype=np.float64)
        group_mem = np.array([g.memory_gib for g in groups], dtype=np.float64)
        # the operating point's verdict (1: no point fits in memory, 2: none meets the SLOs)
        why = shapes.why[:, gm].reshape(n_jobs, n_groups).copy()
        why[group_mem[None, :] < mem[:, None]] = 1  # the job's own --gpu-mem is checked first
        # an explicit time limit binds: no option that runs longer by the model's own estimate
        limit_s = np.array([np.inf if j.time_limit_s is None else j.time_limit_s for j in jobs], dtype=np.float64)
        why[(why == 0) & (self.job_runtime_s > limit_s[:, None] * (1 + 1e-9))] = 4
        largest = np.array([int(self.pool_size[list(g.pools)].max()) for g in groups], dtype=np.int64)
        self.group_largest_pool: np.ndarray = largest  # GPUs of each group's largest pool (node)
        why[(why == 0) & (largest[None, :] < self.job_k[:, None])] = 3
        self.job_why: np.ndarray = why
        self.job_fit: np.ndarray = why == 0

        earliest = np.empty(n_jobs, dtype=np.int64)
        limit = np.full(n_jobs, self.n_slots - 1, dtype=np.int64)
        deadline_s = np.full(n_jobs, np.nan)
        for i, job in enumerate(jobs):
            earliest[i] = self._slot_ceil(max(self.now, job.submitted_at))
            # a job resuming after a checkpoint (issue 30) has started: its maximum delay is met
            if job.max_delay_s is not None and not (job.done_fraction > 0 or job.resume_count > 0):
                limit[i] = min(limit[i], self._slot_floor(job.submitted_at + timedelta(seconds=job.max_delay_s)))
            if job.deadline is not None:
                deadline_s[i] = (job.deadline - self.now).total_seconds()
        self.job_earliest: np.ndarray = earliest
        rt = self.job_runtime_s
        self.job_duration: np.ndarray = duration_slots(rt, self.slot_s)
        has = ~np.isnan(deadline_s)
        # the deadline with a margin for the estimate's uncertainty (policies.margin)
        margin = margin_arrays(jobs, [m for m, _ in kinds], self.book,
                               estimates=getattr(self.snapshot, "estimate_margin", True))[:, gm].reshape(n_jobs, n_groups)
        self._margin, self._deadline_s = margin, deadline_s  # what joint_caps re-prices windows with
        by_deadline = latest_start_slots(deadline_s, rt, margin, earliest, self.slot_s)
        by_deadline = np.where(has[:, None], by_deadline, float(self.n_slots))
        self.job_latest: np.ndarray = np.minimum(limit[:, None], by_deadline).astype(np.int64)
        # the window's two ends apart: the hard one (max delay, horizon) per job, and the last
        # on-time start per (job, group) (may lie before `job_earliest`, or past the horizon)
        self.job_hard_latest: np.ndarray = limit
        self.job_on_time_latest: np.ndarray = np.clip(by_deadline, -1e9, 1e9)
        # held starts (policies.held_starts): the jobs whose window was cut to a promised
        # start, and the window ends before the cut (None while no job is held)
        self.held_jobs: set[int] = set()
        self.job_latest_unheld: np.ndarray | None = None
        self.job_hard_latest_unheld: np.ndarray | None = None
        self.group_row_offsets = np.arange(n_groups, dtype=np.int64) * (self.n_slots + 1)
        self._zone_groups = [np.array([gi for gi, g in enumerate(groups) if g.zone == z], dtype=np.int64)
                             for z in self.zones]

    def _build_job_options(self, j: int) -> JobOptions:
        job = self.jobs[j]
        k = int(self.job_k[j])
        gis = np.flatnonzero(self.job_fit[j])
        excluded: dict[str, str] = {}
        for gi in np.flatnonzero(~self.job_fit[j]).tolist():
            excluded.setdefault(self.groups[gi].model, _WHY[int(self.job_why[j, gi])])
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
            tk, gk = self._zone_knots[z]
            rows = slice(int(gz[0]), int(gz[-1]) + 1)  # groups are sorted by zone first
            view = out[:, rows, :]
            # (interp - base) * scale written straight into `out`: one pass over the chunk's
            # 11 MB fewer than copying interp's result in first (same operations, same bits)
            np.subtract(np.interp(self.slot_offsets_s[None, None, :] + runtime[:, rows, None], tk, gk),
                        self._zone_base[z], out=view)
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

    def _slot_ceil(self, t: datetime) -> int:
        return max(0, int(math.ceil((t - self.now).total_seconds() / self.slot_s - 1e-9)))

    def _slot_floor(self, t: datetime) -> int:
        return int(math.floor((t - self.now).total_seconds() / self.slot_s + 1e-9))

    # -- the price of lateness ----------------------------------------------------------------

    #: grams of CO2 one GPU-hour of lateness is worth (policies.lateness); inf: strict, a
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
        return self.now + timedelta(seconds=slot * self.slot_s)

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
            tk, gk = self._zone_knots[z]
            ends = np.interp(self.slot_offsets_s[None, :] + jo.row_runtime_s[rows][:, None], tk, gk)
            table[rows] = (ends - self._zone_base[z][None, :]) * jo.row_scale[rows][:, None]
        if j in self._spread:
            self._expected_rows(table, self._spread[j], jo.row_runtime_s, jo.row_scale, jo.row_zone)
        self._cost_cache = (j, table)
        return table

    def _expected_rows(self, table: np.ndarray, mult: np.ndarray, runtime_s: np.ndarray, scale: np.ndarray,
                       row_zone: np.ndarray) -> None:
        """Overwrite one job's cost rows (`table[r]`: a group of zone `row_zone[r]` where it
        runs `runtime_s[r]` at `scale[r]` grams per g/kWh x s) with its expected grams over its
        length multipliers `mult` (`policies.length_spread`)."""
        for z in np.unique(row_zone).tolist():
            rows = np.flatnonzero((row_zone == z) & np.isfinite(runtime_s))
            if rows.size == 0:
                continue
            tk, gk = self._zone_knots[z]
            x = self.slot_offsets_s[None, None, :] + (runtime_s[rows][:, None] * mult[None, :])[:, :, None]
            ends = np.interp(x, tk, gk).mean(axis=1)
            table[rows] = (ends - self._zone_base[z][None, :]) * scale[rows][:, None]

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
        """The zone's forecast intensity integrated over each slot (g/kWh x s), cached:
        what one slot of running costs per kWh-rate (`policies.segments`)."""
        cache = self.__dict__.setdefault("_slot_integrals", {})
        hit = cache.get(zone)
        if hit is None:
            tk, gk = self._knots[zone]
            hit = cache[zone] = np.interp(self.slot_offsets_s + self.slot_s, tk, gk) - self._base_integral[zone]
        return hit

    def gco2_at(self, zone: str, start: datetime, runtime_s: float, power_w: float, pue: float,
                spread: np.ndarray | None = None) -> float:
        """Internal cost of drawing power_w from `start` in a zone (blind zones: fallback);
        with `spread` (length multipliers, `policies.length_spread`) the mean over them."""
        if spread is not None:
            return expected(lambda run_s: self.gco2_at(zone, start, run_s, power_w, pue), runtime_s, spread)
        a = (start - self.now).total_seconds()
        end_s = self.now.timestamp() + a + runtime_s
        if end_s > self._until_s and self.curves[zone].tail is not None:  # a pinned or kept run past the knots
            return power_w * pue * curve_integral_g_per_kwh_s(
                self.curves[zone], start, start + timedelta(seconds=runtime_s)) / J_PER_KWH
        tk, gk = self._knots[zone]
        integral = float(np.interp(a + runtime_s, tk, gk) - np.interp(a, tk, gk))
        return power_w * pue * integral / J_PER_KWH

    def tail_s(self, zone: str, start: datetime, runtime_s: float) -> float:
        """Seconds of a run from `start` that fall past the end of the zone's forecast and are
        priced by its tail (`policies.carbon_tail`; 0 for a curve without one)."""
        curve = self.curves.get(zone)
        if curve is None or curve.tail is None:
            return 0.0
        t = start.timestamp()
        return extended(curve).tail_s(t, t + runtime_s)


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


class _Topology(NamedTuple):
    """The pools and groups of a fleet, apart from when each GPU is next free (`free_slot`
    is empty here). It changes only when a GPU does (health, drain, model), not from tick to
    tick, so it is built once per fleet state and shared (`_topology`)."""

    pools: tuple[Pool, ...]
    groups: tuple[Group, ...]
    gpu_pos: np.ndarray  # (pools x widest pool) index into Snapshot.gpus; len(gpus) pads
    pool_size: np.ndarray
    pool_group: np.ndarray
    group_pools: list[np.ndarray]  # per group, its pools
    by_group: np.ndarray  # pools ordered by group (for reductions per group)
    group_starts: np.ndarray  # where each group starts in `by_group`
    pool_of_gpu: dict[int, int]  # GPU id -> the pool of its node and model (also for a GPU left out)


_TOPOLOGIES: dict[tuple, _Topology] = {}


def _topology(snap: Snapshot) -> _Topology:
    """The snapshot's `_Topology`, from a small cache keyed by everything it depends on."""
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
    topo = _Topology(pools=tuple(pools), groups=tuple(group_list), gpu_pos=gpu_pos,
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


def compile_problem(snapshot: Snapshot, lateness_g_per_gpu_h: float = math.inf) -> Problem:
    """Compile a snapshot into the slot-indexed problem (see the module docstring), with the
    price of lateness its policy plans with (`policies.lateness`; inf: strict)."""
    problem = Problem(snapshot)
    problem.lateness_g_per_gpu_h = float(lateness_g_per_gpu_h)
    return problem


def _cumulative_knots(curve: CarbonCurve, now: datetime, until_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Knots (seconds from now, cumulative g/kWh x s) of the curve's integral: flat-extended
    without a tail; with one, its typical values up to `until_s` (epoch s), then its mean."""
    if curve.tail is not None:
        return extended(curve).knots(now.timestamp(), until_s, _FAR_S)
    values = np.asarray(curve.values_g_per_kwh, dtype=np.float64)
    t0 = (curve.start - now).total_seconds()
    n = values.size
    tk = t0 + np.arange(n + 1, dtype=np.float64) * curve.step_s
    gk = np.concatenate([[0.0], np.cumsum(values) * curve.step_s])
    tk = np.concatenate([[t0 - _FAR_S], tk, [tk[-1] + _FAR_S]])
    gk = np.concatenate([[-_FAR_S * values[0]], gk, [gk[-1] + _FAR_S * values[-1]]])
    return tk, gk

