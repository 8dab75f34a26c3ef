"""From picks (job, pool, start slot) to Assignments: GPU ids, estimates, explanations; and
the yardsticks every policy is compared with (`plan_score`, `plan_violations`).

Shared by greedy, cpsat and oracle so their plans read and compare alike.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import NamedTuple

import numpy as np

from policies.pricing.counterfactual import Counterfactual, choose
from policies.pricing.deferral import Deferral
from policies.model.energy import curve_integral_g_per_kwh_s, fits, gang_power_limit_w, job_shape, within_time_limit
from policies.problem.held_starts import HELD, is_held
from policies.pricing.lateness import STRICT_LATENESS_G_PER_GPU_H, price_text
from policies.model.length_spread import multipliers
from policies.types import Assignment, Estimate, Plan, QueuedJob, budget_of, budget_text, grams, sig
from policies.pricing.power_cap import at_limit, default_limit_w, limit_text
from policies.problem.instance import Problem
from policies.problem.segments import exact_segments_s, held_ranges, idle_power_w, segment_cost, work_s

log = logging.getLogger(__name__)

_EPS = 1e-9


class Pick(NamedTuple):
    """Job index j (into problem.jobs) starts on `pool` at `slot`."""

    j: int
    pool: int
    slot: int
    deadline_miss: bool = False
    # an interruptible job's segments as slot ranges [start, end), the first at `slot`
    # (policies.problem.segments); empty: one piece
    segments: tuple[tuple[int, int], ...] = ()


def assign_gpu_ids(problem: Problem, picks: Iterable[Pick]) -> dict[int, tuple[int, ...]]:
    """Concrete GPUs for each pick (by job index), by a sweep in start order per pool that
    also gives GPUs to the kept plans (`Problem.kept`, see `gpu_ids_with_kept`).

    Per-slot counts within capacity guarantee that the sweep never runs short (intervals on
    identical machines); a shortfall means the picks overload a pool, a bug: ValueError.
    """
    return gpu_ids_with_kept(problem, picks)[0]


def gpu_ids_with_kept(problem: Problem, picks: Iterable[Pick]) -> tuple[dict[int, tuple[int, ...]],
                                                                        dict[int, tuple[int, ...]]]:
    """`assign_gpu_ids`, plus the GPUs of each kept plan (by job id)."""
    by_pool: dict[int, list[tuple[int, int, int, int, int]]] = defaultdict(list)  # slot, kind, key, k, dur
    for p in picks:
        group = problem.pools[p.pool].group
        # a segmented pick is given GPUs for its first segment (a checkpoint job may move at its
        # resume) or, paused in place, for its whole span (policies.problem.segments)
        dur = int(problem.job_duration[p.j, group]) if not p.segments else \
            held_ranges(p.segments, problem.jobs[p.j].interruptible == "pause")[0][1] - p.slot
        by_pool[p.pool].append((p.slot, 1, p.j, int(problem.job_k[p.j]), dur))
    for kp in problem.kept:
        by_pool[kp.pool].append((kp.slot, 0, kp.assignment.job_id, kp.k, kp.duration))
    out: dict[int, tuple[int, ...]] = {}
    kept: dict[int, tuple[int, ...]] = {}
    for pool_i, items in by_pool.items():
        pool = problem.pools[pool_i]
        free = list(pool.free_slot)  # slot each GPU is next free
        gpu_ids = pool.gpu_ids
        items.sort()
        for slot, kind, key, k, dur in items:
            # best fit: the GPUs freed last (then the lowest index)
            if k == 1:  # most jobs: one pass, no sort
                best, best_free = -1, -1
                for i, f in enumerate(free):
                    if best_free < f <= slot:
                        best, best_free = i, f
                chosen = [best] if best >= 0 else []
            else:
                chosen = sorted(i for _, i in sorted((-f, i) for i, f in enumerate(free) if f <= slot)[:k])
            if len(chosen) < k:
                raise ValueError(f"pool {pool.node}/{pool.model} overloaded at slot {slot}")
            for i in chosen:
                free[i] = slot + dur
            (out if kind else kept)[key] = tuple(gpu_ids[i] for i in chosen)
    return out, kept


def if_now(problem: Problem, j: int, table: np.ndarray) -> Counterfactual | None:
    """Job j's "if run now" counterfactual (`policies.pricing.counterfactual`: alone, on the earliest
    free fitting GPUs, the fastest of them, the mean over tied (zone, model) pairs), with its
    start as a slot; None when no fitting GPUs are free within the horizon. `table`: the
    job's `cost_table` (rows in `job_options(j).groups` order)."""
    jo = problem.job_options(j)
    if jo.groups.size == 0:
        return None
    k = max(1, problem.jobs[j].gpus)
    width = problem.group_kth_free_slot.shape[1]
    slots = np.maximum(jo.earliest, problem.group_kth_free_slot[jo.groups, min(k, width) - 1]).astype(float)
    slots[slots >= problem.n_slots] = np.inf
    if not np.isfinite(slots).any():
        return None
    at = np.where(np.isfinite(slots), slots, 0).astype(np.int64)
    grams = table[np.arange(jo.groups.size), at]
    kinds = [(problem.groups[int(g)].zone, problem.groups[int(g)].model) for g in jo.groups.tolist()]
    return choose(kinds, slots, problem.job_runtime_s[j, jo.groups], grams, start_tol=0.5)


