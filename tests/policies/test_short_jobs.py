"""Jobs shorter than a planning slot are packed in continuous time around the slot plan:
a queue of short jobs runs back to back, yet still waits for a clearly cleaner hour."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from policies import CarbonCurve, GpuSlot, QueuedJob, Snapshot, get_policy
from policies.types import PowerCap
from policy_checker import violations

NOW = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)


def gpus(n: int, zone: str = "DE", model: str = "H100", node: str = "n1") -> tuple[GpuSlot, ...]:
    return tuple(GpuSlot(id=i + 1, node=node, zone=zone, index=i, model=model, memory_gib=80) for i in range(n))


def job(i: int, runtime_s: float = 2.0, **kw) -> QueuedJob:
    return QueuedJob(id=i, gpus=kw.pop("gpus", 1), gpu_mem_gib=0, submitted_at=NOW - timedelta(seconds=100 - i),
                     est_runtime_s=runtime_s, **kw)


def flat(zone: str = "DE", value: float = 300.0) -> CarbonCurve:
    return CarbonCurve(zone, NOW, 3600.0, (value,) * 72)


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_fifty_two_second_jobs_on_four_gpus_run_back_to_back(policy):
    snap = Snapshot(now=NOW, jobs=tuple(job(i) for i in range(1, 51)), gpus=gpus(4), carbon={"DE": flat()})
    plan = get_policy(policy, **({"max_time_s": 1} if policy == "cpsat" else {})).plan(snap)
    assert violations(snap, plan) == []
    starts = sorted((a.start_at - NOW).total_seconds() for a in plan.assignments)
    assert len(starts) == 50 and max(starts) <= 13 * 2.0 + 1  # 13 rounds of 4 (not one per 15-minute slot)
    assert all("short job" in a.explanation for a in plan.assignments)


def test_a_short_job_waits_for_a_clearly_cleaner_hour_but_not_for_noise():
    dirty_then_clean = CarbonCurve("DE", NOW, 3600.0, (400.0,) * 3 + (100.0,) * 69)
    noisy_flat = CarbonCurve("DE", NOW, 3600.0, tuple(300.0 + 0.001 * (i % 7) for i in range(72)))
    for curve, expect_h in ((dirty_then_clean, 3.0), (noisy_flat, 0.0)):
        snap = Snapshot(now=NOW, jobs=(job(1, runtime_s=600),), gpus=gpus(1), carbon={"DE": curve})
        a = get_policy("greedy").plan(snap).assignments[0]
        assert (a.start_at - NOW).total_seconds() / 3600 == pytest.approx(expect_h, abs=0.01)
        if expect_h:
            assert a.estimate.gco2 == pytest.approx(a.estimate.gco2_if_now / 4, rel=0.01)


def test_max_delay_and_deadline_bound_how_long_a_short_job_waits():
    dirty_then_clean = CarbonCurve("DE", NOW, 3600.0, (400.0,) * 3 + (100.0,) * 69)
    jobs = (job(1, runtime_s=600, max_delay_s=3600.0), job(2, runtime_s=600, deadline=NOW + timedelta(hours=2)))
    snap = Snapshot(now=NOW, jobs=jobs, gpus=gpus(2), carbon={"DE": dirty_then_clean})
    plan = get_policy("greedy").plan(snap)
    assert violations(snap, plan) == []
    for a in plan.assignments:
        assert (a.start_at - NOW).total_seconds() < 3600  # the clean hour is out of reach


def test_short_jobs_go_around_long_ones_and_running_jobs():
    busy = tuple(GpuSlot(id=i + 1, node="n1", zone="DE", index=i, model="H100", memory_gib=80,
                         busy_until=NOW + timedelta(minutes=30) if i == 0 else None) for i in range(2))
    jobs = (job(1, runtime_s=6 * 3600.0), job(2), job(3, gpus=2))
    snap = Snapshot(now=NOW, jobs=jobs, gpus=busy, carbon={"DE": flat()})
    plan = get_policy("greedy").plan(snap)
    assert violations(snap, plan) == []
    by_job = plan.by_job()
    # the 2-GPU short job needs both GPUs: after the running job and the long one end
    long_end = by_job[1].start_at + timedelta(hours=6)
    assert by_job[3].start_at >= min(long_end, NOW + timedelta(minutes=30))


def test_a_site_power_cap_is_honoured_for_short_jobs():
    jobs = tuple(job(i, runtime_s=300) for i in range(1, 5))
    snap = Snapshot(now=NOW, jobs=jobs, gpus=gpus(4), carbon={"DE": flat()},
                    power_caps=(PowerCap(zone="DE", cap_w=1500.0),))
    plan = get_policy("greedy").plan(snap)
    assert violations(snap, plan) == []
    starts = sorted(a.start_at for a in plan.assignments)
    assert len(starts) == 4 and starts[-1] > NOW  # not all four at once under 1.5 kW


def test_short_jobs_leave_room_for_the_rests_of_checkpoint_jobs():
    """Two checkpoint jobs planned on GPU 1 of a 2-GPU node both resume at 2:00: the slot plan
    counts both GPUs of the node taken until 3:00 (a rest may move to any GPU of the node), so
    a short job is not packed onto GPU 2 then, though 2:00-3:00 is the clean hour."""
    from policies.types import Assignment, Plan
    from policies.solvers.short_jobs import book_of, pack

    at = lambda minutes: NOW + timedelta(minutes=minutes)  # noqa: E731
    clean_at_2 = CarbonCurve("DE", NOW, 3600.0, (400.0,) * 2 + (100.0,) + (400.0,) * 69)
    cut = dict(interruptible="checkpoint", min_run_s=900.0, resume_cost_s=60.0)
    a, c = job(1, runtime_s=2 * 3600.0, **cut), job(2, runtime_s=6300.0, **cut)
    short = job(3, runtime_s=600.0)
    snap = Snapshot(now=NOW, jobs=(a, c, short), gpus=gpus(2), carbon={"DE": clean_at_2})
    base = Plan(assignments=(
        Assignment(job_id=1, node="n1", gpu_ids=(1,), start_at=at(0), segments=((at(0), at(60)), (at(120), at(180)))),
        Assignment(job_id=2, node="n1", gpu_ids=(1,), start_at=at(60),
                   segments=((at(60), at(105)), (at(120), at(180)))),
    ))
    placed, unplaced = pack(snap, base, [short], book_of(snap), "greedy")
    assert not unplaced
    (s,) = placed
    end = s.start_at + timedelta(seconds=600)
    assert end <= at(120) or s.start_at >= at(180)
    # with room on the node (one rest only) it takes the clean hour
    alone = Plan(assignments=base.assignments[:1])
    (s,) = pack(snap, alone, [short], book_of(snap), "greedy")[0]
    assert at(120) <= s.start_at < at(180)


def test_cpsat_offers_its_runner_up_when_its_best_long_plan_leaves_a_short_job_late(monkeypatch):
    """The short jobs are packed around cpsat's long plan, greedy's and the search's runner-up,
    and the best whole plan wins: a long plan cheaper by itself that leaves a short job late
    falls back to the runner-up, not all the way to greedy's plan. The search is faked at its
    seam (`_restarts`) so the three long plans are fixed: the 2-hour job at 00:00 (the cheapest,
    past the short job's deadline at 01:30), at 01:00 (greedy's, dear) or at 04:00 (the
    runner-up)."""
    import policies.solvers.cpsat as cpsat

    curve = CarbonCurve("DE", NOW, 3600.0, (40.0, 40.0, 2000.0, 2000.0, 60.0, 60.0) + (3000.0,) * 66)
    jobs = (job(1, runtime_s=2 * 3600.0, deadline=NOW + timedelta(hours=8)),
            job(2, runtime_s=300.0, deadline=NOW + timedelta(minutes=90)))
    snap = Snapshot(now=NOW, jobs=jobs, gpus=gpus(1), carbon={"DE": curve})
    real_edf_pass = cpsat.edf_pass

    def at(problem, slot: int):
        pick = cpsat.Pick(0, 0, slot)
        return [pick], {0: cpsat._pick_cost(problem, pick) / 100}

    def greedy_at_one_hour(problem, order, notes, costs):
        picks, unplaced, state, passes = real_edf_pass(problem, order, notes, costs)
        first, cost = at(problem, 4)
        costs.clear()
        costs.update(cost)
        notes.clear()
        notes.update(cpsat.notes_for_picks(problem, first))
        return first, unplaced, state, passes

    def solution(problem, slot: int, label: str):
        picks, cost = at(problem, slot)
        return cpsat._Solution.of(picks, {}, cost, label, problem)

    def search(problem, best, state, deadline, pass_s, cfg, price=None, clock=None, runner_up=None):
        if runner_up is not None:
            runner_up[:] = [solution(problem, 16, "runner-up")]
        return solution(problem, 0, "best"), state

    monkeypatch.setattr(cpsat, "edf_pass", greedy_at_one_hour)
    monkeypatch.setattr(cpsat, "_earliest_finish", lambda problem, best, state: (best, state))
    monkeypatch.setattr(cpsat, "_restarts", search)
    plan = get_policy("cpsat", max_time_s=5, neighbourhood=0).plan(snap)
    assert violations(snap, plan) == []
    by_job = plan.by_job()
    assert (by_job[1].start_at - NOW).total_seconds() == 4 * 3600  # the runner-up's long plan
    assert by_job[2].start_at < NOW + timedelta(minutes=85)  # the short job on time


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_a_short_job_that_must_start_within_the_hour_is_planned_with_the_long_jobs(policy):
    """Packed after the long plan, a short job with little time to spare finds its GPUs taken
    by the long job's clean hour, and the whole plan falls back to the carbon-blind edf's (the
    long job right after it, into the dirty hour). Planned in slots with the long jobs, it
    runs first and the long job waits for the next clean hour."""
    curve = CarbonCurve("DE", NOW, 3600.0, (100.0, 1000.0, 150.0) + (1000.0,) * 69)
    jobs = (job(1, runtime_s=3600.0, deadline=NOW + timedelta(hours=12)),
            job(2, runtime_s=300.0, deadline=NOW + timedelta(minutes=30)))
    snap = Snapshot(now=NOW, jobs=jobs, gpus=gpus(1), carbon={"DE": curve})
    plan = get_policy(policy, **({"max_time_s": 2} if policy == "cpsat" else {})).plan(snap)
    assert violations(snap, plan) == []
    by_job = plan.by_job()
    assert by_job[2].start_at + timedelta(seconds=300) <= NOW + timedelta(minutes=30)
    assert by_job[1].start_at == NOW + timedelta(hours=2)  # not at 00:05, into the dirty hour
