"""The daemon is ready (READY=1 to systemd, the API answering) without waiting for its planner
process to load its policy, and without the policy tables (which a first start computes):
jobs submitted before the planner has loaded are planned by its first tick, once each.

The planner process is held at its start by the policy tables' cache file being a FIFO: it
waits there until the test writes the tables into it; then the daemon's own process, which
loads them once the planner has, waits there for the test's second write.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
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


def _wait_log(d: DaemonProcess, text: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in d.log():
        assert time.monotonic() < deadline, f"{text!r} not in the daemon's log after {timeout_s}s:\n{d.log()}"
        time.sleep(0.05)


def test_the_daemon_serves_before_its_planner_process_and_the_policy_tables_load_and_loses_no_job(tmp_path):
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
    try:
        d.start(wait=False)
        systemd.wait_for(lambda got: any("READY=1" in m for _, m in got))
        job = d.client().submit(argv=["true"], est_runtime_s=1, name="early", cwd=str(root),
                                env={"PATH": "/usr/bin:/bin"})["id"]
        log = d.log()
        assert "planner process started" in log and "planner process ready" not in log  # still held
        assert "policy tables" not in log  # nor read by the daemon's own process
        assert [j["state"] for j in d.client().jobs(include_done=True)] == ["PENDING"]  # not planned yet

        planner_feed = _feed(fifo, tables)  # the planner process loads: its first tick plans the early job
        _wait_log(d, "planner process ready")
        planner_feed.join(30)
        assert not planner_feed.is_alive()
        _feed(fifo, tables)  # then the daemon's own process
        _wait_log(d, "policy tables loaded")
        done = d.wait_states([job])
        assert done[job]["state"] == "COMPLETED"
        assert d.log().count("planner process ready") == 1 and "serving anyway" not in d.log()
    finally:
        d.stop()
        systemd.close()
        shutil.rmtree(root, ignore_errors=True)
