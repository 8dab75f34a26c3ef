"""The grid operators' day-ahead wind and solar forecasts in the store (scheduler.grid_forecasts),
on SQLite and PostgreSQL: an import stores each hour with the time it was published, the as-of
read never returns a value published after the time asked about (at 17:59 local time of the
day before an hour is unknown, at 18:00 it is known), a refused file stores nothing, a
re-import replaces, exports of one production type each add up to the hour's wind, and the
migration goes down and up.

Inputs: slices of the shared files (tests/data/grid_day_ahead/SOURCE.md).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from alembic import command
from sqlalchemy import func, inspect, select

from scheduler.grid_forecasts import import_day_ahead, read_day_ahead_as_of
from scheduler.store.carbon_models import carbon_zone_versions
from scheduler.store.engine import alembic_config
from scheduler.store.grid_models import grid_day_ahead
from telemetry.grid.readings import CsvFormatError
from tests.telemetry.test_day_ahead_files import sums, write_per_type_exports

DATA = Path(__file__).parents[1] / "data" / "grid_day_ahead"
DE_MARCH = DATA / "DE_2021-03-01_to_2021-03-03.csv"
DE_OCTOBER = DATA / "DE_2021-10-30_to_2021-10-31.csv"
GB_APRIL = DATA / "GB_2021-04-29_to_2021-05-01.csv"
UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
LONDON = ZoneInfo("Europe/London")
IMPORTED = datetime(2026, 12, 8, 2, 0, tzinfo=UTC)
BEFORE = "7c2e4a9f1b36"            # the revision before e5a1c7d2b9f4, which adds grid_day_ahead


def local(tz, *args: int) -> datetime:
    return datetime(*args, tzinfo=tz).astimezone(UTC)


def rows(store) -> int:
    """Stored values: one per hour and production type."""
    with store.read() as conn:
        return conn.execute(select(func.count()).select_from(grid_day_ahead)).scalar()


def importing(store, path: Path, zone: str):
    return import_day_ahead(store, path, zone, clock=lambda: IMPORTED)


def test_an_import_stores_every_hour_in_mw_with_its_publication_time(store):
    result = importing(store, DE_MARCH, "DE")
    assert (result.hours, result.first, result.last) == (72, datetime(2021, 3, 1, tzinfo=UTC),
                                                         datetime(2021, 3, 3, 23, tzinfo=UTC))
    assert result.first_issued_at == local(BERLIN, 2021, 2, 28, 18)
    everything = read_day_ahead_as_of(store, "DE", datetime(2021, 1, 1, tzinfo=UTC),
                                      datetime(2022, 1, 1, tzinfo=UTC), IMPORTED)
    assert len(everything) == 72 and rows(store) == 72 * 2          # solar and wind
    first = everything[0]
    assert (first.solar_mw, first.wind_mw) == (0.0, 17467.0 / 4)   # the slice's first row: sums of 4 quarter-hours
    assert first.source == "carboncast-entsoe-csv" and not first.imputed


def test_a_read_at_1759_local_the_day_before_does_not_see_the_day_and_at_1800_it_does(store):
    importing(store, DE_MARCH, "DE")
    day = (local(BERLIN, 2021, 3, 2, 0), local(BERLIN, 2021, 3, 3, 0))
    assert read_day_ahead_as_of(store, "DE", *day, local(BERLIN, 2021, 3, 1, 17, 59)) == []
    seen = read_day_ahead_as_of(store, "DE", *day, local(BERLIN, 2021, 3, 1, 18, 0))
    assert [v.at for v in seen] == [day[0] + timedelta(hours=i) for i in range(24)]
    assert all(v.issued_at == local(BERLIN, 2021, 3, 1, 18) for v in seen)


def test_no_value_read_is_ever_issued_after_the_time_asked_about(store):
    importing(store, DE_MARCH, "DE")
    span = (datetime(2021, 2, 28, tzinfo=UTC), datetime(2021, 3, 5, tzinfo=UTC))
    t = datetime(2021, 2, 28, 12, tzinfo=UTC)
    while t < span[1]:
        values = read_day_ahead_as_of(store, "DE", *span, t)
        assert all(v.issued_at <= t for v in values)
        # exactly the local days whose publication time has passed
        known_days = {v.at.astimezone(BERLIN).date() for v in values}
        assert all(local(BERLIN, d.year, d.month, d.day, 18) - timedelta(days=1) <= t for d in known_days)
        t += timedelta(minutes=30)


def test_gb_is_known_from_1800_london_time(store):
    importing(store, GB_APRIL, "GB")
    day = (local(LONDON, 2021, 5, 1, 0), local(LONDON, 2021, 5, 2, 0))
    assert read_day_ahead_as_of(store, "GB", *day, local(LONDON, 2021, 4, 30, 17, 59)) == []
    seen = read_day_ahead_as_of(store, "GB", *day, local(LONDON, 2021, 4, 30, 18, 0))
    assert seen and seen[0].at == datetime(2021, 4, 30, 23, tzinfo=UTC)     # 00:00 BST


def test_imputed_hours_and_the_fixed_summer_time_row_are_stored_as_read(store):
    importing(store, GB_APRIL, "GB")
    imputed = [v.at.hour for v in read_day_ahead_as_of(store, "GB", datetime(2021, 4, 30, tzinfo=UTC),
                                                       datetime(2021, 5, 1, tzinfo=UTC), IMPORTED) if v.imputed]
    assert imputed == list(range(1, 24))
    result = importing(store, DE_OCTOBER, "DE")
    assert len(result.fixes) == 1
    [row] = read_day_ahead_as_of(store, "DE", datetime(2021, 10, 31, 0, tzinfo=UTC),
                                 datetime(2021, 10, 31, 1, tzinfo=UTC), IMPORTED)
    assert row.wind_mw == 153985 / 8


def test_a_refused_file_stores_nothing(store, tmp_path):
    lines = DE_MARCH.read_text().splitlines(keepends=True)
    gap = tmp_path / "gap.csv"
    gap.write_text("".join(lines[:40] + lines[41:]))
    with pytest.raises(CsvFormatError):
        importing(store, gap, "DE")
    assert rows(store) == 0


def test_a_re_import_replaces_the_same_hours_and_moves_the_zone_s_data_version(store, tmp_path):
    importing(store, DE_MARCH, "DE")
    changed = tmp_path / "changed.csv"
    changed.write_text(DE_MARCH.read_text().replace("2021-03-01 00:00:00,0.0,17467.0",
                                                    "2021-03-01 00:00:00,0.0,40000.0"))
    importing(store, changed, "DE")
    assert rows(store) == 72 * 2
    [first] = read_day_ahead_as_of(store, "DE", datetime(2021, 3, 1, tzinfo=UTC),
                                   datetime(2021, 3, 1, 1, tzinfo=UTC), IMPORTED)
    assert first.wind_mw == 10000.0
    with store.read() as conn:
        assert conn.execute(select(carbon_zone_versions.c.version)
                            .where(carbon_zone_versions.c.zone == "DE")).scalar() == 2


def test_exports_of_one_type_each_add_up_to_the_same_hours_as_the_shared_layout(store, tmp_path):
    span = (datetime(2021, 3, 1, tzinfo=UTC), datetime(2021, 3, 4, tzinfo=UTC))
    importing(store, DE_MARCH, "DE")
    shared = read_day_ahead_as_of(store, "DE", *span, IMPORTED)
    files = write_per_type_exports(tmp_path, sums(DE_MARCH), 4)
    importing(store, files["ONSHORE"], "DE")
    half = read_day_ahead_as_of(store, "DE", *span, IMPORTED)
    # onshore replaced the one wind value; without offshore the hour's wind is not known
    assert [v.wind_mw for v in half] == [None] * 72
    assert [v.solar_mw for v in half] == [v.solar_mw for v in shared]
    importing(store, files["OFFSHORE"], "DE")
    importing(store, files["SOLAR"], "DE")
    whole = read_day_ahead_as_of(store, "DE", *span, IMPORTED)
    assert rows(store) == 72 * 3 and {v.source for v in whole} == {"entsoe-csv"}
    for a, b in zip(whole, shared, strict=True):
        assert (a.at, a.issued_at) == (b.at, b.issued_at)
        assert a.solar_mw == pytest.approx(b.solar_mw) and a.wind_mw == pytest.approx(b.wind_mw)
    importing(store, DE_MARCH, "DE")                     # and back: one wind value again
    assert rows(store) == 72 * 2
    assert [v.wind_mw for v in read_day_ahead_as_of(store, "DE", *span, IMPORTED)] == [v.wind_mw for v in shared]


def test_zones_are_kept_apart(store):
    importing(store, DE_MARCH, "DE")
    assert read_day_ahead_as_of(store, "GB", datetime(2021, 3, 1, tzinfo=UTC),
                                datetime(2021, 3, 4, tzinfo=UTC), IMPORTED) == []


def test_the_migration_goes_down_and_up(store):
    importing(store, DE_MARCH, "DE")
    assert store.check() == []
    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), BEFORE)
    with store.engine.connect() as conn:
        assert "grid_day_ahead" not in set(inspect(conn).get_table_names())
    assert store.schema_revision() == BEFORE
    store.upgrade()
    assert store.check() == []          # at head again, the table back and empty
    assert rows(store) == 0
