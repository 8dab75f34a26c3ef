"""An independent judge of a plan: feasibility and gCO2, from the snapshot alone.

It does not use the policies' compiled problem: every assignment is checked against the
snapshot's GPUs and jobs in continuous time, and its cost is recomputed with the energy
model (`job_shape`: runtime and power of the job on that GPU model; `job_gco2`: power x
PUE x the integral of the zone's curve over the run). What is checked:

- each job at most once, and every job either placed or listed as unplaced;
- gang: `gpus` distinct GPU ids, all on the assignment's node, of one model;
- the GPUs exist, are healthy and not drained, have the memory and meet the latency SLO
  (`fits`);
- the start is not before `now`, the job's submission or a GPU's `busy_until`;
- no GPU runs two jobs at once (runs last the model's runtime, no slot rounding);
- the deadline: a run that ends after it is a deadline miss; a miss the assignment does
  not flag (`estimate.deadline_miss`) is a violation;
- zone power caps, where the snapshot has any: at every start inside a cap window, the
  power of the queued jobs running then plus the running GPUs' generic power;
- an interruptible job planned in segments (issue 30): only a checkpoint or pause job, at
  most its `max_segments`, the first at its start, in order with a break between each, all
  but the last at least `min_run_s`, running its work plus `resume_cost_s` per resume; its
  end is the last segment's. Its GPUs run the first segment (a pause job holds them to its
  end); a checkpoint job's later segments may move to any GPUs of the same zone and model,
  so they are checked against the free GPUs of that zone and model at each of their starts
  (a relaxation: not per node). Its gCO2 is summed over its segments, plus a pause job's
  GPUs' idle power between them.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from policies.model.energy import ProfileBook, fits, generic_power_w, job_gco2, job_shape, seed_profiles
from policies.types import Assignment, Plan, QueuedJob, Snapshot
from policies.problem.segments import idle_power_w

log = logging.getLogger(__name__)

TOLERANCE_S = 1.0


@dataclass
class PlanCheck:
    """What the judge found."""

    gco2: float = 0.0  # sum over placed jobs, recomputed
    energy_j: float = 0.0
    placed: int = 0
    unplaced: int = 0
    deadline_misses: int = 0  # runs that end after their deadline (flagged or not)
    violations: list[str] = field(default_factory=list)
    estimate_max_diff_pct: float = 0.0  # worst |policy's estimate - recomputed| / recomputed
    starts: dict[int, tuple[datetime, str, str, float]] = field(default_factory=dict)  # job -> start, zone, model, runtime_s
    miss_jobs: set[int] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.violations


def book_of(snapshot: Snapshot) -> ProfileBook:
    return ProfileBook(snapshot.profiles) if snapshot.profiles else ProfileBook(seed_profiles())


def check_plan(snapshot: Snapshot, plan: Plan, book: ProfileBook | None = None) -> PlanCheck:
    """Judge `plan` against `snapshot` (see the module docstring)."""
    book = book or book_of(snapshot)
    out = PlanCheck()
    jobs = {j.id: j for j in snapshot.jobs}
    gpus = {g.id: g for g in snapshot.gpus}
    bad = out.violations
    seen: set[int] = set()
    runs_by_gpu: dict[int, list[tuple[datetime, datetime, int]]] = defaultdict(list)
    runs_by_zone: dict[str, list[tuple[datetime, datetime, float]]] = defaultdict(list)
    # a checkpoint job's later segments: GPUs of a (zone, model), not yet chosen
    later: dict[tuple[str, str], list[tuple[datetime, datetime, int, int]]] = defaultdict(list)
    for a in plan.assignments:
        job = jobs.get(a.job_id)
        if job is None:
            bad.append(f"job {a.job_id}: not in the snapshot")
            continue
        if a.job_id in seen:
            bad.append(f"job {a.job_id}: placed twice")
            continue
        seen.add(a.job_id)
        ids = tuple(a.gpu_ids)
        if len(ids) != job.gpus or len(set(ids)) != len(ids):
            bad.append(f"job {job.id}: {len(ids)} GPUs {ids}, needs {job.gpus} distinct")
        slots = [gpus.get(i) for i in ids]
        if not ids or any(g is None for g in slots):
            bad.append(f"job {job.id}: unknown GPU ids {ids}")
            continue
        nodes = {g.node for g in slots}
        models = {g.model for g in slots}
        if nodes != {a.node} or len(models) != 1:
            bad.append(f"job {job.id}: GPUs on nodes {sorted(nodes)} of models {sorted(models)} (node {a.node})")
            continue
        g0 = slots[0]
        for g in slots:
            if not g.healthy or g.drained:
                bad.append(f"job {job.id}: GPU {g.id} is {'unhealthy' if not g.healthy else 'drained'}")
            why = fits(job, g.model, g.memory_gib, book)
            if why is not None:
                bad.append(f"job {job.id}: GPU {g.id} ({g.model}, {g.memory_gib:g} GiB) does not fit: {why}")
                break
        release = max(snapshot.now, job.submitted_at)
        if a.start_at < release - timedelta(seconds=TOLERANCE_S):
            bad.append(f"job {job.id}: starts {a.start_at.isoformat()} before its release {release.isoformat()}")
        for g in slots:
            if g.busy_until is not None and a.start_at < g.busy_until - timedelta(seconds=TOLERANCE_S):
                bad.append(f"job {job.id}: GPU {g.id} busy until {g.busy_until.isoformat()}, "
                           f"job starts {a.start_at.isoformat()}")
        shape = job_shape(job, g0.model, book, snapshot.default_runtime_s)
        end = a.start_at + timedelta(seconds=shape.runtime_s)
        segs = [(a.start_at, end)]
        if len(a.segments) > 1:
            segs = list(a.segments)
            bad.extend(_segment_violations(job, a, shape.runtime_s))
            end = segs[-1][1]
        if job.deadline is not None and end > job.deadline + timedelta(seconds=TOLERANCE_S):
            out.deadline_misses += 1
            out.miss_jobs.add(job.id)
            if not a.estimate.deadline_miss:
                bad.append(f"job {job.id}: ends {end.isoformat()} after its deadline "
                           f"{job.deadline.isoformat()} without the deadline_miss flag")
        pause = job.interruptible == "pause"
        held_to = end if pause else segs[0][1]
        for g in slots:
            runs_by_gpu[g.id].append((a.start_at, held_to, job.id))
        if not pause:
            later[(g0.zone, g0.model)].extend((s, e, len(ids), job.id) for s, e in segs[1:])
        idle_w = idle_power_w(g0.model, len(ids)) if pause else 0.0
        gaps = [(e1, s2) for (_, e1), (s2, _) in zip(segs, segs[1:])]
        runs_by_zone[g0.zone].extend((s, e, shape.power_w) for s, e in segs)
        runs_by_zone[g0.zone].extend((s, e, idle_w) for s, e in gaps if idle_w)
        pue = float(snapshot.pue.get(g0.zone, 1.0))
        curve = snapshot.carbon.get(g0.zone)
        parts = [job_gco2(curve, s, (e - s).total_seconds(), shape.power_w, pue) for s, e in segs]
        parts += [job_gco2(curve, s, (e - s).total_seconds(), idle_w, pue) for s, e in gaps if idle_w]
        gco2 = None if any(x is None for x in parts) else sum(parts)
        energy_j = shape.energy_j if len(segs) == 1 else (
            shape.power_w * sum((e - s).total_seconds() for s, e in segs)
            + idle_w * sum((e - s).total_seconds() for s, e in gaps))
        if gco2 is not None:
            out.gco2 += gco2
            if a.estimate.gco2 is not None and gco2 > 0:
                diff = 100.0 * abs(a.estimate.gco2 - gco2) / gco2
                out.estimate_max_diff_pct = max(out.estimate_max_diff_pct, diff)
        out.energy_j += energy_j
        out.placed += 1
        out.starts[job.id] = (a.start_at, g0.zone, g0.model, shape.runtime_s)
    tol = timedelta(seconds=TOLERANCE_S)
    for gid, runs in runs_by_gpu.items():
        runs.sort()
        for (s1, e1, j1), (s2, e2, j2) in zip(runs, runs[1:]):
            if s2 < e1 - tol:
                bad.append(f"GPU {gid}: job {j1} runs until {e1.isoformat()}, job {j2} starts {s2.isoformat()}")
    bad.extend(_later_segment_violations(snapshot, runs_by_gpu, later))
    for cap in snapshot.power_caps:
        runs = runs_by_zone.get(cap.zone, [])
        running = [(snapshot.now, g.busy_until, generic_power_w(g.model)) for g in snapshot.gpus
                   if g.zone == cap.zone and g.busy_until is not None and g.busy_until > snapshot.now]
        every = runs + running
        for t in sorted({s for s, _, _ in runs}):
            if (cap.start is not None and t < cap.start) or (cap.end is not None and t >= cap.end):
                continue
            load_w = sum(p for s, e, p in every if s <= t < e)
            if load_w > cap.cap_w + 1e-6:
                bad.append(f"zone {cap.zone}: {load_w:.0f} W at {t.isoformat()} over the {cap.cap_w:.0f} W cap")
    missing = set(jobs) - seen - set(plan.unplaced)
    if missing:
        bad.append(f"{len(missing)} jobs neither placed nor unplaced, e.g. {sorted(missing)[:5]}")
    out.unplaced = len(set(plan.unplaced) - seen)
    if bad:
        log.warning("plan has %d violations, e.g. %s", len(bad), bad[0])
    return out


def _segment_violations(job: QueuedJob, a: Assignment, runtime_s: float) -> list[str]:
    """What is wrong with an assignment's segments on their own (see the module docstring)."""
    segs, tol = list(a.segments), timedelta(seconds=TOLERANCE_S)
    out = []
    if job.interruptible not in ("checkpoint", "pause"):
        out.append(f"job {job.id}: planned in {len(segs)} segments but not interruptible")
    if len(segs) > job.max_segments:
        out.append(f"job {job.id}: {len(segs)} segments, at most {job.max_segments}")
    if abs(segs[0][0] - a.start_at) > tol:
        out.append(f"job {job.id}: its first segment starts {segs[0][0].isoformat()}, not at {a.start_at.isoformat()}")
    for i, ((s1, e1), (s2, _)) in enumerate(zip(segs, segs[1:])):
        if not s1 < e1 < s2:
            out.append(f"job {job.id}: segment {i + 1} ({s1.isoformat()}-{e1.isoformat()}) is not before "
                       f"segment {i + 2} with a break ({s2.isoformat()})")
        if job.min_run_s and (e1 - s1).total_seconds() < job.min_run_s - TOLERANCE_S:
            out.append(f"job {job.id}: segment {i + 1} runs {(e1 - s1).total_seconds():.0f} s, "
                       f"shorter than its minimum run {job.min_run_s:.0f} s")
    resumed = job.done_fraction > 0 or job.resume_count > 0
    need_s = runtime_s * max(0.0, 1.0 - job.done_fraction) + job.resume_cost_s * (len(segs) - 1 + resumed)
    ran_s = sum((e - s).total_seconds() for s, e in segs)
    if ran_s < need_s - TOLERANCE_S * len(segs):
        out.append(f"job {job.id}: its segments run {ran_s:.0f} s, its work and resumes need {need_s:.0f} s")
    return out


def _later_segment_violations(snapshot: Snapshot, runs_by_gpu: dict[int, list[tuple[datetime, datetime, int]]],
                              later: dict[tuple[str, str], list[tuple[datetime, datetime, int, int]]]) -> list[str]:
    """At the start of each checkpoint job's later segment, the GPUs of its zone and model
    that are free (healthy, not drained, not busy, not running a placed job) must hold it and
    the other later segments running then."""
    out = []
    tol = timedelta(seconds=TOLERANCE_S)
    for (zone, model), segs in later.items():
        gpus = [g for g in snapshot.gpus if g.zone == zone and g.model == model and g.healthy and not g.drained]
        for t, _, _, job_id in segs:
            probe = t + tol
            free = sum(1 for g in gpus if (g.busy_until is None or g.busy_until <= probe)
                       and not any(s <= probe < e for s, e, _ in runs_by_gpu.get(g.id, ())))
            need = sum(k for s, e, k, _ in segs if s <= probe < e)
            if need > free:
                out.append(f"{zone} {model}: {need} GPUs for later segments at {t.isoformat()} (job {job_id}), "
                           f"{free} free")
    return out
