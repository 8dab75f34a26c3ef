"""Incremental planning in the daemon's planner (`full_replan` / `Planner(full_replan_s=...)`)
against a real store: between full re-plans a tick passes the stored plans of the PLANNED,
unpinned jobs as `Snapshot.keep`, so they stay where they are while new jobs are planned
around them; a kept plan that no longer fits is planned again; every `full_replan_s` a tick
re-plans every queued job. Without the setting every tick is full, as before.

The carbon forecast is a live forecast run in the store, replaced between ticks by a newer
run whose cheap hours come later, so a full re-plan would move a planned job.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, update

from scheduler.carbon import CarbonSignals
from scheduler.daemon.access import Caller, ServiceConfig
from scheduler.daemon.planner import Planner
from scheduler.daemon.planner_process import PlannerSpec, build_planner
from scheduler.daemon.policy_factory import make_policy
from scheduler.daemon.service import JobService
from scheduler.store.models import gpus, jobs
from telemetry.grid.readings import IntensityReading

import fleet

ROOT = Caller(uid=0, gid=0)
T = datetime(2022, 1, 10, 12, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
SIX_HOURS = 6 * 3600.0


class Clocks:
    """The planner's wall clock and monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = T
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        self.mono += seconds


@pytest.fixture
def clocks():
    return Clocks()


@pytest.fixture
def service(store, tmp_path, clocks):
    return JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs", clock=lambda: clocks.now)


def add_node(store, name: str, zone: str = "DE", n: int = 1) -> list[int]:
    return fleet.add_node(store, name, at=T, zone=zone, n=n)


def forecast(store, issued: datetime, valley_from_h: int, zone: str = "DE") -> None:
    """A live forecast run issued at `issued` for 72 h: 400 g/kWh, 20 g/kWh for 4 hours from
    `valley_from_h` hours after T."""
    first = issued.replace(minute=0, second=0, microsecond=0)
    readings = []
    for i in range(72):
        at = first + i * HOUR
        cheap = T + valley_from_h * HOUR <= at < T + (valley_from_h + 4) * HOUR
        readings.append(IntensityReading(zone=zone, at=at, duration_s=3600, gco2_per_kwh=20.0 if cheap else 400.0,
                                         signal="average", kind="forecast", issued_at=issued,
                                         source="electricitymaps"))
    CarbonSignals(store, track_status=False).writes.store_readings(readings)


def planner_for(store, clocks, *, full_replan_s: float | None = SIX_HOURS, policy: str = "greedy") -> Planner:
    # node_timeout_s: the nodes' heartbeats stay put while the test moves the clock
    return Planner(store, make_policy(policy, plan_interval_s=15.0), clock=lambda: clocks.now,
                   monotonic=lambda: clocks.mono, plan_interval_s=15.0, full_replan_s=full_replan_s,
                   node_timeout_s=30 * 24 * 3600.0)


def submit(service, **body) -> int:
    return service.submit(ROOT, {"argv": ["true"], "gpus": 1, "est_runtime_s": 4 * 3600, **body})["id"]


def plan_of(store, job_id: int):
    with store.read() as conn:
        r = conn.execute(select(jobs.c.state, jobs.c.planned_node, jobs.c.planned_gpu_ids, jobs.c.planned_start)
                         .where(jobs.c.id == job_id)).one()
    return r.state, r.planned_node, r.planned_gpu_ids, r.planned_start


def near(start: datetime, hours: int) -> bool:
    """Whether a planned start is at the valley `hours` after T (slots follow the clock)."""
    return abs(start - (T + hours * HOUR)) <= timedelta(minutes=15)


def new_forecast(store, clocks, valley_from_h: int) -> None:
    """A newer forecast run, visible from the next tick on."""
    clocks.advance(60)
    forecast(store, clocks.now, valley_from_h)
    clocks.advance(60)


@pytest.fixture
def world(store, clocks):
    """One DE node with one GPU; the forecast's cheap hours are +10 h to +14 h."""
    forecast(store, T - HOUR, 10)
    return add_node(store, "a")


