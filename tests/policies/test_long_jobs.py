"""Long jobs are placed by their whole run (issue 24, item 6).

Past the end of a zone's forecast a planner prices the zone at its typical intensity for the
month and hour (`CarbonCurve.tail`, a `Climatology`), not at the forecast's last value: a
10-day job goes to the zone that is cleaner over 10 days, although another is cleaner for
the forecast's first hours. Every integral of a curve (fifo's, the counterfactual's, the
slot problem's, short-job packing's) prices the tail alike. The climatology is built from
actuals known at `now` only: by the daemon's planner from the store, by the simulator from
the trace's past hours.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from policies import get_policy
from policies.pricing.carbon_tail import MAX_TAIL_S, extended
from policies.model.energy import CurveIntegrator, curve_integral_g_per_kwh_s, job_gco2
from policies.types import CLIMATOLOGY_CELLS, CarbonCurve, Climatology, GpuSlot, QueuedJob, Snapshot
from policies.problem.instance import compile_problem
from policies.solvers.short_jobs import _slot_costs
from scheduler.carbon import CarbonSignals
from scheduler.carbon_climatology import LOOKBACK_DAYS, MIN_CELL_DAYS, climatology_from_hourly
from scheduler.simulate.forecasts import ForecastModel
from scheduler.simulate.intensity import ZoneIntensity
from telemetry.grid.readings import IntensityReading
from telemetry.grid.static import static_intensity

NOW = datetime(2026, 3, 2, 0, tzinfo=timezone.utc)
DAY_S = 86400.0


def flat_tail(value: float) -> Climatology:
    return Climatology((value,) * CLIMATOLOGY_CELLS, source="test")


def by_month(values: dict[int, float], default: float) -> Climatology:
    """A climatology flat within each month: `values` by month (1-12), `default` elsewhere."""
    return Climatology(tuple(values.get(m, default) for m in range(1, 13) for _ in range(24)), source="test")


# Zone A is the cleaner one for the forecast's first 6 h and at its last hour (a night dip),
# but typically dirty; zone B is middling over the forecast and typically clean.
A_FORECAST = (50.0,) * 6 + (300.0,) * 41 + (50.0,)
B_FORECAST = (150.0,) * 48


def two_zone_snapshot(*, tails: bool, runtime_s: float = 10 * DAY_S) -> Snapshot:
    a = CarbonCurve("A", NOW, 3600.0, A_FORECAST, tail=flat_tail(400.0) if tails else None)
    b = CarbonCurve("B", NOW, 3600.0, B_FORECAST, tail=flat_tail(150.0) if tails else None)
    gpus = (GpuSlot(1, "a1", "A", 0, "H100", 80.0), GpuSlot(2, "b1", "B", 0, "H100", 80.0))
    job = QueuedJob(1, 1, 10.0, NOW, est_runtime_s=runtime_s, deadline=NOW + timedelta(seconds=runtime_s + 3 * 3600))
    return Snapshot(now=NOW, jobs=(job,), gpus=gpus, carbon={"A": a, "B": b}, slot_s=900.0)


# -- placement ------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["greedy", "cpsat", "oracle"])
def test_a_ten_day_job_goes_to_the_zone_cleaner_over_ten_days_not_over_the_forecast(policy):
    plan = get_policy(policy).plan(two_zone_snapshot(tails=True))
    (a,) = plan.assignments
    assert a.node == "b1"
    # priced over its whole run: 48 h of forecast, 192 h at B's typical 150 g/kWh
    power_w = a.estimate.energy_j / a.estimate.runtime_s
    assert a.estimate.gco2 == pytest.approx(power_w * 240 * 150.0 / 1000.0, rel=1e-9)
    assert "192 h of the run past the forecast priced at B's typical values" in a.explanation


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_without_a_climatology_the_forecast_s_last_value_still_holds_past_its_end(policy):
    """The old flat extension, kept for curves without a tail: A's last hour (50 g) repeated
    makes A look cleaner over ten days."""
    (a,) = get_policy(policy).plan(two_zone_snapshot(tails=False)).assignments
    assert a.node == "a1"
    assert "past the forecast" not in a.explanation


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_a_job_inside_the_forecast_is_placed_by_the_forecast_alone(policy):
    """A 4 h job never reaches the tail: A's first 6 h are the cleanest, tails or not."""
    (a,) = get_policy(policy).plan(two_zone_snapshot(tails=True, runtime_s=4 * 3600)).assignments
    assert a.node == "a1" and a.start_at == NOW
    assert "past the forecast" not in a.explanation


