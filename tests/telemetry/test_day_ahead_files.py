"""Day-ahead wind and solar forecast files (telemetry.grid.day_ahead): both layouts read to the
same hourly mean MW, gaps and duplicated hours are refused in one line, the shared file's
summer-time row is fixed and its imputed hours flagged, and each hour is known from 18:00
local time of the day before.

The shared-layout inputs are small slices of the shared files (tests/data/grid_day_ahead/
SOURCE.md). The Transparency Platform exports are written here from those slices in the
platform's column layouts (all types in one file, and the newer one file per type): each
hour's sum is spread over its market time units (MTUs) so that their mean is the hour's MW,
wind split into onshore and offshore, the Intraday and Current columns filled with values
that must never be read.
"""

from __future__ import annotations

import csv
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from telemetry.grid.day_ahead import (
    LAYOUT_CARBONCAST,
    LAYOUT_ENTSOE,
    LAYOUT_ENTSOE_PER_TYPE,
    detect_layout,
    issued_at,
    read_day_ahead,
    sniff_layout,
    wind_total,
)
from telemetry.grid.readings import CsvFormatError

DATA = Path(__file__).parents[1] / "data" / "grid_day_ahead"
DE_MARCH = DATA / "DE_2021-03-01_to_2021-03-03.csv"
DE_OCTOBER = DATA / "DE_2021-10-30_to_2021-10-31.csv"
GB_APRIL = DATA / "GB_2021-04-29_to_2021-05-01.csv"
UTC = timezone.utc
BRUSSELS = ZoneInfo("Europe/Brussels")
NEVER_READ = "999999"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def sums(path: Path) -> list[tuple[datetime, float, float]]:
    """The shared slice's rows: (UTC hour, solar sum, wind sum)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))[1:]
    return [(datetime.fromisoformat(r[0]).replace(tzinfo=UTC), float(r[1]), float(r[2])) for r in rows]


def mtu_text(start: datetime, end: datetime, tz, style: str, marks: bool) -> str:
    def one(t: datetime) -> str:
        local = t.astimezone(tz)
        text = local.strftime("%d.%m.%Y %H:%M" if style == "legacy" else "%d/%m/%Y %H:%M:%S")
        return f"{text} ({local.tzname()})" if marks else text
    return f"{one(start)} - {one(end)}"


def write_export(path: Path, hours: list[tuple[datetime, float, float]], per_hour: int, *,
                 area: str = "BZN|DE-LU", time_column: str = "MTU (CET/CEST)", style: str = "legacy",
                 marks: bool = False, extra_rows: list[list[str]] | None = None) -> Path:
    """A Transparency Platform export of `hours` (UTC hour, solar sum, wind sum over `per_hour` MTUs)."""
    tz = UTC if time_column == "MTU (UTC)" else BRUSSELS
    header = [time_column]
    for kind in ("Solar", "Wind Offshore", "Wind Onshore"):
        header += [f"Generation - {kind}  [MW] Day Ahead/ {area}", f"Generation - {kind}  [MW] Intraday / {area}",
                   f"Generation - {kind}  [MW] Current / {area}"]
    step = timedelta(hours=1) / per_hour
    spread = [(i - (per_hour - 1) / 2) for i in range(per_hour)]       # sums to zero
    rows = []
    for at, solar_sum, wind_sum in hours:
        for i in range(per_hour):
            solar = solar_sum / per_hour + (spread[i] if solar_sum / per_hour >= per_hour else 0.0)
            wind = wind_sum / per_hour + (spread[i] if wind_sum / per_hour >= per_hour else 0.0)
            start = at + i * step
            rows.append([mtu_text(start, start + step, tz, style, marks),
                         repr(solar), NEVER_READ, NEVER_READ,
                         repr(wind * 0.25), NEVER_READ, NEVER_READ,
                         repr(wind * 0.75), NEVER_READ, NEVER_READ])
    rows += extra_rows or []
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_ALL)
        writer.writerow(header)
        writer.writerows(rows)
    return path


PER_TYPE_SHARE = {"SOLAR": ("solar", 1.0), "ONSHORE": ("wind", 0.75), "OFFSHORE": ("wind", 0.25)}


def write_per_type_exports(directory: Path, hours: list[tuple[datetime, float, float]], per_hour: int, *,
                           area: str = "BZN|DE-LU") -> dict[str, Path]:
    """The platform's newer exports of `hours`, one file per production type, named as the
    platform names them; wind split 75 % onshore, 25 % offshore as in `write_export`."""
    step = timedelta(hours=1) / per_hour
    files = {}
    for token, (column, share) in PER_TYPE_SHARE.items():
        path = directory / f"GUI_WIND_SOLAR_GENERATION_FORECAST_{token}_202102282300-202103032300.csv"
        rows = [["MTU (CET/CEST)", "Area", "Day-ahead (MW)", "Intraday (MW)", "Current (MW)", "Actual (MW)"]]
        for at, solar_sum, wind_sum in hours:
            value = (solar_sum if column == "solar" else wind_sum) / per_hour * share
            for i in range(per_hour):
                start = at + i * step
                rows.append([mtu_text(start, start + step, BRUSSELS, "new", True), area, repr(value),
                             NEVER_READ, NEVER_READ, NEVER_READ])
        with open(path, "w", newline="") as f:
            csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)
        files[token] = path
    return files


def refused(path: Path, zone: str = "DE") -> str:
    with pytest.raises(CsvFormatError) as e:
        read_day_ahead(path, zone)
    assert "\n" not in str(e.value)
    return str(e.value)


# -- both layouts, one unit ---------------------------------------------------------------------

def test_the_shared_layout_is_hourly_sums_of_quarter_hours_read_as_hourly_mean_mw():
    got = read_day_ahead(DE_MARCH, "DE")
    assert got.layout == LAYOUT_CARBONCAST and got.mtu_s == 900 and len(got.hours) == 72
    first = got.hours[0]
    assert first.at == utc(2021, 3, 1, 0)
    raw = sums(DE_MARCH)[0]
    assert (first.solar_mw, first.wind_mw) == (raw[1] / 4, raw[2] / 4)
    assert [h.at for h in got.hours] == [utc(2021, 3, 1) + timedelta(hours=i) for i in range(72)]
    assert got.fixes == [] and got.imputed == 0


@pytest.mark.parametrize("time_column, style, marks", [("MTU (CET/CEST)", "legacy", False),
                                                        ("MTU (CET/CEST)", "new", True),
                                                        ("MTU (UTC)", "new", False)])
def test_the_platform_export_reads_to_the_same_mw_as_the_shared_layout(tmp_path, time_column, style, marks):
    shared = read_day_ahead(DE_MARCH, "DE")
    export = write_export(tmp_path / "Generation Forecasts for Wind and Solar_202103010000-202103040000.csv",
                          sums(DE_MARCH), 4, time_column=time_column, style=style, marks=marks)
    got = read_day_ahead(export, "DE")
    assert got.layout == LAYOUT_ENTSOE and got.mtu_s == 900 and got.area == "BZN|DE-LU"
    assert [h.at for h in got.hours] == [h.at for h in shared.hours]
    for a, b in zip(got.hours, shared.hours):
        assert a.solar_mw == pytest.approx(b.solar_mw) and a.wind_mw == pytest.approx(b.wind_mw)


def test_gb_half_hours_read_to_the_same_mw_in_both_layouts(tmp_path):
    shared = read_day_ahead(GB_APRIL, "GB")
    assert shared.mtu_s == 1800
    raw = sums(GB_APRIL)[0]
    assert shared.hours[0].wind_mw == raw[2] / 2
    got = read_day_ahead(write_export(tmp_path / "gb.csv", sums(GB_APRIL), 2, area="BZN|GB"), "GB")
    for a, b in zip(got.hours, shared.hours, strict=True):
        assert (a.at, a.solar_mw, a.wind_mw) == (b.at, pytest.approx(b.solar_mw), pytest.approx(b.wind_mw))


def test_the_newer_export_of_one_production_type_per_file_reads_each_type(tmp_path):
    shared = read_day_ahead(DE_MARCH, "DE")
    files = write_per_type_exports(tmp_path, sums(DE_MARCH), 4)
    solar, onshore, offshore = (read_day_ahead(files[t], "DE") for t in ("SOLAR", "ONSHORE", "OFFSHORE"))
    assert solar.layout == LAYOUT_ENTSOE_PER_TYPE and solar.area == "BZN|DE-LU" and solar.mtu_s == 900
    assert (solar.production_types, onshore.production_types, offshore.production_types) == \
        (["solar"], ["wind_onshore"], ["wind_offshore"])
    for s, on, off, b in zip(solar.hours, onshore.hours, offshore.hours, shared.hours, strict=True):
        assert s.at == on.at == off.at == b.at
        assert s.solar_mw == pytest.approx(b.solar_mw)
        assert wind_total({**on.mw, **off.mw}) == pytest.approx(b.wind_mw)
        assert on.wind_mw is None               # onshore alone is not the hour's wind


def test_an_export_of_one_type_needs_the_platform_s_file_name(tmp_path):
    path = write_per_type_exports(tmp_path, sums(DE_MARCH)[:2], 4)["SOLAR"]
    renamed = path.rename(tmp_path / "my_forecast.csv")
    assert "named only in the file name" in refused(renamed)


def test_an_export_saved_with_semicolons_and_decimal_commas_reads_the_same(tmp_path):
    comma = read_day_ahead(write_export(tmp_path / "comma.csv", sums(DE_MARCH), 4), "DE")
    rows = list(csv.reader((tmp_path / "comma.csv").read_text().splitlines()))
    semi = tmp_path / "semicolon.csv"
    with open(semi, "w", newline="") as f:
        csv.writer(f, delimiter=";", quoting=csv.QUOTE_ALL).writerows(
            [rows[0]] + [[r[0]] + [v.replace(".", ",") for v in r[1:]] for r in rows[1:]])
    assert sniff_layout(semi) == LAYOUT_ENTSOE
    got = read_day_ahead(semi, "DE")
    assert [(h.at, h.mw) for h in got.hours] == [(h.at, h.mw) for h in comma.hours]


def test_layouts_are_told_from_the_header_and_a_carbon_trace_is_neither(tmp_path):
    assert sniff_layout(DE_MARCH) == LAYOUT_CARBONCAST
    assert sniff_layout(write_export(tmp_path / "x.csv", sums(DE_MARCH)[:1], 4)) == LAYOUT_ENTSOE
    assert detect_layout(["Datetime (UTC)", "Zone Id", "Carbon Intensity gCO₂eq/kWh (direct)"]) is None
    assert detect_layout(["time", "gco2_per_kwh"]) is None
    assert sniff_layout(tmp_path / "missing.csv") is None


def test_not_expected_counts_as_zero_and_an_area_without_offshore_reads(tmp_path):
    path = write_export(tmp_path / "x.csv", sums(DE_MARCH)[:2], 4)
    text = path.read_text().splitlines()
    # offshore Day Ahead is the 5th column: "n/e" in every row, as for an area without offshore wind
    rows = [next(csv.reader([line])) for line in text]
    for r in rows[1:]:
        r[4] = "n/e"
    with open(path, "w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)
    got = read_day_ahead(path, "DE")
    assert got.hours[0].wind_mw == pytest.approx(sums(DE_MARCH)[0][2] / 4 * 0.75)


# -- refused: gaps and duplicated hours, one line, nothing returned ------------------------------

def test_a_missing_hour_in_the_shared_layout_is_refused_in_one_line(tmp_path):
    lines = DE_MARCH.read_text().splitlines(keepends=True)
    path = tmp_path / "gap.csv"
    path.write_text("".join(lines[:11] + lines[12:]))          # 2021-03-01 10:00 gone
    assert "1 hour missing after 2021-03-01 09:00 UTC" in refused(path)


def test_a_duplicated_hour_in_the_shared_layout_is_refused_in_one_line(tmp_path):
    lines = DE_MARCH.read_text().splitlines(keepends=True)
    path = tmp_path / "dup.csv"
    path.write_text("".join(lines[:11] + [lines[10]] + lines[11:]))
    message = refused(path)
    assert "2021-03-01 09:00 UTC given twice" in message and "line 12" in message


def test_an_empty_value_in_the_shared_layout_is_a_gap(tmp_path):
    lines = DE_MARCH.read_text().splitlines(keepends=True)
    lines[5] = lines[5].rsplit(",", 1)[0] + ",\n"
    path = tmp_path / "empty.csv"
    path.write_text("".join(lines))
    assert "has no value: a gap" in refused(path)


def test_a_missing_quarter_hour_in_the_export_is_refused(tmp_path):
    path = write_export(tmp_path / "x.csv", sums(DE_MARCH)[:3], 4)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:6] + lines[7:]))
    assert "1 market time unit missing" in refused(path)


def test_an_export_mtu_without_a_day_ahead_value_inside_the_span_is_a_gap(tmp_path):
    path = write_export(tmp_path / "x.csv", sums(DE_MARCH)[:3], 4)
    rows = list(csv.reader(path.read_text().splitlines()))
    rows[5][1] = "-"
    with open(path, "w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)
    assert "has no solar value: a gap" in refused(path)
    rows[5][4] = "-"
    with open(path, "w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)
    assert "has no solar or wind offshore value: a gap" in refused(path)


def test_a_duplicated_mtu_in_the_export_is_refused(tmp_path):
    path = write_export(tmp_path / "x.csv", sums(DE_MARCH)[:3], 4)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:6] + [lines[5]] + lines[6:]))
    assert "given twice" in refused(path)


def test_unpublished_rows_at_the_end_of_an_export_are_trimmed_and_counted(tmp_path):
    start = utc(2021, 3, 1, 3)
    unpublished = [[mtu_text(start + timedelta(minutes=15 * i), start + timedelta(minutes=15 * (i + 1)), BRUSSELS,
                             "legacy", False)] + ["-"] * 9 for i in range(8)]
    path = write_export(tmp_path / "x.csv", sums(DE_MARCH)[:3], 4, extra_rows=unpublished)
    got = read_day_ahead(path, "DE")
    assert len(got.hours) == 3 and got.hours[-1].at == utc(2021, 3, 1, 2) and got.trimmed_rows == 8


def test_sums_of_a_zone_whose_mtus_per_hour_are_unknown_are_refused():
    assert "known only for DE, DE-LU, GB, not FR" in refused(DE_MARCH, "FR")


# -- the shared file's defects ----------------------------------------------------------------

def test_the_summer_time_end_row_is_halved_and_the_fix_is_said():
    got = read_day_ahead(DE_OCTOBER, "DE")
    by_hour = {h.at: h for h in got.hours}
    assert by_hour[utc(2021, 10, 31, 0)].wind_mw == 153985 / 8
    assert by_hour[utc(2021, 10, 30, 23)].wind_mw == 88084 / 4
    assert by_hour[utc(2021, 10, 31, 1)].wind_mw == 97990 / 4
    [fix] = got.fixes
    assert "2021-10-31 00:00 UTC" in fix and "local 02:00 CEST" in fix and "halved" in fix


def test_a_summer_time_end_row_that_is_not_doubled_is_left_alone(tmp_path):
    path = tmp_path / "fixed.csv"
    path.write_text(DE_OCTOBER.read_text().replace("2021-10-31 00:00:00,0.0,153985.0",
                                                   "2021-10-31 00:00:00,0.0,93000.0"))
    got = read_day_ahead(path, "DE")
    assert got.fixes == [] and {h.at: h for h in got.hours}[utc(2021, 10, 31, 0)].wind_mw == 93000 / 4


@pytest.mark.parametrize("times_neighbours, halved", [(1.35, False), (1.45, True), (2.2, True)])
def test_the_summer_time_row_is_halved_when_half_of_it_is_nearer_its_neighbours(tmp_path, times_neighbours, halved):
    mean = (88084 + 97990) / 2
    value = round(mean * times_neighbours)
    path = tmp_path / "row.csv"
    path.write_text(DE_OCTOBER.read_text().replace("2021-10-31 00:00:00,0.0,153985.0",
                                                   f"2021-10-31 00:00:00,0.0,{value}.0"))
    got = read_day_ahead(path, "DE")
    assert {h.at: h for h in got.hours}[utc(2021, 10, 31, 0)].wind_mw == value / (8 if halved else 4)
    assert len(got.fixes) == halved


def test_hours_the_source_filled_in_are_flagged_imputed():
    got = read_day_ahead(GB_APRIL, "GB")
    assert [h.at for h in got.hours if h.imputed] == [utc(2021, 4, 30, h) for h in range(1, 24)]


# -- the platform export around the clock changes ----------------------------------------------

@pytest.mark.parametrize("marks", [False, True])
def test_the_export_s_repeated_autumn_hour_maps_to_two_utc_hours(tmp_path, marks):
    hours = [(utc(2021, 10, 30, 22) + timedelta(hours=i), 0.0, 4000.0 * (i + 1)) for i in range(6)]
    path = write_export(tmp_path / "x.csv", hours, 4, marks=marks)
    assert "31.10.2021 02:00" in path.read_text() or "31/10/2021" in path.read_text()
    got = read_day_ahead(path, "DE")
    assert [(h.at, h.wind_mw) for h in got.hours] == [(at, pytest.approx(w / 4)) for at, _, w in hours]


def test_the_export_s_skipped_spring_hour_may_be_listed_empty_but_not_with_values(tmp_path):
    hours = [(utc(2021, 3, 27, 23) + timedelta(hours=i), 0.0, 4000.0) for i in range(4)]
    skipped = [[f"28.03.2021 02:{m:02d} - 28.03.2021 02:{m + 15:02d}".replace("02:60", "03:00")] + ["-"] * 9
               for m in (0, 15, 30, 45)]
    path = write_export(tmp_path / "x.csv", hours, 4, extra_rows=skipped)
    assert len(read_day_ahead(path, "DE").hours) == 4
    skipped[0][1:] = ["1"] * 9
    path = write_export(tmp_path / "x.csv", hours, 4, extra_rows=skipped)
    assert "does not exist in local time" in refused(path)


# -- when each value was known -------------------------------------------------------------------

@pytest.mark.parametrize("zone, hour, issued", [
    ("DE", utc(2021, 3, 1, 22), utc(2021, 2, 28, 17)),    # 23:00 CET on 1 March: issued 28 Feb 18:00 CET
    ("DE", utc(2021, 3, 1, 23), utc(2021, 3, 1, 17)),     # 00:00 CET on 2 March: issued 1 March 18:00 CET
    ("DE", utc(2021, 10, 31, 0), utc(2021, 10, 30, 16)),  # 02:00 CEST on 31 October: 30 Oct 18:00 CEST
    ("GB", utc(2021, 5, 1, 0), utc(2021, 4, 30, 17)),     # 01:00 BST on 1 May: 30 April 18:00 BST
    ("GB", utc(2021, 1, 1, 23), utc(2020, 12, 31, 18)),   # 23:00 GMT on 1 January: 31 Dec 18:00 GMT
])
def test_each_hour_is_issued_at_18_local_time_of_the_day_before(zone, hour, issued):
    assert issued_at(hour, zone) == issued