def test_an_incremental_tick_keeps_a_plan_a_full_re_plan_would_move(store, service, clocks, world):
    planner = planner_for(store, clocks)
    job = submit(service)
    first = planner.tick()
    assert first.full and first.kept == 0 and first.planned == 1
    _, node, gpu_ids, start = plan_of(store, job)
    assert start == T + 10 * HOUR  # in the valley

    new_forecast(store, clocks, 30)  # the valley moved to +30 h
    # What a full re-plan would do now (and what `carbonsched plan` shows): move it.
    _, preview = planner.preview()
    assert near(preview.by_job()[job].start_at, 30)

    second = planner.tick()
    assert not second.full and second.kept == 1 and not second.skipped
    assert second.moved == 0
    assert plan_of(store, job) == ("PLANNED", node, gpu_ids, start)

    # Once full_replan_s has passed (monotonic) since the first tick, a tick re-plans it fully.
    # (Only the monotonic clock jumps: six hours on the wall clock would age the forecast out.)
    clocks.mono += SIX_HOURS - 121
    assert not planner.full_replan_due()
    clocks.advance(1)
    third = planner.tick()
    assert third.full and third.kept == 0 and third.moved == 1
    assert near(plan_of(store, job)[3], 30)
    # ... and the next ones are incremental again.
    assert not planner.tick().full


def test_a_new_job_is_planned_around_the_kept_plans(store, service, clocks, world):
    planner = planner_for(store, clocks)
    first = submit(service)
    planner.tick()
    kept = plan_of(store, first)
    assert kept[3] == T + 10 * HOUR

    new_forecast(store, clocks, 30)
    second = submit(service)
    stats = planner.tick()
    assert not stats.full and stats.kept == 1 and stats.planned == 1 and stats.moved == 0
    assert plan_of(store, first) == kept
    state, node, gpu_ids, start = plan_of(store, second)
    assert (state, node, gpu_ids) == ("PLANNED", "a", world)
    # One GPU: the new job does not overlap the kept run (it took the new valley at +30 h).
    assert start >= kept[3] + 4 * HOUR or start + 4 * HOUR <= kept[3]
    assert near(start, 30)


def test_a_kept_plan_whose_gpu_went_unhealthy_is_planned_again(store, service, clocks, world):
    (b,) = add_node(store, "b")
    planner = planner_for(store, clocks)
    job = submit(service)
    planner.tick()
    _, node, (gpu_id,), start = plan_of(store, job)
    with store.write() as conn:
        conn.execute(update(gpus).where(gpus.c.id == gpu_id).values(healthy=False))
    clocks.advance(60)
    with store.read() as conn:
        snap, _ = planner.snapshot(conn, incremental=True)
    assert set(snap.keep) == {job}  # offered to the policy to keep...
    stats = planner.tick()
    assert not stats.full and stats.kept == 0 and stats.moved == 1  # offered, did not fit
    state, new_node, new_gpus, new_start = plan_of(store, job)
    assert state == "PLANNED" and new_node != node and new_gpus != [gpu_id]
    assert near(new_start, 10)  # still the valley, on the other node


def test_a_pinned_plan_is_pinned_not_kept(store, service, clocks, world):
    planner = planner_for(store, clocks)
    job = submit(service)
    planner.tick()
    soon = clocks.now + timedelta(seconds=120)
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job).values(planned_start=soon))
    clocks.advance(60)  # it starts 60 s from now: after the next tick, so kept
    with store.read() as conn:
        snap, _ = planner.snapshot(conn, incremental=True)
    assert set(snap.keep) == {job} and not snap.pinned
    assert snap.keep[job].start_at == soon and snap.keep[job].node == "a"
    clocks.advance(50)  # now the start falls within the plan interval
    with store.read() as conn:
        snap, _ = planner.snapshot(conn, incremental=True)
    assert set(snap.pinned) == {job} and not snap.keep


def test_without_full_replan_every_tick_is_full(store, service, clocks, world):
    planner = planner_for(store, clocks, full_replan_s=None)
    job = submit(service)
    assert planner.tick().full
    assert plan_of(store, job)[3] == T + 10 * HOUR
    new_forecast(store, clocks, 30)
    stats = planner.tick()
    assert stats.full and stats.kept == 0 and stats.moved == 1
    assert near(plan_of(store, job)[3], 30)


