"""The planner's child process: woken by submissions, it plans, reports, and never makes the
API threads that wake it wait."""

from __future__ import annotations

import threading
import time

import pytest

from scheduler.daemon.access import Caller, ServiceConfig
from scheduler.daemon.planner_process import PlannerProcess, PlannerSpec
from scheduler.daemon.service import JobService


@pytest.fixture
def planned(store, tmp_path):
    ticks: list[tuple[float, int]] = []
    done = threading.Event()

    def on_tick(duration_s: float, changed: int) -> None:
        ticks.append((duration_s, changed))
        if changed:
            done.set()

    proc = PlannerProcess(PlannerSpec(db_url=store.engine.url.render_as_string(hide_password=False),
                                      policy="fifo"), on_tick=on_tick)
    proc.start()
    yield proc, ticks, done
    proc.stop()


def test_a_wake_up_plans_queued_jobs_in_the_child_and_reports_back(planned, store, tmp_path):
    proc, ticks, done = planned
    # A node with one GPU so that fifo can place the job.
    from scheduler.node.agent import Agent
    from scheduler.node.config import AgentConfig
    from telemetry.gpu import EmulatedBackend, EmulatedModel

    agent = Agent(store, EmulatedBackend([EmulatedModel("H100", "nvidia", 80, 70, 700)], node="n1"),
                  AgentConfig(node="n1", zone="DE", state_dir=tmp_path / "s"))
    agent.register()
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path)
    job = service.submit(Caller(0, 0), {"argv": ["true"], "gpus": 1})["id"]
    proc.wake()
    assert done.wait(60), f"no tick reported a change: {ticks}"
    assert service.get_job(Caller(0, 0), job)["state"] == "PLANNED"


def test_a_flood_of_wake_ups_never_blocks_the_caller(planned):
    proc, ticks, done = planned
    started = time.monotonic()
    for _ in range(20_000):  # far more than a pipe buffer holds
        proc.wake()
    assert time.monotonic() - started < 2.0


def test_a_plan_preview_runs_in_a_worker_process_with_the_daemons_policy_and_site(store, tmp_path):
    """`carbonsched plan` in the daemon: the worker builds the planner from the same spec as
    the planner child (policy, carbon from the store, PUE), answers, and writes nothing."""
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import insert, select, update

    from scheduler.carbon import CarbonSignals
    from scheduler.daemon.planner_process import PreviewProcess
    from scheduler.site import SiteConfig
    from scheduler.store.models import gpus, jobs, nodes

    # Carbon rows for zone GB up to now (a constant series: the estimate depends on PUE only).
    now = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    csv = tmp_path / "gb.csv"
    lines = ["time,gco2_per_kwh,zone"]
    lines += [f"{(now - timedelta(hours=h)).isoformat()},200,GB" for h in range(48, 0, -1)]
    csv.write_text("\n".join(lines) + "\n")
    CarbonSignals(store, track_status=False).writes.import_file(csv)
    with store.write() as conn:
        conn.execute(insert(nodes).values(name="gb1", zone="GB", backend="emulated", emulated=True,
                                          registered_at=now, last_heartbeat=datetime.now(timezone.utc)))
        conn.execute(insert(gpus).values(node_name="gb1", index=0, uuid="gb1-0", model="H100",
                                         vendor="nvidia", memory_gib=80, healthy=True))
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path)
    job = service.submit(Caller(0, 0), {"argv": ["true"], "gpus": 1, "est_runtime_s": 3600})["id"]
    url = store.engine.url.render_as_string(hide_password=False)

    grams = {}
    for pue in (1.0, 2.0):
        preview = PreviewProcess(PlannerSpec(db_url=url, policy="greedy",
                                             site=SiteConfig(site_pue=pue)))
        try:
            preview.rows()  # the worker starts (spawn, imports: a minute and more on a loaded host)
            # The node is alive while it beats: a heartbeat older than the node timeout (60 s)
            # would take its GPU out of the plan, and the worker's start must not age it.
            with store.write() as conn:
                conn.execute(update(nodes).where(nodes.c.name == "gb1")
                             .values(last_heartbeat=datetime.now(timezone.utc)))
            (row,) = preview.rows()
        finally:
            preview.stop()
        assert (row["job"], row["node"], row["zone"], row["gpus"]) == (job, "gb1", "GB", [0]), row
        grams[pue] = row["gco2"]
    assert grams[1.0] > 0
    assert grams[2.0] == pytest.approx(2 * grams[1.0])
    with store.read() as conn:
        assert conn.execute(select(jobs.c.state).where(jobs.c.id == job)).scalar_one() == "PENDING"


def test_a_helper_process_exits_when_its_parent_is_killed(tmp_path):
    """Issue 28: after `kill -9` of the daemon its preview worker stayed alive with PPID 1."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "helper.pid"
    helper = tmp_path / "helper.py"
    helper.write_text("import os, sys, time\n"
                      "from scheduler.process import exit_when_orphaned\n"
                      "exit_when_orphaned(0.1)\n"
                      "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
                      "time.sleep(60)\n")
    code = ("import subprocess, sys, time\n"
            f"subprocess.Popen([sys.executable, {str(helper)!r}, {str(pid_file)!r}])\n"
            "time.sleep(60)\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": root})
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        helper = int(pid_file.read_text())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(helper, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(helper, signal.SIGKILL)
            raise AssertionError("the helper outlived its killed parent")
    finally:
        if parent.poll() is None:
            parent.kill()