class Notes(NamedTuple):
    """What an explanation needs from the job's cost table (taken while it is at hand)."""

    gco2: float
    now: Counterfactual | None  # the "if run now" counterfactual, start in slots (None: no free GPUs)
    binding: str | None


def notes_for(problem: Problem, pick: Pick, table: np.ndarray | None = None) -> Notes:
    """Compute a pick's Notes (table: the job's `cost_table`, recomputed when None)."""
    if table is None:
        table = problem.cost_table(pick.j)
    jo = problem.job_options(pick.j)
    pool = problem.pools[pick.pool]
    gco2 = float(table[_row(jo, pool.group), pick.slot])
    return Notes(gco2, if_now(problem, pick.j, table), _binding(problem, pick.j, pick, gco2, table))


def _row(jo, group: int) -> int:
    return int(np.searchsorted(jo.groups, group))


def build_assignment(problem: Problem, pick: Pick, gpu_ids: tuple[int, ...], policy: str,
                     notes: Notes | None = None) -> Assignment:
    """The Assignment of one pick, with its estimate and a one-line explanation."""
    j = pick.j
    job = problem.jobs[j]
    if notes is None:
        notes = notes_for(problem, pick)
    pool = problem.pools[pick.pool]
    runtime_s = float(problem.job_runtime_s[j, pool.group])
    energy_j = float(problem.job_power_w[j, pool.group]) * runtime_s
    start = problem.slot_time(pick.slot)
    gco2_model, now, binding = notes
    blind = pool.zone in problem.blind_zones
    finish = start + timedelta(seconds=runtime_s)
    segments: tuple[tuple[datetime, datetime], ...] = ()
    pause_note = ""
    if pick.segments:  # issue 30: the job runs in segments (policies.problem.segments)
        pause = job.interruptible == "pause"
        segs_s = exact_segments_s(pick.segments, work_s(problem, j, pool.group), job.resume_cost_s or 0.0,
                                  bool(problem.job_resumed[j]), problem.slot_s)
        runtime_s, energy_j, gco2_model = segment_cost(problem, j, pool.group, segs_s, pause)
        segments = tuple((problem.now + timedelta(seconds=a), problem.now + timedelta(seconds=b)) for a, b in segs_s)
        finish = segments[-1][1]
        pause_note = "; " + pause_text(problem, pool.zone, segments, pause)
    # a pick outside its window (pick.deadline_miss) ran as soon as possible; the estimate
    # flags a miss only when it really finishes after the deadline
    miss = job.deadline is not None and finish > job.deadline
    if pick.deadline_miss and not miss:
        binding = "max delay" if job.max_delay_s is not None else "capacity"
    now_cost = job.gco2_if_now if job.gco2_if_now is not None else (None if now is None else now.gco2)
    price = problem.blind_price
    estimate = Estimate(
        finish_at=finish,
        energy_j=energy_j,
        gco2=gco2_model,
        gco2_if_now=now_cost,
        runtime_s=runtime_s,
        prompts=job.prompts,
        binding=binding,
        deadline_miss=miss,
        blind_g_per_kwh=price.g_per_kwh if blind and price is not None else None,
        time_limit_s=job.derived_time_limit_s(runtime_s),
    )
    cap_note = ""
    cap_w = float(problem.job_cap_w[j, pool.group])
    if not pick.segments and math.isfinite(cap_w):  # a power limit chosen with the placement (joint_caps)
        estimate, cap_note = _at_limit(problem, j, pool, start, estimate, cap_w)
    when = _when(problem.now, start)
    cost = grams(gco2_model)
    if job.prompts:
        cost += f" ({sig(gco2_model / job.prompts)} g/prompt)"
    if blind and price is not None:
        cost += f" {price.note()}"
    if job.gco2_if_now is not None:
        alt = f"{grams(job.gco2_if_now)} if run at submission"
    elif now is not None:
        now_blind = any(z in problem.blind_zones for z, _ in now.kinds)
        alt_cost = grams(now.gco2) + (" priced blind" if now_blind else "")
        at = "now" if now.start < 0.5 else _when(problem.now, problem.slot_time(int(now.start))).replace("at ", "")
        alt = f"{alt_cost} {at} on {now.where()}"
    else:
        alt = "no free GPU within the horizon"
    if pick.deadline_miss and not problem.strict:
        late = late_gpu_h(job, finish)
        why = (f"{sig(late)} GPU-h late: at {price_text(problem.lateness_g_per_gpu_h)} cheaper than on time"
               if late > 0 else "past its deadline margin: cheaper than on time")
    elif pick.deadline_miss:
        why = f"{binding} cannot be met: as soon as possible"
    elif binding in ("deadline", "capacity", "power cap", HELD) and job.deadline is not None:
        # what being on time cost: the chosen grams over the cheapest start from release on
        # (any GPU that fits, the queue and the deadline ignored)
        cheapest = problem.cheapest_start_g(j)
        cheapest = gco2_model if cheapest is None else cheapest
        extra = gco2_model - cheapest
        why = f"{binding} binds; on time for +{grams(extra)} over its cheapest start" if extra >= 0.5 \
            else f"{binding} binds"
    else:
        why = f"{binding} binds" if binding else "cheapest forecast slot"
    tail_h = problem.tail_s(pool.zone, start, runtime_s) / 3600.0
    if tail_h >= 0.05:  # a long run: priced past the forecast by the zone's typical values
        why += f"; {sig(tail_h)} h of the run past the forecast priced at {pool.zone}'s typical values"
    explanation = f"{policy}: {len(gpu_ids)}x{pool.model} in {pool.zone} {when}: {cost} vs {alt} ({why}{pause_note})" \
        + cap_note
    return Assignment(job_id=job.id, node=pool.node, gpu_ids=gpu_ids, start_at=start,
                      estimate=estimate, explanation=explanation, segments=segments)