def test_a_due_full_re_plan_is_not_skipped_after_an_incremental_one(store, service, clocks, world):
    """The fingerprint skip vouches only for plans of the same kind: with nothing changed, a
    full re-plan that falls due after an incremental run still runs."""
    planner = planner_for(store, clocks)
    calls = []
    inner = planner.policy.plan
    planner.policy.plan = lambda snap: calls.append(bool(snap.keep)) or inner(snap)
    submit(service)
    assert planner.tick().full
    assert planner.tick().skipped  # incremental after an identical full run: nothing to do
    submit(service)
    assert not planner.tick().full
    while not planner.tick().skipped:  # (a written plan may change the snapshot once)
        pass
    assert calls[-1] is True  # the last run was incremental
    n = len(calls)
    assert planner.tick().skipped and len(calls) == n  # unchanged, not due: skipped
    clocks.mono += SIX_HOURS  # due; the wall clock (and so the snapshot) has not moved
    stats = planner.tick()
    assert stats.full and not stats.skipped and len(calls) == n + 1 and calls[-1] is False
    assert planner.tick().skipped  # incremental after an identical full run: nothing to do


def test_the_log_line_says_incremental_and_how_many_were_kept(store, service, clocks, world, caplog):
    planner = planner_for(store, clocks)
    submit(service)
    planner.tick()
    submit(service)
    clocks.advance(60)
    with caplog.at_level(logging.INFO, logger="scheduler.daemon.planner"):
        planner.tick()
    assert any("incremental" in r.getMessage() and "1 of 1 earlier plans kept" in r.getMessage() for r in caplog.records)


def test_the_planner_process_spec_carries_full_replan(store):
    spec = PlannerSpec(db_url=str(store.engine.url), policy="greedy", full_replan_s=SIX_HOURS)
    assert build_planner(spec, store).full_replan_s == SIX_HOURS
    assert build_planner(PlannerSpec(db_url="", policy="greedy"), store).full_replan_s is None


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_a_bad_full_replan_is_refused(store, bad):
    with pytest.raises(ValueError, match="full_replan_s"):
        Planner(store, make_policy("greedy"), full_replan_s=bad)


def test_a_full_re_plan_offers_the_stored_plans_as_its_starting_point(store, service, clocks, world):
    planner = planner_for(store, clocks, full_replan_s=None)
    job = submit(service)
    planner.tick()
    _, node, gpu_ids, start = plan_of(store, job)
    clocks.advance(60)
    with store.read() as conn:
        snap, _ = planner.snapshot(conn)
    assert not snap.keep and not snap.pinned  # nothing is bound to it...
    assert set(snap.previous) == {job}  # ...but the policy may start from it
    assert (snap.previous[job].node, list(snap.previous[job].gpu_ids), snap.previous[job].start_at) == \
        (node, gpu_ids, start)
    with store.read() as conn:
        snap, _ = planner.snapshot(conn, incremental=True)
    assert set(snap.keep) == {job} and not snap.previous  # between full re-plans it is kept instead


@pytest.mark.parametrize("policy", ["greedy", "cpsat", "fifo"])
def test_a_job_submitted_while_the_snapshot_is_read_starts_now_not_a_slot_later(store, clocks, policy, tmp_path):
    """On a loaded host the queue is read a moment after the tick's clock: a job submitted in
    between (its time later than the tick's now) once rounded up to the next 15-minute slot
    and waited that long on an idle cluster (seen on CI: PLANNED, starts in 870 s)."""
    add_node(store, "a")  # no carbon data: carbon-blind, as soon as possible
    late_clock = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs",
                            clock=lambda: clocks.now + timedelta(seconds=0.4))
    job = late_clock.submit(ROOT, {"argv": ["true"], "gpus": 1, "est_runtime_s": 3600})["id"]
    planner_for(store, clocks, policy=policy).tick()
    state, _, _, start = plan_of(store, job)
    assert state == "PLANNED" and abs(start - clocks.now) < timedelta(seconds=1), (start, clocks.now)
