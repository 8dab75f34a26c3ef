"""`carbonsched carbon import FILE --zone Z` with grid operators' day-ahead wind and solar
forecasts: both layouts are recognised from the header (beside the carbon-intensity traces),
the import says in one line what it stored, the summer-time fix is said, a file with a gap or
a duplicated hour is refused in one line (exit 2) with nothing stored, and `carbon forget`
deletes a zone's day-ahead forecasts with its other values.

Inputs: slices of the shared files (tests/data/grid_day_ahead/SOURCE.md) and a platform
export written from one by tests/telemetry/test_day_ahead_files.py's writer.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from scheduler.cli.common import CliError
from scheduler.store import Store
from scheduler.store.grid_models import grid_day_ahead
from tests.cli.test_carbon_cli import DE, carbon, carbonsched, env  # noqa: F401  (env: the fixture)
from tests.telemetry.test_day_ahead_files import (
    DE_MARCH,
    DE_OCTOBER,
    GB_APRIL,
    sums,
    write_export,
    write_per_type_exports,
)


def stored(env: dict[str, str]) -> int:
    """Rows in the day-ahead table (the import migrates the database before it reads the file)."""
    store = Store(env["CARBONSCHED_DB"])
    try:
        with store.read() as conn:
            return conn.execute(select(func.count()).select_from(grid_day_ahead)).scalar()
    finally:
        store.dispose()


def test_the_shared_layout_imports_in_one_line(env, capsys):
    assert carbon("import", str(DE_MARCH), "--zone", "DE") == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("imported 72 hours of day-ahead wind and solar forecasts for DE")
    assert "2021-03-01T00:00:00Z" in line and "2021-03-03T23:00:00Z" in line
    assert "hourly mean MW" in line and "18:00 Europe/Berlin the day before" in line
    assert stored(env) == 72 * 2                                  # solar and wind per hour


def test_the_platform_export_imports_in_one_line(env, capsys, tmp_path):
    export = write_export(tmp_path / "Generation Forecasts for Wind and Solar_202103010000-202103040000.csv",
                          sums(DE_MARCH), 4)
    assert carbon("import", str(export), "--zone", "DE") == 0
    [line] = capsys.readouterr().out.splitlines()
    assert "ENTSO-E export BZN|DE-LU" in line and "15 min MTUs" in line and line.startswith("imported 72 hours")


def test_the_newer_export_of_one_type_per_file_imports_and_says_what_wind_still_needs(env, capsys, tmp_path):
    files = write_per_type_exports(tmp_path, sums(DE_MARCH), 4)
    assert carbon("import", str(files["ONSHORE"]), "--zone", "DE") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("imported 72 hours of day-ahead wind onshore forecasts for DE (ENTSO-E export BZN|DE-LU")
    assert out[1] == "  note: an hour's wind is known once both its onshore and offshore forecasts are imported"
    assert carbon("import", str(files["OFFSHORE"]), "--zone", "DE", "--json") == 0
    assert json.loads(capsys.readouterr().out)["production_types"] == ["wind_offshore"]
    assert stored(env) == 72 * 2


def test_the_summer_time_fix_and_imputed_hours_are_said(env, capsys):
    assert carbon("import", str(DE_OCTOBER), "--zone", "DE") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("imported 48 hours")
    assert out[1].startswith("  fixed: summer-time end 2021-10-31 00:00 UTC") and "halved" in out[1]
    assert carbon("import", str(GB_APRIL), "--zone", "GB", "--json") == 0
    got = json.loads(capsys.readouterr().out)
    assert got["production_types"] == ["solar", "wind"]
    assert (got["kind"], got["zone"], got["hours"], got["imputed_hours"], got["mtu_s"]) == \
        ("day_ahead_wind_solar", "GB", 72, 23, 1800)
    assert got["known_from"] == "18:00 Europe/London the day before"
    assert got["first_issued_at"] == "2021-04-28T17:00:00Z"


@pytest.mark.parametrize("damage, words", [("gap", "1 hour missing after 2021-03-01 09:00 UTC"),
                                           ("duplicate", "2021-03-01 09:00 UTC given twice")])
def test_a_file_with_a_gap_or_a_duplicated_hour_is_refused_in_one_line_and_nothing_is_stored(
        env, tmp_path, damage, words):
    lines = DE_MARCH.read_text().splitlines(keepends=True)
    bad = tmp_path / "bad.csv"
    bad.write_text("".join(lines[:11] + lines[12:] if damage == "gap" else lines[:11] + [lines[10]] + lines[11:]))
    proc = carbonsched(env, "carbon", "import", str(bad), "--zone", "DE")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"carbonsched: cannot import {bad}") and words in line and "nothing stored" in line
    assert proc.stdout == ""
    assert stored(env) == 0


def test_a_day_ahead_file_needs_a_zone_and_takes_no_as_forecast(env):
    with pytest.raises(CliError, match="give --zone Z") as e:
        carbon("import", str(DE_MARCH))
    assert e.value.code == 2
    with pytest.raises(CliError, match="--as-forecast is for carbon-intensity traces"):
        carbon("import", str(DE_MARCH), "--zone", "DE", "--as-forecast")


def test_carbon_intensity_traces_still_import_as_before(env, capsys):
    assert carbon("import", str(DE)) == 0
    out = capsys.readouterr().out
    assert out.startswith("imported 504 values for DE") and "electricitymaps format" in out
    assert stored(env) == 0


def test_forget_deletes_a_zone_s_day_ahead_forecasts_too(env, capsys):
    assert carbon("import", str(DE_MARCH), "--zone", "DE-LU") == 0       # meant DE
    assert carbon("import", str(DE_MARCH), "--zone", "DE") == 0
    capsys.readouterr()
    assert carbon("forget", "--zone", "DE-LU") == 0
    assert capsys.readouterr().out == "deleted 144 day-ahead wind and solar forecast values of zone DE-LU\n"
    assert stored(env) == 144                                              # DE's are kept
    with pytest.raises(CliError, match="no carbon data for zone 'DE-LU' \\(zones with data: DE\\)"):
        carbon("forget", "--zone", "DE-LU")
