"""Held starts (`policies.problem.held_starts`, cpsat's `hold` option): once a job's plan leaves it
little slack, a later plan may start it earlier, never later; a job with slack to spare
still follows the cleaner hours; and a held job that cannot keep its start is placed inside
its real window without being counted late.
"""

from __future__ import annotations

import math
import re

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from policies import Assignment, GpuSlot, QueuedJob, Snapshot
from policies.model.catalog import catalog
from policies.solvers.cpsat import CpsatPolicy
from policies.solvers.greedy import GreedyState, greedy_picks
from policies.problem.held_starts import hold_starts
from policies.types import CarbonCurve
from policies.problem.instance import compile_problem
from policy_checker import violations

NOW = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
# dirty for 6 hours, then clean: a carbon-aware plan starts a 2-h job as late as it may
CURVE = CarbonCurve("Z1", NOW, 3600.0, tuple([500.0] * 6 + [50.0] * 42))


def _snapshot(previous_start: timedelta | None, deadline: timedelta = 8 * HOUR,
              busy_until: timedelta | None = None) -> Snapshot:
    gpu = GpuSlot(id=1, node="n1", zone="Z1", index=0, model="H100", memory_gib=catalog()["H100"].memory_gib,
                  busy_until=None if busy_until is None else NOW + busy_until)
    job = QueuedJob(id=1, gpus=1, gpu_mem_gib=0.0, submitted_at=NOW - HOUR, est_runtime_s=2 * 3600.0, deadline=NOW + deadline)
    previous = {} if previous_start is None else {
        1: Assignment(job_id=1, node="n1", gpu_ids=(1,), start_at=NOW + previous_start)}
    return Snapshot(now=NOW, jobs=(job,), gpus=(gpu,), carbon={"Z1": CURVE}, previous=previous)


def _policy(hold: float = 1.0, **options) -> CpsatPolicy:
    """cpsat holding every job by `hold` alone: no pace, no cap on the slack, no node-share
    gate (the mechanism, not the default's selection of jobs)."""
    return CpsatPolicy(max_time_s=0.5, deterministic=True, hold=hold, **{
        "hold_pace": 0.0, "hold_max_h": math.inf, "hold_node_share": 0.0, **options})


def _plan(snapshot: Snapshot, hold: float) -> Assignment:
    plan = _policy(hold).plan(snapshot)
    assert violations(snapshot, plan) == []
    (a,) = plan.assignments
    assert not a.estimate.deadline_miss
    return a


def _start(snapshot: Snapshot, hold: float) -> timedelta:
    return _plan(snapshot, hold).start_at - NOW


def test_a_job_left_little_slack_is_never_started_later_than_its_last_plan_said():
    # planned at 4:30, done at 6:30, due at 8:00: 1.5 h of slack, less than its 2-h run
    held = _snapshot(previous_start=4.5 * HOUR)
    assert _start(held, hold=0.0) == 6 * HOUR  # free, it follows the clean hours from 6:00
    a = _plan(held, hold=1.0)
    assert a.start_at - NOW <= 4.5 * HOUR
    # and its explanation says why it did not wait for the clean hours, and what that cost
    assert a.estimate.binding == "held start"
    assert re.search(r"held start binds; on time for \+\d+ g over its cheapest start", a.explanation)


def test_a_job_with_slack_to_spare_still_follows_the_cleaner_hours():
    # planned at 1:00, done at 3:00, due at 8:00: 5 h of slack, more than its 2-h run
    roomy = _snapshot(previous_start=1 * HOUR)
    assert _start(roomy, hold=1.0) > 4 * HOUR
    # a wider gate holds it too
    assert _start(roomy, hold=3.0) <= 1 * HOUR


def test_a_late_previous_plan_or_no_deadline_promises_nothing():
    late = _snapshot(previous_start=7 * HOUR)  # done at 9:00, due at 8:00
    problem = compile_problem(late)
    assert hold_starts(problem, 1.0) == 0
    assert problem.job_latest.max() == 6 * 4  # the window is whole: its last start is 6:00


def test_a_held_job_that_cannot_keep_its_promise_is_planned_in_its_real_window_and_is_not_late():
    # held at 4:30, but its GPU is busy until 5:30 now: no start at or before the promise
    # fits, so it is planned as if it had none (the cheapest start of its real window, 6:00,
    # on time: due at 8:00), not as soon as possible as a job that cannot be on time is
    snapshot = _snapshot(previous_start=4.5 * HOUR, busy_until=5.5 * HOUR)
    problem = compile_problem(snapshot)
    assert hold_starts(problem, 1.0) == 1
    picks, unplaced = greedy_picks(problem, GreedyState(problem))
    (p,) = picks
    assert not unplaced and not p.deadline_miss
    assert p.slot * problem.slot_s == 6 * 3600
    assert _start(snapshot, hold=1.0) == 6 * HOUR


