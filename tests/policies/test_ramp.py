"""Ramp limits (issue 29): no more new GPU load a minute than a site allows (`policies.pricing.ramp`).

Every policy's plan is staggered afterwards, in the daemon's planner and the simulator alike:
the starts of a zone with `ramp_w_per_min`, in order, are held back so that the power of the
jobs starting in any 60 seconds, those started in the minute before included, stays within it.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from policies.types import Assignment, Estimate, Plan, QueuedJob
from policies.pricing.ramp import RecentStart, stagger_starts
from scheduler.power_budget import parse_zone_budget
from scheduler.simulate.cluster import cluster_from_dict
from scheduler.simulate.forecasts import ForecastModel
from scheduler.simulate.intensity import ZoneIntensity
from scheduler.simulate.model import Simulation
from scheduler.simulate.settings import SimSettings

NOW = datetime(2022, 10, 19, tzinfo=timezone.utc)


def _a(job_id: int, gpu: int, start_s: float, power_w: float = 700.0, runtime_s: float = 3600.0) -> Assignment:
    start = NOW + timedelta(seconds=start_s)
    return Assignment(job_id, "n", (gpu,), start, Estimate(finish_at=start + timedelta(seconds=runtime_s),
                                                            energy_j=power_w * runtime_s, runtime_s=runtime_s),
                      explanation="greedy: 1xH100")


def _most_in_a_minute(starts: list[tuple[datetime | float, float]]) -> float:
    """The most power started in any 60 s (starts as datetimes or epoch seconds)."""
    secs = [(s.timestamp() if isinstance(s, datetime) else s, w) for s, w in starts]
    return max(sum(w for s2, w in secs if 0 <= s - s2 < 60) for s, _ in secs)


def test_starts_are_held_back_in_order_so_no_minute_takes_more_than_the_limit():
    plan = Plan(assignments=tuple(_a(i, i, 0.0) for i in range(1, 7)) + (_a(7, 7, 30.0),))
    zones = {g: "DE" for g in range(1, 8)}
    out = stagger_starts(plan, NOW, zones, {"DE": 1500.0})  # two 700 W jobs a minute
    starts = sorted((a.start_at, 700.0) for a in out.assignments)
    assert _most_in_a_minute(starts) <= 1500.0
    at = {a.job_id: (a.start_at - NOW).total_seconds() for a in out.assignments}
    assert at[1] == at[2] == 0.0 and at[3] == at[4] == 60.0 and at[5] == at[6] == 120.0 and at[7] == 180.0
    held = {a.job_id: a for a in out.assignments}[3]
    assert held.estimate.finish_at == NOW + timedelta(seconds=60 + 3600)  # it runs as long as planned
    assert "held back 60 s by DE's ramp limit (1.5 kW of new load a minute)" in held.explanation


def test_recent_starts_pinned_jobs_and_other_zones():
    plan = Plan(assignments=(_a(1, 1, 0.0), _a(2, 2, 0.0), _a(3, 3, 0.0)))
    zones = {1: "DE", 2: "DE", 3: "GB"}
    # 1,000 W started 20 s ago: job 1 (pinned, about to be claimed) is counted, never moved; job 2 waits
    out = stagger_starts(plan, NOW, zones, {"DE": 1800.0},
                         recent=[RecentStart("DE", NOW - timedelta(seconds=20), 1000.0)], pinned=[1])
    at = {a.job_id: (a.start_at - NOW).total_seconds() for a in out.assignments}
    assert at[1] == 0.0 and at[3] == 0.0  # GB has no limit
    assert at[2] == 40.0  # the 20 s-old start drops out of the minute
    # a job over the limit alone starts once nothing else has in the minute before
    big = stagger_starts(Plan(assignments=(_a(1, 1, 0.0), _a(2, 2, 0.0, power_w=5000.0))), NOW, zones, {"DE": 1000.0})
    assert {a.job_id: (a.start_at - NOW).total_seconds() for a in big.assignments} == {1: 0.0, 2: 60.0}


@pytest.mark.parametrize("value, words", [(-1, "positive number of watts"), ("fast", "positive number of watts")])
def test_a_bad_ramp_limit_is_refused_with_the_keys_path(value, words):
    with pytest.raises(ValueError, match=words) as e:
        parse_zone_budget("DE", {"ramp_w_per_min": value})
    assert "zones.DE.ramp_w_per_min" in str(e.value)
    assert parse_zone_budget("DE", {"ramp_w_per_min": 5000}).ramp_w_per_min == 5000.0  # a ramp alone is a budget


def test_the_simulated_cluster_never_takes_on_more_new_load_a_minute_than_its_ramp():
    """Twelve jobs arrive together on an idle 8-GPU node; the ramp allows about two a minute."""
    start = NOW
    carbon = {"DE": ZoneIntensity(zone="DE", first_hour=int(start.timestamp() // 3600),
                                  values_g_per_kwh=np.full(96, 300.0), signal="average", source="synthetic")}
    jobs = [QueuedJob(id=i + 1, gpus=1, gpu_mem_gib=10, submitted_at=start, est_runtime_s=1800.0,
                      deadline=start + timedelta(hours=30)) for i in range(12)]

    def run(ramp):
        zone = {"ramp_w_per_min": ramp} if ramp else {}
        cluster = cluster_from_dict({"zone": {"DE": zone}, "node": [{"name": "n", "zone": "DE", "gpus": "8xH100"}]})
        return Simulation(cluster=cluster, jobs=jobs, carbon=carbon, policy="greedy",
                          forecast=ForecastModel(kind="perfect", zones=carbon, name="perfect"),
                          settings=SimSettings(plan_interval_s=900.0, wake_on_submit=True)).run()

    free = run(None)
    power = max(r.planned_power_w for r in free.records)
    assert _most_in_a_minute([(r.start_s, r.planned_power_w) for r in free.records]) > 4 * power  # all at once
    ramped = run(2.5 * power)
    assert all(r.state == "done" for r in ramped.records)
    starts = [(r.start_s, r.planned_power_w) for r in ramped.records]
    assert _most_in_a_minute(starts) <= 2.5 * power + 1e-6
    assert max(s for s, _ in starts) - min(s for s, _ in starts) >= 60.0 * 3  # 8 at first: four minutes of starts


def test_the_daemon_planner_stores_staggered_starts_and_counts_jobs_started_in_the_last_minute(store, tmp_path):
    """Four 1-GPU jobs for an idle 4-GPU node whose zone takes ~1.5 jobs' power a minute, one
    job of that zone started 30 s ago: the stored planned starts are a minute apart, the
    first once that start has aged out, each with its reason."""
    from sqlalchemy import select, update

    from policies import get_policy
    from scheduler.clock import utcnow
    from scheduler.daemon.access import Caller, ServiceConfig
    from scheduler.daemon.planner import Planner
    from scheduler.daemon.service import JobService
    from scheduler.site import SiteConfig
    from scheduler.store.models import gpus, jobs, nodes

    now = utcnow()
    with store.engine.begin() as conn:
        conn.execute(nodes.insert().values(name="n1", zone="Z", backend="emulated", emulated=True,
                                           registered_at=now, last_heartbeat=now))
        for i in range(5):
            conn.execute(gpus.insert().values(node_name="n1", index=i, uuid=f"u{i}", model="H100", vendor="nvidia",
                                              memory_gib=80, healthy=True, power_limit_w=700,
                                              power_limit_default_w=700))
        gpu_ids = [r.id for r in conn.execute(select(gpus.c.id).order_by(gpus.c.index))]
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path)
    root = Caller(uid=0, gid=0)
    running = service.submit(root, {"argv": ["true"], "gpus": 1, "est_runtime_s": 3600})["id"]
    with store.engine.begin() as conn:  # it started 30 s ago on GPU 0, planned at 600 W
        conn.execute(update(jobs).where(jobs.c.id == running).values(
            state="RUNNING", node="n1", gpu_ids=[gpu_ids[0]], started_at=now - timedelta(seconds=30),
            est_energy_j=600.0 * 3600, est_runtime_planned_s=3600.0))
        conn.execute(update(gpus).where(gpus.c.id == gpu_ids[0]).values(job_id=running))
    ids = [service.submit(root, {"argv": ["true"], "gpus": 1, "est_runtime_s": 3600})["id"] for _ in range(4)]
    planner = Planner(store, get_policy("fifo"), site=SiteConfig.from_config({"zones": {"Z": {"ramp_w_per_min": 900}}}))
    planner.tick()
    with store.read() as conn:
        rows = {r.id: r for r in conn.execute(select(jobs).where(jobs.c.id.in_(ids)))}
    starts = sorted(r.planned_start for r in rows.values())
    assert all(r.state == "PLANNED" for r in rows.values())
    gaps = [(b - a).total_seconds() for a, b in zip(starts, starts[1:])]
    assert all(g >= 60.0 - 1e-3 for g in gaps), gaps  # one job's ~600 W a minute at most
    assert starts[0] >= now + timedelta(seconds=30) - timedelta(seconds=1)  # after the running one's minute
    assert all("ramp limit" in (r.explanation or "") for r in rows.values()
               if r.planned_start > now + timedelta(seconds=1))
