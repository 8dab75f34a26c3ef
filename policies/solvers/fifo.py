"""FIFO: the carbon-agnostic baseline.

Jobs are taken in submission order; each gets the earliest start on one node with enough
GPUs of one model that each have enough memory and meet the job's latency SLO. Later jobs
may start earlier on GPUs the head of the queue cannot use (list scheduling), but never
delay an earlier job's planned start. Starts are exact (not slot-aligned): a job starts the
moment its GPUs free up. Unhealthy and drained GPUs are never used; pinned jobs keep their
current plan, and so do the kept plans of incremental planning. FIFO ignores deadlines (a job
that will finish late is flagged) and site power caps: it is the "run it as soon as possible" yardstick.

Each assignment carries a full estimate from the energy model (runtime on the chosen
model, energy, gCO2 at that start, a zone without a forecast priced by `policies.pricing.blind`), so
its gCO2 compares fairly with the carbon-aware policies; `gco2_if_now` is the counterfactual
of `policies.pricing.counterfactual` (the job alone on the earliest free, fastest GPUs; ties
averaged). An explicit time limit (`QueuedJob.time_limit_s`) rules out models the job would
overrun.

Jobs of higher `QueuedJob.priority` are placed first (the order above within equal
priority), so a later job never delays a higher-priority job's planned start. edf takes a
faster pool only where it starts within the job's `max_defer_s` of the earliest one.

Ties never depend on names: among equally early pools (within `START_TOL_S`) the one that
finishes the job first wins, and among those a seeded random one (`seed`; the draw is per
job, so a re-plan of an unchanged queue gives the same answer). Before, "first free GPUs"
took the nodes whose names sort first, so renaming nodes changed the baseline's grams; the
simulator reports fifo as the mean and spread over several seeds.

`edf` (policies.solvers.edf) is the same list scheduler in deadline order, taking the pool that
finishes each job soonest: the carbon-blind, deadline-aware baseline.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

import numpy as np

from policies.pricing.blind import blind_price, priced_curves
from policies.pricing.counterfactual import START_TOL_S, choose
from policies.model.energy import (CurveIntegrator, JobShape, ProfileBook, fits, gang_power_limit_w, has_slo, job_shape,
                             seed_profiles, slo_text, within_time_limit)
from policies.model.length_spread import expected, multipliers
from policies.types import J_PER_KWH, Assignment, Estimate, GpuSlot, Plan, QueuedJob, Snapshot, grams


@dataclass
class FifoPolicy:
    name: str = "fifo"
    seed: int = 0  # ties between equally early, equally fast pools: a seeded random choice

    # submission order, the earliest start (then the earliest finish); edf overrides both
    by_deadline = False
    rule = "first free GPUs in submission order"

    def _order(self, job: QueuedJob) -> tuple:
        # higher priority first (`policies.solvers.priority`): each placement is final and later
        # jobs fit around it, so no job delays the planned start of one of higher priority
        if self.by_deadline:
            return (-job.priority, job.deadline is None, job.deadline or job.submitted_at, job.submitted_at, job.id)
        return (-job.priority, job.submitted_at, job.id)

    def plan(self, snapshot: Snapshot, explain: bool = True, beat: tuple[int, int] | None = None) -> Plan | None:
        """fifo's plan. `explain=False` leaves out what only a reader needs (the "if run now"
        alternative, the explanation text): enough to score the plan, at about half the cost.

        `beat`: the (unplaced jobs, deadline misses) of a plan fifo's is compared with (see
        `placement.Score`): None is returned once fifo's own unplaced jobs and misses (which
        only grow as it goes) show its plan cannot be better. A policy that meets every
        deadline learns so from fifo's first miss instead of its whole pass."""
        book = ProfileBook(snapshot.profiles) if snapshot.profiles else ProfileBook(seed_profiles())
        pinned = {j.id: snapshot.pinned[j.id] for j in snapshot.jobs
                  if j.pinned and j.id in snapshot.pinned}
        pinned.update(_still_valid_keeps(snapshot, pinned))
        fleet = _Fleet(snapshot, _busy_until(snapshot, pinned, book))

        assignments: list[Assignment] = list(pinned.values())
        unplaced: dict[int, str] = {}
        misses = 0
        for job in sorted(snapshot.jobs, key=self._order):
            if job.id in pinned:
                continue
            if beat is not None and _cannot_beat(len(unplaced), misses, beat):
                return None
            ok = fleet.eligible(job, book, snapshot.default_runtime_s)
            if isinstance(ok, str):
                unplaced[job.id] = ok
                continue
            a = self._place(job, ok, fleet, book, snapshot, explain)
            misses += a.estimate.deadline_miss
            assignments.append(a)
        if beat is not None and _cannot_beat(len(unplaced), misses, beat):
            return None
        return Plan(assignments=tuple(assignments), unplaced=unplaced)

    def _place(self, job: QueuedJob, ok: np.ndarray, fleet: "_Fleet", book: ProfileBook, snapshot: Snapshot,
               explain: bool) -> Assignment:
        """The job on the pool `_pick` chooses among the eligible ones (`ok`), at the moment
        its GPUs free up; the pool's GPUs are then busy until it finishes."""
        now = snapshot.now
        k = max(1, job.gpus)
        release_s = max(0.0, (job.submitted_at - now).total_seconds())
        starts = np.where(ok, np.maximum(fleet.free[:, k - 1] if fleet.width >= k else np.inf, release_s), np.inf)
        p = self._pick(job, starts, fleet.shapes, book, snapshot.default_runtime_s)
        start_s = float(starts[p])
        model = fleet.models[p]
        gpu_ids = fleet.first_gpus(p, k)
        shape = job_shape(job, model, book, snapshot.default_runtime_s,
                          gang_power_limit_w(fleet.limit_of.get(g) for g in gpu_ids))
        start = now + timedelta(seconds=start_s)
        finish = start + timedelta(seconds=shape.runtime_s)
        fleet.hold(p, k, (finish - now).total_seconds())  # via datetimes: exact microseconds

        key = fleet.keys[p]
        zone = fleet.zone_of[key]
        pue = snapshot.gpu_pue(fleet.pools[key][0])
        gco2 = _gco2(fleet.integrators.get(zone), start, shape, pue, multipliers(job))
        miss = job.deadline is not None and finish > job.deadline
        if not explain:
            return Assignment(
                job_id=job.id, node=key[0], gpu_ids=gpu_ids, start_at=start,
                estimate=Estimate(finish_at=finish, energy_j=shape.energy_j, gco2=gco2,
                                  runtime_s=shape.runtime_s, deadline_miss=miss,
                                  time_limit_s=job.derived_time_limit_s(shape.runtime_s)))
        gco2_now = job.gco2_if_now
        if gco2_now is None:
            gco2_now = _if_now(job, ok, fleet, k, release_s, now, book, snapshot)
        wait_s = start_s
        when = "now" if wait_s < 1 else f"in {_human(wait_s)}"
        blind, price = zone in fleet.blind, fleet.price
        cost = grams(gco2) + (f" {price.note()}" if blind and price is not None else "")
        return Assignment(
            job_id=job.id,
            node=key[0],
            gpu_ids=gpu_ids,
            start_at=start,
            estimate=Estimate(finish_at=finish, energy_j=shape.energy_j, gco2=gco2,
                              gco2_if_now=gco2_now, runtime_s=shape.runtime_s, prompts=job.prompts,
                              binding="deadline" if miss else None, deadline_miss=miss,
                              blind_g_per_kwh=price.g_per_kwh if blind and price else None,
                              time_limit_s=job.derived_time_limit_s(shape.runtime_s)),
            explanation=(
                f"{self.name}: {k}x{model} on {key[0]} in {zone} {when}, {cost}; "
                f"{self.rule}"
                + (" (finishes after its deadline)" if miss else "")
            ),
        )

    def _pick(self, job: QueuedJob, starts: np.ndarray, shapes: "_PoolShapes", book: ProfileBook,
              default_runtime_s: float) -> int:
        """The pool the job takes: fifo the earliest start, edf the earliest finish; then the
        earliest finish (fifo) or start (edf); then a seeded random one of the tied pools."""
        cand = np.isfinite(starts).nonzero()[0]  # starts is 1-D (pools)
        if cand.size == 0:
            return int(np.argmin(starts))
        if not self.by_deadline:  # only the equally early pools can win
            cand = cand[starts[cand] <= starts[cand].min() + START_TOL_S]
            if cand.size == 1:
                return int(cand[0])
        elif job.max_defer_s is not None:  # edf: a faster pool only within the job's deferral bound
            cand = cand[starts[cand] <= starts[cand].min() + max(START_TOL_S, float(job.max_defer_s))]
        # one runtime per (model, power limit) among the candidates, then the finishes as one
        # array sum (the same float additions): a Python loop over ~100 pools per job was half
        # of edf's time when greedy compares its plan (5,000 jobs)
        kinds = shapes.of_pool[cand]
        runtime = np.zeros(len(shapes.keys))
        for q in set(kinds.tolist()):
            model, cap = shapes.keys[q]
            runtime[q] = job_shape(job, model, book, default_runtime_s, cap).runtime_s
        finish = starts[cand] + runtime[kinds]
        first, then = (finish, starts[cand]) if self.by_deadline else (starts[cand], finish)
        tied = cand[first <= first.min() + START_TOL_S]
        then = then[first <= first.min() + START_TOL_S]
        tied = tied[then <= then.min() + START_TOL_S]
        if tied.size == 1:
            return int(tied[0])
        # the draw is seeded per (seed, job id) as 64-bit words: a non-negative id or seed
        # keeps its draw, a negative one (a caller's own snapshot) is valid too
        return int(np.random.default_rng((self.seed % 2**64, job.id % 2**64)).choice(tied))