def test_the_if_run_now_counterfactual_and_fifo_price_the_whole_run_too():
    snap = two_zone_snapshot(tails=True)
    (g,) = get_policy("greedy").plan(snap).assignments
    (f,) = get_policy("fifo").plan(snap).assignments
    power_w = f.estimate.energy_j / f.estimate.runtime_s
    expected_f = power_w * (sum(A_FORECAST) + 192 * 400.0) / 1000.0 if f.node == "a1" else \
        power_w * 240 * 150.0 / 1000.0
    assert f.estimate.gco2 == pytest.approx(expected_f, rel=1e-9)
    # "if run now": the mean of both zones' whole-run grams (both are free now)
    both = power_w * ((sum(A_FORECAST) + 192 * 400.0) + 240 * 150.0) / 2 / 1000.0
    assert g.estimate.gco2_if_now == pytest.approx(both, rel=1e-9)


# -- one integral ---------------------------------------------------------------------------------

def test_the_tail_takes_the_month_and_utc_hour_of_each_step():
    # the forecast ends at 2026-01-31 22:00 UTC; January is typically 100 g, February 300 g
    start = datetime(2026, 1, 31, 18, tzinfo=timezone.utc)
    curve = CarbonCurve("Z", start, 3600.0, (10.0,) * 4, tail=by_month({1: 100.0, 2: 300.0}, 999.0))
    a, b = start + timedelta(hours=3), start + timedelta(hours=8)  # 1 h forecast, 2 h Jan, 2 h Feb
    assert curve_integral_g_per_kwh_s(curve, a, b) == pytest.approx((10 + 2 * 100 + 2 * 300) * 3600.0)
    # the hour of the day, too: a tail that is 1000 g at 03:00 UTC only
    hourly = Climatology(tuple(1000.0 if h == 3 else 0.0 for _ in range(12) for h in range(24)))
    curve = CarbonCurve("Z", start, 900.0, (0.0,) * 4, tail=hourly)  # the forecast ends at 19:00
    day = datetime(2026, 2, 1, 0, tzinfo=timezone.utc)
    assert curve_integral_g_per_kwh_s(curve, day, day + timedelta(days=1)) == pytest.approx(1000.0 * 3600)
    assert curve_integral_g_per_kwh_s(curve, day, day + timedelta(hours=3)) == pytest.approx(0.0)


def test_every_integral_of_a_curve_prices_the_tail_alike():
    """CurveIntegrator (fifo, job_gco2), the slot problem (greedy, cpsat, oracle, LP bound)
    and short-job packing give the same grams for runs that cross the forecast's end."""
    rng = np.random.default_rng(7)
    tail = Climatology(tuple(rng.uniform(50, 500, CLIMATOLOGY_CELLS).round(1)))
    curve = CarbonCurve("Z", NOW, 900.0, tuple(rng.uniform(50, 500, 48 * 4).round(1)), tail=tail)
    gpus = (GpuSlot(1, "z1", "Z", 0, "H100", 80.0),)
    runtimes = [600.0, 30 * 3600.0, 3 * DAY_S, 20 * DAY_S, 90 * DAY_S]
    jobs = tuple(QueuedJob(i + 1, 1, 1.0, NOW, est_runtime_s=r) for i, r in enumerate(runtimes))
    problem = compile_problem(Snapshot(now=NOW, jobs=jobs, gpus=gpus, carbon={"Z": curve}, slot_s=900.0))
    tables = problem.cost_tables(np.arange(len(jobs)))
    power_w = 700.0
    for j, run_s in enumerate(runtimes):
        scale = problem.job_scale[j, 0]
        for slot in (0, 17, 150, problem.n_slots - 1):
            start = problem.slot_time(slot)
            by_integrator = job_gco2(curve, start, run_s, power_w)
            by_problem = tables[j, 0, slot] / scale * power_w / 3.6e6
            by_packer = _slot_costs(curve, np.array([start.timestamp()]), np.array([run_s]), np.array([power_w]), 1.0)
            by_gco2_at = problem.gco2_at("Z", start, run_s, power_w, 1.0)
            assert by_problem == pytest.approx(by_integrator, rel=1e-9)
            assert float(by_packer[0, 0]) == pytest.approx(by_integrator, rel=1e-9)
            assert by_gco2_at == pytest.approx(by_integrator, rel=1e-9)
    # and the integral is the sum of the steps' values
    end = NOW + timedelta(days=3)
    ext = extended(curve)
    ext.cover(3 * 96)
    assert curve_integral_g_per_kwh_s(curve, NOW, end) == pytest.approx(float(ext.values[:3 * 96].sum()) * 900.0)