def _at_limit(problem: Problem, j: int, pool, start: datetime, estimate: Estimate,
              cap_w: float) -> tuple[Estimate, str]:
    """The estimate of job j planned at the power limit `cap_w` (`policies.problem.joint_caps`), with
    the same placement at the default limit beside it, and the explanation's note, in the
    words of `power_cap.choose_caps` (which may revise it after placement)."""
    from policies.model.catalog import lookup

    runtime_u = float(problem.job_uncapped_runtime_s[j, pool.group])
    power_u = float(problem.job_uncapped_power_w[j, pool.group])
    energy_u = runtime_u * power_u
    gco2_u = problem.gco2_at(pool.zone, start, runtime_u, power_u, pool.pue, problem._spread.get(j))
    est = replace(estimate, power_limit_w=round(cap_w, 1), uncapped_runtime_s=runtime_u,
                  uncapped_energy_j=energy_u, uncapped_gco2=gco2_u)
    default_w = default_limit_w(lookup(pool.model).tdp_w, pool.power_limit_w)
    energy, runtime = estimate.energy_j or 0.0, estimate.runtime_s or 0.0
    note = "; " + limit_text(cap_w, default_w, estimate.gco2, gco2_u, energy / energy_u,
                             runtime / runtime_u) + ", chosen with the placement"
    return est, note


