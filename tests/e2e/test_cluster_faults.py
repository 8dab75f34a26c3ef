"""A multi-node cluster on PostgreSQL survives the faults of real clusters.

One head-node daemon and three node agents, each its own process with its own emulated fleet
(different GPU models and zones), share only the PostgreSQL store: a server of the test's own,
so that restarting it disturbs nobody else on the machine. 120 jobs flow through
while one agent is killed with -9 in the middle of running jobs (and restarted, as systemd
would), PostgreSQL itself is restarted once, and the daemon is killed with -9 twice.

Every job's command appends its id to a ledger, so the ledger counts how often each really
ran. Afterwards every job is in exactly one terminal state, none ran twice, none vanished.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from daemon_harness import REPO, DaemonProcess, world_dir

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

JOBS = 120
AGENTS = [("node-de", "DE", "8xMI300X"), ("node-gb", "GB", "4xH100"), ("node-us", "US-CAL-CISO", "4xA100")]


class AgentProcess:
    """One `carbonsched agent` process of a GPU node, restartable like a systemd service."""

    def __init__(self, root: Path, config: Path, db_url: str, node: str, zone: str, fleet: str) -> None:
        self.root, self.config, self.db_url = root, config, db_url
        self.node, self.zone, self.fleet = node, zone, fleet
        self.log_path = root / f"agent-{node}.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        with open(self.log_path, "a") as log:
            log.write(f"\n==== start {self.starts} ====\n")
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "scheduler", "--config", str(self.config), "agent",
                 "--db", self.db_url, "--node", self.node, "--zone", self.zone,
                 "--state-dir", str(self.root / f"state-{self.node}"), "--emulate", self.fleet,
                 "--sample-hz", "2", "--dispatch-interval", "0.2s"],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.starts += 1

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent {self.node} exited with {self.proc.returncode}:\n{self.log()}")
            if self.log().count("carbonsched agent ready") >= self.starts:
                return
            time.sleep(0.1)
        raise TimeoutError(f"agent {self.node} not ready:\n{self.log()}")

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except FileNotFoundError:
            return ""


class PrivatePostgres:
    """A PostgreSQL server of the test's own (initdb in a temporary directory, a free port),
    so the test can restart it without disturbing anyone else using the machine's server."""

    def __init__(self, root: Path) -> None:
        bindirs = sorted(Path("/usr/lib/postgresql").glob("*/bin")) if Path("/usr/lib/postgresql").exists() else []
        pg_config = shutil.which("pg_config")
        if pg_config:
            bindirs.append(Path(subprocess.run([pg_config, "--bindir"], capture_output=True,
                                               text=True).stdout.strip()))
        self.bin = next((b for b in reversed(bindirs) if (b / "pg_ctl").exists()), None)
        if self.bin is None:
            self._unavailable("PostgreSQL server binaries (initdb, pg_ctl) not installed")
        if os.geteuid() == 0:
            try:
                import pwd
                pwd.getpwnam("postgres")
            except KeyError:
                self._unavailable("running as root needs a `postgres` user for initdb")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        else:
            self.as_user = []
        self.dir = root / "pg"
        self.dir.mkdir()
        if self.as_user:
            shutil.chown(self.dir, "postgres", "postgres")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    @staticmethod
    def _unavailable(why: str) -> None:
        if os.environ.get("CARBONSCHED_REQUIRE_PG"):
            pytest.fail(f"CARBONSCHED_REQUIRE_PG=1 but {why}")
        pytest.skip(why)

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, capture_output=True, text=True, timeout=120)

    def _ctl(self, *args: str) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-w", "-t", "60", *args)

    def start(self) -> None:
        self._run(str(self.bin / "initdb"), "-D", str(self.dir / "data"), "-A", "trust", "-U", "postgres",
                  "--no-sync")
        self._ctl("-l", str(self.dir / "server.log"),
                  "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def restart(self) -> None:
        """Fast restart: every session is cut off, as when an operator restarts the server."""
        self._ctl("-m", "fast", "-l", str(self.dir / "server.log"), "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off",
                  "restart")

    def stop(self) -> None:
        try:
            self._ctl("-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass


def ledger_lines(path: Path) -> int:
    try:
        return len(path.read_text().split())
    except FileNotFoundError:
        return 0


def wait_for_ledger(path: Path, n: int, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while ledger_lines(path) < n:
        assert time.monotonic() < deadline, f"only {ledger_lines(path)} of {n} jobs started in time"
        time.sleep(0.1)


def test_three_agents_survive_agent_kill_postgres_restart_and_daemon_kills():
    root = world_dir("cs-cluster-")
    rng = random.Random(7)
    pg = PrivatePostgres(root)
    pg.start()
    url = pg.url
    head = DaemonProcess(root, url, emulate=None, local_agent=False)
    agents = [AgentProcess(root, head.config, url, *spec) for spec in AGENTS]
    try:
        head.start()
        for a in agents:
            a.start()
        for a in agents:
            a.wait_ready()
        ledger = root / "ledger"
        client = head.client()
        ids = []
        for i in range(JOBS):
            secs = rng.choice(["0.2", "0.5", "1.0", "1.5"])
            # Most jobs must start at once (max delay 1 s), so they use whichever node is free;
            # the rest may wait for the zone the planner finds cleanest.
            urgent = {"max_delay_s": 1} if i % 4 else {}
            r = client.submit(argv=["sh", "-c", f'echo "$CARBONSCHED_JOB_ID" >> {ledger}; sleep {secs}'],
                              gpus=rng.choice([1, 1, 1, 2]), est_runtime_s=2, name=f"cluster-{i}",
                              cwd=str(root), env={"PATH": "/usr/bin:/bin"}, **urgent)
            ids.append(r["id"])
        client.close()

        wait_for_ledger(ledger, JOBS // 5)
        victim = None
        deadline = time.monotonic() + 60
        while victim is None:  # an agent that is running jobs right now
            assert time.monotonic() < deadline, "no agent ran any job"
            running = [j["node"] for j in head.client().jobs(states=["RUNNING"])]
            victim = next((a for a in agents if a.node in running), None)
        victim.kill9()  # its running jobs' supervisors live on; the restarted agent adopts them
        time.sleep(2.0)
        victim.start()
        victim.wait_ready()

        wait_for_ledger(ledger, 2 * JOBS // 5)
        pg.restart()

        wait_for_ledger(ledger, 11 * JOBS // 20)
        head.kill9()
        head.start(wait=False)
        time.sleep(rng.uniform(0.2, 1.5))
        head.kill9()
        head.start()

        jobs = head.wait_states(ids, timeout_s=240)
    finally:
        head.stop()
        for a in agents:
            a.stop()
        logs = {a.node: a.log() for a in agents}
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                per_job = dict(conn.execute(text(
                    "select job_id, count(*) from job_events where to_state in "
                    "('COMPLETED','FAILED','CANCELLED','TIMEOUT','LOST') group by job_id")).all())
                nodes_used = dict(conn.execute(text(
                    "select node, count(*) from jobs group by node")).all())
        finally:
            engine.dispose()
            pg.stop()

    runs = Counter(int(line) for line in ledger.read_text().split()) if ledger.exists() else Counter()
    twice = {job_id: n for job_id, n in runs.items() if n > 1}
    assert not twice, f"jobs ran more than once: {twice}"
    assert set(ids) <= set(jobs), "a job vanished"
    bad = {i: per_job.get(i) for i in ids if per_job.get(i) != 1}
    assert not bad, f"jobs without exactly one terminal event: {bad}"
    states = Counter(j["state"] for j in jobs.values())
    assert states == Counter({"COMPLETED": JOBS}), states
    assert all(runs[i] == 1 for i in ids)
    assert len([n for n in nodes_used if n]) == 3, nodes_used  # all three agents ran jobs
    adopted = sum(int(m) for m in re.findall(r"reconciled (\d+) running job", logs[victim.node]))
    assert adopted > 0, "the killed agent had no running job to adopt: the kill proved nothing"
    print(f"\ncluster faults: {JOBS} jobs, states {dict(states)}, ledger lines {sum(runs.values())}, "
          f"jobs per node {nodes_used}, adopted by the restarted agent ({victim.node}) {adopted}, "
          f"daemon starts {head.starts}, agent starts {[a.starts for a in agents]}")
    shutil.rmtree(root, ignore_errors=True)  # kept, with every log, when the test fails
