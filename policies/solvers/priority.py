"""Priority under contention: the backfill rule for the slot planners (greedy, cpsat, oracle).

A job may take GPUs a job of higher `QueuedJob.priority` wants only where that does not
delay the higher job's planned start. The slot planners honour it by planning in priority
tiers, highest first: each tier is planned by the policy's own machinery (short-job packing,
the comparison with fifo, cpsat's search) with the jobs of the tiers above held where they
were placed, so nothing of a lower tier can move them; a lower tier fits around them and
may use their GPUs before they start (backfill). Carbon then chooses GPU model, zone, start
and power limit within what priority leaves.

The tiers above are handed to the next tier as kept plans (`Snapshot.keep`: node and start
held, the GPUs of a node re-assigned around the new jobs). A kept plan holds whole slots, so
a few that share a slot (short jobs packed back to back, fifo's starts between slot
boundaries) may not all fit again; those that moved are pinned (`Snapshot.pinned`: their GPUs
busy from now until they finish, which always holds them, at the cost of the backfill before
them) and the tier is planned again, up to `MAX_PIN_ROUNDS` times, then with all pinned.

With one priority (the default 0.0 everywhere) the policy's plan is made as before, in one
call: every plan is the same as without this module. fifo and edf need no tiers: they place
jobs one by one in priority order (`policies.solvers.fifo`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from policies.types import Assignment, Plan, QueuedJob, Snapshot

log = logging.getLogger(__name__)

PlanFn = Callable[[Snapshot], Plan]

#: rounds of pinning the held plans that did not stay put before all of them are pinned
MAX_PIN_ROUNDS = 3


def tiers(snapshot: Snapshot) -> list[list[QueuedJob]]:
    """The jobs to plan by priority, highest first, each tier in the snapshot's order (pinned
    jobs with a plan are held by every tier and belong to none)."""
    by_priority: dict[float, list[QueuedJob]] = {}
    for job in snapshot.jobs:
        if job.pinned and job.id in snapshot.pinned:
            continue
        by_priority.setdefault(float(job.priority), []).append(job)
    return [by_priority[p] for p in sorted(by_priority, reverse=True)]


def plan_by_priority(snapshot: Snapshot, plan_tier: PlanFn, first: tuple[Callable[[QueuedJob], bool], PlanFn] | None = None,
                     on_tier: Callable[[int, int], None] | None = None) -> Plan:
    """`plan_tier`'s plan of `snapshot`, tier by tier where the jobs differ in priority.

    `first` = (which, plan_fn): in each tier the jobs `which` selects are planned first by
    `plan_fn` and held, then the others by `plan_tier` (cpsat: the jobs that bound carbon's
    freedom take greedy's rule, `policies.pricing.worth`, before its search). `on_tier(jobs
    planned, jobs in all)` is called before each call of `plan_tier` where there are several
    (cpsat shares its time budget out)."""
    groups = tiers(snapshot)
    if first is not None:
        which, plan_first = first
        steps = [(part, fn) for group in groups
                 for part, fn in (([j for j in group if which(j)], plan_first),
                                  ([j for j in group if not which(j)], plan_tier)) if part]
    else:
        steps = [(group, plan_tier) for group in groups]
    if len(steps) <= 1 and (not steps or steps[0][1] is plan_tier):
        return plan_tier(snapshot)
    total = sum(len(part) for part, fn in steps if fn is plan_tier)
    held: dict[int, Assignment] = {}
    unplaced: dict[int, str] = {}
    plan = Plan()
    pinned = _pinned_ids(snapshot)
    for part, fn in steps:
        if on_tier is not None and fn is plan_tier:
            on_tier(len(part), total)
        plan = plan_around(snapshot, held, part, fn)
        unplaced.update({i: why for i, why in plan.unplaced.items() if i not in held})
        held = {a.job_id: a for a in plan.assignments if a.job_id not in pinned}
    return Plan(assignments=plan.assignments, unplaced=unplaced)


def plan_around(snapshot: Snapshot, held: dict[int, Assignment], jobs: list[QueuedJob], plan_fn: PlanFn) -> Plan:
    """`plan_fn`'s plan of `jobs` with the `held` plans of other jobs kept where they are
    (node and start); pinned where keeping them would move one."""
    if not held:
        return plan_fn(_only(snapshot, jobs, {}, set()))
    pin = _closure(held, {i for i, a in held.items() if not _on_slot(snapshot, a)})
    for _ in range(MAX_PIN_ROUNDS):
        plan = plan_fn(_only(snapshot, jobs, held, pin))
        moved = _moved(plan, held)
        if not moved:
            return plan
        log.info("priority: %d of %d held plans did not fit as kept plans; pinning them", len(moved), len(held))
        pin = _closure(held, pin | moved)
    return plan_fn(_only(snapshot, jobs, held, set(held)))


def _on_slot(snapshot: Snapshot, a: Assignment) -> bool:
    """Whether a plan starts on a slot boundary (a kept plan holds its slots exactly as the
    slot planner placed it; one packed between boundaries may share a slot it cannot hold)."""
    offset_s = (a.start_at - snapshot.now).total_seconds()
    return abs(offset_s / snapshot.slot_s - round(offset_s / snapshot.slot_s)) < 1e-6


def _closure(held: dict[int, Assignment], pin: set[int]) -> set[int]:
    """`pin` with every held plan that starts before a pinned one on one of its GPUs: a pinned
    job's GPUs are busy from now, so such a plan could not be kept."""
    out = set(pin)
    grow = True
    while grow:
        last: dict[int, datetime] = {}  # per GPU, the latest start of a pinned plan on it
        for i in out:
            for gid in held[i].gpu_ids:
                last[gid] = max(last.get(gid, held[i].start_at), held[i].start_at)
        more = {i for i, a in held.items() if i not in out
                and any(g in last and a.start_at < last[g] for g in a.gpu_ids)}
        out |= more
        grow = bool(more)
    return out


def _pinned_ids(snapshot: Snapshot) -> set[int]:
    return {j.id for j in snapshot.jobs if j.pinned and j.id in snapshot.pinned}


def _only(snapshot: Snapshot, jobs: list[QueuedJob], held: dict[int, Assignment], pin: set[int]) -> Snapshot:
    """The snapshot with its pinned jobs, the held jobs and `jobs` only; the held plans kept,
    those in `pin` pinned; the snapshot's own kept and previous plans of `jobs` as they were."""
    pinned = _pinned_ids(snapshot)
    by_id = {j.id: j for j in snapshot.jobs}
    mine = {j.id for j in jobs}
    held_jobs = [replace(by_id[i], pinned=True) if i in pin else by_id[i] for i in held]
    keep = {i: a for i, a in snapshot.keep.items() if i in mine}
    keep.update({i: a for i, a in held.items() if i not in pin})
    return replace(
        snapshot,
        jobs=tuple(j for j in snapshot.jobs if j.id in pinned) + tuple(held_jobs) + tuple(jobs),
        pinned={**snapshot.pinned, **{i: a for i, a in held.items() if i in pin}},
        keep=keep,
        previous={i: a for i, a in snapshot.previous.items() if i in mine})


def _moved(plan: Plan, held: dict[int, Assignment]) -> set[int]:
    """The held jobs `plan` does not have on their node at their start."""
    got = plan.by_job()
    return {i for i, a in held.items()
            if i not in got or got[i].node != a.node or got[i].start_at != a.start_at}


def plan_with_bounds(snapshot: Snapshot, plan_tier: PlanFn, plan_rule: PlanFn,
                     budget: Callable[[float], None]) -> Plan:
    """A searching policy's plan (`plan_tier`: cpsat's) by priority, where the jobs that bound
    their deferral (`QueuedJob.max_defer_s`) are placed first in their tier by a policy that
    applies the bound where it picks a start (`plan_rule`: greedy's). A job with a least
    saving (`min_saving_gco2`, `min_saving_frac`) is searched like any other; where its plan
    saves less than that against its "if run now" grams, the plan is made again with it placed
    by `plan_rule` too (which runs it at its earliest start unless a later one saves enough).
    `budget(share)` sets the searching policy's share of its time for the next call (its
    tiers get it by their jobs; half for each plan where a second may follow)."""
    from policies.pricing.worth import has_threshold, worth_deferring

    thresholds = any(has_threshold(j) for j in snapshot.jobs)
    part = 0.5 if thresholds else 1.0

    def plan(first: Callable[[QueuedJob], bool]) -> Plan:
        return plan_by_priority(snapshot, plan_tier, first=(first, plan_rule),
                                on_tier=lambda n, total: budget(part * n / max(1, total)))

    budget(part)
    out = plan(lambda j: j.max_defer_s is not None)
    if not thresholds:
        return out
    jobs = {j.id: j for j in snapshot.jobs}
    short = {a.job_id for a in out.assignments
             if a.job_id in jobs and has_threshold(jobs[a.job_id]) and a.job_id not in snapshot.pinned
             and not worth_deferring(jobs[a.job_id], a.estimate.gco2_if_now, a.estimate.gco2)}
    if not short:
        return out
    log.info("priority: %d jobs save less than their least saving; placing them by the rule", len(short))
    budget(part)
    return plan(lambda j: j.max_defer_s is not None or j.id in short)
