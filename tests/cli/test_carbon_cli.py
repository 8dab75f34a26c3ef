"""`carbonsched carbon import|show|zones`: the operator's view of the carbon-signal store.

Contract: the verbs work on the store directly (--db / CARBONSCHED_DB / the state dir),
`show --json` has at least zone, at, gco2_per_kwh, kind, signal, source, the forecast
list and freshness; static values and downgrades are flagged; every error is one clear
line (`carbonsched: ...`) with exit code 2 for bad input, never a traceback.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.cli import carbon as cli_carbon
from scheduler.cli.common import CliError

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parents[1] / "data" / "carbon"
DE = DATA / "DE-LU_2022-01-01_to_2022-01-21_hourly.csv"
BR = DATA / "BR-SP_2022-01-01_to_2022-01-02_hourly.csv"

@pytest.fixture
def env(tmp_path, monkeypatch) -> dict[str, str]:
    """No CARBONSCHED_* settings from the caller; the database is a SQLite file in tmp_path."""
    for key in list(os.environ):
        if key.startswith("CARBONSCHED_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("CARBONSCHED_DB", f"sqlite:///{tmp_path / 'carbon.db'}")
    return {**{k: v for k, v in os.environ.items()}, "PYTHONPATH": str(ROOT)}


def carbon(*argv: str, config: dict | None = None) -> int:
    parser = argparse.ArgumentParser(prog="carbonsched")
    cli_carbon.add_parser(parser.add_subparsers(dest="verb"))
    return cli_carbon.run(parser.parse_args(["carbon", *argv]), config or {})


def carbonsched(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scheduler", *argv], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def show_json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert carbon("show", "--json", *argv) == 0
    return json.loads(capsys.readouterr().out)


# -- import ---------------------------------------------------------------------------------


def _plain_csv_around_now(path: Path) -> list[tuple]:
    """A plain CSV without issued_at: hourly rows from 24 h ago to 26 h ahead (51 rows), the
    value 123 from 3 h ahead on. Returns (period start, value) per row."""
    from datetime import datetime, timedelta, timezone

    hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    rows = [(hour + timedelta(hours=k), 300.0 if k < 3 else 123.0) for k in range(-24, 27)]
    path.write_text("time,gco2_per_kwh\n" + "".join(f"{t.isoformat()},{v}\n" for t, v in rows))
    return rows


def test_an_import_says_how_many_rows_lie_in_the_future_and_that_they_are_unused_as_actuals(env, tmp_path, capsys):
    """Issue 16 defect 5: future rows without issued_at used to be imported silently as
    actuals that are "not known yet"; the import said only "imported 51 values"."""
    from datetime import datetime, timedelta

    rows = _plain_csv_around_now(tmp_path / "lab.csv")
    assert carbon("import", str(tmp_path / "lab.csv"), "--zone", "LAB-1", "--json") == 0
    result = json.loads(capsys.readouterr().out)
    imported_at = datetime.fromisoformat(result["imported_at"].replace("Z", "+00:00"))
    future = [t for t, _ in rows if t + timedelta(hours=1) > imported_at]
    assert result["rows_stored"] == len(rows) == 51
    assert result["future_values"] == len(future) > 0
    assert result["future_stored_as"] == "actual"
    assert carbon("import", str(tmp_path / "lab.csv"), "--zone", "LAB-1") == 0
    out = capsys.readouterr().out
    assert f"{len(future)} of them lie in the future" in out
    assert "stored as actuals" in out and "--as-forecast" in out
    # ... and as actuals they are indeed not used: three hours ahead is not the file's 123
    ahead = show_json(capsys, "--zone", "LAB-1", "--at", "3h")
    assert ahead["gco2_per_kwh"] != 123.0


def test_as_forecast_stores_the_future_rows_as_a_forecast_issued_at_import_time(env, tmp_path, capsys):
    from datetime import datetime, timedelta

    rows = _plain_csv_around_now(tmp_path / "lab.csv")
    assert carbon("import", str(tmp_path / "lab.csv"), "--zone", "LAB-1", "--as-forecast", "--json") == 0
    result = json.loads(capsys.readouterr().out)
    imported_at = datetime.fromisoformat(result["imported_at"].replace("Z", "+00:00"))
    assert result["future_stored_as"] == "forecast"
    assert result["future_values"] == sum(1 for t, _ in rows if t + timedelta(hours=1) > imported_at)
    # a window that lies inside the file (its rows end 27 h after the current hour began): past
    # the file the own forecast would fill in, issued at the moment of `show`, not of the import
    ahead = show_json(capsys, "--zone", "LAB-1", "--at", "3h", "--hours", "20")
    assert (ahead["kind"], ahead["source"], ahead["gco2_per_kwh"]) == ("forecast", "csv", 123.0)
    assert len(ahead["forecast"]) >= 20
    assert all((p["kind"], p["source"], p["issued_at"]) == ("forecast", "csv", result["imported_at"])
               for p in ahead["forecast"])
    # the rows already over stay actuals, known at the end of their hour
    past = show_json(capsys, "--zone", "LAB-1", "--at", (rows[0][0] + timedelta(minutes=30)).isoformat())
    assert (past["kind"], past["gco2_per_kwh"]) == ("actual", 300.0)
    capsys.readouterr()
    assert carbon("import", str(tmp_path / "lab.csv"), "--zone", "LAB-1", "--as-forecast") == 0
    assert "stored as a forecast issued now" in capsys.readouterr().out


def test_import_help_documents_issued_at_and_as_forecast(env, capsys):
    with pytest.raises(SystemExit):
        carbon("import", "--help")
    text = capsys.readouterr().out
    assert "issued_at" in text and "--as-forecast" in text and "time,gco2_per_kwh" in text

def test_import_reports_what_it_stored(env, capsys):
    assert carbon("import", str(DE)) == 0
    out = capsys.readouterr().out
    assert "imported 504 values for DE" in out and "2022-01-01T00:00:00Z" in out


def test_import_json_and_zone_override(env, capsys):
    assert carbon("import", str(BR), "--zone", "BR-SP", "--json") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["zones"] == ["BR-SP"] and result["rows_stored"] == 48
    assert result["format"] == "electricitymaps" and result["signals"] == ["average"]


def test_import_of_a_malformed_file_is_one_line_with_the_line_number(env, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("time,gco2_per_kwh\n2022-01-01T00:00Z,100\n2022-01-01T01:00Z,lots\n")
    proc = carbonsched(env, "carbon", "import", str(bad), "--zone", "DE")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("carbonsched: cannot import ")
    assert "line 3" in lines[0] and "'lots'" in lines[0]


def test_a_missing_file_or_zone_is_a_usage_error(env, tmp_path):
    with pytest.raises(CliError, match="no such file") as e:
        carbon("import", str(tmp_path / "x.csv"))
    assert e.value.code == 2
    plain = tmp_path / "plain.csv"
    plain.write_text("time,gco2_per_kwh\n2022-01-01T00:00Z,100\n")
    with pytest.raises(CliError, match="give the zone"):
        carbon("import", str(plain))


def test_a_big_import_shows_a_progress_bar_on_a_terminal(env, monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(cli_carbon, "PROGRESS_MIN_BYTES", 0)
    assert carbon("import", str(DE)) == 0
    assert "[##############################] 100%" in err.getvalue()


# -- show -----------------------------------------------------------------------------------

def test_show_json_inside_the_record_is_the_actual_value(env, capsys):
    carbon("import", str(DE))
    data = show_json(capsys, "--zone", "DE", "--at", "2022-01-10T12:30:00Z", "--hours", "6")
    for key in ("zone", "at", "gco2_per_kwh", "kind", "signal", "source", "forecast", "freshness"):
        assert key in data, key
    assert data["zone"] == "DE" and data["at"] == "2022-01-10T12:30:00Z"
    assert (data["kind"], data["signal"], data["source"]) == ("actual", "average", "electricitymaps-csv")
    assert data["valid_from"] == "2022-01-10T12:00:00Z"
    assert len(data["forecast"]) == 7 and {p["kind"] for p in data["forecast"]} == {"actual"}
    assert data["gaps"] == []
    assert data["freshness"]["latest_actual_at"] == "2022-01-21T23:00:00Z"


def test_show_as_of_a_past_moment_gets_the_own_forecast_with_its_quality(env, capsys):
    carbon("import", str(DE))
    data = show_json(capsys, "--zone", "DE", "--at", "2022-01-10T12:00:00Z", "--as-of", "2022-01-10T06:00:00Z")
    assert (data["kind"], data["source"]) == ("forecast", "own-forecast")
    assert data["forecast_level"] == "own" and 0 < data["forecast_expected_mape_pct"] < 20
    assert "no live forecast provider" in data["forecast_reason"]
    assert all(p["issued_at"] <= "2022-01-10T06:00:00Z" for p in data["forecast"])


def test_show_now_falls_back_to_the_flagged_static_value(env, capsys):
    carbon("import", str(DE))
    data = show_json(capsys, "--zone", "DE")
    assert (data["kind"], data["source"], data["forecast_level"]) == ("static", "static", "static")
    assert data["gco2_per_kwh"] == data["static"]["gco2_per_kwh"]
    capsys.readouterr()
    assert carbon("show", "--zone", "DE") == 0
    text = capsys.readouterr().out
    assert "STATIC yearly average, not live data" in text
    assert "downgraded:" in text


def test_show_errors_are_one_clear_line(env):
    proc = carbonsched(env, "carbon", "show", "--zone", "DE")
    assert proc.returncode == 1 and "import a trace first" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    carbonsched(env, "carbon", "import", str(DE))
    proc = carbonsched(env, "carbon", "show", "--zone", "XX")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "carbonsched: no carbon data for zone 'XX' (zones with data: DE)"
    proc = carbonsched(env, "carbon", "show", "--zone", "de")  # a zone name in the wrong case
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("carbonsched: no carbon data for zone 'de' (did you mean 'DE'? "
                                   "zones with data: DE)")
    proc = carbonsched(env, "carbon", "show", "--zone", "DE", "--at", "yesterday-ish")
    assert proc.returncode == 2 and "malformed time" in proc.stderr and "Traceback" not in proc.stderr


# -- zones ----------------------------------------------------------------------------------

def test_zones_lists_data_providers_and_static_values(env, capsys, tmp_path):
    from scheduler.cli.common import CliError

    with pytest.raises(CliError, match="no database at"):  # a wrong --db is no "no zones", exit 0
        carbon("zones")
    assert not (tmp_path / "carbon.db").exists()
    carbon("import", str(DE))
    carbon("import", str(BR))
    capsys.readouterr()
    config = {"carbon": {"zones": {"GB": {"provider": "ukgrid"}}}}
    assert carbon("zones", "--json", config=config) == 0
    zones = {z["zone"]: z for z in json.loads(capsys.readouterr().out)}
    assert set(zones) == {"BR-CS", "DE", "GB"}
    assert zones["DE"]["actual_rows"] == 504 and zones["DE"]["last_actual_at"] == "2022-01-21T23:00:00Z"
    assert zones["GB"]["provider"] == "ukgrid"
    assert carbon("zones", config=config) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:3] == ["ZONE", "SIGNAL", "SOURCES"]


def test_a_bad_carbon_config_is_a_usage_error(env):
    with pytest.raises(CliError, match="config: carbon config zones.DE.provider") as e:
        carbon("zones", config={"carbon": {"zones": {"DE": {"provider": "carbonara"}}}})
    assert e.value.code == 2


def test_the_verb_is_wired_into_carbonsched(env):
    """`carbonsched carbon` is a verb of the installed command line."""
    from scheduler.cli import main as cli

    verbs = cli.build_parser()._subparsers._group_actions[0].choices
    assert "carbon" in verbs
    assert carbonsched(env, "db", "upgrade").returncode == 0  # an empty store: no zones yet
    proc = subprocess.run([sys.executable, "-m", "scheduler", "carbon", "zones", "--json"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_an_intensity_beyond_any_grid_is_refused_and_a_zone_can_be_forgotten(env, tmp_path, capsys):
    """Issue 28: 1e9 g/kWh is a unit mistake, not data; a zone imported by mistake can go."""
    from scheduler.cli.common import CliError

    bad = tmp_path / "bad.csv"
    bad.write_text("time,gco2_per_kwh,zone\n2022-01-01T00:00:00Z,1e9,XX\n")
    with pytest.raises(CliError, match="beyond any grid"):
        carbon("import", str(bad))
    ok = tmp_path / "ok.csv"
    ok.write_text("time,gco2_per_kwh,zone\n2022-01-01T00:00:00Z,350,XX\n2022-01-01T01:00:00Z,1999,XX\n")
    assert carbon("import", str(ok)) == 0
    carbon("import", str(DE))
    capsys.readouterr()
    assert carbon("forget", "--zone", "XX") == 0
    assert "deleted 2 values of zone XX" in capsys.readouterr().out
    assert carbon("zones", "--json") == 0
    assert [z["zone"] for z in json.loads(capsys.readouterr().out)] == ["DE"]
    with pytest.raises(CliError, match="no carbon data for zone 'XX'"):
        carbon("forget", "--zone", "XX")
