"""Jobs shorter than a planning slot, packed on the GPUs' continuous timelines.

The slot-indexed model (`problem.py`) gives every job at least one whole slot (15 minutes) on
each of its GPUs. That is the right grain for carbon: intensity changes hourly. But a queue
of short jobs (tests, evaluations, small batches) would be spread one job per GPU per slot:
fifty 2-second jobs on four GPUs would take three hours. So greedy and cpsat plan only the
jobs that run for at least a slot on every GPU model that can take them; this module then
places the short ones, in deadline order, after the long jobs' plan:

- a short job's candidate starts are its release time, every slot boundary in the horizon,
  and every moment one of its GPUs comes free; at each, k GPUs of one model on one node
  must be free for the whole run (running jobs, pinned plans, the long jobs' plan and the
  short jobs placed before it all count);
- the cheapest candidate wins: gCO2 = power x PUE x intensity over the run (the carbon curve
  of the GPUs' zone), ties broken by the earlier start, so a carbon-blind queue simply runs
  back to back as soon as GPUs free up;
- deadline and maximum delay limit the candidates; a job that fits no candidate runs as soon
  as possible and is flagged (`deadline_miss`), like the slot planner's.

Site power caps (`Snapshot.power_caps`) are hard: a start is a candidate only if the zone's
running jobs (at the documented running-GPU power), the planned jobs and this job stay under
the cap over the whole run.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from policies.energy import ProfileBook, fits, generic_power_w, job_gco2, job_shape, seed_profiles
from policies.model import Assignment, Estimate, GpuSlot, Plan, QueuedJob, Snapshot



def book_of(snapshot: Snapshot) -> ProfileBook:
    return ProfileBook(snapshot.profiles) if snapshot.profiles else ProfileBook(seed_profiles())


def is_short(job: QueuedJob, snapshot: Snapshot, book: ProfileBook) -> bool:
    """Whether the job runs for less than one slot on every GPU model that could take it."""
    if job.id in snapshot.pinned:
        return False
    models = {g.model for g in snapshot.gpus if fits(job, g.model, g.memory_gib, book) is None}
    if not models:
        return False
    return all(job_shape(job, m, book, snapshot.default_runtime_s).runtime_s < snapshot.slot_s
               for m in models)


def plan_with_short_jobs(snapshot: Snapshot, plan_long: Callable[[Snapshot], Plan], policy: str) -> Plan:
    """`plan_long` for the jobs of a slot or more, then the short jobs packed around them."""
    book = book_of(snapshot)
    short = [j for j in snapshot.jobs if is_short(j, snapshot, book)]
    if not short:
        return plan_long(snapshot)
    short_ids = {j.id for j in short}
    long_plan = plan_long(replace(snapshot, jobs=tuple(j for j in snapshot.jobs if j.id not in short_ids)))
    packed, unplaced = pack(snapshot, long_plan, short, book, policy)
    return Plan(assignments=long_plan.assignments + tuple(packed),
                unplaced={**long_plan.unplaced, **unplaced})


class _Timeline:
    """Busy intervals of one GPU (epoch seconds), sorted by start, with the running maximum
    of their ends (intervals may overlap: a plan can start a job on a GPU whose running job
    is expected to end just before)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self._max_end: list[float] = []

    def free(self, t0: float, t1: float) -> bool:
        """No busy interval overlaps [t0, t1)."""
        i = bisect.bisect_left(self.starts, t1 - 1e-6)  # intervals starting before t1
        return i == 0 or self._max_end[i - 1] <= t0 + 1e-6

    def add(self, t0: float, t1: float) -> None:
        i = bisect.bisect_right(self.starts, t0)
        self.starts.insert(i, t0)
        self.ends.insert(i, t1)
        self._max_end[i:] = []
        m = self._max_end[-1] if self._max_end else -math.inf
        for e in self.ends[i:]:
            m = max(m, e)
            self._max_end.append(m)


