"""The slot-indexed planning problem that greedy, cpsat, oracle and the LP bound share.

`compile_problem(snapshot)` turns a Snapshot into:

* **pools**: the usable GPUs of one model on one node (same zone, PUE, memory). A job runs on
  k GPUs of one pool (gang on one node, one model). Unhealthy and drained GPUs are left out;
  a GPU busy with a running job (or a pinned job) is free from `free_slot` on.
* **groups**: pools with the same (zone, model, memory, PUE). A job costs the same on every
  pool of a group, so costs are computed per group and shared (128 pools of a 1,024-GPU
  cluster fall into ~24 groups).
* **options** per job: the pools that fit it (memory, latency SLO, at least k usable GPUs
  on the node), each with the job's shape on that model, its duration in slots and its
  start window [earliest_slot, latest_slot].
* **cost(j, o)**: gCO2 per start slot (inf outside the window), from prefix integrals of
  each zone's forecast (one vectorised `numpy.interp` per zone and job).
* **capacity(pool)**: GPUs free per slot; **power_cap_w(zone)**: watts left per slot.

Time is discretised into `slot_s` slots from `now` (slot 0 starts now) over `horizon_s`.
Starts fall on slot boundaries; a job holds its GPUs for `duration_slots = ceil(runtime /
slot_s)` whole slots, so per-slot GPU counts are exact: if at most c(s) GPUs of a pool are
used in every slot, a sweep in start order gives every job the same GPUs for its whole run
(interval graphs are perfect), which `assign_gpu_ids` does.

Windows: a job never starts before `max(now, submitted_at)` (the oracle plans future
arrivals); `latest_slot` is the last start that finishes by the deadline, starts within
`max_delay_s` of submission, and lies in the horizon. `latest_slot < earliest_slot` means the
option cannot meet the deadline (policies then place the job as soon as possible, flagged).

A zone without a forecast is planned carbon-blind: its internal cost uses the mean intensity
of the zones that have one (or 1 g/kWh when none does, which makes the cost proportional to
energy), and its estimates report gCO2 as None.

Pinned jobs (`QueuedJob.pinned` with a current plan in `Snapshot.pinned`) are not decision
variables: their GPUs are busy until their planned finish, their power counts against the
zone's power cap, and `Problem.pinned` hands their assignments back unchanged.

Power caps: a cap applies to a slot it overlaps. Running jobs count against it at their GPUs'
generic power (`energy.generic_power_w`) until their expected end.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

import numpy as np

from policies.energy import J_PER_KWH, JobShape, ProfileBook, fits, generic_power_w, job_shape, seed_profiles
from policies.model import Assignment, CarbonCurve, QueuedJob, Snapshot

log = logging.getLogger(__name__)

_FAR_S = 1e9  # flat extension of a forecast beyond its ends, in seconds


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
        self.now: datetime = snapshot.now
        self.slot_s: float = float(snapshot.slot_s)
        self.n_slots: int = max(1, int(math.ceil(snapshot.horizon_s / self.slot_s)))
        self.book = ProfileBook(snapshot.profiles) if snapshot.profiles else ProfileBook(seed_profiles())
        self.slot_offsets_s = np.arange(self.n_slots, dtype=np.float64) * self.slot_s

        pinned_map = getattr(snapshot, "pinned", None) or {}
        self.pinned: tuple[Assignment, ...] = tuple(
            pinned_map[j.id] for j in snapshot.jobs if j.pinned and j.id in pinned_map)
        pinned_ids = {a.job_id for a in self.pinned}
        self.jobs: list[QueuedJob] = [j for j in snapshot.jobs if j.id not in pinned_ids]
        self.job_index: dict[int, int] = {j.id: i for i, j in enumerate(self.jobs)}

        self._build_curves()
        self._build_pools()
        self._build_power_caps()
        self._job_options: list[JobOptions] = [self._compile_job(j) for j in self.jobs]
        self.options: Sequence[list[Option]] = _LazyOptions(self)
        self._cost_cache: tuple[int, np.ndarray] | None = None

    # -- construction ------------------------------------------------------------------------

    def _build_curves(self) -> None:
        snap = self.snapshot
        zones = sorted({g.zone for g in snap.gpus})
        self.zones: list[str] = zones
        self.blind_zones: set[str] = {z for z in zones if z not in snap.carbon}
        known = [c for z, c in snap.carbon.items() if c.values_g_per_kwh]
        if known:
            end = self.now + timedelta(seconds=self.n_slots * self.slot_s)
            fallback = float(np.mean([_curve_mean(c, self.now, end) for c in known]))
        else:
            fallback = 1.0
        self.curves: dict[str, CarbonCurve] = {}
        self._knots: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for zone in zones:
            curve = snap.carbon.get(zone)
            if curve is None or not curve.values_g_per_kwh:
                curve = CarbonCurve(zone=zone, start=self.now, step_s=self.slot_s,
                                    values_g_per_kwh=(fallback,), signal="blind",
                                    source="no forecast: mean of the other zones")
            self.curves[zone] = curve
            self._knots[zone] = _cumulative_knots(curve, self.now)
        self._base_integral = {z: np.interp(self.slot_offsets_s, *self._knots[z]) for z in zones}
        self._zone_knots = [self._knots[z] for z in zones]
        self._zone_base = [self._base_integral[z] for z in zones]

    def _build_pools(self) -> None:
        snap = self.snapshot
        busy_until: dict[int, datetime | None] = {g.id: g.busy_until for g in snap.gpus}
        self._pinned_power: list[tuple[str, int, int, float]] = []  # zone, from, to, W
        zone_of_gpu = {g.id: g.zone for g in snap.gpus}
        model_of_gpu = {g.id: g.model for g in snap.gpus}
        jobs_by_id = {j.id: j for j in snap.jobs}
        for a in self.pinned:
            runtime_s = a.estimate.runtime_s
            if runtime_s is None and a.estimate.finish_at is not None:
                runtime_s = (a.estimate.finish_at - a.start_at).total_seconds()
            model = model_of_gpu.get(a.gpu_ids[0], "H100") if a.gpu_ids else "H100"
            shape = job_shape(jobs_by_id[a.job_id], model, self.book, snap.default_runtime_s)
            if runtime_s is None:
                runtime_s = shape.runtime_s
            end = a.start_at + timedelta(seconds=runtime_s)
            for gid in a.gpu_ids:
                prev = busy_until.get(gid)
                busy_until[gid] = end if prev is None or prev < end else prev
            if a.gpu_ids:
                power_w = (a.estimate.energy_j / runtime_s) if a.estimate.energy_j and runtime_s \
                    else shape.power_w
                self._pinned_power.append((zone_of_gpu.get(a.gpu_ids[0], "?"), self._slot_floor(a.start_at),
                                           self._slot_ceil(end), power_w))

        by_key: dict[tuple[str, str, str, float], list] = defaultdict(list)
        self._running_power: list[tuple[str, int, float]] = []  # zone, until slot, W
        for g in snap.gpus:
            if g.busy_until is not None and g.busy_until > self.now:  # running, even if unhealthy now
                self._running_power.append((g.zone, min(self.n_slots, self._slot_ceil(g.busy_until)),
                                            generic_power_w(g.model)))
            if not g.healthy or g.drained:
                continue
            free = 0
            bu = busy_until.get(g.id)
            if bu is not None and bu > self.now:
                free = min(self.n_slots, self._slot_ceil(bu))
            by_key[(g.node, g.zone, g.model, float(g.memory_gib))].append((g.index, g.id, free))

        groups: dict[tuple[str, str, float, float], list[int]] = defaultdict(list)
        pools: list[Pool] = []
        for (node, zone, model, mem), gs in sorted(by_key.items()):
            gs.sort()
            pue = float(snap.pue.get(zone, 1.0))
            gkey = (zone, model, mem, pue)
            groups[gkey].append(len(pools))
            pools.append(Pool(node=node, zone=zone, model=model, memory_gib=mem,
                              gpu_ids=tuple(g[1] for g in gs), pue=pue,
                              free_slot=tuple(g[2] for g in gs)))
        self.groups: list[Group] = []
        for gkey, members in sorted(groups.items()):
            gi = len(self.groups)
            self.groups.append(Group(zone=gkey[0], model=gkey[1], memory_gib=gkey[2], pue=gkey[3],
                                     pools=tuple(members)))
            for p in members:
                pools[p] = pools[p]._replace(group=gi)
        self.pools: list[Pool] = pools
        self.pool_size = np.array([len(p.gpu_ids) for p in pools], dtype=np.int64)
        self.pool_group = np.array([p.group for p in pools], dtype=np.int64)
        cap = np.zeros((len(pools), self.n_slots), dtype=np.int32)
        for i, p in enumerate(pools):
            for f in p.free_slot:
                if f < self.n_slots:
                    cap[i, f:] += 1
        self._capacity = cap
        # kth_free_slot[p, k-1]: first slot with k GPUs of pool p free (n_slots: never)
        width = int(self.pool_size.max()) if pools else 1
        kth = np.full((len(pools), width), self.n_slots, dtype=np.int64)
        for i, p in enumerate(pools):
            kth[i, :len(p.free_slot)] = sorted(p.free_slot)
        self.kth_free_slot = kth
        # per group: pools sorted by size, to pick those with >= k GPUs quickly
        self._group_pools = [np.array(g.pools, dtype=np.int64) for g in self.groups]
        zone_index = {z: i for i, z in enumerate(self.zones)}
        self._group_zone = np.array([zone_index[g.zone] for g in self.groups], dtype=np.int64)
        self._members_cache: dict[tuple[int, int], np.ndarray] = {}

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

    def _compile_job(self, job: QueuedJob) -> JobOptions:
        release = max(self.now, job.submitted_at)
        earliest = self._slot_ceil(release)
        limit = self.n_slots - 1
        if job.max_delay_s is not None:
            limit = min(limit, self._slot_floor(job.submitted_at + timedelta(seconds=job.max_delay_s)))
        deadline_s = None if job.deadline is None else (job.deadline - self.now).total_seconds()
        shapes: dict[str, JobShape] = {}
        excluded: dict[str, str] = {}
        fit_by_model: dict[tuple[str, float], str | None] = {}
        members_l: list[np.ndarray] = []
        gis: list[int] = []
        durs: list[int] = []
        latests: list[int] = []
        k = max(1, job.gpus)
        for gi, g in enumerate(self.groups):
            key = (g.model, g.memory_gib)
            if key in fit_by_model:
                why = fit_by_model[key]
            else:
                why = fit_by_model[key] = fits(job, g.model, g.memory_gib, self.book)
            if why is not None:
                excluded.setdefault(g.model, why)
                continue
            members = self._members(gi, k)
            if members.size == 0:
                excluded.setdefault(g.model, "gang")
                continue
            shape = shapes.get(g.model)
            if shape is None:
                shape = job_shape(job, g.model, self.book, self.snapshot.default_runtime_s)
                shapes[g.model] = shape
            dur = max(1, int(math.ceil(shape.runtime_s / self.slot_s - 1e-9)))
            latest = limit
            if deadline_s is not None:
                latest = min(latest, int(math.floor((deadline_s - shape.runtime_s) / self.slot_s + 1e-9)))
            members_l.append(members)
            gis.append(gi)
            durs.append(dur)
            latests.append(latest)
        for model in shapes:
            excluded.pop(model, None)
        if members_l:
            sizes = [m.size for m in members_l]
            gi_arr = np.array(gis, dtype=np.int64)
            first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
            grps = [self.groups[g] for g in gis]
            return JobOptions(np.concatenate(members_l), np.repeat(gi_arr, sizes),
                              np.repeat(np.array(durs, dtype=np.int64), sizes),
                              np.repeat(np.array(latests, dtype=np.int64), sizes), earliest, shapes, excluded,
                              gi_arr, first, self._group_zone[gi_arr],
                              np.array([shapes[g.model].runtime_s for g in grps]),
                              np.array([shapes[g.model].power_w * g.pue for g in grps]) / J_PER_KWH)
        empty = np.zeros(0, dtype=np.int64)
        return JobOptions(empty, empty, empty, empty, earliest, shapes, excluded, empty, empty, empty,
                          np.zeros(0), np.zeros(0))

    def _members(self, gi: int, k: int) -> np.ndarray:
        """Pools of group gi with at least k usable GPUs (cached per (group, k))."""
        key = (gi, k)
        hit = self._members_cache.get(key)
        if hit is None:
            members = self._group_pools[gi]
            hit = self._members_cache[key] = members[self.pool_size[members] >= k]
        return hit

    def _slot_ceil(self, t: datetime) -> int:
        return max(0, int(math.ceil((t - self.now).total_seconds() / self.slot_s - 1e-9)))

    def _slot_floor(self, t: datetime) -> int:
        return int(math.floor((t - self.now).total_seconds() / self.slot_s + 1e-9))

    # -- queries -----------------------------------------------------------------------------

    def job_options(self, j: int) -> JobOptions:
        """The options of job j as numpy arrays (fast path for the policies)."""
        return self._job_options[j]

    def slot_time(self, slot: int) -> datetime:
        return self.now + timedelta(seconds=slot * self.slot_s)

    def capacity(self, pool: int) -> np.ndarray:
        """GPUs of the pool free in each slot (before any queued job is placed)."""
        return self._capacity[pool].copy()

    def capacity_matrix(self) -> np.ndarray:
        """A fresh (pools x slots) int32 array of free GPUs per slot."""
        return self._capacity.copy()

    def power_cap_w(self, zone: str) -> np.ndarray | None:
        """Watts left for queued jobs in each slot of the zone, or None when uncapped."""
        arr = self._power_cap.get(zone)
        return None if arr is None else arr.copy()

    @property
    def capped_zones(self) -> list[str]:
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
        self._cost_cache = (j, table)
        return table

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

    def gco2_at(self, zone: str, start: datetime, runtime_s: float, power_w: float, pue: float) -> float:
        """Internal cost of drawing power_w from `start` in a zone (blind zones: fallback)."""
        tk, gk = self._knots[zone]
        a = (start - self.now).total_seconds()
        integral = float(np.interp(a + runtime_s, tk, gk) - np.interp(a, tk, gk))
        return power_w * pue * integral / J_PER_KWH


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


def compile_problem(snapshot: Snapshot) -> Problem:
    """Compile a snapshot into the slot-indexed problem (see the module docstring)."""
    return Problem(snapshot)


def _cumulative_knots(curve: CarbonCurve, now: datetime) -> tuple[np.ndarray, np.ndarray]:
    """Knots (seconds from now, cumulative g/kWh x s) of the curve's integral, flat-extended."""
    values = np.asarray(curve.values_g_per_kwh, dtype=np.float64)
    t0 = (curve.start - now).total_seconds()
    n = values.size
    tk = t0 + np.arange(n + 1, dtype=np.float64) * curve.step_s
    gk = np.concatenate([[0.0], np.cumsum(values) * curve.step_s])
    tk = np.concatenate([[t0 - _FAR_S], tk, [tk[-1] + _FAR_S]])
    gk = np.concatenate([[-_FAR_S * values[0]], gk, [gk[-1] + _FAR_S * values[-1]]])
    return tk, gk


def _curve_mean(curve: CarbonCurve, start: datetime, end: datetime) -> float:
    tk, gk = _cumulative_knots(curve, start)
    span = (end - start).total_seconds()
    return float((np.interp(span, tk, gk) - np.interp(0.0, tk, gk)) / span)
