"""The learned carbon forecast (telemetry/grid/forecast_model.py) and its replay in the simulator.

Specification:
- training and prediction are strictly as-of: a value from after the issue time changes
  nothing (the fit and the forecast are bit-identical whatever the future holds);
- on a grid with a daily shape, weather-like persistent anomalies and a weekly cycle it beats
  persistence and the profile baseline, and its intervals are ordered and cover about what
  they claim on unseen data;
- the signal store uses it for its own forecast only when the fit is as-of the query;
- `simulate --forecast stored` gives the planner, at each tick, exactly the newest forecast
  run issued at or before the tick (never a later one).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from telemetry.grid.forecast import baseline_forecast, epoch_hour, persistence_forecast
from telemetry.grid.forecast_model import LearnedForecaster, NotEnoughHistory

T0 = epoch_hour(datetime(2022, 3, 1, tzinfo=timezone.utc))


def synthetic_grid(days: int, seed: int = 1) -> dict[int, float]:
    """A grid with a solar dip at midday, an evening peak, a weekly cycle and AR(1) "weather"."""
    rng = np.random.default_rng(seed)
    out = {}
    weather = 0.0
    for i in range(24 * days):
        hour = (T0 + i) % 24
        day = (T0 + i) // 24
        daily = 300 - 120 * max(0.0, math.sin(math.pi * (hour - 6) / 12)) + 40 * math.exp(-((hour - 19) ** 2) / 4)
        weekly = -30 if (day + 3) % 7 >= 5 else 0
        weather = 0.97 * weather + rng.normal(0, 8)
        out[T0 + i] = max(5.0, daily + weekly + weather + rng.normal(0, 5))
    return out


@pytest.fixture(scope="module")
def grid() -> dict[int, float]:
    return synthetic_grid(70)


@pytest.fixture(scope="module")
def fitted(grid) -> LearnedForecaster:
    return LearnedForecaster.fit(grid, T0 + 24 * 50 - 1)


def test_a_value_from_after_the_issue_time_changes_neither_the_fit_nor_the_forecast(grid):
    issue = T0 + 24 * 40 - 1
    future_changed = {h: (v * 7 + 1000 if h > issue else v) for h, v in grid.items()}
    future_dropped = {h: v for h, v in grid.items() if h <= issue}
    targets = list(range(issue + 1, issue + 73))
    a = LearnedForecaster.fit(grid, issue)
    b = LearnedForecaster.fit(future_changed, issue)
    c = LearnedForecaster.fit(future_dropped, issue)
    assert a.trained_rows == b.trained_rows == c.trained_rows
    assert a.ratio_quantiles == b.ratio_quantiles == c.ratio_quantiles
    pa = a.predict(grid, issue, targets)
    assert pa == b.predict(future_changed, issue, targets) == c.predict(future_dropped, issue, targets)
    assert all(v is not None and v > 0 for v in pa)
    qa = a.predict_quantiles(grid, issue, targets)
    assert qa == b.predict_quantiles(future_changed, issue, targets)
    # and the model did read the past: a changed past changes the forecast
    past_changed = {h: (v * 1.5 if h <= issue else v) for h, v in grid.items()}
    assert LearnedForecaster.fit(past_changed, issue).predict(past_changed, issue, targets) != pa


def test_it_beats_persistence_and_the_baseline_a_day_ahead_on_unseen_days(grid, fitted):
    first_issue = fitted.last_known_hour
    errors = {"model": [], "baseline": [], "persistence": []}
    for issue in range(first_issue, first_issue + 24 * 18, 5):
        target = issue + 24
        actual = grid[target]
        errors["model"].append(abs(fitted.predict(grid, issue, [target])[0] - actual) / actual)
        errors["baseline"].append(abs(baseline_forecast(grid, issue, [target])[0] - actual) / actual)
        errors["persistence"].append(abs(persistence_forecast(grid, issue, [target])[0] - actual) / actual)
    mape = {k: 100 * float(np.mean(v)) for k, v in errors.items()}
    assert mape["model"] < 0.95 * mape["persistence"], mape
    assert mape["model"] < mape["baseline"], mape


def test_intervals_are_ordered_and_cover_about_what_they_claim_out_of_sample(grid, fitted):
    assert fitted.out_of_sample
    inside = total = 0
    for issue in range(fitted.last_known_hour, fitted.last_known_hour + 24 * 18, 7):
        targets = list(range(issue + 1, issue + 49))
        q = fitted.predict_quantiles(grid, issue, targets, (0.1, 0.5, 0.9))
        for i, t in enumerate(targets):
            assert q[0.1][i] <= q[0.5][i] <= q[0.9][i]
            inside += q[0.1][i] <= grid[t] <= q[0.9][i]
            total += 1
    # nominal 80 %; the synthetic "weather" is strongly autocorrelated, so 18 days vary widely
    assert 0.55 <= inside / total <= 0.97, inside / total


def test_beyond_its_horizon_or_without_the_newest_hour_it_gives_no_value(grid, fitted):
    issue = fitted.last_known_hour + 10
    assert fitted.predict(grid, issue, [issue, issue + 73]) == [None, None]
    holed = {h: v for h, v in grid.items() if h != issue}
    assert fitted.predict(holed, issue, [issue + 1]) == [None]


def test_three_weeks_of_history_are_needed_to_fit(grid):
    with pytest.raises(NotEnoughHistory):
        LearnedForecaster.fit(grid, T0 + 24 * 20 - 2)


# -- the signal store ----------------------------------------------------------------------------

def _store_with(tmp_path, hours: dict[int, float], **config):
    from scheduler.carbon import CarbonSignals
    from scheduler.carbon_config import CarbonConfig
    from scheduler.store import Store
    from telemetry.grid.forecast import hour_start
    from telemetry.grid.readings import IntensityReading

    store = Store(f"sqlite:///{tmp_path / 'c.db'}")
    store.upgrade()
    readings = [IntensityReading(zone="XX", at=hour_start(h), duration_s=3600, gco2_per_kwh=v, signal="average",
                                 kind="actual", issued_at=hour_start(h + 1), source="test")
                for h, v in sorted(hours.items())]
    cfg = CarbonConfig(**config)
    signals = CarbonSignals(store, cfg, track_status=False)
    signals.writes.store_readings(readings)
    return store, signals


def test_the_store_uses_the_model_for_its_own_forecast_only_when_fitted_as_of_the_query(tmp_path, grid):
    from scheduler.carbon_model import ForecastModels
    from telemetry.grid.forecast import hour_start
    from telemetry.grid.forecast_model import METHOD

    known = {h: v for h, v in grid.items() if h < T0 + 24 * 45}
    store, signals = _store_with(tmp_path, known, model_fit_inline=True)
    try:
        as_of = hour_start(T0 + 24 * 45)
        fc = signals.forecast("XX", as_of, as_of + timedelta(hours=24), as_of=as_of)
        assert fc.level == "own" and fc.method == METHOD
        lk = T0 + 24 * 45 - 1
        model = signals._models.get("XX", "average", lk, as_of)
        expected = model.predict(known, lk, range(lk + 1, lk + 25))
        assert [p.gco2_per_kwh for p in fc.points] == pytest.approx(expected)
        # a model fitted later is never used for an earlier issue
        models = ForecastModels(lambda *a: known, inline=False)
        models._models[("XX", "average")] = [model]
        assert models.get("XX", "average", lk - 5, as_of) is None
    finally:
        store.dispose()


def test_the_daemon_fits_in_the_background_and_answers_with_the_baseline_meanwhile(tmp_path, grid):
    import time

    from telemetry.grid.forecast import METHOD as BASELINE_METHOD
    from telemetry.grid.forecast import hour_start
    from telemetry.grid.forecast_model import METHOD

    known = {h: v for h, v in grid.items() if h < T0 + 24 * 45}
    store, signals = _store_with(tmp_path, known)  # model_fit = background, the default
    try:
        as_of = hour_start(T0 + 24 * 45)
        first = signals.forecast("XX", as_of, as_of + timedelta(hours=24), as_of=as_of)
        assert first.level == "own" and first.method == BASELINE_METHOD  # no waiting on the fit
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            later = signals.forecast("XX", as_of, as_of + timedelta(hours=24), as_of=as_of)
            if later.method == METHOD:
                break
            time.sleep(0.2)
        assert later.method == METHOD
    finally:
        store.dispose()


def test_without_a_fitted_model_the_store_says_it_used_the_baseline(tmp_path, grid):
    from telemetry.grid.forecast import METHOD, hour_start

    known = {h: v for h, v in grid.items() if h < T0 + 24 * 10}  # too short to fit
    store, signals = _store_with(tmp_path, known, model_fit_inline=True)
    try:
        as_of = hour_start(T0 + 24 * 10)
        fc = signals.forecast("XX", as_of, as_of + timedelta(hours=6), as_of=as_of)
        assert fc.level == "own" and fc.method == METHOD
    finally:
        store.dispose()


# -- replaying recorded forecasts in the simulator -----------------------------------------------

DEMO = Path(__file__).resolve().parents[2] / "scheduler" / "simulate" / "data"
START = datetime(2022, 10, 19, 16, tzinfo=timezone.utc)


def _issued_file(tmp_path: Path) -> tuple[Path, dict[datetime, list[tuple[datetime, float]]]]:
    """A plain file: GB's actuals plus a forecast run issued at :20 past every hour for 30 h ahead;
    each run's values are distinctive (they encode the issue), so a curve names its run."""
    from telemetry.grid.csv_import import read_trace

    actual = read_trace(DEMO / "GB.csv").readings
    lines = ["time,gco2_per_kwh,zone,issued_at"]
    for r in actual:
        lines.append(f"{r.at.isoformat()},{r.gco2_per_kwh},GB,")
    runs = {}
    first, last = actual[0].at, actual[-1].at
    issue = first + timedelta(minutes=20)
    k = 0
    while issue < last:
        run = []
        hour0 = issue.replace(minute=0)
        for j in range(30):
            at = hour0 + timedelta(hours=j)
            value = 100.0 + (k % 97) + j / 100.0
            run.append((at, value))
            lines.append(f"{at.isoformat()},{value},GB,{issue.isoformat()}")
        runs[issue] = run
        issue += timedelta(hours=1)
        k += 1
    path = tmp_path / "gb-with-forecasts.csv"
    path.write_text("\n".join(lines) + "\n")
    return path, runs