def pause_text(problem: Problem, zone: str, segments: tuple[tuple[datetime, datetime], ...], pause: bool) -> str:
    """Why a job runs in segments, for its explanation: its longest break and the forecast
    intensity then vs in the segment after it ("in 2 segments, paused 14:00-19:00: 410 g/kWh
    vs 120 after")."""
    gaps = [(b, a2, (a2, b2)) for (_, b), (a2, b2) in zip(segments, segments[1:])]
    b, a2, after = max(gaps, key=lambda x: x[1] - x[0])
    curve = problem.curves[zone]
    during = curve_integral_g_per_kwh_s(curve, b, a2) / max(1.0, (a2 - b).total_seconds())
    then = curve_integral_g_per_kwh_s(curve, *after) / max(1.0, (after[1] - after[0]).total_seconds())
    held = "GPUs held idle" if pause else "GPUs freed, checkpointed"
    return (f"in {len(segments)} segments, paused {b:%H:%M}-{a2:%H:%M} ({held}): "
            f"{during:.0f} g/kWh vs {then:.0f} after")


def _when(now: datetime, start: datetime) -> str:
    if (start - now).total_seconds() < 1:
        return "now"
    days = (start.date() - now.date()).days
    return f"at {start:%H:%M}" + (f" (+{days}d)" if days else "")


def _binding(problem: Problem, j: int, pick: Pick, chosen: float, table: np.ndarray) -> str | None:
    """The constraint that kept the job from a cheaper start (or None: it got the cheapest)."""
    if pick.deadline_miss:
        return "deadline"
    jo = problem.job_options(j)
    lo, S = jo.earliest, problem.n_slots
    if lo >= S:
        return None
    slots = np.arange(S)
    his = jo.latest[jo.first]
    in_window = np.where((slots[None, :] >= lo) & (slots[None, :] <= his[:, None]), table, np.inf)
    per_row = in_window.min(axis=1)
    best_row = int(np.argmin(per_row))
    best_window = float(per_row[best_row])
    best_horizon = float(table[:, lo:].min())
    why = window_binding(problem, j, chosen, best_window, int(jo.groups[best_row]), best_horizon)
    if why is not None:
        return why
    if "slo" in jo.excluded.values():
        return "slo"
    return None


def window_binding(problem: Problem, j: int, chosen: float, best_window: float, best_group: int,
                   best_horizon: float) -> str | None:
    """What kept job `j` from a cheaper start, by the grams of its pick (`chosen`), of the
    cheapest start in its window (`best_window`, on group `best_group`) and of the cheapest
    anywhere in the horizon: a budget or capacity in its window, else what closes the window
    (held, deadline, max delay, horizon). None: neither. The rule of greedy's vectorised
    notes and of `_binding` here."""
    tol = 1e-6 * max(1.0, abs(chosen))
    if chosen > best_window + tol:
        budget = problem.groups[best_group].budget
        return "power cap" if budget in problem.capped_budgets else "capacity"
    if best_window > best_horizon + tol:
        if is_held(problem, j):
            return HELD
        job = problem.jobs[j]
        if job.deadline is not None:
            return "deadline"
        if job.max_delay_s is not None:
            return "max delay"
        return "horizon"
    return None


