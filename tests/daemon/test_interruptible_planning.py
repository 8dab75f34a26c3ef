"""Issue 30 across the seam: the daemon's planner (store -> Snapshot -> greedy -> store) plans
an interruptible job in segments around a dirty stretch of the forecast and stores the
segments, the interrupt time and the resume time its agent acts on; the same job, not
interruptible, is planned in one piece. SQLite and PostgreSQL (the `store` fixture)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from scheduler import interruptible
from scheduler.carbon import CarbonSignals
from scheduler.daemon.access import ServiceConfig
from scheduler.daemon.service import JobService
from scheduler.store.models import jobs
from telemetry.grid.readings import IntensityReading
from test_planner_incremental import HOUR, ROOT, T, Clocks, add_node, planner_for


def dirty_middle(store, zone: str = "DE") -> None:
    """A forecast issued at T: 50 g/kWh for 2 h, 600 for the next 6 h, 50 after."""
    readings = [IntensityReading(zone=zone, at=T + i * HOUR, duration_s=3600,
                                 gco2_per_kwh=600.0 if 2 <= i < 8 else 50.0, signal="average", kind="forecast",
                                 issued_at=T, source="electricitymaps") for i in range(48)]
    CarbonSignals(store, track_status=False).writes.store_readings(readings)


def planned(store, job_id):
    with store.read() as conn:
        return conn.execute(select(jobs.c.state, jobs.c.planned_start, jobs.c.planned_segments,
                                   jobs.c.planned_interrupt_at, jobs.c.planned_resume_at)
                            .where(jobs.c.id == job_id)).one()


@pytest.mark.parametrize("kind", ["checkpoint", "pause"])
def test_greedy_cuts_an_interruptible_job_around_the_dirty_hours_and_the_daemon_stores_the_cut(store, tmp_path, kind):
    clocks = Clocks()
    add_node(store, "a")
    dirty_middle(store)
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs", clock=lambda: clocks.now)
    # 4 h of work by T + 10 h: in one piece it must run 2 h of the dirty stretch; cut, none
    body = {"argv": ["true"], "gpus": 1, "est_runtime_s": 4 * 3600, "deadline": (T + 10 * HOUR).isoformat()}
    cut = service.submit(ROOT, {**body, "interruptible": kind, "min_run_s": 1800, "resume_cost_s": 60})["id"]
    planner_for(store, clocks, policy="greedy").tick()
    row = planned(store, cut)
    segments = interruptible.segments_from_json(row.planned_segments)
    assert row.state == "PLANNED" and len(segments) >= 2, row
    assert row.planned_interrupt_at == segments[0][1] and row.planned_resume_at == segments[1][0]
    assert segments[0][0] == row.planned_start
    dirty = (T + 2 * HOUR, T + 8 * HOUR)
    in_dirty_s = sum(max(0.0, (min(b, dirty[1]) - max(a, dirty[0])).total_seconds()) for a, b in segments)
    assert in_dirty_s < 3600, segments  # it runs in the clean hours, around the dirty ones
    assert segments[-1][1] <= T + 10 * HOUR


def test_the_same_job_not_interruptible_is_planned_in_one_piece(store, tmp_path):
    clocks = Clocks()
    add_node(store, "a")
    dirty_middle(store)
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs", clock=lambda: clocks.now)
    whole = service.submit(ROOT, {"argv": ["true"], "gpus": 1, "est_runtime_s": 4 * 3600,
                                  "deadline": (T + 10 * HOUR).isoformat()})["id"]
    planner_for(store, clocks, policy="greedy").tick()
    row = planned(store, whole)
    assert row.state == "PLANNED" and not row.planned_segments and row.planned_interrupt_at is None
