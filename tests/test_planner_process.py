"""The planner's child process: woken by submissions, it plans, reports, and never makes the
API threads that wake it wait."""

from __future__ import annotations

import threading
import time

import pytest

from scheduler.planner_process import PlannerProcess, PlannerSpec
from scheduler.service import Caller, JobService, ServiceConfig


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
    from scheduler.agent import Agent, AgentConfig
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
