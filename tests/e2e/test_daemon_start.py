"""The daemon is ready (READY=1 to systemd, the API answering) without waiting for its planner
process to load its policy; jobs submitted before the planner has loaded are planned by its
first tick, once each.

The planner process is held at its start by the policy tables' cache file being a FIFO: the
daemon's own process reads it first (the test writes the tables into it once), then the
planner process opens it and waits there until the test writes them a second time.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from daemon_harness import DaemonProcess, world_dir
from scheduler import policy_tables
from test_systemd import FakeSystemd


def _feed(fifo: Path, data: bytes) -> threading.Thread:
    """Write `data` into the FIFO once a reader opens it (opening it for writing waits for one)."""
    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(data)

    t = threading.Thread(target=write, name="tables-fifo", daemon=True)
    t.start()
    return t


def test_the_daemon_serves_before_its_planner_process_has_loaded_and_loses_no_job(tmp_path):
    real = tmp_path / "real-cache"
    policy_tables.warm_policy_tables(real)
    tables = next(real.glob("policy-tables-*.pickle")).read_bytes()
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    fifo = cache / f"policy-tables-{policy_tables.tables_key()}.pickle"
    os.mkfifo(fifo, 0o600)
    root = world_dir("cs-start-")
    systemd = FakeSystemd(tmp_path / "notify.sock")
    d = DaemonProcess(root, None, emulate="2xH100",
                      env={"CARBONSCHED_CACHE_DIR": str(cache), "NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    daemon_feed = _feed(fifo, tables)  # the daemon's own read of the tables
    try:
        d.start(wait=False)
        systemd.wait_for(lambda got: any("READY=1" in m for _, m in got))
        job = d.client().submit(argv=["true"], est_runtime_s=1, name="early", cwd=str(root),
                                env={"PATH": "/usr/bin:/bin"})["id"]
        daemon_feed.join(5)
        assert not daemon_feed.is_alive()
        log = d.log()
        assert "planner process started" in log and "planner process ready" not in log  # still held
        assert "serving anyway" not in log
        assert [j["state"] for j in d.client().jobs(include_done=True)] == ["PENDING"]  # not planned yet

        _feed(fifo, tables)  # let the planner process load: its first tick plans the early job
        done = d.wait_states([job])
        assert done[job]["state"] == "COMPLETED"
        assert d.log().count("planner process ready") == 1
    finally:
        d.stop()
        systemd.close()
        shutil.rmtree(root, ignore_errors=True)
