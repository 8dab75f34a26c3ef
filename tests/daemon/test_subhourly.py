"""Sub-hourly carbon data (issue 26): a real 30-minute GB trace is imported at its own step,
forecast and planned at it, in the store (SQLite and PostgreSQL), the planner and the
simulator; a file whose step changes is refused.

The data: Let's Wait Awhile's GB 2020 half-hours (tests/data/carbon/SOURCE.md). On
2020-06-11 the half-hour 14:00-14:30 is the cleanest of the next twelve hours (117.6 g/kWh),
but its hour averages 136.0 (14:30 holds 154.3), so on hourly means 00:00-01:00 the next day
(131.9) looks cleanest: a planner that sees half-hours starts a 30-minute job at 14:00, one
that sees hours starts it at midnight.
"""

from __future__ import annotations

import csv
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, select

from scheduler.carbon import CarbonSignals
from scheduler.carbon_config import CarbonConfig
from scheduler.daemon.access import Caller, ServiceConfig
from scheduler.daemon.planner import Planner
from scheduler.daemon.policy_factory import make_policy
from scheduler.daemon.service import JobService
from scheduler.store.carbon_models import carbon_intensity
from scheduler.store.models import gpus, jobs, nodes
from telemetry.grid.csv_import import MixedStepsError, read_trace

from tests.conftest import DATA_DIR

GB30 = DATA_DIR / "carbon" / "GB_2020-04-27_to_2020-06-21_30min_lwa.csv"
MIXED = DATA_DIR / "carbon" / "GB_2020-10-30_to_2020-10-31_mixed_lwa.csv"
T = datetime(2020, 6, 11, 13, 0, tzinfo=timezone.utc)
GREEN = datetime(2020, 6, 11, 14, 0, tzinfo=timezone.utc)       # 117.6 g/kWh for half an hour
HOURLY_PICK = datetime(2020, 6, 12, 0, 0, tzinfo=timezone.utc)  # the cleanest hour on hourly means
ROOT = Caller(uid=0, gid=0)


def rows(path=GB30) -> list[tuple[datetime, float]]:
    with open(path, newline="") as f:
        r = csv.reader(f)
        next(r)
        return [(datetime.fromisoformat(t).replace(tzinfo=timezone.utc), float(v)) for t, v in r]


def write_plain(path, values: list[tuple[datetime, float]]) -> None:
    path.write_text("time,gco2_per_kwh\n" + "".join(f"{t.isoformat()},{v}\n" for t, v in values))


def hourly_mean_file(path) -> None:
    """The same data averaged into whole hours, as an hourly-only source would give it."""
    by_hour: dict[datetime, list[float]] = {}
    for t, v in rows():
        by_hour.setdefault(t.replace(minute=0), []).append(v)
    write_plain(path, [(h, sum(vs) / len(vs)) for h, vs in sorted(by_hour.items())])


def test_the_data_has_a_green_half_hour_that_its_hourly_mean_hides():
    half = dict(rows())
    window = [T + timedelta(minutes=30 * k) for k in range(24)]
    assert min(window, key=half.get) == GREEN
    hours = {t: (half[t] + half[t + timedelta(minutes=30)]) / 2 for t in window[::2]}
    assert min(hours, key=hours.get) == HOURLY_PICK


# -- import -------------------------------------------------------------------------------------

def test_a_30_minute_file_is_stored_at_30_minutes(store):
    result = CarbonSignals(store, track_status=False, clock=lambda: T).writes.import_file(GB30, zone="GB")
    assert result.step_s == {"GB": 1800} and result.rows_stored == 2688
    with store.read() as conn:
        durations = set(conn.execute(select(carbon_intensity.c.duration_s)
                                     .where(carbon_intensity.c.zone == "GB")).scalars())
    assert durations == {1800}


def test_a_real_file_that_turns_from_30_to_15_minutes_is_refused_in_one_line(store):
    with pytest.raises(MixedStepsError) as e:
        CarbonSignals(store, track_status=False).writes.import_file(MIXED, zone="GB")
    message = str(e.value)
    assert "\n" not in message
    assert "mixed time steps for zone GB: 30 min from 2020-10-30T00:00Z to 2020-10-31T00:00Z, 15 min" in message
    with store.read() as conn:
        assert conn.execute(select(carbon_intensity.c.zone)).first() is None  # nothing stored