def pack(snapshot: Snapshot, base: Plan, short: list[QueuedJob], book: ProfileBook,
         policy: str) -> tuple[list[Assignment], dict[int, str]]:
    """Place each short job at its cheapest feasible start around `base` (see module doc)."""
    now = snapshot.now
    t_now = now.timestamp()
    horizon_end = t_now + snapshot.horizon_s
    usable = [g for g in snapshot.gpus if g.healthy and not g.drained]
    by_id: dict[int, GpuSlot] = {g.id: g for g in snapshot.gpus}
    lines: dict[int, _Timeline] = {g.id: _Timeline() for g in usable}
    for g in usable:
        if g.busy_until is not None and g.busy_until > now:
            lines[g.id].add(t_now - 1.0, g.busy_until.timestamp())
    runtime_of = {j.id: j for j in snapshot.jobs}
    for a in (*snapshot.pinned.values(), *base.assignments):
        job = runtime_of.get(a.job_id)
        if a.estimate.runtime_s is not None:
            run_s = a.estimate.runtime_s
        elif job is not None and a.gpu_ids and a.gpu_ids[0] in by_id:
            run_s = job_shape(job, by_id[a.gpu_ids[0]].model, book, snapshot.default_runtime_s).runtime_s
        else:
            run_s = snapshot.default_runtime_s
        for gid in a.gpu_ids:
            if gid in lines:
                lines[gid].add(a.start_at.timestamp(), a.start_at.timestamp() + run_s)

    # power drawn per zone over time, for the caps: (start, end, watts)
    draws: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    capped = {c.zone for c in snapshot.power_caps}
    if capped:
        for g in snapshot.gpus:
            if g.zone in capped and g.busy_until is not None and g.busy_until > now:
                draws[g.zone].append((t_now, g.busy_until.timestamp(), generic_power_w(g.model)))
        for a in (*snapshot.pinned.values(), *base.assignments):
            g0 = by_id.get(a.gpu_ids[0]) if a.gpu_ids else None
            e = a.estimate
            if g0 is not None and g0.zone in capped and e.runtime_s and e.energy_j is not None:
                t0 = a.start_at.timestamp()
                draws[g0.zone].append((t0, t0 + e.runtime_s, e.energy_j / e.runtime_s))

    def under_cap(zone: str, t0: float, t1: float, watts: float) -> bool:
        for cap in snapshot.power_caps:
            if cap.zone != zone:
                continue
            lo = max(t0, cap.start.timestamp()) if cap.start else t0
            hi = min(t1, cap.end.timestamp()) if cap.end else t1
            if lo >= hi:
                continue
            points = {lo} | {s for s, _, _ in draws[zone] if lo < s < hi}
            for p in points:
                if sum(w for s, f, w in draws[zone] if s <= p < f) + watts > cap.cap_w + 1e-6:
                    return False
        return True

    groups: dict[tuple[str, str], list[GpuSlot]] = defaultdict(list)
    for g in usable:
        groups[(g.node, g.model)].append(g)
    slot_starts = [t_now + i * snapshot.slot_s for i in range(int(math.ceil(snapshot.horizon_s / snapshot.slot_s)))]

    def order(j: QueuedJob):
        return (j.deadline or datetime.max.replace(tzinfo=now.tzinfo), j.submitted_at, j.id)

    placed: list[Assignment] = []
    unplaced: dict[int, str] = {}
    for job in sorted(short, key=order):
        release = max(t_now, job.submitted_at.timestamp())
        latest = horizon_end
        if job.max_delay_s is not None:
            latest = min(latest, job.submitted_at.timestamp() + job.max_delay_s)
        best = None  # (cost or inf, start, key, gpus, shape)
        asap = None  # (start, cost, key, gpus, shape): the earliest start anywhere
        reasons = set()
        for key, members in groups.items():
            node, model = key
            why = fits(job, model, members[0].memory_gib, book)
            if why is not None:
                reasons.add(why)
                continue
            if len(members) < job.gpus:
                reasons.add("gpus")
                continue
            shape = job_shape(job, model, book, snapshot.default_runtime_s)
            zone = members[0].zone
            curve = snapshot.carbon.get(zone)
            pue = snapshot.pue.get(zone, 1.0)
            deadline_start = (job.deadline.timestamp() - shape.runtime_s) if job.deadline else horizon_end
            candidates = {release}
            candidates.update(s for s in slot_starts if s > release)
            for g in members:
                candidates.update(e for e in lines[g.id].ends if e > release)
            for t in sorted(candidates):
                if t > horizon_end:
                    break
                free = [g for g in members if lines[g.id].free(t, t + shape.runtime_s)]
                if len(free) < job.gpus:
                    continue
                if zone in capped and not under_cap(zone, t, t + shape.runtime_s, shape.power_w):
                    reasons.add(f"power cap of {zone}")
                    continue
                chosen = tuple(sorted(g.id for g in free[:job.gpus]))
                start = datetime.fromtimestamp(t, now.tzinfo)
                cost = job_gco2(curve, start, shape.runtime_s, shape.power_w, pue)
                if asap is None or t < asap[0]:
                    asap = (t, cost, key, chosen, shape)
                if t > latest + 1e-6 or t > deadline_start + 1e-6:
                    continue
                rank = (cost if cost is not None else math.inf, t)
                if best is None or rank < (best[0], best[1]):
                    best = (rank[0], t, key, chosen, shape, cost)
        if best is None and asap is None:
            unplaced[job.id] = ("no GPU model can take it (" + ", ".join(sorted(reasons)) + ")") if reasons \
                else "no healthy GPUs"
            continue
        miss = best is None
        if miss:
            t, cost, key, chosen, shape = asap
        else:
            _, t, key, chosen, shape, cost = best
        for gid in chosen:
            lines[gid].add(t, t + shape.runtime_s)
        if by_id[chosen[0]].zone in capped:
            draws[by_id[chosen[0]].zone].append((t, t + shape.runtime_s, shape.power_w))
        start = datetime.fromtimestamp(t, now.tzinfo)
        now_cost = asap[1] if asap else None
        g0 = by_id[chosen[0]]
        finish = start + timedelta(seconds=shape.runtime_s)
        deadline_miss = job.deadline is not None and finish > job.deadline
        binding = "deadline" if miss and job.deadline else ("max delay" if miss else None)
        when = "now" if t - t_now < 1 else f"at {start:%H:%M:%S}" if t - t_now < 86400 else f"at {start:%Y-%m-%d %H:%M}"
        cost_txt = "no forecast" if cost is None else f"{cost:.2g} g"
        alt_txt = "no forecast" if now_cost is None else f"{now_cost:.2g} g"
        why = f"{binding} cannot be met: as soon as possible" if miss else "short job packed between longer ones"
        placed.append(Assignment(
            job_id=job.id, node=key[0], gpu_ids=chosen, start_at=start,
            estimate=Estimate(finish_at=finish, energy_j=shape.energy_j, gco2=cost, gco2_if_now=now_cost,
                              runtime_s=shape.runtime_s, prompts=job.prompts, binding=binding,
                              deadline_miss=deadline_miss),
            explanation=(f"{policy}: {len(chosen)}x{g0.model} in {g0.zone} {when}: {cost_txt} vs {alt_txt} "
                         f"at the earliest ({why})")))
    return placed, unplaced
