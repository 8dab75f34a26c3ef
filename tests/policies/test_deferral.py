"""A job that is late either way waits for faster GPUs past the planning horizon when they
finish it sooner than the slow GPUs free now (policies.pricing.deferral), and a plan that lets it
wait is scored as the deadline miss it is, not as a job left unplaced."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from policies import GpuSlot, QueuedJob, Snapshot, get_policy
from policies.base import parse_policy_spec
from policies.model.catalog import catalog
from policies.pricing.deferral import Deferral, past_horizon_start
from policies.types import CarbonCurve, Plan
from policies.solvers.placement import estimate_score, plan_score
from policies.problem.instance import compile_problem

NOW = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)


def fleet(b200_busy_h: float) -> tuple[GpuSlot, ...]:
    """Eight B200 busy with a running job for `b200_busy_h` hours, eight A100 free now."""
    gpus = []
    for node, model, busy in (("b", "B200", NOW + b200_busy_h * HOUR), ("a", "A100", None)):
        for i in range(8):
            gpus.append(GpuSlot(id=len(gpus) + 1, node=node, zone="Z", index=i, model=model,
                                memory_gib=catalog()[model].memory_gib, busy_until=busy))
    return tuple(gpus)


def late_gang_job(job_id: int = 1) -> QueuedJob:
    """8 GPUs for 40 h on an H100 (about 17 h on B200, 91 h on A100), due in 5 h: late anywhere."""
    return QueuedJob(id=job_id, gpus=8, gpu_mem_gib=0, submitted_at=NOW - HOUR, est_runtime_s=40 * 3600.0,
                     deadline=NOW + 5 * HOUR)


def snapshot(b200_busy_h: float, jobs: tuple[QueuedJob, ...] | None = None) -> Snapshot:
    carbon = {"Z": CarbonCurve("Z", NOW, 3600.0, tuple(300.0 for _ in range(400)))}
    return Snapshot(now=NOW, jobs=jobs or (late_gang_job(),), gpus=fleet(b200_busy_h), carbon=carbon)


def _policy(spec: str):
    name, params = parse_policy_spec(spec)
    return get_policy(name, **params)


@pytest.mark.parametrize("policy", ["greedy", "cpsat:max_time_s=1:deterministic=true"])
def test_a_late_gang_job_waits_for_the_faster_gpus_past_the_horizon(policy):
    # B200 free at 60 h (past the 48 h horizon): done at ~77 h there, at ~91 h on the A100 now
    plan = _policy(policy).plan(snapshot(60.0))
    assert not plan.assignments
    why = plan.unplaced[1]
    assert isinstance(why, Deferral)
    assert why.startswith("deadline cannot be met: waits for 8xB200 in Z")
    assert "past the planning horizon" in why and "A100" in why
    assert NOW + 76 * HOUR < why.finish_at < NOW + 78 * HOUR


@pytest.mark.parametrize("policy", ["greedy", "cpsat:max_time_s=1:deterministic=true"])
def test_it_runs_on_the_slow_gpus_now_when_waiting_would_finish_later(policy):
    # B200 free only at 80 h: ~97 h there, ~91 h on the A100 now
    plan = _policy(policy).plan(snapshot(80.0))
    (a,) = plan.assignments
    assert a.start_at == NOW and a.estimate.deadline_miss
    assert {g.model for g in fleet(80.0) if g.id in a.gpu_ids} == {"A100"}


def test_a_waiting_job_scores_as_its_miss_at_its_expected_lateness_not_as_unplaced():
    snap = snapshot(60.0)
    problem = compile_problem(snap)
    finish = NOW + 77 * HOUR
    waiting = Plan(unplaced={1: Deferral("deadline cannot be met: waits for 8xB200", finish)})
    left = Plan(unplaced={1: "no GPUs free within the planning horizon"})
    for score in (plan_score, estimate_score):
        s = score(problem, waiting)
        assert (s.unplaced, s.deadline_misses) == (0, 1)
        assert s.late_gpu_h == pytest.approx(8 * 72.0)
        assert score(problem, left).unplaced == 1
    # fifo runs it on the A100 now, 86 h late: the plan that waits is the better one
    fifo = get_policy("fifo").plan(snap)
    assert estimate_score(problem, waiting).better_than(estimate_score(problem, fifo))


def test_the_start_past_the_horizon_counts_the_gpus_held_beyond_it():
    horizon = 192
    assert past_horizon_start(8, 8, [], horizon) == horizon  # nothing holds them past it
    assert past_horizon_start(8, 8, [(250, 8)], horizon) == 250
    assert past_horizon_start(8, 4, [(250, 4)], horizon) == horizon  # four free from its end
    assert past_horizon_start(8, 4, [(250, 4), (300, 4)], horizon) == 250
    assert past_horizon_start(8, 6, [(250, 4), (300, 4)], horizon) == 300
    assert past_horizon_start(8, 6, [(250, 1), (250, 1), (300, 6)], horizon) == 300
    assert past_horizon_start(8, 8, [(300, 8), (300, -8)], horizon) == horizon  # taken, then given back
    assert past_horizon_start(8, 8, [(100, 8)], horizon) == horizon  # ends inside the horizon


def test_a_pick_of_this_plan_that_runs_past_the_horizon_holds_its_gpus_there():
    # job 2 (due first) takes the B200s from 20 h for ~120 h; the late job 1 then sees them
    # free only at ~140 h and runs on the A100 now instead of waiting
    long_job = QueuedJob(id=2, gpus=8, gpu_mem_gib=0, submitted_at=NOW - 2 * HOUR, est_runtime_s=280 * 3600.0,
                         deadline=NOW + 4 * HOUR)
    plan = get_policy("greedy").plan(snapshot(20.0, (late_gang_job(), long_job)))
    by_job = plan.by_job()
    assert 1 in by_job, plan.unplaced
    assert {g.model for g in fleet(20.0) if g.id in by_job[1].gpu_ids} == {"A100"}


def test_the_daemon_keeps_the_waiting_job_pending_with_its_reason(store, tmp_path):
    """Through the daemon's planner and store (SQLite and PostgreSQL): the B200 node runs a
    job expected for 60 h, the A100 node is idle; the late gang job stays PENDING and its
    reason (the `queue` REASON column) says what it waits for."""
    from sqlalchemy import insert, select, update

    from scheduler.carbon import CarbonSignals
    from scheduler.daemon.access import Caller, ServiceConfig
    from scheduler.daemon.planner import Planner
    from scheduler.daemon.policy_factory import make_policy
    from scheduler.daemon.service import JobService
    from scheduler.store.models import gpus, jobs, nodes
    from telemetry.grid.readings import IntensityReading

    t = datetime(2022, 1, 10, 12, 0, tzinfo=timezone.utc)
    root = Caller(uid=0, gid=0)
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs", clock=lambda: t)
    ids: dict[str, list[int]] = {}
    with store.write() as conn:
        for name, model, mem in (("b", "B200", 192.0), ("a", "A100", 80.0)):
            conn.execute(insert(nodes).values(name=name, zone="DE", backend="emulated", emulated=True,
                                              registered_at=t, last_heartbeat=t))
            ids[name] = [conn.execute(insert(gpus).values(node_name=name, index=i, uuid=f"{name}-{i}", model=model,
                                                          vendor="nvidia", memory_gib=mem, healthy=True)
                                      .returning(gpus.c.id)).scalar_one() for i in range(8)]
    CarbonSignals(store, track_status=False).writes.store_readings([
        IntensityReading(zone="DE", at=t + i * HOUR, duration_s=3600, gco2_per_kwh=300.0, signal="average",
                         kind="forecast", issued_at=t - HOUR, source="electricitymaps") for i in range(72)])
    running = service.submit(root, {"argv": ["true"], "gpus": 8, "est_runtime_s": 60 * 3600})["id"]
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == running).values(state="RUNNING", started_at=t))
        conn.execute(update(gpus).where(gpus.c.id.in_(ids["b"])).values(job_id=running))
    # due in 41 h: accepted (40 h on an H100), late on every GPU of this fleet (77 h, 91 h)
    late = service.submit(root, {"argv": ["true"], "gpus": 8, "est_runtime_s": 40 * 3600,
                                 "deadline": (t + 41 * HOUR).isoformat()})["id"]

    planner = Planner(store, make_policy("greedy", plan_interval_s=15.0), clock=lambda: t,
                      monotonic=lambda: 1000.0, plan_interval_s=15.0, node_timeout_s=30 * 24 * 3600.0)
    planner.tick()
    with store.read() as conn:
        row = conn.execute(select(jobs.c.state, jobs.c.reason).where(jobs.c.id == late)).one()
    assert row.state == "PENDING"
    assert row.reason.startswith("deadline cannot be met: waits for 8xB200 in DE, free in ~60 h")