def test_a_held_start_does_not_creep_earlier_as_plans_follow_each_other_off_the_slot_grid():
    """Plans every 4 minutes (a submit each): slots count from each plan's moment, so no
    slot starts at the promised 4:30 exactly; the promise is remembered, so the start stays
    within a slot of it instead of creeping a slot earlier at each plan to "now"."""
    policy = _policy()
    snapshot = _snapshot(previous_start=4.5 * HOUR)
    starts = []
    for k in range(12):
        now = NOW + k * timedelta(minutes=4)
        snap = replace(snapshot, now=now)
        plan = policy.plan(snap)
        assert violations(snap, plan) == []
        (a,) = plan.assignments
        starts.append(a.start_at - NOW)
        snapshot = replace(snap, previous=plan.by_job())
    assert all(abs(s - 4.5 * HOUR) < timedelta(minutes=15) for s in starts), starts  # within a slot
    # a fresh policy each time (no memory of the promise) re-reads the last start: it creeps
    snapshot, crept = _snapshot(previous_start=4.5 * HOUR), []
    for k in range(12):
        snap = replace(snapshot, now=NOW + k * timedelta(minutes=4))
        plan = _policy().plan(snap)
        crept.append(plan.assignments[0].start_at - NOW)
        snapshot = replace(snap, previous=plan.by_job())
    assert crept[2] > crept[1] > crept[0] and crept[-1] > 5 * HOUR  # the promise slips by a plan's lag each time


def _paced_starts(plan_every: timedelta, pace: float, hours: float = 2.0) -> list[timedelta]:
    """Re-plan the held job of `_snapshot(4:30)` every `plan_every` for `hours` with one
    policy (its promises kept) pulling at `pace` hours per hour; the planned starts."""
    policy = _policy(hold_pace=pace)
    # cleaner by the hour until 6:00: inside its held window the job starts as late as it may
    falling = CarbonCurve("Z1", NOW, 3600.0, tuple([600.0 - 50 * h for h in range(6)] + [50.0] * 42))
    snapshot, starts = replace(_snapshot(previous_start=4.5 * HOUR), carbon={"Z1": falling}), []
    for k in range(int(hours * HOUR / plan_every) + 1):
        snap = replace(snapshot, now=NOW + k * plan_every)
        plan = policy.plan(snap)
        assert violations(snap, plan) == []
        (a,) = plan.assignments
        assert not a.estimate.deadline_miss
        starts.append(a.start_at - NOW)
        snapshot = replace(snap, previous=plan.by_job())
    return starts


def test_a_paced_promise_moves_earlier_with_the_clock_whatever_the_number_of_plans():
    # promised 4:30 at 0:00; pulled one hour per hour, it is due to start by 2:30 at 2:00
    every_4_min = _paced_starts(timedelta(minutes=4), pace=1.0)
    hourly = _paced_starts(HOUR, pace=1.0)
    for starts in (every_4_min, hourly):
        assert starts[-1] <= 2.5 * HOUR + timedelta(minutes=15), starts  # within a slot of 2:30
        assert starts[-1] >= 2.5 * HOUR - timedelta(minutes=15)  # not pulled to "now" (2:00) by the plans
    # without a pace the promise stays at 4:30
    assert abs(_paced_starts(HOUR, pace=0.0)[-1] - 4.5 * HOUR) < timedelta(minutes=15)


def _node_snapshot(job_gpus: int, node_gpus: int = 2) -> Snapshot:
    """`_snapshot(4:30)` on a node of `node_gpus` GPUs with a job of `job_gpus` of them."""
    mem = catalog()["H100"].memory_gib
    gpus = tuple(GpuSlot(id=i + 1, node="n1", zone="Z1", index=i, model="H100", memory_gib=mem)
                 for i in range(node_gpus))
    job = QueuedJob(id=1, gpus=job_gpus, gpu_mem_gib=0.0, submitted_at=NOW - HOUR,
                    est_runtime_s=2 * 3600.0, deadline=NOW + 8 * HOUR)
    previous = {1: Assignment(job_id=1, node="n1", gpu_ids=tuple(range(1, job_gpus + 1)), start_at=NOW + 4.5 * HOUR)}
    return Snapshot(now=NOW, jobs=(job,), gpus=gpus, carbon={"Z1": CURVE}, previous=previous)


def _node_start(job_gpus: int, policy: CpsatPolicy) -> timedelta:
    snapshot = _node_snapshot(job_gpus)
    plan = policy.plan(snapshot)
    assert violations(snapshot, plan) == []
    (a,) = plan.assignments
    assert not a.estimate.deadline_miss
    return a.start_at - NOW


def test_a_node_share_gate_holds_only_the_jobs_that_need_that_much_of_a_node():
    """Under load a job that needs a whole node starts only when every GPU of one is free at
    once, and a deferred one loses its on-time start first (the overload replays' extra
    misses); a narrow job finds a later gap. `hold_node_share` holds only the wide ones."""
    assert _node_start(2, _policy(hold_node_share=1.0)) <= 4.5 * HOUR  # the whole node: held to its promise
    assert _node_start(1, _policy(hold_node_share=1.0)) == 6 * HOUR  # half of it: free to wait for the clean hours
    assert _node_start(1, _policy(hold_node_share=0.5)) <= 4.5 * HOUR  # a lower share holds it too
    assert _node_start(1, _policy(hold_node_share=0.0)) <= 4.5 * HOUR  # no gate: every job is held


def test_by_default_cpsat_gives_paced_promises_to_whole_node_gangs_only():
    default = CpsatPolicy(max_time_s=0.5, deterministic=True)
    assert (default.hold, default.hold_pace, default.hold_max_h, default.hold_node_share) == (1.0, 1.0, 12.0, 1.0)
    assert _node_start(2, default) <= 4.5 * HOUR
    assert _node_start(1, default) == 6 * HOUR
    # hold=0 turns promises off: the gang waits for the clean hours too
    assert _node_start(2, CpsatPolicy(max_time_s=0.5, deterministic=True, hold=0.0)) == 6 * HOUR
