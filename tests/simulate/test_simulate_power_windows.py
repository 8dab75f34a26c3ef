"""Site power budgets in the simulator (issue 29 item 3): a zone's daily demand-response
window is planned through (no planned start draws the zone over the cap in force) and the
simulated power is measured against the cap in force at each moment (`over_cap_s`)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from policies.model.energy import generic_power_w
from policies.types import QueuedJob
from scheduler.simulate.cluster import ClusterSpecError, cluster_from_dict
from scheduler.simulate.forecasts import ForecastModel
from scheduler.simulate.intensity import ZoneIntensity
from scheduler.simulate.model import Simulation
from scheduler.simulate.settings import SimSettings

START = datetime(2022, 10, 19, 0, tzinfo=timezone.utc)
GPUS = 4
PEAK_W = GPUS * generic_power_w("H100", None)  # what four busy H100s draw by the planner's model


def _flat_zone() -> ZoneIntensity:
    return ZoneIntensity(zone="DE", first_hour=int(START.timestamp() // 3600), values_g_per_kwh=np.full(96, 300.0),
                         signal="average", source="synthetic")


def _run(windows: list[dict] | None, **budget):
    zone = ({"power_windows": windows} if windows is not None else {}) | budget
    cluster = cluster_from_dict({"zone": {"DE": zone}, "node": [{"name": "n", "zone": "DE", "gpus": f"{GPUS}xH100"}]})
    carbon = {"DE": _flat_zone()}
    jobs = [QueuedJob(id=i + 1, gpus=1, gpu_mem_gib=10, submitted_at=START + timedelta(minutes=30 * i),
                      est_runtime_s=2 * 3600.0, deadline=START + timedelta(hours=30)) for i in range(12)]
    sim = Simulation(cluster=cluster, jobs=jobs, carbon=carbon, policy="greedy",
                     forecast=ForecastModel(kind="perfect", zones=carbon, name="perfect"),
                     settings=SimSettings(plan_interval_s=900.0, wake_on_submit=True))
    return sim.run()


def test_a_demand_response_window_at_60_percent_of_peak_is_never_exceeded():
    window = {"start": "02:00", "end": "06:00", "cap_w": 0.6 * PEAK_W}
    run = _run([window])
    meter = run.meters["DE"]
    assert all(r.state == "done" for r in run.records)
    assert meter.over_cap_s == 0.0
    lo, hi = (START + timedelta(hours=h) for h in (2, 6))
    in_window = [w for t, w, _ in meter.timeline if lo.timestamp() <= t < hi.timestamp()]
    assert in_window and max(in_window) <= 0.6 * PEAK_W + 1e-6
    # without the window the same queue draws more than that in those hours
    free = _run(None).meters["DE"]
    assert max(w for t, w, _ in free.timeline if lo.timestamp() <= t < hi.timestamp()) > 0.6 * PEAK_W


def test_the_meter_counts_time_over_the_cap_in_force_only():
    from scheduler.power_budget import parse_zone_budget
    from scheduler.simulate.records import ZoneMeter

    budget = parse_zone_budget("DE", {"power_windows": [{"start": "01:00", "end": "02:00", "cap_w": 100.0}]})
    meter = ZoneMeter(zone="DE", pue=1.0, intensity=_flat_zone(), budget=budget, last_s=START.timestamp())
    meter.change(START.timestamp(), 500.0)  # 500 W from 00:00 to 03:00: over the cap only in 01:00-02:00
    meter.advance((START + timedelta(hours=3)).timestamp())
    assert meter.over_cap_s == pytest.approx(3600.0)


def test_a_bad_window_in_the_cluster_file_is_a_one_line_error():
    with pytest.raises(ClusterSpecError, match="HH:MM"):
        cluster_from_dict({"zone": {"DE": {"power_windows": [{"start": "2am", "end": "06:00", "cap_w": 1}]}},
                           "node": [{"name": "n", "zone": "DE", "gpus": "1xH100"}]})


def test_a_dated_event_and_the_sites_static_power_are_planned_through():
    """A demand-response event on one date (not daily) at 60 % of the GPUs' peak plus the
    hosts' static power: the GPUs get the cap less the static power in those hours."""
    static = 0.25 * PEAK_W
    event = {"start": (START + timedelta(hours=2)).isoformat(), "end": (START + timedelta(hours=6)).isoformat(),
             "cap_w": 0.6 * PEAK_W + static}
    run = _run(None, power_events=[event], static_power_w=static, power_cap_w=PEAK_W + static)
    meter = run.meters["DE"]
    assert all(r.state == "done" for r in run.records) and meter.over_cap_s == 0.0
    lo, hi = (START + timedelta(hours=h) for h in (2, 6))
    in_event = [w for t, w, _ in meter.timeline if lo.timestamp() <= t < hi.timestamp()]
    assert in_event and max(in_event) <= 0.6 * PEAK_W + 1e-6
    # the next day at the same hours nothing is capped below the peak: the event is dated
    assert run.meters["DE"].budget.gpu_cap_at(lo + timedelta(days=1)) == pytest.approx(PEAK_W)
