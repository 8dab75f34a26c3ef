"""Continuous re-planning: how much of the gap repeated planner ticks close.

The daemon plans every tick and only the jobs that start before the next tick are final;
the rest are re-planned with a later `now`. This simulates that on a generated instance
with a perfect forecast (the same curves every tick), so any improvement comes from the
re-planning itself: tick 0 plans everything; at tick i (now + i x 15 min) the jobs whose
planned start is before the new `now` have started (their GPUs are busy until their end),
and the policy re-plans the others from the new `now`, given their last plan as a starting
point (`Snapshot.previous`, as in the daemon; `warm=False`: from scratch). After each tick
the cost of the whole schedule (started jobs + the current plan) is judged by
`check.check_plan` against the original snapshot, so it is comparable with the single-shot
runs and the LP bound.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

from bench.planner.check import book_of, check_plan
from bench.planner.instance import InstanceSpec, generate
from policies.model.energy import job_shape
from policies.types import Assignment, Plan

log = logging.getLogger(__name__)


def replan_ticks(spec: InstanceSpec, ticks: int, *, policy: str = "cpsat", params: dict | None = None,
                 warm: bool = True, progress: Callable[[str], None] = lambda line: None) -> list[dict]:
    """One row per tick: tick, now, started jobs, wall s of the re-plan, gCO2, misses, violations.

    `warm`: each re-plan gets the last tick's plan of its jobs as `Snapshot.previous` (as the
    daemon's full re-plans do); otherwise it starts from scratch."""
    from policies.base import get_policy

    params = params or {}
    snap0 = generate(spec).snapshot
    book = book_of(snap0)
    jobs = {j.id: j for j in snap0.jobs}
    gpus = {g.id: g for g in snap0.gpus}
    started: dict[int, Assignment] = {}
    rows: list[dict] = []
    plan = Plan()
    for tick in range(ticks + 1):
        now = snap0.now + timedelta(seconds=tick * snap0.slot_s)
        for a in plan.assignments:
            if a.start_at < now:
                started[a.job_id] = a
        busy = {gid: g.busy_until for gid, g in gpus.items()}
        for a in started.values():
            model = gpus[a.gpu_ids[0]].model
            end = a.start_at + timedelta(seconds=job_shape(jobs[a.job_id], model, book,
                                                            snap0.default_runtime_s).runtime_s)
            for gid in a.gpu_ids:
                if busy[gid] is None or busy[gid] < end:
                    busy[gid] = end
        previous = {a.job_id: a for a in plan.assignments if a.job_id not in started} if warm else {}
        snap = replace(snap0, now=now, jobs=tuple(j for j in snap0.jobs if j.id not in started),
                       gpus=tuple(replace(g, busy_until=busy[g.id] if busy[g.id] and busy[g.id] > now else None)
                                  for g in snap0.gpus), previous=previous)
        t0 = time.perf_counter()
        plan = get_policy(policy, **params).plan(snap)
        wall_s = time.perf_counter() - t0
        whole = Plan(assignments=tuple(started.values()) + plan.assignments, unplaced=dict(plan.unplaced))
        c = check_plan(snap0, whole, book)
        row = {"tick": tick, "now": now.isoformat(), "started": len(started), "replanned": len(snap.jobs),
               "wall_s": wall_s, "gco2": c.gco2, "deadline_misses": c.deadline_misses,
               "unplaced": c.unplaced, "violations": len(c.violations)}
        rows.append(row)
        progress(f"[{spec.label}] re-plan tick {tick}: {len(started)} started, {len(snap.jobs)} re-planned in "
                 f"{wall_s:.1f} s, schedule {c.gco2 / 1e6:.4f} t CO2, {c.deadline_misses} misses"
                 + (f", {len(c.violations)} VIOLATIONS: {c.violations[0]}" if c.violations else ""))
    return rows