def test_stored_forecasts_replay_exactly_the_run_issued_before_each_tick(tmp_path):
    from dataclasses import dataclass, field

    from policies.solvers.greedy import GreedyPolicy
    from scheduler.simulate.cluster import cluster_from_dict
    from scheduler.simulate.forecasts import parse_forecast
    from scheduler.simulate.intensity import load_zone_files
    from scheduler.simulate.model import Simulation
    from scheduler.simulate.scenario import build_scenario
    from scheduler.simulate.settings import SimSettings
    from scheduler.simulate.traces import read_jobs

    path, runs = _issued_file(tmp_path)
    carbon = {"GB": load_zone_files("GB", [path])}
    assert carbon["GB"].issued is not None and len(carbon["GB"].issued) == len(runs)
    lines = (DEMO / "pai_demo.csv").read_text().splitlines()[:21]
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("\n".join(lines) + "\n")
    sc = build_scenario(cluster_from_dict({"node": [{"name": "n", "zone": "GB", "gpus": "16xH100"}]}),
                        read_jobs(jobs), carbon, start=START, slack_s=12 * 3600)

    @dataclass
    class Recording:
        name: str = "recording"
        seen: list = field(default_factory=list)
        inner: GreedyPolicy = field(default_factory=GreedyPolicy)

        def plan(self, snapshot):
            self.seen.append((snapshot.now, snapshot.carbon["GB"]))
            return self.inner.plan(snapshot)

    policy = Recording()
    forecast = parse_forecast("stored", sc.carbon)
    Simulation(cluster=sc.cluster, jobs=sc.jobs, carbon=sc.carbon, policy=policy, forecast=forecast,
               settings=SimSettings(plan_interval_s=900)).run()
    issues = sorted(runs)
    used = {max(i for i in issues if i <= now) for now, _ in policy.seen}
    assert len(policy.seen) >= 10 and len(used) >= 3  # ticks across several issued runs
    for now, curve in policy.seen:
        newest = max(i for i in issues if i <= now)
        by_hour = dict(runs[newest])
        for i, v in enumerate(curve.values_g_per_kwh):
            at = curve.start + timedelta(seconds=i * curve.step_s)
            if at in by_hour:
                assert v == pytest.approx(by_hour[at]), (now, newest, at)
        # the run issued next (after this tick) would have given other values
        later = [i for i in issues if i > now]
        if later:
            nxt = dict(runs[later[0]])
            assert any(v != pytest.approx(nxt[curve.start + timedelta(seconds=i * curve.step_s)])
                       for i, v in enumerate(curve.values_g_per_kwh)
                       if curve.start + timedelta(seconds=i * curve.step_s) in nxt)
    assert {s[2] for s in forecast.seen} <= {i.timestamp() for i in issues}


