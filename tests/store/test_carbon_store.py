"""scheduler.carbon.CarbonSignals: the carbon-signal store, on SQLite and PostgreSQL.

The contract: intensity(zone, t) is the recorded value holding at t or None (a gap, never
zero); forecast(zone, start, end, as_of) uses only what was issued at or before as_of,
reports gaps, and falls back live forecast -> own forecast -> static, saying which level it
reached, from which source, how good it is expected to be and why it was downgraded; each
downgrade is logged once and recorded for `carbonsched carbon show`.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from databases import make_pg_database, require_pg
from sqlalchemy import delete, func, inspect, select

from scheduler.carbon import CarbonSignals
from scheduler.carbon_config import CarbonConfig, ZoneConfig
from scheduler.store.carbon_models import carbon_intensity
from telemetry.grid.readings import IntensityReading
from telemetry.grid.static import STATIC_YEARLY_GCO2_PER_KWH

DATA = Path(__file__).parents[1] / "data" / "carbon"
DE = DATA / "DE-LU_2022-01-01_to_2022-01-21_hourly.csv"
UTC = timezone.utc
T0 = datetime(2022, 1, 1, tzinfo=UTC)
RECORD_END = datetime(2022, 1, 22, tzinfo=UTC)   # the DE slice ends with the hour 21 Jan 23:00


def at(day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(2022, 1, day, hour, minute, tzinfo=UTC)


def reading(zone: str, t: datetime, value: float, *, kind: str = "actual", issued: datetime | None = None,
            signal: str = "average", source: str = "test", duration_s: int = 3600) -> IntensityReading:
    return IntensityReading(zone=zone, at=t, duration_s=duration_s, gco2_per_kwh=value, signal=signal,
                            kind=kind, issued_at=issued or t + timedelta(seconds=duration_s), source=source)


def forecast_run(zone: str, issued: datetime, hours: int, value: float, source: str = "electricitymaps"):
    """A provider forecast issued at `issued` for the next `hours` whole hours, flat at value."""
    first = issued.replace(minute=0, second=0, microsecond=0)
    return [reading(zone, first + timedelta(hours=i), value, kind="forecast", issued=issued, source=source)
            for i in range(hours)]


@pytest.fixture
def signals(store):
    """A fresh store holding the DE slice, for tests that write."""
    s = CarbonSignals(store, track_status=False)
    s.writes.import_file(DE)
    return s


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def shared(request, tmp_path_factory):
    """One store per database kind holding the DE slice, shared by read-only tests."""
    from scheduler.store import Store

    drop = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('carbon') / 'carbonsched.db'}"
    else:
        require_pg()
        url, drop = make_pg_database()
    store = Store(url)
    try:
        store.upgrade()
        s = CarbonSignals(store, track_status=False)
        s.writes.import_file(DE)
        yield s
    finally:
        store.dispose()
        if drop is not None:
            drop()


def row_count(store) -> int:
    with store.read() as conn:
        return conn.execute(select(func.count()).select_from(carbon_intensity)).scalar_one()


# -- schema ---------------------------------------------------------------------------------

def test_the_migrated_schema_has_the_carbon_tables_and_matches_the_models(store):
    assert store.check() == []
    with store.engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
    assert {"carbon_intensity", "carbon_fetches", "carbon_zone_status"} <= tables


# -- intensity(zone, t) ---------------------------------------------------------------------

def test_intensity_is_the_hour_that_starts_at_or_before_t(shared):
    v = shared.intensity("DE", at(1, 0, 30))
    assert v.gco2_per_kwh == pytest.approx(163.46)
    assert (v.valid_from, v.valid_until) == (at(1, 0), at(1, 1))
    assert (v.kind, v.signal, v.source) == ("actual", "average", "electricitymaps-csv")
    assert shared.intensity("DE", at(1, 1)).gco2_per_kwh == pytest.approx(166.66)   # the next row takes over


def test_intensity_outside_the_record_is_none(shared):
    assert shared.intensity("DE", T0 - timedelta(seconds=1)) is None
    assert shared.intensity("DE", RECORD_END - timedelta(seconds=1)) is not None
    assert shared.intensity("DE", RECORD_END) is None          # the last hour has ended
    assert shared.intensity("XX", at(2)) is None                # unknown zone


def test_a_hole_in_the_record_is_a_gap_not_the_previous_value_or_zero(store, signals):
    with store.write() as conn:
        conn.execute(delete(carbon_intensity).where(carbon_intensity.c.at == at(5, 10)))
    assert signals.intensity("DE", at(5, 9, 59)) is not None
    assert signals.intensity("DE", at(5, 10, 30)) is None
    fc = signals.forecast("DE", at(5, 8), at(5, 13), as_of=RECORD_END)
    assert fc.gaps == ((at(5, 10), at(5, 11)),)
    assert fc.value_at(at(5, 10, 30)) is None
    assert fc.mean_gco2_per_kwh() is None                        # a mean over a gap is unknown
    assert all(p.gco2_per_kwh > 0 for p in fc.points)
    assert all(p.kind == "actual" for p in fc.points)            # no static or own filling inside


def test_intensity_as_of_ignores_values_not_known_yet(shared):
    t = at(3, 12, 30)
    assert shared.intensity("DE", t, as_of=at(3, 12, 59)) is None   # the hour is not over
    assert shared.intensity("DE", t, as_of=at(3, 13)) is not None


def test_reimporting_is_idempotent_and_a_changed_value_replaces_the_old(store, signals):
    n = row_count(store)
    signals.writes.import_file(DE)
    assert row_count(store) == n
    signals.writes.store_readings([reading("DE", at(1, 0), 999.0, source="electricitymaps-csv")])
    assert row_count(store) == n
    assert signals.intensity("DE", at(1, 0)).gco2_per_kwh == 999.0


# -- forecast(): as_of ----------------------------------------------------------------------

def test_a_forecast_never_contains_anything_issued_after_as_of(store, signals):
    runs = []
    for i in range(0, 20 * 24, 6):                    # a provider forecast every 6 h, 48 h ahead
        issued = at(1) + timedelta(hours=i, minutes=7)
        runs += forecast_run("DE", issued, 48, 100.0 + i)
    signals.writes.store_readings(runs)
    moments = [at(2, 5, 30), at(8, 13), at(12, 0), at(15, 23, 59), at(20, 6)]
    full = {t: signals.forecast("DE", t - timedelta(hours=3), t + timedelta(hours=72), as_of=t)
            for t in moments}
    for t, fc in full.items():
        for p in fc.points:
            assert p.issued_at is None or p.issued_at <= t, (t, p)
    # Stronger: the answer as of t is the same as if nothing after t had ever been stored.
    for t in sorted(moments, reverse=True):
        with store.write() as conn:
            conn.execute(delete(carbon_intensity).where(carbon_intensity.c.issued_at > t))
        signals._signal_cache.clear()
        again = signals.forecast("DE", t - timedelta(hours=3), t + timedelta(hours=72), as_of=t)
        assert again == full[t]


def test_the_newest_forecast_run_issued_by_as_of_is_used(signals):
    signals.writes.store_readings(forecast_run("DE", at(10, 0), 48, 111.0) + forecast_run("DE", at(10, 6), 48, 222.0))
    before = signals.forecast("DE", at(10, 8), at(10, 9), as_of=at(10, 5))
    after = signals.forecast("DE", at(10, 8), at(10, 9), as_of=at(10, 6))
    assert [p.gco2_per_kwh for p in before.points] == [111.0]
    assert [p.gco2_per_kwh for p in after.points] == [222.0]
    assert after.level == "live" and after.source == "electricitymaps"


# -- forecast(): the fallback chain ----------------------------------------------------------

def test_a_fresh_live_forecast_covers_the_future_and_actuals_the_past(signals):
    as_of = at(15, 12, 10)
    signals.writes.store_readings(forecast_run("DE", at(15, 12, 5), 80, 250.0))
    fc = signals.forecast("DE", as_of - timedelta(hours=2), as_of + timedelta(hours=72), as_of=as_of)
    assert fc.level == "live"
    assert fc.source == "electricitymaps"
    assert fc.reason is None and fc.complete
    assert fc.value_at(at(15, 10, 30)) == pytest.approx(signals.intensity("DE", at(15, 10)).gco2_per_kwh)
    assert {p.kind for p in fc.points if p.at >= at(15, 12)} == {"forecast"}


def test_without_a_live_forecast_the_own_forecast_takes_over_with_its_quality(shared):
    as_of = at(15, 12, 10)
    fc = shared.forecast("DE", as_of, as_of + timedelta(hours=72), as_of=as_of)
    assert fc.level == "own"
    assert fc.source == "own-forecast"
    assert fc.complete
    assert 0 < fc.expected_mape_pct < 20
    assert "no live forecast provider" in fc.reason
    assert fc.method and "profile" in fc.method
    assert all(p.kind == "forecast" and p.source == "own-forecast" and p.issued_at == as_of for p in fc.points)
    assert all(0 < p.gco2_per_kwh < 1000 for p in fc.points)
    assert fc.points[0].at == as_of and fc.points[-1].until == as_of + timedelta(hours=72)


def test_a_stale_live_forecast_is_not_used(store):
    config = CarbonConfig(zones={"DE": ZoneConfig("DE", provider="electricitymaps")}, forecast_max_age_s=6 * 3600)
    s = CarbonSignals(store, config, track_status=False)
    s.writes.import_file(DE)
    s.writes.store_readings(forecast_run("DE", at(15, 0), 72, 250.0))
    fc = s.forecast("DE", at(15, 12), at(16, 12), as_of=at(15, 12))   # the run is 12 h old
    assert fc.level == "own"
    assert "no electricitymaps forecast issued in the 6 h before" in fc.reason


def test_a_short_live_forecast_is_continued_by_the_own_forecast(signals):
    as_of = at(15, 12)
    signals.writes.store_readings(forecast_run("DE", as_of, 24, 250.0))
    fc = signals.forecast("DE", as_of, as_of + timedelta(hours=72), as_of=as_of)
    assert fc.complete
    assert fc.level == "own"
    assert {p.source for p in fc.points if p.at < as_of + timedelta(hours=24)} == {"electricitymaps"}
    assert {p.source for p in fc.points if p.at >= as_of + timedelta(hours=24)} == {"own-forecast"}
    assert "ends" in fc.reason


def test_far_beyond_the_record_the_static_average_is_used_and_flagged(shared):
    fc = shared.forecast("DE", at(25), at(26), as_of=at(25))        # history ends 3 days earlier: own
    assert fc.level == "own"
    late = datetime(2022, 3, 1, tzinfo=UTC)                          # 5 weeks after the record
    fc = shared.forecast("DE", late, late + timedelta(hours=24), as_of=late)
    assert fc.level == "static" and fc.source == "static"
    assert [p.kind for p in fc.points] == ["static"]
    assert fc.points[0].gco2_per_kwh == STATIC_YEARLY_GCO2_PER_KWH["DE"]
    assert fc.points[0].issued_at is None
    assert fc.expected_mape_pct and "own forecast" in fc.reason


def test_a_zone_with_no_data_and_no_static_value_is_all_gap(shared):
    fc = shared.forecast("XX", at(2), at(3), as_of=at(2))
    assert fc.level == "none"
    assert fc.points == ()
    assert fc.gaps == ((at(2), at(3)),)
    assert fc.value_at(at(2, 5)) is None


def test_a_configured_static_value_is_used_for_zones_without_one(store):
    s = CarbonSignals(store, CarbonConfig(static={"XX": 55.0}), track_status=False)
    fc = s.forecast("XX", at(2), at(3), as_of=at(2))
    assert (fc.level, fc.points[0].gco2_per_kwh) == ("static", 55.0)


# -- signals are never mixed ----------------------------------------------------------------

def test_average_and_marginal_signals_are_never_mixed(signals):
    moer = [reading("DE", at(2, h), 700.0, signal="marginal", source="watttime") for h in range(24)]
    signals.writes.store_readings(moer)
    assert signals.signal_of("DE") == "average"                       # average first when both exist
    assert signals.intensity("DE", at(2, 3)).gco2_per_kwh < 700
    marginal = signals.intensity("DE", at(2, 3), signal="marginal")
    assert (marginal.gco2_per_kwh, marginal.signal) == (700.0, "marginal")
    fc = signals.forecast("DE", at(2), at(3), as_of=at(3), signal="marginal")
    assert {p.gco2_per_kwh for p in fc.points} == {700.0}
    signals.writes.store_readings([reading("CAISO_NORTH", at(2), 900.0, signal="marginal")])
    assert signals.signal_of("CAISO_NORTH") == "marginal"
    late = signals.forecast("CAISO_NORTH", at(20), at(21), as_of=at(20))
    assert late.level == "none" and late.gaps                          # no static for marginal


def test_the_configured_signal_of_a_zone_wins(store):
    s = CarbonSignals(store, CarbonConfig(zones={"DE": ZoneConfig("DE", signal="marginal")}), track_status=False)
    s.writes.import_file(DE)
    assert s.signal_of("DE") == "marginal"
    assert s.intensity("DE", at(2)) is None


# -- downgrades: logged once, recorded ------------------------------------------------------

def test_each_downgrade_is_logged_once_and_recorded(store, caplog):
    now = [at(15, 12)]
    config = CarbonConfig(zones={"DE": ZoneConfig("DE", provider="electricitymaps")})
    s = CarbonSignals(store, config, clock=lambda: now[0])
    s.writes.import_file(DE)
    s.writes.store_readings(forecast_run("DE", at(15, 11, 55), 80, 250.0))
    caplog.set_level(logging.INFO, logger="scheduler.carbon")
    for _ in range(3):
        assert s.forecast("DE", now[0], now[0] + timedelta(hours=24)).level == "live"
    assert s.zone_status("DE")["level"] == "live"
    now[0] = at(16, 1)                                   # the live forecast is now 13 h old
    for _ in range(3):
        assert s.forecast("DE", now[0], now[0] + timedelta(hours=24)).level == "own"
    downgrades = [r for r in caplog.records if "forecasts now from own-forecast" in r.getMessage()]
    assert len(downgrades) == 1 and downgrades[0].levelno == logging.WARNING
    status = s.zone_status("DE")
    assert status["level"] == "own" and status["since"] == at(16, 1)
    assert "no electricitymaps forecast" in status["reason"]
    # a replay in the past (simulator) neither logs nor changes the recorded status
    s.forecast("DE", at(10), at(11), as_of=at(10))
    assert s.zone_status("DE")["since"] == at(16, 1)
    # recovery is logged too
    s.writes.store_readings(forecast_run("DE", at(16, 0, 59), 80, 250.0))
    assert s.forecast("DE", now[0], now[0] + timedelta(hours=24)).level == "live"
    assert any("back to electricitymaps" in r.getMessage() for r in caplog.records)
    assert s.zone_status("DE")["level"] == "live"


def test_zones_summarise_data_providers_and_static_values(shared):
    config = CarbonConfig(zones={"GB": ZoneConfig("GB", provider="ukgrid")})
    zones = {z["zone"]: z for z in CarbonSignals(shared.store, config, track_status=False).zones()}
    assert zones["DE"]["actual_rows"] == 504
    assert zones["DE"]["first_actual_at"] == at(1) and zones["DE"]["last_actual_at"] == at(21, 23)
    assert zones["DE"]["sources"] == ["electricitymaps-csv"]
    assert zones["DE"]["static_gco2_per_kwh"] == STATIC_YEARLY_GCO2_PER_KWH["DE"]
    assert zones["GB"]["provider"] == "ukgrid" and zones["GB"]["actual_rows"] == 0


def test_naive_times_are_refused(shared):
    with pytest.raises(ValueError, match="timezone-aware"):
        shared.intensity("DE", datetime(2022, 1, 2))
    with pytest.raises(ValueError, match="empty"):
        shared.forecast("DE", at(3), at(2), as_of=at(2))


def test_a_watttime_zone_is_marginal_even_before_it_has_data_and_gets_no_static_value(store):
    config = CarbonConfig(zones={"GB": ZoneConfig("GB", provider="watttime", region="UK")})
    s = CarbonSignals(store, config, track_status=False)
    s.writes.import_file(DATA / "GB_2022-01-01_to_2022-01-14_hourly.csv")        # average data as well
    assert s.signal_of("GB") == "marginal"
    fc = s.forecast("GB", at(20), at(21), as_of=at(20))
    assert fc.signal == "marginal" and fc.level == "none" and fc.points == ()


def test_a_big_batch_is_bulk_upserted_with_progress(store):
    """1,200 rows take the bulk path on PostgreSQL (COPY + one upsert); same contract everywhere."""
    s = CarbonSignals(store, track_status=False)
    start = datetime(2023, 1, 1, tzinfo=UTC)
    batch = [reading("ZZ", start + timedelta(hours=i), 100.0 + i) for i in range(1200)]
    seen: list[tuple[int, int]] = []
    assert s.writes.store_readings(batch, progress=lambda done, total: seen.append((done, total))) == 1200
    assert seen[-1] == (1200, 1200)
    n = row_count(store)
    changed = [reading("ZZ", r.at, r.gco2_per_kwh + 1) for r in batch] + batch[:1]   # a repeat inside
    s.writes.store_readings(changed)
    assert row_count(store) == n
    assert s.intensity("ZZ", start + timedelta(minutes=1)).gco2_per_kwh == 100.0   # the later repeat wins
    assert s.intensity("ZZ", start + timedelta(hours=6)).gco2_per_kwh == 107.0


def test_future_rows_without_an_issue_time_are_counted_and_as_forecast_makes_them_usable_now(store, tmp_path):
    """Issue 16 defect 5, at the store: an import at 10 Jan 12:30 of hourly rows from 11:00 to
    16:00. The 11:00 hour ended at 12:00, so it is an actual either way; 12:00 (ends 13:00)
    and later lie in the future."""
    now = at(10, 12, 30)
    csv = tmp_path / "z.csv"
    csv.write_text("time,gco2_per_kwh\n" + "".join(f"{at(10, h).isoformat()},{100 * h}\n" for h in range(11, 17)))
    plain = CarbonSignals(store, track_status=False, clock=lambda: now)
    result = plain.writes.import_file(csv, zone="Z1")
    assert (result.future_values, result.future_first, result.future_last) == (5, at(10, 12), at(10, 16))
    fc = plain.forecast("Z1", at(10, 13), at(10, 15), as_of=now)
    assert all(p.kind != "forecast" or p.source != "csv" for p in fc.points)

    result = plain.writes.import_file(csv, zone="Z2", as_forecast=True)
    assert result.future_values == 5 and result.as_forecast
    fc = plain.forecast("Z2", at(10, 13), at(10, 15), as_of=now)
    assert [(p.kind, p.source, p.gco2_per_kwh, p.issued_at) for p in fc.points] == [
        ("forecast", "csv", 1300.0, now), ("forecast", "csv", 1400.0, now)]
    assert plain.intensity("Z2", at(10, 11, 30), as_of=now).gco2_per_kwh == 1100.0  # over: an actual
