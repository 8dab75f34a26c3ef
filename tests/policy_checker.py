"""An independent feasibility checker for plans, written from the constraints in the issue
(not from the policies' code), shared by the policy tests."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from policies.model.catalog import catalog
from policies.types import Plan, Snapshot

# A GPU busy with a running job draws idle + 80% of (TDP - idle) until it frees (the
# documented rule for running jobs under a site power cap).
def running_w(model: str) -> float:
    m = catalog()[model]
    return m.idle_w + 0.8 * (m.tdp_w - m.idle_w)


def violations(snapshot: Snapshot, plan: Plan) -> list[str]:
    gpus = {g.id: g for g in snapshot.gpus}
    jobs = {j.id: j for j in snapshot.jobs}
    p95 = {(p.workload, p.model): p.latency_p95_ms for p in snapshot.profiles}
    out: list[str] = []
    placed = [a.job_id for a in plan.assignments]
    if len(placed) != len(set(placed)):
        out.append("a job is assigned twice")
    if set(placed) & set(plan.unplaced):
        out.append("a job is both placed and unplaced")
    if set(placed) | set(plan.unplaced) != set(jobs):
        out.append("a job is neither placed nor reported")
    spans: dict[int, list[tuple]] = defaultdict(list)
    draws: list[tuple[str, object, object, float]] = []
    for a in plan.assignments:
        j = jobs[a.job_id]
        gs = [gpus[i] for i in a.gpu_ids]
        e = a.estimate
        if len(set(a.gpu_ids)) != j.gpus:
            out.append(f"job {j.id}: {len(set(a.gpu_ids))} GPUs, wants {j.gpus}")
        if len({g.node for g in gs}) != 1 or {g.node for g in gs} != {a.node}:
            out.append(f"job {j.id}: not on one node")
        if len({g.model for g in gs}) != 1:
            out.append(f"job {j.id}: mixes models")
        if any(not g.healthy or g.drained for g in gs):
            out.append(f"job {j.id}: unhealthy or drained GPU")
        if any(g.memory_gib < j.gpu_mem_gib for g in gs):
            out.append(f"job {j.id}: too little memory")
        if j.latency_slo_ms is not None and gs:
            fastest = _fastest_latency_ms(j.workload, gs[0].model, j.gpus)
            lat = fastest if fastest is not None else p95.get((j.workload, gs[0].model))
            if lat is None or lat != lat:
                out.append(f"job {j.id}: an SLO, and no latency model for {j.workload!r} on {gs[0].model}")
            elif lat > j.latency_slo_ms:
                out.append(f"job {j.id}: {gs[0].model} p95 {lat} ms > SLO {j.latency_slo_ms}")
        if a.start_at < max(snapshot.now, j.submitted_at):
            out.append(f"job {j.id}: starts before release")
        if any(g.busy_until is not None and a.start_at < g.busy_until for g in gs):
            out.append(f"job {j.id}: starts on a busy GPU")
        # a job that cannot start in time (its maximum delay has passed, or its deadline
        # cannot be met) runs as soon as possible and says so
        if j.max_delay_s is not None and not e.deadline_miss and e.binding != "max delay" and \
                a.start_at > j.submitted_at + timedelta(seconds=j.max_delay_s):
            out.append(f"job {j.id}: exceeds its maximum delay")
        if e.runtime_s is None or e.finish_at is None or e.energy_j is None:
            out.append(f"job {j.id}: incomplete estimate")
            continue
        finish = a.start_at + timedelta(seconds=e.runtime_s)
        if j.deadline is not None and finish > j.deadline + timedelta(seconds=1) and not e.deadline_miss:
            out.append(f"job {j.id}: misses its deadline without the flag")
        for g in gs:
            spans[g.id].append((a.start_at, finish, j.id))
        if gs:
            draws.append((gs[0].zone, a.start_at, finish, e.energy_j / e.runtime_s))
    for gid, ss in spans.items():
        ss.sort()
        for (s1, e1, j1), (s2, e2, j2) in zip(ss, ss[1:]):
            if s2 < e1 - timedelta(seconds=1):
                out.append(f"GPU {gid}: jobs {j1} and {j2} overlap")
    planned = list(draws)
    for g in snapshot.gpus:
        if g.busy_until is not None and g.busy_until > snapshot.now:
            draws.append((g.zone, snapshot.now, g.busy_until, running_w(g.model)))
    for cap in snapshot.power_caps:
        for zone, t, _, _ in planned:  # a plan must not add a job where the cap has no room
            if zone != cap.zone or (cap.start and t < cap.start) or (cap.end and t >= cap.end):
                continue
            # the same second of tolerance as for GPU overlaps: a job starting where another
            # ends (float seconds vs datetimes) may differ from its end by a microsecond
            used = sum(w for z, s, f, w in draws if z == zone and s <= t < f - timedelta(seconds=1))
            if used > cap.cap_w + 1e-6:
                out.append(f"zone {zone}: {used:.0f} W over the {cap.cap_w:.0f} W cap at {t}")
    return out


def strict_score(snapshot: Snapshot, plan: Plan) -> tuple[int, int, float, float]:
    """(unplaced, deadline misses, GPU-hours late, total estimated gCO2): the policies' strict
    order (issue 24: a job that must miss finishes as soon as it can), smaller is better."""
    jobs = {j.id: j for j in snapshot.jobs}
    late_gpu_h = 0.0
    for a in plan.assignments:
        job = jobs.get(a.job_id)
        if job is None or job.deadline is None or a.estimate.runtime_s is None:
            continue
        finish = a.start_at + timedelta(seconds=a.estimate.runtime_s)
        late_gpu_h += max(1, job.gpus) * max(0.0, (finish - job.deadline).total_seconds()) / 3600.0
    unplaced, misses, grams = score(plan)
    return unplaced, misses, late_gpu_h, grams


def score(plan: Plan) -> tuple[int, int, float]:
    """(unplaced, deadline misses, total estimated gCO2): smaller is better, in that order."""
    return (len(plan.unplaced), sum(a.estimate.deadline_miss for a in plan.assignments),
            sum(a.estimate.gco2 or 0.0 for a in plan.assignments))


def _fastest_latency_ms(workload: str | None, model: str, k: int) -> float | None:
    """For a performance-model workload: the lowest per-prompt p95 latency of any point of it
    that fits on k GPUs of `model` (a TP degree dividing k); None for other workloads."""
    from policies.model.perf_model import frontier, parts, presets

    w = presets().get(workload or "")
    if w is None or w.kind != "inference" or model not in parts() or not parts()[model].supports(w.precision):
        return None
    tps = [t for t in (1, 2, 4, 8) if t <= k and k % t == 0]
    lat = [p.latency_p95_ms for p in frontier(w, model, max_tp=max(tps)) if p.point.tp in tps]
    return min(lat) if lat else float("inf")


def priority_violations(snapshot: Snapshot, plan: Plan, tol_s: float | None = None) -> list[str]:
    """The backfill rule, checked on the plan alone: no job's placement delays the planned
    start of a job of higher priority.

    What a plan shows of it: job A's GPUs carry nothing of priority >= A's (nor running work,
    nor pinned plans) from `free_at` (the end of the last such occupation that starts before A)
    until A's planned start, so A could have started at `free_at` on its own GPUs had only the
    jobs of its priority or higher been planned. A may start later only for carbon, and at most
    its deferral bound (`QueuedJob.max_defer_s`) later. A plan breaks the rule where A starts
    later than `free_at` + that bound (+ `tol_s`, a slot by default: slot planners start jobs
    on slot boundaries) while a job of LOWER priority holds one of A's GPUs in that interval:
    that job took the GPUs A would have run on. A job with no deferral bound may be moved
    anywhere for carbon, which a plan alone cannot tell from being pushed; jobs under a site
    power cap may wait for watts, not GPUs: neither is judged here (the policy tests add
    `lower_priority_changes` for the first)."""
    tol = timedelta(seconds=snapshot.slot_s if tol_s is None else tol_s)
    jobs = {j.id: j for j in snapshot.jobs}
    fixed = {j.id for j in snapshot.jobs if j.pinned and j.id in snapshot.pinned}
    capped = {c.zone for c in snapshot.power_caps}
    budget = {g.id: g.budget or g.zone for g in snapshot.gpus}
    spans: dict[int, list[tuple]] = defaultdict(list)  # gpu -> (start, end, job id or None)
    for g in snapshot.gpus:
        if g.busy_until is not None and g.busy_until > snapshot.now:
            spans[g.id].append((snapshot.now, g.busy_until, None))
    for a in plan.assignments:
        if a.estimate.runtime_s is None:
            continue
        for gid in a.gpu_ids:
            spans[gid].append((a.start_at, a.start_at + timedelta(seconds=a.estimate.runtime_s), a.job_id))
    out: list[str] = []
    for a in plan.assignments:
        job = jobs.get(a.job_id)
        if job is None or job.max_defer_s is None or a.job_id in fixed or any(budget[i] in capped for i in a.gpu_ids):
            continue
        free_at = max(snapshot.now, job.submitted_at)
        for gid in a.gpu_ids:
            for s, e, other in spans[gid]:
                if other != a.job_id and s < a.start_at and (other is None or other in fixed
                                                             or jobs[other].priority >= job.priority):
                    free_at = max(free_at, min(e, a.start_at))
        if a.start_at <= free_at + timedelta(seconds=job.max_defer_s) + tol:
            continue
        for gid in a.gpu_ids:
            for s, e, other in spans[gid]:
                if other is not None and other not in fixed and jobs[other].priority < job.priority \
                        and s < a.start_at - timedelta(seconds=1) and e > free_at + timedelta(seconds=1):
                    out.append(f"job {job.id} (priority {job.priority:g}) could start at {free_at} on its GPUs, "
                               f"starts at {a.start_at}, beyond its deferral bound, while job {other} "
                               f"(priority {jobs[other].priority:g}) holds GPU {gid}")
    return out


def lower_priority_changes(full: Plan, upper: Plan, snapshot: Snapshot) -> list[str]:
    """Where `full` (the plan of the whole queue) places a job differently (node or start)
    from `upper` (the same policy's plan of the queue without the jobs of lower priority than
    the lowest in `upper`): a job of lower priority moved one of higher."""
    got, want = full.by_job(), upper.by_job()
    out = [f"job {i}: {'unplaced' if i not in got else f'{got[i].node} at {got[i].start_at}'} with the lower "
           f"priorities, {a.node} at {a.start_at} without" for i, a in want.items()
           if i not in got or (got[i].node, got[i].start_at) != (a.node, a.start_at)]
    return out