class _PoolShapes(NamedTuple):
    """Pools grouped by what a job's runtime depends on: `keys[of_pool[p]]` is pool p's
    (model, gang power limit)."""

    of_pool: np.ndarray
    keys: list[tuple[str, float | None]]


def _busy_until(snapshot: Snapshot, pinned: dict[int, Assignment], book: ProfileBook) -> dict[int, datetime | None]:
    """When each GPU is free: its own busy_until, or later the end of a pinned or kept plan
    on it (fifo schedules a GPU as a list: nothing goes in the gap before them)."""
    busy_until: dict[int, datetime | None] = {g.id: g.busy_until for g in snapshot.gpus}
    jobs_by_id = {j.id: j for j in snapshot.jobs}
    model_of = {g.id: g.model for g in snapshot.gpus}
    for a in pinned.values():
        model = model_of.get(a.gpu_ids[0], "H100") if a.gpu_ids else "H100"
        runtime_s = a.estimate.runtime_s or job_shape(
            jobs_by_id[a.job_id], model, book, snapshot.default_runtime_s).runtime_s
        end = a.start_at + timedelta(seconds=runtime_s)
        for gid in a.gpu_ids:
            prev = busy_until.get(gid)
            busy_until[gid] = end if prev is None or prev < end else prev
    return busy_until


