"""telemetry.grid.csv_import: reading carbon-intensity trace files.

Three formats (Electricity Maps hourly exports, WattTime MOER, plain time,gco2_per_kwh) are
recognised from their header. Times become aware UTC; repeated and out-of-order rows are
handled and counted; an empty value is a gap (never a zero); anything malformed is
rejected with its line number. The Electricity Maps inputs are real slices (tests/data/carbon,
ODbL, see SOURCE.md).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from telemetry.grid.csv_import import detect_format, read_trace
from telemetry.grid.readings import CsvFormatError, lbs_per_mwh_to_g_per_kwh

DATA = Path(__file__).parents[1] / "data" / "carbon"
DE = DATA / "DE-LU_2022-01-01_to_2022-01-21_hourly.csv"
GB = DATA / "GB_2022-01-01_to_2022-01-14_hourly.csv"
BR = DATA / "BR-SP_2022-01-01_to_2022-01-02_hourly.csv"
EM_HEADER = ("Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),"
             "Carbon Intensity gCO₂eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,"
             "Data Source,Data Estimated,Data Estimation Method")
UTC = timezone.utc


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def em_row(t: str, value: str, zone: str = "DE", estimated: str = "false") -> str:
    return f"{t},Germany,Germany,{zone},{value},200.0,50.0,40.0,entsoe.eu,{estimated},"


# -- Electricity Maps exports (real slices) -------------------------------------------------

def test_an_electricitymaps_hourly_export_is_read_as_average_hourly_actuals():
    trace = read_trace(DE)
    assert trace.fmt == "electricitymaps"
    assert trace.zones == ["DE"]                       # the file's Zone Id, not the folder DE-LU
    assert trace.rows == len(trace.readings) == 21 * 24
    first = trace.readings[0]
    assert first.at == datetime(2022, 1, 1, 0, 0, tzinfo=UTC)
    assert first.gco2_per_kwh == pytest.approx(163.46)  # the direct column, not LCA (213.79)
    assert first.duration_s == 3600
    assert (first.signal, first.kind, first.source) == ("average", "actual", "electricitymaps-csv")
    assert first.estimated is False
    # an hourly average is only known once its hour has ended
    assert first.issued_at == first.at + timedelta(hours=1)
    assert trace.readings[-1].at == datetime(2022, 1, 21, 23, 0, tzinfo=UTC)


def test_the_zone_comes_from_the_file_even_when_the_folder_name_differs():
    assert read_trace(BR).zones == ["BR-CS"]


def test_zone_override_renames_the_readings():
    trace = read_trace(BR, zone="BR-SP")
    assert trace.zones == ["BR-SP"]
    assert {r.zone for r in trace.readings} == {"BR-SP"}


def test_the_subscript_header_is_read_as_utf8_and_a_non_utf8_file_is_rejected(tmp_path):
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes((EM_HEADER + "\n" + em_row("2022-01-01 00:00:00", "1.0")).encode("utf-8")
                       .replace("₂".encode(), b"\xb2"))
    with pytest.raises(CsvFormatError) as e:
        read_trace(latin1)
    assert e.value.line == 1
    assert "UTF-8" in str(e.value)


def test_lifecycle_values_can_be_chosen_instead_of_direct():
    trace = read_trace(DE, emission_factor="lifecycle")
    assert trace.readings[0].gco2_per_kwh == pytest.approx(213.79)


def test_the_format_is_detected_from_the_header():
    assert detect_format(EM_HEADER.split(",")) == "electricitymaps"
    assert detect_format(["point_time", "value", "version"]) == "watttime"
    assert detect_format(["timestamp", "MOER"]) == "watttime"
    assert detect_format(["time", "gco2_per_kwh"]) == "plain"
    assert detect_format(["when", "how_much"]) is None


# -- duplicates, order, gaps ----------------------------------------------------------------

def test_out_of_order_rows_are_sorted_and_counted(tmp_path):
    path = write(tmp_path, "\n".join([EM_HEADER, em_row("2022-01-01 02:00:00", "3"),
                                      em_row("2022-01-01 00:00:00", "1"),
                                      em_row("2022-01-01 01:00:00", "2")]) + "\n")
    trace = read_trace(path)
    assert [r.gco2_per_kwh for r in trace.readings] == [1, 2, 3]
    assert trace.out_of_order == 1
    assert trace.duration_s == {"DE": 3600}


def test_a_repeated_timestamp_keeps_the_last_row_and_counts_conflicts(tmp_path):
    path = write(tmp_path, "\n".join([EM_HEADER, em_row("2022-01-01 00:00:00", "1"),
                                      em_row("2022-01-01 01:00:00", "2"),
                                      em_row("2022-01-01 01:00:00", "2"),
                                      em_row("2022-01-01 01:00:00", "5")]) + "\n")
    trace = read_trace(path)
    assert [r.gco2_per_kwh for r in trace.readings] == [1, 5]
    assert trace.duplicates == 2
    assert trace.conflicting_duplicates == 1


def test_an_empty_value_is_a_gap_not_a_zero(tmp_path):
    path = write(tmp_path, "\n".join([EM_HEADER, em_row("2022-01-01 00:00:00", "1"),
                                      em_row("2022-01-01 01:00:00", ""),
                                      em_row("2022-01-01 02:00:00", "3")]) + "\n")
    trace = read_trace(path)
    assert [r.at.hour for r in trace.readings] == [0, 2]
    assert all(r.gco2_per_kwh > 0 for r in trace.readings)
    assert trace.missing == 1
    assert trace.duration_s == {"DE": 3600}   # the hole does not stretch the period


def test_a_file_with_two_zones_keeps_both_but_refuses_a_zone_override(tmp_path):
    path = write(tmp_path, "\n".join([EM_HEADER, em_row("2022-01-01 00:00:00", "1", "DE"),
                                      em_row("2022-01-01 00:00:00", "9", "FR")]) + "\n")
    assert read_trace(path).zones == ["DE", "FR"]
    with pytest.raises(CsvFormatError, match="several zones"):
        read_trace(path, zone="DE")


# -- malformed files: rejected with the line number -----------------------------------------

@pytest.mark.parametrize(("bad_row", "message"), [
    (em_row("2022-01-01 01:00:00", "abc"), "malformed value"),
    (em_row("2022-01-01 01:00:00", "-5"), "negative"),
    (em_row("2022-01-01 01:00:00", "nan"), "not a finite number"),
    (em_row("not a time", "5"), "malformed time"),
    ("2022-01-01 01:00:00,Germany,DE,5", "expected 11 fields, got 4"),
    (em_row("2022-01-01 01:00:00", "5", zone=""), "empty Zone Id"),
])
def test_a_malformed_row_is_rejected_with_its_line_number(tmp_path, bad_row, message):
    path = write(tmp_path, "\n".join([EM_HEADER, em_row("2022-01-01 00:00:00", "1"), bad_row,
                                      em_row("2022-01-01 02:00:00", "3")]) + "\n")
    with pytest.raises(CsvFormatError) as e:
        read_trace(path)
    assert e.value.line == 3
    assert message in str(e.value)
    assert f"{path}, line 3" in str(e.value)


def test_an_unknown_header_an_empty_file_and_a_missing_file_are_rejected(tmp_path):
    with pytest.raises(CsvFormatError, match="unrecognised header") as e:
        read_trace(write(tmp_path, "when,how_much\n2022-01-01,5\n"))
    assert e.value.line == 1
    with pytest.raises(CsvFormatError, match="empty file"):
        read_trace(write(tmp_path, "", "empty.csv"))
    with pytest.raises(CsvFormatError, match="no such file"):
        read_trace(tmp_path / "nope.csv")


# -- WattTime MOER --------------------------------------------------------------------------

def test_watttime_moer_is_converted_from_lbs_per_mwh_and_marked_marginal(tmp_path):
    path = write(tmp_path, "point_time,value,version,region\n"
                           "2024-01-01T00:05:00+00:00,1000.0,3.2,CAISO_NORTH\n"
                           "2024-01-01T00:00:00+00:00,900.0,3.2,CAISO_NORTH\n"
                           "2024-01-01T00:10:00+00:00,800.0,3.2,CAISO_NORTH\n")
    trace = read_trace(path)
    assert trace.fmt == "watttime"
    assert trace.zones == ["CAISO_NORTH"]
    assert [r.gco2_per_kwh for r in trace.readings] == pytest.approx([408.233133, 453.59237, 362.873896])
    assert lbs_per_mwh_to_g_per_kwh(1000) == pytest.approx(453.59237)  # 1 lb = 453.59237 g
    assert {(r.signal, r.kind, r.duration_s) for r in trace.readings} == {("marginal", "actual", 300)}


def test_a_v2_watttime_export_needs_the_zone_given(tmp_path):
    path = write(tmp_path, "timestamp,MOER\n2019-02-28 00:00:00+00:00,466\n2019-02-28 00:05:00+00:00,426\n")
    with pytest.raises(CsvFormatError, match="--zone"):
        read_trace(path)
    trace = read_trace(path, zone="CAISO_NORTH")
    assert trace.readings[0].gco2_per_kwh == pytest.approx(466 * 0.45359237)


def test_watttime_historical_forecasts_keep_their_generated_at_as_issue_time(tmp_path):
    path = write(tmp_path, "point_time,value,generated_at\n"
                           "2024-01-01T01:00:00Z,900,2024-01-01T00:00:00Z\n"
                           "2024-01-01T01:00:00Z,950,2024-01-01T00:30:00Z\n")
    trace = read_trace(path, zone="CAISO_NORTH")
    assert [(r.kind, r.issued_at.minute, round(r.gco2_per_kwh)) for r in trace.readings] == [
        ("forecast", 0, 408), ("forecast", 30, 431)]
    assert trace.duplicates == 0   # two issues of the same hour are two forecasts


def test_watttime_values_in_other_units_are_refused(tmp_path):
    path = write(tmp_path, "point_time,value,units\n2024-01-01T00:00:00Z,60,percentile\n")
    with pytest.raises(CsvFormatError, match="lbs_co2_per_mwh") as e:
        read_trace(path, zone="CAISO_NORTH")
    assert e.value.line == 2


# -- plain time,gco2_per_kwh and time zones -------------------------------------------------

def test_plain_times_with_offsets_become_utc(tmp_path):
    path = write(tmp_path, "time,gco2_per_kwh\n2022-06-01T02:00:00+02:00,100\n2022-06-01T01:00:00+00:00,110\n")
    trace = read_trace(path, zone="DE")
    assert [(r.at, r.gco2_per_kwh) for r in trace.readings] == [
        (datetime(2022, 6, 1, 0, 0, tzinfo=UTC), 100), (datetime(2022, 6, 1, 1, 0, tzinfo=UTC), 110)]
    assert trace.readings[0].source == "csv"


def test_plain_times_without_offset_are_read_in_the_given_time_zone_across_dst(tmp_path):
    # 2022-03-27: Berlin skips 02:00 local; 01:00 CET = 00:00 UTC, 03:00 CEST = 01:00 UTC
    path = write(tmp_path, "time,gco2_per_kwh\n2022-03-27 01:00,100\n2022-03-27 03:00,110\n")
    trace = read_trace(path, zone="DE", tz="Europe/Berlin")
    assert [r.at.hour for r in trace.readings] == [0, 1]
    assert trace.duration_s["DE"] == 3600
    utc = read_trace(path, zone="DE")
    assert [r.at.hour for r in utc.readings] == [1, 3]


def test_an_unknown_time_zone_is_a_clear_error(tmp_path):
    path = write(tmp_path, "time,gco2_per_kwh\n2022-03-27 01:00,100\n")
    with pytest.raises(CsvFormatError, match="unknown time zone"):
        read_trace(path, zone="DE", tz="Mars/Olympus")


def test_plain_rows_with_an_issue_time_are_forecasts_and_signal_is_per_row(tmp_path):
    path = write(tmp_path, "time,gco2_per_kwh,issued_at,signal,zone\n"
                           "2022-01-01T10:00Z,100,2022-01-01T08:00Z,average,DE\n"
                           "2022-01-01T10:00Z,300,,marginal,DE\n")
    trace = read_trace(path)
    kinds = {(r.kind, r.signal) for r in trace.readings}
    assert kinds == {("forecast", "average"), ("actual", "marginal")}
    with pytest.raises(CsvFormatError, match="signal 'dirty'"):
        read_trace(write(tmp_path, "time,gco2_per_kwh,signal\n2022-01-01T10:00Z,1,dirty\n", "s.csv"), zone="DE")


def test_progress_is_reported_up_to_the_end(tmp_path):
    seen: list[tuple[int, int]] = []
    read_trace(DE, progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1]