def picks_to_plan(problem: Problem, picks: list[Pick], unplaced: dict[int, str], policy: str,
                  notes: dict[int, Notes] | None = None) -> Plan:
    """Assignments for the picks plus the pinned jobs as they are and the kept plans (their
    node and start as they are, GPUs on that node given by the sweep).

    `notes` (by job index) saves recomputing each job's cost table; missing ones are computed.
    """
    ids, kept_ids = gpu_ids_with_kept(problem, picks)
    notes = notes or {}
    assignments = list(problem.pinned)
    for kp in problem.kept:
        a, ids_now = kp.assignment, kept_ids[kp.assignment.job_id]
        assignments.append(a if a.gpu_ids == ids_now else replace(a, gpu_ids=ids_now))
    for p in sorted(picks, key=lambda p: p.j):
        n = notes.get(p.j)
        if n is None or n.gco2 != n.gco2:  # missing or stale (nan)
            n = None
        assignments.append(build_assignment(problem, p, ids[p.j], policy, n))
    return Plan(assignments=tuple(assignments), unplaced=dict(unplaced))


class Score(NamedTuple):
    """A plan's quality: fewer unplaced jobs first; then, strict (`price` inf), fewer deadline
    misses, then fewer grams (the model's own estimate, blind zones included); with a price of
    lateness (grams per GPU-hour late, `policies.pricing.lateness`), fewer grams + price x GPU-hours
    late."""

    unplaced: int
    deadline_misses: int
    gco2: float
    late_gpu_h: float = 0.0
    price: float = math.inf

    @property
    def objective_g(self) -> float:
        """Grams plus the priced lateness (strict: at the tie-break price)."""
        price = self.price if math.isfinite(self.price) else STRICT_LATENESS_G_PER_GPU_H
        return self.gco2 + price * self.late_gpu_h

    def better_than(self, other: "Score") -> bool:
        if math.isfinite(self.price):
            first, second = self.unplaced, other.unplaced
        else:
            first, second = (self.unplaced, self.deadline_misses), (other.unplaced, other.deadline_misses)
        if first != second:
            return first < second
        a, b = self.objective_g, other.objective_g
        return a < b - 1e-6 * max(1.0, abs(b))


def late_gpu_h(job: QueuedJob, finish: datetime | None) -> float:
    """GPU-hours a job finishing at `finish` is late by (k GPUs x hours past its deadline)."""
    if job.deadline is None or finish is None or finish <= job.deadline:
        return 0.0
    return max(1, job.gpus) * (finish - job.deadline).total_seconds() / 3600.0


def plan_score(problem: Problem, plan: Plan) -> Score:
    """Score any plan (slot-aligned or not) with the problem's own carbon model."""
    gpu = {g.id: g for g in problem.snapshot.gpus}
    jobs = {j.id: j for j in problem.jobs}
    total, misses, late = 0.0, 0, 0.0
    for a in plan.assignments:
        if a.job_id not in jobs or not a.gpu_ids:  # pinned and kept jobs are not problem jobs
            continue
        job = jobs[a.job_id]
        g = gpu[a.gpu_ids[0]]
        shape = job_shape(job, g.model, problem.book, problem.snapshot.default_runtime_s, g.power_limit_w)
        shape = _planned(shape, a)
        if a.segments:  # issue 30: each segment at the job's power, a pause job's gaps at idle power
            total += sum(problem.gco2_at(g.zone, s0, (s1 - s0).total_seconds(), shape.power_w,
                                         problem.snapshot.gpu_pue(g)) for s0, s1 in a.segments)
            if job.interruptible == "pause":
                idle_w = idle_power_w(g.model, len(a.gpu_ids))
                total += sum(problem.gco2_at(g.zone, e0, (s1 - e0).total_seconds(), idle_w, problem.snapshot.gpu_pue(g))
                             for (_, e0), (s1, _) in zip(a.segments, a.segments[1:]))
            finish = a.segments[-1][1]
        else:
            total += problem.gco2_at(g.zone, a.start_at, shape.runtime_s, shape.power_w,
                                     problem.snapshot.gpu_pue(g), multipliers(job))
            finish = a.start_at + timedelta(seconds=shape.runtime_s)
        if job.deadline is not None and finish > job.deadline:
            misses += 1
            late += late_gpu_h(job, finish)
    return _with_deferred(problem, plan, misses, total, late)