class _Fleet:
    """fifo's pools (the usable GPUs of one (node, model, memory)) and when each GPU is free:
    `free[p, i]`, seconds from now when the i-th GPU of pool p is free, rows kept sorted (the
    GPUs' ids and indices beside it); `first_free` the same before any queued job. With each
    pool's zone, PUE, gang power limit, and each zone's priced curve."""

    def __init__(self, snapshot: Snapshot, busy_until: dict[int, datetime | None]) -> None:
        now = snapshot.now
        self.by_node: dict[str, list[GpuSlot]] = defaultdict(list)
        pools: dict[tuple[str, str, float], list[GpuSlot]] = defaultdict(list)
        for gpu in snapshot.gpus:
            if not gpu.healthy or gpu.drained:
                continue
            self.by_node[gpu.node].append(gpu)
            pools[(gpu.node, gpu.model, float(gpu.memory_gib))].append(gpu)
        self.pools = pools
        keys = self.keys = sorted(pools)
        self.limit_of = {g.id: g.power_limit_w for g in snapshot.gpus}
        width = self.width = max((len(v) for v in pools.values()), default=1)
        self.free = np.full((len(keys), width), np.inf)
        self.ids = np.full((len(keys), width), -1, dtype=np.int64)
        self.index = np.zeros((len(keys), width), dtype=np.int64)
        for p, key in enumerate(keys):
            rows = []
            for g in pools[key]:
                bu = busy_until.get(g.id)
                rows.append((max(0.0, (bu - now).total_seconds()) if bu else 0.0, g.index, g.id))
            rows.sort()
            for i, (f, idx, gid) in enumerate(rows):
                self.free[p, i], self.index[p, i], self.ids[p, i] = f, idx, gid
        self.first_free = self.free.copy()
        self.size = np.array([len(pools[k]) for k in keys], dtype=np.int64)
        self.mem = np.array([k[2] for k in keys])
        self.models = [k[1] for k in keys]
        self.zone_of = {k: pools[k][0].zone for k in keys}
        curves = priced_curves(snapshot)  # blind zones priced by the one rule (policies.pricing.blind)
        self.integrators = {z: CurveIntegrator(c) for z, c in curves.items()}
        self.blind = {z for z, c in curves.items() if c.signal == "blind"}
        self.price = blind_price(snapshot) if self.blind else None
        self.kind_of = [(self.zone_of[key], key[1]) for key in keys]
        self.pue_of = [snapshot.gpu_pue(pools[key][0]) for key in keys]
        self.cap_of = [gang_power_limit_w(g.power_limit_w for g in pools[key]) for key in keys]
        # pools by (model, power limit): a job's runtime depends on these only (see `_pick`)
        shape_ix: dict[tuple[str, float | None], int] = {}
        pool_shape = np.array([shape_ix.setdefault(mc, len(shape_ix)) for mc in zip(self.models, self.cap_of)],
                              dtype=np.int64)
        self.shapes = _PoolShapes(pool_shape, list(shape_ix))

    def eligible(self, job: QueuedJob, book: ProfileBook, default_runtime_s: float) -> np.ndarray | str:
        """Which pools can take the job (GPUs, memory, operating point, time limit), or why
        none can."""
        k = max(1, job.gpus)
        models, keys = self.models, self.keys
        ok = (self.size >= k) & (self.mem >= job.gpu_mem_gib)
        if job.workload is not None or has_slo(job):  # operating point: memory and SLOs
            point_ok = {m: fits(job, m, 1e9, book) is None for m in set(models)}
            ok &= np.array([point_ok[m] for m in models], dtype=bool) if keys else ok
        if job.time_limit_s is not None and ok.any():
            limit_ok = {(m, c): within_time_limit(job, m, book, default_runtime_s, c)
                        for m, c in set(zip(models, self.cap_of))}
            ok &= np.array([limit_ok[m, c] for m, c in zip(models, self.cap_of)], dtype=bool)
            if not ok.any():
                return (f"runs longer than its time limit ({_human(job.time_limit_s)}) on every GPU "
                        "model that can take it")
        if not ok.any():
            return _why_unplaceable(job, self.by_node, book)
        return ok

    def first_gpus(self, p: int, k: int) -> tuple[int, ...]:
        """The ids of pool p's k first free GPUs, in GPU index order."""
        chosen = sorted(range(k), key=lambda i: self.index[p, i])
        return tuple(int(self.ids[p, i]) for i in chosen)

    def hold(self, p: int, k: int, until_s: float) -> None:
        """Pool p's k first free GPUs busy until `until_s` (seconds from now); rows re-sorted."""
        free, ids, index = self.free, self.ids, self.index
        free[p, :k] = until_s
        order = np.lexsort((index[p], free[p]))
        free[p], ids[p], index[p] = free[p, order], ids[p, order], index[p, order]