def test_a_runtime_of_years_prices_past_the_materialised_tail_at_its_mean_and_stays_small():
    tail = by_month({7: 1000.0}, 100.0)
    curve = CarbonCurve("Z", NOW, 900.0, (200.0,) * 8, tail=tail)
    integ = CurveIntegrator(curve)
    far = NOW + timedelta(days=5000)
    total = integ.integral(NOW, far)
    ext = extended(curve)
    assert ext.values.size <= 8 + MAX_TAIL_S / 900.0 + 1
    covered = ext.covered_until_s()
    mean = float(np.mean(tail.values_g_per_kwh))
    assert total == pytest.approx(float(ext.prefix[-1]) * 900.0 + (far.timestamp() - covered) * mean, rel=1e-9)


def test_a_climatology_has_twelve_months_of_twenty_four_hours():
    with pytest.raises(ValueError, match="288 values"):
        Climatology((1.0,) * 24)
    c = by_month({2: 7.0}, 1.0)
    assert c.value(2, 23) == 7.0 and c.value(3, 0) == 1.0


# -- the climatology --------------------------------------------------------------------------------

def epoch_hour(t: datetime) -> int:
    return int(t.timestamp() // 3600)


def test_cells_are_the_mean_of_their_month_and_hour_and_thin_months_fall_back_to_the_hour_of_day():
    first = epoch_hour(datetime(2025, 3, 1, tzinfo=timezone.utc))
    hours = np.arange(first, first + 24 * (31 + 10))  # all of March, 10 days of April
    hour_of_day = hours % 24
    in_april = hours >= epoch_hour(datetime(2025, 4, 1, tzinfo=timezone.utc))
    values = 100.0 + hour_of_day + np.where(in_april, 50.0, 0.0)
    c = climatology_from_hourly(hours, values, static_g_per_kwh=999.0, label="Z actuals")
    assert c.value(3, 5) == pytest.approx(105.0)
    assert c.value(4, 5) == pytest.approx(155.0)  # 10 days >= MIN_CELL_DAYS: on its own
    # months without data: that hour's mean over everything known (31 x 105 + 10 x 155) / 41
    assert c.value(8, 5) == pytest.approx((31 * 105.0 + 10 * 155.0) / 41)
    assert "2 of 12 months" in c.source and "Z actuals" in c.source


def test_with_too_little_history_the_static_yearly_mean_fills_and_without_either_there_is_none():
    first = epoch_hour(NOW)
    two_days = np.arange(first, first + 48)
    c = climatology_from_hourly(two_days, np.full(48, 80.0), static_g_per_kwh=400.0)
    assert c.value(3, 0) == 400.0  # 2 values per hour < MIN_HOUR_DAYS
    assert climatology_from_hourly([], [], static_g_per_kwh=400.0).values_g_per_kwh == (400.0,) * 288
    assert climatology_from_hourly([], []) is None
    week = np.arange(first, first + 24 * MIN_CELL_DAYS)
    assert climatology_from_hourly(week, np.full(week.size, 80.0)).value(3, 0) == 80.0


def readings(zone: str, start: datetime, hours: int, value, *, kind: str = "actual",
             issued: datetime | None = None) -> list[IntensityReading]:
    out = []
    for i in range(hours):
        at = start + timedelta(hours=i)
        v = value(at) if callable(value) else value
        out.append(IntensityReading(zone=zone, at=at, duration_s=3600, gco2_per_kwh=v, signal="average", kind=kind,
                                    issued_at=issued or at + timedelta(hours=1), source="test"))
    return out


def test_the_store_climatology_uses_only_what_was_known_at_the_start_of_the_day(store):
    signals = CarbonSignals(store, track_status=False)
    now = datetime(2026, 3, 20, 15, 30, tzinfo=timezone.utc)
    day = datetime(2026, 3, 20, tzinfo=timezone.utc)
    signals.writes.store_readings(readings("XZ", day - timedelta(days=30), 30 * 24, 200.0))  # known history
    signals.writes.store_readings(readings("XZ", day, 24 * 5, 9000.0))  # today and later: not known at the day's start
    # a revision of past hours issued after the day's start is not known either
    signals.writes.store_readings(readings("XZ", day - timedelta(days=2), 24, 7000.0, issued=now))
    # older than the lookback
    signals.writes.store_readings(readings("XZ", day - timedelta(days=LOOKBACK_DAYS + 20), 24 * 10, 5000.0))
    c = signals.climatology("XZ", "average", now)
    assert c is not None
    assert set(c.values_g_per_kwh) == {200.0}
    assert "720 h" in c.source


def test_the_store_climatology_falls_back_to_the_static_yearly_mean_of_a_zone_without_history(store):
    signals = CarbonSignals(store, track_status=False)
    c = signals.climatology("DE", "average", NOW)
    assert c is not None and set(c.values_g_per_kwh) == {static_intensity("DE").gco2_per_kwh}
    assert "static" in c.source
    assert signals.climatology("NO-SUCH-ZONE", "average", NOW) is None
    assert signals.climatology("DE", "marginal", NOW) is None  # the static table is average-only


def test_the_daemon_places_a_ten_day_job_by_the_zones_stored_history(store, tmp_path):
    """End to end through the planner: the live forecast says A is cleaner for the next
    three days, a month of history says B is typically far cleaner."""
    from scheduler.daemon.access import Caller, ServiceConfig
    from scheduler.daemon.planner import Planner
    from scheduler.daemon.policy_factory import make_policy
    from scheduler.daemon.service import JobService
    from sqlalchemy import select

    from sqlalchemy import insert

    from scheduler.store.models import gpus, jobs, nodes

    now = datetime(2026, 3, 20, 12, tzinfo=timezone.utc)
    signals = CarbonSignals(store, track_status=False)
    past = now - timedelta(days=30)
    signals.writes.store_readings(readings("XA", past, 30 * 24, 600.0) + readings("XB", past, 30 * 24, 120.0))
    signals.writes.store_readings(readings("XA", now, 80, 100.0, kind="forecast", issued=now)
                           + readings("XB", now, 80, 200.0, kind="forecast", issued=now))
    with store.write() as conn:
        ids = []
        for name, zone in (("xa1", "XA"), ("xb1", "XB")):
            conn.execute(insert(nodes).values(name=name, zone=zone, backend="emulated", emulated=True,
                                              registered_at=now, last_heartbeat=now))
            ids.append(conn.execute(insert(gpus).values(node_name=name, index=0, uuid=f"{name}-0", model="H100",
                                                        vendor="nvidia", memory_gib=80.0, healthy=True)
                                    .returning(gpus.c.id)).scalar_one())
    a, b = ids
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs", clock=lambda: now)
    long_job = service.submit(Caller(0, 0), {"argv": ["true"], "gpus": 1, "est_runtime_s": 10 * DAY_S})["id"]
    short_job = service.submit(Caller(0, 0), {"argv": ["true"], "gpus": 1, "est_runtime_s": 3600})["id"]
    planner = Planner(store, make_policy("greedy"), clock=lambda: now)
    with store.read() as conn:
        snap, _ = planner.snapshot(conn)
    assert {z: c.tail is not None for z, c in snap.carbon.items()} == {"XA": True, "XB": True}
    assert snap.carbon["XB"].tail.value(3, 12) == pytest.approx(120.0)
    planner.tick()
    with store.read() as conn:
        rows = {r.id: r for r in conn.execute(select(jobs))}
    assert rows[long_job].planned_gpu_ids == [b]
    assert "past the forecast priced at XB's typical values" in rows[long_job].explanation
    assert rows[short_job].planned_gpu_ids == [a]  # an hour: the forecast decides


# -- the simulator ----------------------------------------------------------------------------------

def test_the_simulator_s_climatology_comes_from_the_trace_s_past_hours_only():
    first = epoch_hour(datetime(2022, 1, 1, tzinfo=timezone.utc))
    n = 24 * 60
    values = np.where(np.arange(n) < 24 * 40, 100.0, 900.0)  # the last 20 days are far dirtier
    zone = ZoneIntensity("DE", first, values, "average", "test trace")
    model = ForecastModel(kind="perfect", zones={"DE": zone})
    now_s = (first + 24 * 40) * 3600.0 + 5 * 3600  # day 40, 05:00
    curve = model.curve("DE", now_s, 48 * 3600.0)
    assert curve.tail is not None
    assert set(curve.tail.values_g_per_kwh) == {100.0}  # nothing from day 40 on
    assert curve.values_g_per_kwh[0] == 900.0  # the forecast itself is perfect
    # at the trace's start nothing is known: the static yearly mean
    cold = model.curve("DE", first * 3600.0, 48 * 3600.0).tail
    assert set(cold.values_g_per_kwh) == {static_intensity("DE").gco2_per_kwh}


def test_a_simulated_two_week_job_runs_where_it_is_cleaner_over_two_weeks(tmp_path):
    """Zone A is clean (50 g) for 10 days, about what the simulator's perfect forecast sees
    (48 h + 7 days), then back to its typical 600 g; zone B is 150 g throughout. With the
    climatology the job runs in B; with the forecast's last value repeated past its end (the
    planner before issue 24) it ran in A and emitted over a third more (2,900 vs 2,100
    g/kWh x days)."""
    from scheduler.simulate.cluster import cluster_from_dict
    from scheduler.simulate.runner import run_policies
    from scheduler.simulate.scenario import build_scenario
    from scheduler.simulate.settings import SimSettings
    from scheduler.simulate.traces import read_jobs

    start = datetime(2022, 3, 1, tzinfo=timezone.utc)
    h0 = epoch_hour(start) - 60 * 24
    hours = np.arange(90 * 24)
    a = np.where((hours >= 60 * 24) & (hours < 70 * 24), 50.0, 600.0)
    carbon = {"A": ZoneIntensity("A", h0, a, "average", "synthetic"),
              "B": ZoneIntensity("B", h0, np.full(hours.size, 150.0), "average", "synthetic")}
    cluster = cluster_from_dict({"node": [{"name": "a1", "zone": "A", "gpus": "1xH100"},
                                          {"name": "b1", "zone": "B", "gpus": "1xH100"}]})
    trace = tmp_path / "one.csv"
    trace.write_text("submit_time,gpus,runtime_s,name\n0,1,1209600,two-weeks\n")
    sc = build_scenario(cluster, read_jobs(trace), carbon, start=start, slack_s=2 * DAY_S)
    ran = {}
    for on in (True, False):
        res = run_policies(sc, ["greedy"], forecast="perfect",
                           settings=SimSettings(plan_interval_s=3600.0, climatology=on))
        (record,) = res.runs["greedy"].records
        ran[on] = (record.zone, res.summaries["greedy"]["kgco2"])
    assert ran[True][0] == "B" and ran[False][0] == "A"
    assert ran[True][1] == pytest.approx(ran[False][1] * 2100 / 2900, rel=0.01)