def _with_deferred(problem: Problem, plan: Plan, misses: int, total: float, late: float) -> Score:
    """The Score of a plan whose placed jobs gave `misses`, `total` grams and `late` GPU-hours:
    a job left to wait past the horizon (`Deferral`) counts as the miss it is, not as
    unplaced."""
    placed = {a.job_id for a in plan.assignments}
    waiting, waiting_late = deferred_misses(plan.unplaced, problem.jobs)
    unplaced = sum(1 for j in problem.jobs if j.id not in placed) - waiting
    return Score(unplaced, misses + waiting, total, late + waiting_late, problem.lateness_g_per_gpu_h)


def deferred_misses(unplaced: Mapping[int, str], jobs: Iterable[QueuedJob]) -> tuple[int, float]:
    """How many of a plan's unplaced jobs (of `jobs`) wait for GPUs past the horizon
    (`Deferral`), and the GPU-hours late they are expected to finish by."""
    waiting = {job_id: why for job_id, why in unplaced.items() if isinstance(why, Deferral)}
    if not waiting:  # the usual case: no lookup of the jobs at all
        return 0, 0.0
    n, late = 0, 0.0
    for job in jobs:
        why = waiting.get(job.id)
        if why is not None:
            n += 1
            late += late_gpu_h(job, why.finish_at)
    return n, late


def estimate_score(problem: Problem, plan: Plan) -> Score:
    """`plan_score` from the plan's own estimates when every one of them has a gCO2 figure
    (fifo, greedy and cpsat estimate with the same energy model, so the sums agree), else
    `plan_score`. Saves re-integrating thousands of assignments on every tick."""
    jobs = problem.job_index
    total, misses, late = 0.0, 0, 0.0
    for a in plan.assignments:
        if a.job_id not in jobs or not a.gpu_ids:  # pinned and kept jobs are not problem jobs
            continue
        e = a.estimate
        if e.gco2 is None or e.finish_at is None:
            return plan_score(problem, plan)
        total += e.gco2
        job = problem.jobs[jobs[a.job_id]]
        if job.deadline is not None and e.finish_at > job.deadline:
            misses += 1
            late += late_gpu_h(job, e.finish_at)
    return _with_deferred(problem, plan, misses, total, late)