def _cannot_beat(unplaced: int, misses: int, beat: tuple[int, int]) -> bool:
    """Whether a plan with at least these unplaced jobs and misses ranks below `beat`'s
    (unplaced, misses), whatever its grams (`placement.Score` compares in that order)."""
    return unplaced > beat[0] or (unplaced >= beat[0] and misses > beat[1])


def _still_valid_keeps(snapshot: Snapshot, pinned: dict[int, Assignment]) -> dict[int, Assignment]:
    """The kept plans (`Snapshot.keep`) fifo can hold as they are: not yet started, on
    usable GPUs that are free by then. Like pinned jobs, their GPUs count as busy from now
    to their end (fifo schedules a GPU as a list: nothing goes in the gap before them)."""
    gpu = {g.id: g for g in snapshot.gpus}
    jobs = {j.id: j for j in snapshot.jobs}
    out: dict[int, Assignment] = {}
    for job_id, a in snapshot.keep.items():
        job = jobs.get(job_id)
        if job is None or job_id in pinned or a.start_at < snapshot.now or len(a.gpu_ids) != max(1, job.gpus):
            continue
        gs = [gpu.get(i) for i in a.gpu_ids]
        if all(g is not None and g.healthy and not g.drained and (g.busy_until is None or g.busy_until <= a.start_at)
               for g in gs):
            out[job_id] = a
    return out


