"""Crash safety of power limits (issue 29): kill -9 the node agent mid-job 20 times while
jobs planned with a power limit flow through it; at the end no GPU is left capped.

The agent runs as its own process (`carbonsched agent --emulate`) against SQLite and
PostgreSQL. The emulated boards keep their limits in the state directory across agent
restarts, as real boards do (a limit outlives the process that set it), so a killed agent
really leaves capped GPUs behind: the restarted agent must restore each GPU that runs no job
of ours, and the jobs it adopts must get their GPUs restored when they end.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from daemon_harness import DB_KINDS, REPO, TERMINAL, database_for, world_dir
from scheduler.clock import utcnow
from scheduler.daemon.access import Caller, ServiceConfig
from scheduler.daemon.service import JobService
from scheduler.node.main import EMULATED_LIMITS_FILE
from scheduler.store import Store
from scheduler.store.models import gpus, job_events, jobs

pytestmark = pytest.mark.slow

JOBS = 24
KILLS = 20
GPUS = 4
H100_DEFAULT_W = 700.0
CAP_W = 490.0  # 70 % of an H100's 700 W default


class AgentProcess:
    def __init__(self, root, url):
        self.root, self.url = root, url
        self.state = root / "state"
        self.log_path = root / "agent.log"
        self.proc = None
        self.starts = 0

    def start(self):
        cmd = [sys.executable, "-m", "scheduler", "agent", "--db", self.url, "--state-dir", str(self.state),
               "--node", "n1", "--zone", "DE", "--emulate", f"{GPUS}xH100", "--dispatch-interval", "0.2s",
               "--grace", "1s"]
        with open(self.log_path, "a") as log:
            log.write(f"\n==== start {self.starts} ====\n")
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.starts += 1

    def kill9(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def limits(self) -> dict[str, float]:
        path = self.state / EMULATED_LIMITS_FILE
        return json.loads(path.read_text()) if path.exists() else {}

    def log(self) -> str:
        return self.log_path.read_text()[-20000:] if self.log_path.exists() else ""


@pytest.fixture(params=DB_KINDS)
def world(request):
    root = world_dir("cs-capcrash-")
    with database_for(request.param, root) as url:
        (root / "state").mkdir(exist_ok=True)
        store = Store(url)
        store.upgrade()
        agent = AgentProcess(root, url)
        try:
            yield store, agent
        finally:
            agent.stop()
            store.dispose()
            import shutil
            shutil.rmtree(root, ignore_errors=True)


def wait_for(predicate, timeout_s, what, agent):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} after {timeout_s}s:\n{agent.log()}")


def test_kill_9_of_the_agent_mid_job_20_times_leaves_no_gpu_capped(world):
    store, agent = world
    rng = random.Random(20261201)
    ledger = agent.root / "ledger"
    agent.start()

    def gpu_ids():
        with store.read() as conn:
            return sorted(conn.execute(select(gpus.c.id).where(gpus.c.node_name == "n1")).scalars())

    wait_for(lambda: len(gpu_ids()) == GPUS, 30, "the agent never registered its GPUs", agent)
    ids_of_gpus = gpu_ids()
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=agent.state / "logs")
    me = Caller(uid=os.getuid(), gid=os.getgid())
    start = utcnow()
    ids = []
    for i in range(JOBS):
        secs = rng.choice(["0.8", "1.2", "1.6", "2.0"])
        job = service.submit(me, {"argv": ["sh", "-c", f'echo "$CARBONSCHED_JOB_ID $CARBONSCHED_POWER_LIMIT_W" '
                                            f'>> {ledger}; sleep {secs}'],
                                  "gpus": 1, "cwd": str(agent.root), "env": {"PATH": "/usr/bin:/bin"}})["id"]
        ids.append(job)
        with store.engine.begin() as conn:  # what the planner writes: the GPU, the start, the limit
            conn.execute(update(jobs).where(jobs.c.id == job).values(
                state="PLANNED", planned_node="n1", planned_gpu_ids=[ids_of_gpus[i % GPUS]],
                planned_start=start + timedelta(seconds=0.4 * i), planned_power_limit_w=CAP_W))

    def replan() -> None:
        """The planner's part: a job the agent re-queued (claimed but never launched when it
        was killed) is planned again on its GPU, now."""
        with store.engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id.in_(ids), jobs.c.state == "PENDING").values(
                state="PLANNED", planned_node="n1", planned_start=utcnow(), planned_power_limit_w=CAP_W,
                planned_gpu_ids=[ids_of_gpus[0]]))

    def running() -> int:
        replan()
        with store.read() as conn:
            return len(conn.execute(select(jobs.c.id).where(jobs.c.state == "RUNNING")).all())

    capped_at_kill = 0
    for kill in range(KILLS):
        wait_for(lambda: running() > 0 or kill >= KILLS - 2, 30, "no job running to kill the agent under", agent)
        time.sleep(rng.uniform(0.0, 0.6))
        capped_at_kill += sum(1 for w in agent.limits().values() if w < H100_DEFAULT_W)
        agent.kill9()
        agent.start()
    def all_ended() -> bool:
        replan()
        with store.read() as conn:
            states = conn.execute(select(jobs.c.state).where(jobs.c.id.in_(ids))).scalars().all()
        return all(s in TERMINAL for s in states)

    try:
        wait_for(all_ended, 180, "jobs did not all end", agent)
    except TimeoutError as e:
        with store.read() as conn:
            states = dict(conn.execute(select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(ids))).all())
        raise TimeoutError(f"{states}\n{e}") from None
    time.sleep(1.0)  # a tick after the last end
    agent.stop()

    limits = agent.limits()
    assert len(limits) == GPUS
    left_capped = {u: w for u, w in limits.items() if abs(w - H100_DEFAULT_W) > 0.5}
    assert not left_capped, f"GPUs left capped: {left_capped}\n{agent.log()}"
    with store.read() as conn:
        rows = {r.id: r for r in conn.execute(select(jobs.c.id, jobs.c.state, jobs.c.power_limit_w)
                                              .where(jobs.c.id.in_(ids)))}
        set_events = conn.execute(select(job_events.c.job_id).where(
            job_events.c.reason.like("GPU power limit set to%"))).scalars().all()
    assert {r.state for r in rows.values()} == {"COMPLETED"}, {i: r.state for i, r in rows.items()}
    lines = [line.split() for line in ledger.read_text().splitlines()]
    assert lines and all(len(p) == 2 and float(p[1]) == CAP_W for p in lines), lines  # every run was capped
    assert capped_at_kill > 0, "no kill hit a capped GPU: the test proved nothing"
    log = agent.log()
    restored_at_start = log.count("at start-up, no job of ours runs on it")
    print(f"\npower-limit crash test: {agent.starts} agent starts, {KILLS} kill -9, {len(set_events)} limits set for {JOBS} jobs "
          f"at {CAP_W:g} W, {capped_at_kill} capped GPUs seen at the kills, "
          f"{restored_at_start} GPU limits restored at start-up, 0 of {GPUS} GPUs left capped")