def test_stored_without_recorded_forecasts_is_a_clear_error():
    from scheduler.simulate.forecasts import parse_forecast
    from scheduler.simulate.intensity import load_zone_files

    carbon = {"GB": load_zone_files("GB", [DEMO / "GB.csv"])}
    with pytest.raises(ValueError, match="no recorded forecasts .* zone\\(s\\) GB"):
        parse_forecast("stored", carbon)


def _vessim_files(tmp_path: Path) -> tuple[Path, Path, dict[datetime, dict[datetime, float]]]:
    """Vessim's WattTime layout: 5-min actuals `time,<region>` and, every 30 min, a forecast
    `request_time,forecast_time,<region>` for the next 65 min (values already in gCO2/kWh)."""
    t0 = datetime(2023, 6, 8, tzinfo=timezone.utc)
    actual = ["time,Caiso_North"]
    for i in range(12 * 48):
        actual.append(f"{(t0 + timedelta(minutes=5 * i)).strftime('%Y-%m-%d %H:%M:%S')},{400 + (i % 12)}")
    forecast = ["request_time,forecast_time,Caiso_North"]
    runs: dict[datetime, dict[datetime, float]] = {}
    for k in range(2 * 47):
        issue = t0 + timedelta(minutes=30 * k)
        run = runs[issue] = {}
        for j in range(13):
            at = issue + timedelta(minutes=5 * j)
            run[at] = 200.0 + k + j / 10
            forecast.append(f"{issue.strftime('%Y-%m-%d %H:%M:%S')},{at.strftime('%Y-%m-%d %H:%M:%S')},{run[at]}")
    a, f = tmp_path / "watttime2023_caiso-north_actual.csv", tmp_path / "watttime2023_caiso-north_forecast.csv"
    a.write_text("\n".join(actual) + "\n")
    f.write_text("\n".join(forecast) + "\n")
    return a, f, runs


