"""End to end (issue 26): the real `carbonsched carbon import` and `carbonsched daemon`, on SQLite
and PostgreSQL, plan a 30-minute job into the 30-minute green slot of a real GB trace that
the trace's hourly mean hides.

The trace is tests/data/carbon/GB_2020-04-27_to_2020-06-21_30min_lwa.csv with its times moved
by whole half-hours so that 2020-06-11 13:00 UTC becomes the current half-hour; its values
are unchanged. The rows ahead are imported with --as-forecast (a forecast issued now). In
the next twelve hours the half-hour that was 14:00 (117.6 g/kWh) is the cleanest; on hourly
means the hour that was 00:00 the next day is (see tests/daemon/test_subhourly.py). The daemon's
slots are 15 minutes from the tick's `now`, not from the clock's quarter-hours, so the
planned start is one of the two slots around the half-hour's start: within one slot of it
(which of the two depends on the minute the test runs and on the neighbouring half-hours).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest

from daemon_harness import DB_KINDS, DaemonProcess, database_for, world_dir
from tests.daemon.test_subhourly import GREEN, HOURLY_PICK, T, rows, write_plain

pytestmark = pytest.mark.slow

SLOT = timedelta(seconds=900)


def _moved(path, hourly: bool) -> tuple[timedelta, list]:
    now = datetime.now(timezone.utc)
    here = now.replace(second=0, microsecond=0, minute=now.minute - now.minute % 30)
    shift = here - T
    data = rows()
    if hourly:  # the trace's own hours, averaged before the move
        by_hour: dict[datetime, list[float]] = {}
        for t, v in data:
            by_hour.setdefault(t.replace(minute=0), []).append(v)
        data = [(h, sum(vs) / len(vs)) for h, vs in sorted(by_hour.items())]
    data = [(t + shift, v) for t, v in data]
    write_plain(path, data)
    return shift, data


@pytest.mark.parametrize("view", ["30min", "hourly-mean"])
@pytest.mark.parametrize("db", DB_KINDS)
def test_the_daemon_plans_a_half_hour_job_into_the_green_half_hour(db, view):
    root = world_dir("cs-subhourly-")
    with database_for(db, root) as url:
        d = DaemonProcess(root, url, emulate="1xH100", env={"CARBONSCHED_ZONE": "GB"})
        try:
            shift, _ = _moved(root / "gb.csv", hourly=view == "hourly-mean")
            imp = d.cli("carbon", "import", str(root / "gb.csv"), "--zone", "GB", "--as-forecast", "--json",
                        "--db", url)
            assert imp.returncode == 0, imp.stderr
            assert json.loads(imp.stdout)["step_s"] == {"GB": 1800 if view == "30min" else 3600}
            d.start()
            sub = d.cli("submit", "--json", "--est-runtime", "30m", "--deadline", "12h", "--name", "half-hour",
                        "--", "true")
            assert sub.returncode == 0, sub.stderr
            job = json.loads(sub.stdout)["id"]
            d.wait_states([job], {"PLANNED"}, timeout_s=60)
            time.sleep(2)  # a few more ticks: the plan holds
            shown = d.cli("show", str(job), "--json")
            assert shown.returncode == 0, shown.stderr
            start = datetime.fromisoformat(json.loads(shown.stdout)["planned_start"].replace("Z", "+00:00"))
            if view == "30min":
                assert abs(start - (GREEN + shift)) < SLOT, (start, GREEN + shift)
            else:
                pick = HOURLY_PICK + shift
                assert pick - timedelta(seconds=5) <= start <= pick + timedelta(minutes=30), (start, pick)
        finally:
            d.cleanup()
