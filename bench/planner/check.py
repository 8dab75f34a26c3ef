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
  power of the queued jobs running then plus the running GPUs' generic power.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from policies.energy import ProfileBook, fits, generic_power_w, job_gco2, job_shape, seed_profiles
from policies.model import Plan, Snapshot

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
        if job.deadline is not None and end > job.deadline + timedelta(seconds=TOLERANCE_S):
            out.deadline_misses += 1
            out.miss_jobs.add(job.id)
            if not a.estimate.deadline_miss:
                bad.append(f"job {job.id}: ends {end.isoformat()} after its deadline "
                           f"{job.deadline.isoformat()} without the deadline_miss flag")
        for g in slots:
            runs_by_gpu[g.id].append((a.start_at, end, job.id))
        runs_by_zone[g0.zone].append((a.start_at, end, shape.power_w))
        pue = float(snapshot.pue.get(g0.zone, 1.0))
        gco2 = job_gco2(snapshot.carbon.get(g0.zone), a.start_at, shape.runtime_s, shape.power_w, pue)
        if gco2 is not None:
            out.gco2 += gco2
            if a.estimate.gco2 is not None and gco2 > 0:
                diff = 100.0 * abs(a.estimate.gco2 - gco2) / gco2
                out.estimate_max_diff_pct = max(out.estimate_max_diff_pct, diff)
        out.energy_j += shape.energy_j
        out.placed += 1
        out.starts[job.id] = (a.start_at, g0.zone, g0.model, shape.runtime_s)
    tol = timedelta(seconds=TOLERANCE_S)
    for gid, runs in runs_by_gpu.items():
        runs.sort()
        for (s1, e1, j1), (s2, e2, j2) in zip(runs, runs[1:]):
            if s2 < e1 - tol:
                bad.append(f"GPU {gid}: job {j1} runs until {e1.isoformat()}, job {j2} starts {s2.isoformat()}")
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