def test_vessim_watttime_files_import_with_their_issue_times_and_replay_from_the_store(tmp_path):
    from scheduler.carbon import CarbonSignals
    from scheduler.simulate.shadow import store_carbon
    from scheduler.store import Store
    from telemetry.grid.csv_import import read_trace

    a, f, runs = _vessim_files(tmp_path)
    actual, forecast = read_trace(a), read_trace(f)
    assert (actual.fmt, forecast.fmt) == ("vessim", "vessim")
    assert actual.zones == forecast.zones == ["Caiso_North"]
    assert {r.kind for r in actual.readings} == {"actual"} and {r.kind for r in forecast.readings} == {"forecast"}
    assert {r.signal for r in forecast.readings} == {"marginal"} and forecast.duration_s["Caiso_North"] == 300
    first = forecast.readings[0]
    assert first.issued_at == datetime(2023, 6, 8, tzinfo=timezone.utc) and first.gco2_per_kwh == 200.0

    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    store.upgrade()
    try:
        signals = CarbonSignals(store, track_status=False, clock=lambda: datetime(2024, 1, 1, tzinfo=timezone.utc))
        signals.writes.import_file(a, zone="CAISO_NORTH")
        signals.writes.import_file(f, zone="CAISO_NORTH")
        z = store_carbon(store, ["CAISO_NORTH"])["CAISO_NORTH"]
    finally:
        store.dispose()
    assert z.signal == "marginal" and z.issued is not None and len(z.issued) == len(runs)
    issues = sorted(runs)
    for now in (issues[3] + timedelta(minutes=1), issues[3] + timedelta(minutes=29), issues[10]):
        i = z.issued.latest(now.timestamp())
        newest = max(t for t in issues if t <= now)
        assert z.issued.issued_s[i] == newest.timestamp()
        hour = int(newest.timestamp() // 3600)
        in_hour = [v for at, v in runs[newest].items() if int(at.timestamp() // 3600) == hour]
        assert z.issued.runs[i][hour] == pytest.approx(sum(in_hour) / len(in_hour))
    assert z.issued.latest(issues[0].timestamp() - 1) is None


def test_an_electricity_maps_export_with_an_issue_column_is_a_forecast(tmp_path):
    from telemetry.grid.csv_import import read_trace

    p = tmp_path / "em-forecast.csv"
    p.write_text("Datetime (UTC),Zone Id,Carbon Intensity gCO₂eq/kWh (direct),updatedAt\n"
                 "2022-06-01 10:00:00,DE,300.5,2022-06-01 08:00:00\n"
                 "2022-06-01 11:00:00,DE,280.0,2022-06-01 08:00:00\n"
                 "2022-06-01 09:00:00,DE,310.0,\n", encoding="utf-8")
    t = read_trace(p)
    kinds = {(r.at.hour, r.kind, r.issued_at.hour) for r in t.readings}
    assert kinds == {(9, "actual", 10), (10, "forecast", 8), (11, "forecast", 8)}


def test_forecast_specs_parse_and_bad_ones_say_what_is_accepted():
    from scheduler.simulate.forecasts import parse_forecast

    assert parse_forecast("noisy:0.2", {}).sigma == 0.2
    assert parse_forecast("model:q=0.7", {}).quantile == 0.7
    assert parse_forecast("model:spread=0.5", {}).spread_penalty == 0.5
    assert parse_forecast("baseline", {}).kind == "baseline"
    for bad in ("model:q=1.5", "model:x=1", "baseline:3", "persistence:1"):
        with pytest.raises(ValueError):
            parse_forecast(bad, {})
