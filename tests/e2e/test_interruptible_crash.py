"""kill -9 of a real `carbonsched agent` process while an interruptible job is paused or
checkpointing (issue 30): after the agent's restart the job finishes once, with no lost
or repeated work beyond its last checkpoint. SQLite and PostgreSQL.

The head's part (submit, planner) runs in this process with a test policy that cuts jobs
into segments (tests/node/test_interruptible_run.SegmentingPolicy); the agent is its own process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scheduler.daemon.access import ServiceConfig
from scheduler.daemon.planner import Planner
from scheduler.daemon.service import JobService

from tests.node.test_interruptible_run import (ME, SegmentingPolicy, row, segs, steps_run, submit,
                                    uninterrupted_output)

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


class AgentProcess:
    def __init__(self, db_url: str, state_dir: Path, log_path: Path) -> None:
        self.db_url, self.state_dir, self.log_path = db_url, state_dir, log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.log_path, "a")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "agent", "--db", self.db_url, "--node", "n1", "--zone", "DE",
             "--state-dir", str(self.state_dir), "--emulate", "2xH100", "--sample-hz", "5",
             "--dispatch-interval", "0.2s"],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        log.close()

    def kill9(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, self.log_path.read_text()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def head(store, db_url, tmp_path):
    state = tmp_path / "agent-state"
    agent = AgentProcess(db_url, state, tmp_path / "agent.log")
    agent.start()
    service = JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=state / "logs")
    policy = SegmentingPolicy(first_s=1.5, gap_s=2.0)
    planner = Planner(store, policy, plan_interval_s=0.5)
    yield agent, service, planner, policy, state
    agent.stop()


def wait(planner, store, job_id, done, timeout_s=60.0, agent=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        planner.tick()
        r = row(store, job_id)
        if done(r):
            return r
        time.sleep(0.1)
    log = agent.log_path.read_text() if agent is not None else ""
    raise TimeoutError(f"job {job_id} is {row(store, job_id).state}\n{log[-4000:]}")


def test_kill_9_of_the_agent_during_a_pause_the_job_is_continued_and_finishes_once(head, store, tmp_path):
    agent, service, planner, policy, state = head
    job, out, trace = submit(service, tmp_path, kind="pause", steps=60)
    wait(planner, store, job, lambda r: r.state == "RUNNING" and service.get_job(ME, job)["paused_until"],
         agent=agent)
    agent.kill9()
    time.sleep(2.5)  # the planned pause ends while no agent runs: the supervisor continues it
    agent.start()
    final = wait(planner, store, job, lambda r: r.state in ("COMPLETED", "FAILED", "LOST"), agent=agent)
    assert final.state == "COMPLETED", final.reason
    assert out.read_text() == uninterrupted_output(tmp_path, 60)
    assert sorted(steps_run(trace)) == list(range(1, 61))
    assert [s.kind for s in segs(store, job)] == ["run", "pause", "run"]
    assert final.attempts == 1


def test_kill_9_of_the_agent_during_a_checkpoint_the_job_finishes_once(head, store, tmp_path):
    agent, service, planner, policy, state = head
    policy.gap_s = 0.5
    job, out, trace = submit(service, tmp_path, kind="checkpoint", steps=80, checkpoint_grace_s=5)
    request = state / "logs" / f"{job}.checkpoint"
    wait(planner, store, job, lambda r: request.exists(), agent=agent)
    agent.kill9()  # the job is saving its state now
    time.sleep(1.0)
    agent.start()
    final = wait(planner, store, job, lambda r: r.state in ("COMPLETED", "FAILED", "LOST"), agent=agent)
    assert final.state == "COMPLETED", final.reason
    assert out.read_text() == uninterrupted_output(tmp_path, 80)
    assert sorted(steps_run(trace)) == list(range(1, 81))  # nothing ran twice, nothing was skipped
    assert [s.outcome for s in segs(store, job)] == ["checkpointed", "checkpointed", "completed"]
    assert final.resume_count == 2