def test_the_cli_says_the_mixed_steps_in_one_line_and_exits_2(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("CARBONSCHED_")}
    env["PYTHONPATH"] = str(DATA_DIR.parent.parent)
    proc = subprocess.run([sys.executable, "-m", "scheduler", "carbon", "import", str(MIXED), "--zone", "GB",
                           "--db", f"sqlite:///{tmp_path / 'c.db'}"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "mixed time steps" in lines[0] and "15 min" in lines[0], proc.stderr


def test_a_step_that_is_no_multiple_of_the_resolution_is_refused(tmp_path):
    t0 = datetime(2020, 6, 1, tzinfo=timezone.utc)
    write_plain(tmp_path / "odd.csv", [(t0, 100.0), (t0 + timedelta(minutes=30), 110.0),
                                       (t0 + timedelta(minutes=70), 120.0)])
    with pytest.raises(MixedStepsError, match="irregular time steps for zone GB: 30 min steps, but "
                                              "2020-06-01T00:30Z to 2020-06-01T01:10Z is 40 min"):
        read_trace(tmp_path / "odd.csv", zone="GB")


def test_a_missing_half_hour_is_a_gap_and_the_step_stays_30_minutes(tmp_path):
    data = rows()
    del data[100]
    write_plain(tmp_path / "gap.csv", data)
    trace = read_trace(tmp_path / "gap.csv", zone="GB")
    assert trace.duration_s == {"GB": 1800} and {r.duration_s for r in trace.readings} == {1800}


def test_hourly_data_stays_hourly(tmp_path):
    hourly_mean_file(tmp_path / "h.csv")
    assert read_trace(tmp_path / "h.csv", zone="GB").duration_s == {"GB": 3600}


# -- own forecast -------------------------------------------------------------------------------

def test_the_own_forecast_of_a_30_minute_zone_is_at_30_minutes_and_as_of_safe(store, tmp_path):
    """Only the history before T is known at T: the forecast ahead comes from the own
    forecaster, in half-hours shaped like the zone's recent half-hours, and importing the
    rest of the file (values after T) changes nothing in it."""
    write_plain(tmp_path / "known.csv", [(t, v) for t, v in rows() if t < T])
    config = CarbonConfig(model_fit_inline=True)
    signals = CarbonSignals(store, config, track_status=False, clock=lambda: T)
    signals.writes.import_file(tmp_path / "known.csv", zone="GB")
    end = T + timedelta(hours=24)
    before = signals.forecast("GB", T, end, as_of=T)
    assert before.level == "own" and before.complete
    assert before.method.startswith("gradient-boosted") and "split into 30-min steps" in before.method
    assert {(p.until - p.at) for p in before.points} == {timedelta(minutes=30)}
    # the halves of an hour differ (the shape), unlike an hourly forecast cut in two
    halves = [p.gco2_per_kwh for p in before.points]
    assert sum(abs(a - b) > 0.5 for a, b in zip(halves[::2], halves[1::2])) >= 12

    signals.writes.import_file(GB30, zone="GB")
    after = CarbonSignals(store, config, track_status=False, clock=lambda: T).forecast("GB", T, end, as_of=T)
    assert [(p.at, round(p.gco2_per_kwh, 9)) for p in after.points] == \
        [(p.at, round(p.gco2_per_kwh, 9)) for p in before.points]


# -- planner --------------------------------------------------------------------------------------

def _node(store, zone: str = "GB") -> None:
    with store.write() as conn:
        conn.execute(insert(nodes).values(name="gb1", zone=zone, backend="emulated", emulated=True,
                                          registered_at=T, last_heartbeat=T))
        conn.execute(insert(gpus).values(node_name="gb1", index=0, uuid="gb1-0", model="H100",
                                         vendor="nvidia", memory_gib=80.0, healthy=True))


def _plan_half_hour_job(store, tmp_path, path) -> tuple[datetime, object]:
    CarbonSignals(store, track_status=False, clock=lambda: T).writes.import_file(path, zone="GB", as_forecast=True)
    _node(store)
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs", clock=lambda: T)
    job = service.submit(ROOT, {"argv": ["true"], "gpus": 1, "est_runtime_s": 1800,
                                "deadline": (T + timedelta(hours=12)).isoformat()})["id"]
    planner = Planner(store, make_policy("greedy", plan_interval_s=15.0), clock=lambda: T, plan_interval_s=15.0)
    with store.read() as conn:
        snap, _ = planner.snapshot(conn)
    planner.tick()
    with store.read() as conn:
        start = conn.execute(select(jobs.c.planned_start).where(jobs.c.id == job)).scalar_one()
    return start.replace(tzinfo=timezone.utc) if start.tzinfo is None else start, snap


def test_the_planner_starts_a_half_hour_job_in_the_green_half_hour(store, tmp_path):
    start, snap = _plan_half_hour_job(store, tmp_path, GB30)
    curve = snap.carbon["GB"]
    assert snap.slot_s == 900.0 and curve.step_s == 900.0  # 15-min slots: finer than the data
    k = int((GREEN - curve.start).total_seconds() // curve.step_s)
    assert curve.values_g_per_kwh[k] == curve.values_g_per_kwh[k + 1] == pytest.approx(117.6, abs=0.05)
    assert start == GREEN


def test_on_the_hourly_mean_of_the_same_data_the_planner_misses_it(store, tmp_path):
    hourly_mean_file(tmp_path / "h.csv")
    start, _ = _plan_half_hour_job(store, tmp_path, tmp_path / "h.csv")
    assert HOURLY_PICK <= start < HOURLY_PICK + timedelta(hours=1)


# -- simulator ------------------------------------------------------------------------------------

def test_the_simulator_replays_the_trace_at_30_minutes_and_plans_on_half_hours():
    from scheduler.simulate.forecasts import parse_forecast
    from scheduler.simulate.intensity import load_zone_files

    zone = load_zone_files("GB", [GB30])
    assert zone.step_s == 1800.0
    half = dict(rows())
    # the truth is integrated at 30 minutes: the green half-hour alone, not its hour's mean
    a = GREEN.timestamp()
    assert zone.integral_g_per_kwh_s(a, a + 1800) / 1800 == pytest.approx(half[GREEN])
    curve = parse_forecast("perfect", {"GB": zone}).curve("GB", T.timestamp(), 12 * 3600)
    assert curve.step_s == 1800.0 and curve.start == T
    assert curve.values_g_per_kwh[2] == pytest.approx(half[GREEN])
    hourly = parse_forecast("perfect+hourly", {"GB": zone}).curve("GB", T.timestamp(), 12 * 3600)
    assert hourly.step_s == 3600.0 and hourly.values_g_per_kwh[1] == pytest.approx(
        (half[GREEN] + half[GREEN + timedelta(minutes=30)]) / 2)
    model = parse_forecast("model", {"GB": zone}).curve("GB", T.timestamp(), 12 * 3600)
    assert model.step_s == 1800.0


def test_a_simulated_half_hour_job_emits_less_on_half_hours_than_on_hourly_means(tmp_path):
    """One 30-minute job with 12 h of slack at T, greedy, on each view of the same trace: the
    emissions, counted on the 30-minute truth in both runs, show what hourly averaging cost."""
    from scheduler.simulate.cluster import load_cluster
    from scheduler.simulate.intensity import load_zone_files
    from scheduler.simulate.runner import run_policies
    from scheduler.simulate.scenario import build_scenario
    from scheduler.simulate.settings import SimSettings
    from scheduler.simulate.traces import read_jobs

    (tmp_path / "c.toml").write_text('[[node]]\nname = "gb"\nzone = "GB"\ngpus = "1xH100"\n')
    (tmp_path / "j.csv").write_text("arrival_time,length,cpus\n0.0,1800.0,1\n")
    scenario = build_scenario(load_cluster(tmp_path / "c.toml"), read_jobs(tmp_path / "j.csv"),
                              {"GB": load_zone_files("GB", [GB30])}, start=T, slack_s=11.5 * 3600)
    kg = {}
    for fc in ("perfect", "perfect+hourly"):
        result = run_policies(scenario, ["greedy"], forecast=fc, settings=SimSettings())
        kg[fc] = result.summaries["greedy"]["kgco2"]
        assert result.summaries["greedy"]["deadline_misses"] == 0
    half = dict(rows())
    assert kg["perfect"] < kg["perfect+hourly"]
    # the ratio of the two is that of the half-hours they chose: 14:00 against 00:00 or 00:30
    assert kg["perfect+hourly"] / kg["perfect"] == pytest.approx(
        min(half[HOURLY_PICK], half[HOURLY_PICK + timedelta(minutes=30)]) / half[GREEN], rel=0.02)