def plan_violations(problem: Problem, plan: Plan) -> list[str]:
    """Hard constraints a plan breaks (memory, SLO, explicit time limit, gang, usable GPUs,
    overlaps, release, max delay, power caps, room on its node for a checkpoint job's later
    segments). Deadlines are soft (flagged), so they are not listed."""
    snap = problem.snapshot
    gpu = {g.id: g for g in snap.gpus}
    jobs = {j.id: j for j in snap.jobs}
    out: list[str] = []
    busy: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    for g in snap.gpus:
        if g.busy_until is not None and g.busy_until > snap.now:
            busy[g.id].append((snap.now - timedelta(days=3650), g.busy_until))
    power: list[tuple[str, datetime, datetime, float]] = []
    later: dict[tuple[str, str], list[tuple[datetime, datetime, int]]] = defaultdict(list)
    for a in plan.assignments:
        job = jobs.get(a.job_id)
        if job is None:
            out.append(f"job {a.job_id}: not in the snapshot")
            continue
        gs = [gpu.get(i) for i in a.gpu_ids]
        if any(g is None for g in gs) or len(gs) != job.gpus or len(set(a.gpu_ids)) != len(gs):
            out.append(f"job {job.id}: needs {job.gpus} distinct known GPUs, got {a.gpu_ids}")
            continue
        if len({(g.node, g.model) for g in gs}) != 1:
            out.append(f"job {job.id}: GPUs span nodes or models")
        if any(not g.healthy or g.drained for g in gs) and not job.pinned:
            out.append(f"job {job.id}: on an unhealthy or drained GPU")
        g0 = gs[0]
        why = fits(job, g0.model, min(g.memory_gib for g in gs), problem.book)
        if why is not None:
            out.append(f"job {job.id}: {why} does not fit {g0.model}")
        if not within_time_limit(job, g0.model, problem.book, snap.default_runtime_s,
                                 gang_power_limit_w(g.power_limit_w for g in gs)):
            out.append(f"job {job.id}: runs longer than its time limit on {g0.model}")
        release = max(snap.now, job.submitted_at)
        if a.start_at < release - timedelta(seconds=1):
            out.append(f"job {job.id}: starts before its release")
        if job.max_delay_s is not None and not a.estimate.deadline_miss and a.estimate.binding != "max delay" and \
                not (job.done_fraction > 0 or job.resume_count > 0) and \
                a.start_at > job.submitted_at + timedelta(seconds=job.max_delay_s + 1):
            out.append(f"job {job.id}: starts after its maximum delay")
        shape = _planned(job_shape(job, g0.model, problem.book, snap.default_runtime_s,
                                   gang_power_limit_w(g.power_limit_w for g in gs)), a)
        end = a.start_at + timedelta(seconds=shape.runtime_s)
        if a.segments:
            # a pause job holds its GPUs from its first start to its last end; a checkpoint job
            # holds the listed GPUs for its first segment (it may resume on others)
            end = a.segments[-1][1] if job.interruptible == "pause" else a.segments[0][1]
            if job.interruptible != "pause":
                later[(g0.node, g0.model)].extend((s0, s1, len(gs)) for s0, s1 in a.segments[1:])
        for g in gs:
            busy[g.id].append((a.start_at, end))
        for s0, s1 in (a.segments or ((a.start_at, a.start_at + timedelta(seconds=shape.runtime_s)),)):
            power.append((budget_of(g0), s0, s1, shape.power_w))
    for gid, spans in busy.items():
        spans.sort()
        for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
            if s2 < e1 - timedelta(seconds=1):
                out.append(f"GPU {gid}: two jobs overlap at {s2.isoformat()}")
    # a checkpoint job's later segments hold GPUs of its node and model, not given ones (it may
    # resume on others): at each one's start, the node's free GPUs must hold those running then
    for (node, model), segs in later.items():
        ids = [g.id for g in snap.gpus if g.node == node and g.model == model and g.healthy and not g.drained]
        for t0, _, _ in sorted(segs):
            probe = t0 + timedelta(seconds=1)
            free = sum(1 for gid in ids if not any(s <= probe < e for s, e in busy.get(gid, ())))
            need = sum(k for s, e, k in segs if s <= probe < e)
            if need > free:
                out.append(f"node {node}: {need} {model} GPUs for later segments at {t0.isoformat()}, {free} free")
                break
    for cap in snap.power_caps:
        # from now on (the past is not the plan's), and only where the plan itself draws power:
        # running jobs alone above a cap are not a plan's violation
        lo = max(cap.start, snap.now) if cap.start else snap.now
        hi = cap.end or snap.now + timedelta(days=3650)
        events = sorted({t for z, s, e, _ in power if z == cap.zone for t in (s, e)} | {lo})
        for t in events:
            if not lo <= t < hi:
                continue
            used = sum(w for z, s, e, w in power if z == cap.zone and s <= t < e)
            if used <= 0.0:
                continue
            used += sum(_running_w(g) for g in snap.gpus
                        if budget_of(g) == cap.zone and g.busy_until is not None and g.busy_until > t)
            if used > cap.cap_w + 1e-6:
                out.append(f"{budget_text(cap.zone)}: {used:.0f} W > cap {cap.cap_w:.0f} W at {t.isoformat()}")
                break
    return out


def _planned(shape, a: Assignment):
    """The shape at the power limit the plan chose for it (`Estimate.power_limit_w`), if any."""
    if a.estimate.power_limit_w is None:
        return shape
    runtime_s, power_w = at_limit(shape.runtime_s, shape.power_w, shape.gpus, a.estimate.power_limit_w, shape.model)
    return replace(shape, runtime_s=runtime_s, power_w=power_w, energy_j=runtime_s * power_w)


def _running_w(g) -> float:
    """What a running GPU is taken to draw: its model's generic power, never above its limit."""
    from policies.model.energy import generic_power_w

    w = generic_power_w(g.model)
    return min(w, g.power_limit_w) if g.power_limit_w else w