def _if_now(job: QueuedJob, ok: np.ndarray, fleet: _Fleet, k: int, release_s: float, now: datetime,
            book: ProfileBook, snapshot: Snapshot) -> float | None:
    """The job's "if run now" counterfactual (`policies.pricing.counterfactual`): alone on the pools'
    first free GPUs (the queue ignored), the earliest, then the fastest, then the mean over the
    tied (zone, model) pairs."""
    first_free, width, models, kind_of = fleet.first_free, fleet.width, fleet.models, fleet.kind_of
    pue_of, cap_of, integrators = fleet.pue_of, fleet.cap_of, fleet.integrators
    alone = np.where(ok, np.maximum(first_free[:, k - 1] if width >= k else np.inf, release_s), np.inf)
    if not np.isfinite(alone).any():
        return None
    # only the equally early pools can be chosen, and one per (zone, model, site PUE, power
    # limit): the same grams (pools of one kind that differ in PUE or limit are averaged by `choose`)
    early = np.flatnonzero(alone <= alone.min() + START_TOL_S)
    first: dict[tuple[tuple[str, str], float, float | None], int] = {}
    for p in early[np.argsort(alone[early], kind="stable")].tolist():
        first.setdefault((kind_of[p], pue_of[p], cap_of[p]), p)
    cand = np.array(sorted(first.values()), dtype=np.int64)
    shapes = {(models[p], cap_of[p]): job_shape(job, models[p], book, snapshot.default_runtime_s, cap_of[p])
              for p in cand.tolist()}
    runtime = np.array([shapes[models[p], cap_of[p]].runtime_s for p in cand.tolist()])
    spread = multipliers(job)
    grams = np.array([float(_gco2(integrators[kind_of[p][0]], now + timedelta(seconds=float(alone[p])),
                                  shapes[models[p], cap_of[p]], pue_of[p], spread))
                      for p in cand.tolist()])
    cf = choose([kind_of[p] for p in cand.tolist()], alone[cand], runtime, grams)
    return None if cf is None else cf.gco2


def _gco2(integrator: "CurveIntegrator | None", start: datetime, shape: JobShape, pue: float,
          spread: np.ndarray | None = None) -> float | None:
    """The run's grams; with `spread` (length multipliers, `policies.model.length_spread`) the mean
    over them, as the slot planner prices the job."""
    if integrator is None:  # a zone of no GPU of the snapshot (every GPU zone has a priced curve)
        return None
    return expected(lambda run_s: shape.power_w * pue * integrator.integral(
        start, start + timedelta(seconds=run_s)) / J_PER_KWH, shape.runtime_s, spread)


def _why_unplaceable(job: QueuedJob, by_node: dict[str, list[GpuSlot]], book: ProfileBook) -> str:
    if not by_node:
        return "no healthy GPUs"
    most = max(sum(1 for g in gs if g.model == m) for gs in by_node.values() for m in {g.model for g in gs})
    if job.gpus > most:
        return f"needs {job.gpus} GPUs of one model on one node; the most any node has is {most}"
    models = {g.model for gs in by_node.values() for g in gs if g.memory_gib >= job.gpu_mem_gib}
    reasons = {fits(job, m, 1e9, book) for m in models}
    if models and reasons == {"slo"}:
        return f"no GPU model meets the latency SLOs of workload {job.workload!r} ({slo_text(job)})"
    if models and None not in reasons:
        return f"no GPU model holds workload {job.workload!r} on {job.gpus} GPU(s) within its SLOs ({slo_text(job)})"
    return f"no node has {job.gpus} healthy GPUs with >= {job.gpu_mem_gib:g} GiB each"


def _human(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
