#!/usr/bin/env python3
"""Two users on one carbonsched: replay the ten attacks of the second shared-cluster audit
against a daemon set up as the systemd unit sets it up, print whether each held, and time
another user's submits while one user floods the daemon.

The set-up (root, as `systemd/carbonsched.service` runs it): umask 077, a state directory
0711, the socket in a 0755 runtime directory, a world-readable config that holds no secret
and names a root-only `db_file` (the database URL, with a password on PostgreSQL), the
emulated fleet `2xH100,2xMI300X`, the metrics port on loopback, and two throwaway local
users: `mallory` (the attacker) and `bob` (everyone else). The users run what users run: the
CLI and the client library (`bench/audit_client.py`) with the system's python3, from a copy
of the code every user can read.

The attacks (numbered as the audit's findings) and what "held" means for each:

 1. mallory's job writes 700 MiB to stdout: its log stops at the output limit with the
    receipt saying so, bob still submits and root still cancels.
 2. secrets in the config: `config check` refuses a world-readable config with a database
    password in it; mallory cannot read the `db_file`; mallory's CLI works with a config it
    cannot read.
 3. mallory teaches a profile with two one-prompt sleep jobs: bob's 20,000-prompt job with a
    12-hour deadline is accepted and planned; only root may `profiles reset`.
 4. twelve 1,000-task held arrays and one array with a 250 KB argument: at most
    `max_queued_per_user` tasks are stored, the big one is refused, the store stays small.
 5. and 6. 32 threads `POST /v1/hold` with 130,000 ids and 32 threads reading a 4 MiB log of
    \\x01 bytes, together: bob's submits get no error and their p99 stays under 100 ms (beside
    the same run without the attack), mallory never gets a 500, the daemon's memory stays
    bounded and its log shows no exhausted pool.
 7. 1,000 half-sent requests to the metrics port: the daemon's threads stay bounded and bob's
    submits stay fast.
 8. root holds mallory's job: mallory's `release` is refused.
 9. `since=9999-12-31T23:59:59-23:59` and 1,001 `name=` filters: both a 400, no false outage.
10. removing mallory while her job runs: her processes are killed and the user is gone.

Run (as root, from the checkout): `.venv/bin/python bench/two_user_audit.py [--db
sqlite|postgres] [--submits N] [--json FILE]`. Exit 0 when every attack held and the p99
target is met, 1 otherwise, 2 when it cannot run (not root, no useradd). It takes about three
minutes. This is a benchmark, not a test: see docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scheduler.cli.client import ApiError, Client, DaemonUnreachable  # noqa: E402
from scheduler.simulate.metrics import percentile  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))  # throwaway users, made and removed as the test suite does
from suite_hygiene import make_user, pids_of_uid, remove_user  # noqa: E402

FLEET = "2xH100,2xMI300X"
OUTPUT_LIMIT_MIB = 64  # the config's job_output_limit_mib: attack 1 writes 700 MiB past it
TARGET_P99_MS = 100.0
FLOOD_THREADS = 32
HOLD_IDS = 130_000  # attack 5's body: 929 KB of ids
LOG_BYTES = 4 * 1024 * 1024  # attack 6's log
MAX_RSS_GROWTH_MB = 256.0  # the audit saw 576 -> 970 MB
HALF_SENT = 1000
PG_ADMIN_URL = os.environ.get("CARBONSCHED_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "LOST"}


def say(text: str) -> None:
    print(text, flush=True)


@dataclass
class Outcome:
    number: str
    attack: str
    held: bool
    detail: str


@dataclass
class World:
    """The daemon and its two users, set up as the unit does."""

    root: Path
    db: str
    daemon_log: Path = field(init=False)
    socket: Path = field(init=False)
    state: Path = field(init=False)
    code: Path = field(init=False)
    config: Path = field(init=False)
    db_file: Path = field(init=False)
    metrics_port: int = field(init=False)
    users: dict[str, str] = field(default_factory=dict)  # role -> user name
    proc: subprocess.Popen | None = None
    pg_database: str | None = None
    keep: bool = False

    def __post_init__(self) -> None:
        self.daemon_log = self.root / "daemon.log"
        self.socket = self.root / "run" / "carbonsched.sock"
        self.state = self.root / "state"
        self.code = self.root / "code"
        self.config = self.root / "etc" / "config.toml"
        self.db_file = self.root / "etc" / "db.url"
        self.metrics_port = _free_port()

    # -- set-up -------------------------------------------------------------------------------

    def set_up(self) -> None:
        self.root.chmod(0o755)
        for d, mode in (("run", 0o755), ("etc", 0o755), ("home", 0o755)):
            (self.root / d).mkdir(mode=mode)
            (self.root / d).chmod(mode)
        self.state.mkdir(mode=0o711)
        self.state.chmod(0o711)
        self._copy_code()
        for role in ("mallory", "bob"):
            name = make_user()
            self.users[role] = name
            home = self.root / "home" / name
            home.mkdir(mode=0o700)
            pw = pwd.getpwnam(name)
            os.chown(home, pw.pw_uid, pw.pw_gid)
        self.db_file.write_text(self._db_url() + "\n")
        self.db_file.chmod(0o600)
        self.config.write_text(
            f'# as an operator writes it: no secret here, the database URL is in a root-only file\n'
            f'db_file = "{self.db_file}"\n'
            f'job_output_limit_mib = {OUTPUT_LIMIT_MIB}\n'
            f'metrics_port = {self.metrics_port}\n')
        self.config.chmod(0o644)

    def _copy_code(self) -> None:
        """The packages and audit_client.py where every user can read them (the checkout may
        be a clone other users cannot enter)."""
        for pkg in ("scheduler", "policies", "telemetry"):
            shutil.copytree(ROOT / pkg, self.code / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copy(ROOT / "bench" / "audit_client.py", self.code / "audit_client.py")
        for path in [self.code, *self.code.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)

    def _db_url(self) -> str:
        if self.db == "sqlite":
            return f"sqlite:///{self.state / 'carbonsched.db'}"
        from sqlalchemy import create_engine, text

        self.pg_database = f"cs_audit_{uuid.uuid4().hex[:8]}"
        engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.pg_database}"'))
        engine.dispose()
        base = PG_ADMIN_URL.rsplit("/", 1)[0]
        # a password in the URL, as on a real cluster (this server trusts local connections
        # and never asks for it): the secret the config must not expose
        return base.replace("postgres@", "postgres:not-for-users@", 1) + f"/{self.pg_database}"

    def start_daemon(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CARBONSCHED_")}
        env.update(PYTHONUNBUFFERED="1", CARBONSCHED_CONFIG=str(self.config))
        cmd = [sys.executable, "-m", "scheduler", "daemon", "--state-dir", str(self.state),
               "--socket", str(self.socket), "--emulate", FLEET, "--local-agent"]
        with open(self.daemon_log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd="/", umask=0o077, env=env)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            try:
                Client(self.socket, timeout=2).request("GET", "/health")
                if "planner process started" not in self.log_text() or "planner process ready" in self.log_text():
                    return
            except (DaemonUnreachable, ApiError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"the daemon did not answer within 180 s:\n{self.log_text()[-4000:]}")

    def tear_down(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for name in self.users.values():
            with contextlib.suppress(Exception):
                remove_user(name)
        if self.pg_database:
            from sqlalchemy import create_engine, text

            engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
            with engine.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{self.pg_database}" WITH (FORCE)'))
            engine.dispose()
        if self.keep:
            say(f"kept {self.root} (the daemon's log: {self.daemon_log})")
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- acting as someone ----------------------------------------------------------------

    def home(self, role: str) -> Path:
        return self.root / "home" / self.users[role]

    def _as(self, role: str, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        return ["runuser", "-u", self.users[role], "--", "env", "-i", "PATH=/usr/bin:/bin",
                f"PYTHONPATH={self.code}", *[f"{k}={v}" for k, v in (env or {}).items()], *argv]

    def cli(self, role: str | None, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """`carbonsched ARGS` as `role` (None: root), from its home directory."""
        if role is None:
            argv = [sys.executable, "-m", "scheduler", "--socket", str(self.socket), *args]
            full_env = {k: v for k, v in os.environ.items() if not k.startswith("CARBONSCHED_")}
            full_env.update(env or {})
            return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=str(self.root),
                                  env=full_env)
        argv = [_system_python(), "-m", "scheduler", "--socket", str(self.socket), *args]
        return subprocess.run(self._as(role, argv, env), capture_output=True, text=True, timeout=120,
                              cwd=str(self.home(role)))

    def client_verb(self, role: str, verb: str, **kwargs) -> subprocess.Popen:
        """Start `audit_client.py VERB` as `role`, on this daemon's socket; its JSON comes on stdout."""
        if verb not in ("half_sent", "read_file"):
            kwargs.setdefault("socket_path", str(self.socket))
        argv = [_system_python(), str(self.code / "audit_client.py"), verb]
        proc = subprocess.Popen(self._as(role, argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=str(self.home(role)))
        proc.stdin.write(json.dumps(kwargs))  # on stdin: attack 4's body is past an argument's limit
        proc.stdin.close()
        proc.stdin = None
        return proc

    def run_verb(self, role: str, verb: str, timeout_s: float = 600, **kwargs) -> dict:
        return finish(self.client_verb(role, verb, **kwargs), timeout_s)

    def submit_cli(self, role: str, *args: str) -> int:
        done = self.cli(role, "submit", "--json", *args)
        if done.returncode != 0:
            raise RuntimeError(f"submit {' '.join(args)} as {role} failed: {done.stderr.strip()}")
        return json.loads(done.stdout)["id"]

    def root_client(self) -> Client:
        return Client(self.socket, timeout=120)

    def wait_state(self, job: int, states: set[str], timeout_s: float = 180) -> dict:
        client = self.root_client()
        deadline = time.monotonic() + timeout_s
        while True:
            row = client.job(job)
            if row["state"] in states:
                return row
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job} is {row['state']} after {timeout_s:.0f} s, not in {sorted(states)}: "
                                   f"{row.get('explanation') or row.get('reason')}")
            time.sleep(0.2)

    def cancel_all_of(self, role: str) -> None:
        client = self.root_client()
        ids = [j["id"] for j in client.jobs(users=[self.users[role]]) if j["state"] not in TERMINAL]
        for i in range(0, len(ids), 1000):
            client.cancel(ids[i:i + 1000])

    def log_text(self) -> str:
        try:
            return self.daemon_log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def daemon_status(self, key: str) -> float:
        """A field of /proc/PID/status of the daemon's main process (VmRSS in MB, Threads)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                value = float(line.split()[1])
                return value / 1024.0 if key == "VmRSS" else value
        raise KeyError(key)

    def state_bytes(self) -> int:
        """What the store takes: the state directory's files (SQLite), plus the database's
        size on the server (PostgreSQL)."""
        total = sum(p.stat().st_size for p in self.state.rglob("*") if p.is_file())
        if self.pg_database:
            from sqlalchemy import create_engine, text

            engine = create_engine(self.db_file.read_text().strip())
            with engine.connect() as conn:
                total += conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
            engine.dispose()
        return total


def _system_python() -> str:
    return shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def finish(proc: subprocess.Popen, timeout_s: float = 600) -> dict:
    out, err = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"audit client failed ({proc.returncode}): {err.strip()[-2000:]}")
    return json.loads(out)


def one_line(done: subprocess.CompletedProcess) -> str:
    return (done.stderr.strip() or done.stdout.strip()).splitlines()[-1] if (done.stderr or done.stdout) else ""


# -- the attacks ---------------------------------------------------------------------------------

def attack_1_output_flood(w: World) -> Outcome:
    job = w.submit_cli("mallory", "--est-runtime", "1m", "--", "sh", "-c", "head -c 700M /dev/zero; sleep 1")
    row = w.wait_state(job, TERMINAL)
    logs = list(w.state.rglob(f"{job}.out"))
    size = logs[0].stat().st_size if logs else 0
    bob = w.cli("bob", "submit", "--hold", "--json", "--", "true")
    bob_job = json.loads(bob.stdout)["id"] if bob.returncode == 0 else None
    cancel = w.cli(None, "cancel", str(bob_job)) if bob_job else None
    cut = row.get("output_truncated") or []
    held = (0 < size <= (OUTPUT_LIMIT_MIB + 1) * 2**20 and "stdout" in cut and bob.returncode == 0
            and cancel is not None and cancel.returncode == 0)
    return Outcome("1", "700 MiB of job output", held,
                   f"log {size / 2**20:.1f} MiB (limit {OUTPUT_LIMIT_MIB} MiB), output_truncated={cut}, "
                   f"bob's submit exit {bob.returncode}, root's cancel exit {cancel.returncode if cancel else '-'}")


def attack_2_config_secrets(w: World) -> Outcome:
    leaky = w.root / "etc" / "leaky.toml"
    leaky.write_text('db = "postgresql+psycopg://carbonsched:hunter2@db.example/carbonsched"\n')
    leaky.chmod(0o644)
    check = w.cli(None, "--config", str(leaky), "config", "check")
    private = w.root / "etc" / "private.toml"
    private.write_text(f'db_file = "{w.db_file}"\n')
    private.chmod(0o600)
    queue = w.cli("mallory", "queue", "--json", env={"CARBONSCHED_CONFIG": str(private)})
    read = w.run_verb("mallory", "read_file", path=str(w.db_file))
    held = check.returncode != 0 and queue.returncode == 0 and not read["readable"]
    return Outcome("2", "secrets in a readable config", held,
                   f"config check of a 0644 config with a password: exit {check.returncode} "
                   f"({one_line(check)[:90]}); mallory reads db_file: {read['readable']}; "
                   f"mallory's CLI with an unreadable config: exit {queue.returncode}")


def attack_3_poisoned_profiles(w: World) -> Outcome:
    teach = [w.submit_cli("mallory", "--workload", "llm-chat-70b", "--gpus", "2", "--prompts", "1",
                          "--est-runtime", "1m", "--", "sleep", "3") for _ in range(2)]
    for job in teach:
        w.wait_state(job, TERMINAL)
    bob = w.cli("bob", "submit", "--json", "--workload", "llm-chat-70b", "--gpus", "2", "--prompts", "20000",
                "--deadline", "12h", "--tpot-slo", "200ms", "--", "true")
    state = "-"
    if bob.returncode == 0:
        job = json.loads(bob.stdout)["id"]
        state = w.wait_state(job, {"PLANNED", "RUNNING", *TERMINAL}, timeout_s=120)["state"]
    reset_mallory = w.cli("mallory", "profiles", "reset")
    reset_root = w.cli(None, "profiles", "reset")
    w.cancel_all_of("bob")
    held = (bob.returncode == 0 and state in {"PLANNED", "RUNNING", "COMPLETED"}
            and reset_mallory.returncode != 0 and reset_root.returncode == 0)
    return Outcome("3", "profiles poisoned by one user", held,
                   f"bob's 20,000-prompt submit: exit {bob.returncode}, then {state}; "
                   f"mallory's profiles reset: exit {reset_mallory.returncode}; root's: exit {reset_root.returncode}")


def attack_4_arrays(w: World) -> Outcome:
    before = w.state_bytes()
    home = str(w.home("mallory"))
    statuses = [w.run_verb("mallory", "call", method="POST", path="/jobs",
                           body={"argv": ["sleep", "1"], "hold": True, "array": "0-999", "cwd": home})["status"]
                for _ in range(12)]
    big = w.run_verb("mallory", "call", method="POST", path="/jobs",
                     body={"argv": ["echo", "x" * 250_000], "hold": True, "array": "0-999", "cwd": home})
    stored = len([j for j in w.root_client().jobs(users=[w.users["mallory"]]) if j["state"] not in TERMINAL])
    grown_mb = (w.state_bytes() - before) / 1e6
    w.cancel_all_of("mallory")
    limit = 5000  # max_queued_per_user's default
    held = stored <= limit and 400 <= big["status"] < 500 and all(s < 500 for s in statuses) and grown_mb < 100
    return Outcome("4", "arrays past the queue and storage limits", held,
                   f"12 x 1,000 held tasks: {statuses.count(200)} arrays stored ({stored} tasks, limit {limit}), "
                   f"others {sorted(set(s for s in statuses if s != 200))}; 250 KB x 1,000: {big['status']}; "
                   f"store +{grown_mb:.1f} MB")


def attack_7_metrics(w: World) -> Outcome:
    threads_before = w.daemon_status("Threads")
    flood = w.client_verb("mallory", "half_sent", host="127.0.0.1", port=w.metrics_port,
                          connections=HALF_SENT, hold_s=20.0)
    peak = threads_before
    bob = w.client_verb("bob", "submit_latency", n=60, pause_s=0.2,
                        argv=["true"], est_runtime_s=60.0)
    while bob.poll() is None:
        peak = max(peak, w.daemon_status("Threads"))
        time.sleep(0.1)
    bob_r, flood_r = finish(bob), finish(flood)
    w.cancel_all_of("bob")
    p99 = percentile(bob_r["latencies_ms"], 99)
    held = peak - threads_before <= 32 and p99 < TARGET_P99_MS and set(bob_r["statuses"]) == {"200"}
    return Outcome("7", "1,000 half-sent metrics requests", held,
                   f"daemon threads {threads_before:.0f} -> peak {peak:.0f}; of {flood_r['opened']} opened "
                   f"(in {flood_r['connect_s']:.1f} s), {flood_r['answered_busy']} answered 503 at once, "
                   f"{flood_r['closed_by_server']} closed, {flood_r['still_open']} open after 20 s; "
                   f"bob's submit p99 {p99:.0f} ms")


def attack_8_operator_hold(w: World) -> Outcome:
    job = w.submit_cli("mallory", "--hold", "--", "true")
    root_hold = w.cli(None, "hold", str(job))
    release = w.cli("mallory", "release", str(job))
    root_release = w.cli(None, "release", str(job))
    w.cancel_all_of("mallory")
    held = root_hold.returncode == 0 and release.returncode != 0 and root_release.returncode == 0
    return Outcome("8", "the owner releases an operator's hold", held,
                   f"mallory's release: exit {release.returncode} ({one_line(release)[:80]}); "
                   f"root's release: exit {root_release.returncode}")


def attack_9_filters(w: World) -> Outcome:
    before = w.log_text().count("cannot be reached")
    since = w.run_verb("mallory", "call", method="GET", path="/jobs",
                       query={"since": "9999-12-31T23:59:59-23:59"})
    names = w.run_verb("mallory", "call", method="GET", path="/jobs", query={"name": [f"n{i}" for i in range(1001)]})
    outage = w.log_text().count("cannot be reached") - before
    held = since["status"] == 400 and names["status"] == 400 and outage == 0
    return Outcome("9", "times out of range, 1,001 filters", held,
                   f"since=9999-12-31T23:59:59-23:59: {since['status']}; 1,001 name= filters: {names['status']}; "
                   f"outage warnings logged: {outage}")


def attack_10_remove_running_user(w: World) -> Outcome:
    job = w.submit_cli("mallory", "--est-runtime", "10m", "--", "sleep", "600")
    w.wait_state(job, {"RUNNING"})
    name = w.users["mallory"]
    uid = pwd.getpwnam(name).pw_uid
    deadline = time.monotonic() + 60  # RUNNING is set just before the command starts as her
    while not pids_of_uid(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        remove_user(name)
        gone, why = True, "removed"
    except RuntimeError as e:
        gone, why = False, str(e)
    if gone:
        del w.users["mallory"]
    state = w.wait_state(job, TERMINAL, timeout_s=120)["state"] if gone else "-"
    health = w.run_verb("bob", "call", method="GET", path="/health")["status"]
    return Outcome("10", "removing a user whose job runs", gone and health == 200,
                   f"userdel: {why}; her job then {state}; bob's health check {health}")


# -- attacks 5 and 6, and the latency they cost bob -----------------------------------------------

def submit_phase(w: World, n: int, label: str) -> dict:
    r = w.run_verb("bob", "submit_latency", n=n, pause_s=0.05,
                   argv=["true"], est_runtime_s=3600.0)
    lat = r["latencies_ms"]
    return {"label": label, "n": len(lat), "p50_ms": statistics.median(lat), "p99_ms": percentile(lat, 99),
            "max_ms": max(lat), "statuses": r["statuses"], "latencies_ms": lat}


def attacks_5_and_6(w: World, n: int) -> tuple[list[Outcome], list[dict]]:
    log_job = w.submit_cli("mallory", "--est-runtime", "1m", "--", "sh", "-c",
                           f"head -c {LOG_BYTES} /dev/zero | tr '\\000' '\\001'")
    w.wait_state(log_job, TERMINAL)
    blockers = [w.submit_cli("bob", "--est-runtime", "1d", "--", "sleep", "900") for _ in range(4)]
    for job in blockers:  # running, or planned behind one another: bob's submits queue behind them
        w.wait_state(job, {"PLANNED", "RUNNING"})
    phases = [submit_phase(w, n, "quiet")]
    stop = w.root / "run" / f"stop-{uuid.uuid4().hex[:6]}"
    pool_errors_before = w.log_text().count("QueuePool limit")
    rss_before = w.daemon_status("VmRSS")
    hold = w.client_verb("mallory", "hold_flood", threads=FLOOD_THREADS,
                         stop_file=str(stop), max_s=600.0, ids=HOLD_IDS)
    logs = w.client_verb("mallory", "log_flood", threads=FLOOD_THREADS,
                         stop_file=str(stop), max_s=600.0, job=log_job)
    peak_rss = [rss_before]
    sampling = threading.Event()

    def sample_rss() -> None:
        while not sampling.wait(0.2):
            with contextlib.suppress(OSError, KeyError):
                peak_rss[0] = max(peak_rss[0], w.daemon_status("VmRSS"))

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    try:
        phases.append(submit_phase(w, n, "attacks 5+6"))
    finally:
        stop.touch()
        hold_r, logs_r = finish(hold), finish(logs)
        sampling.set()
        sampler.join()
    phases.append(submit_phase(w, n, "quiet again"))
    pool_errors = w.log_text().count("QueuePool limit") - pool_errors_before
    w.cancel_all_of("bob")
    attacked = phases[1]
    bob_ok = set(attacked["statuses"]) == {"200"} and attacked["p99_ms"] < TARGET_P99_MS
    growth = peak_rss[0] - rss_before
    o5 = Outcome("5", "32 threads of 130,000-id holds", bob_ok and all(int(s) < 500 or int(s) == 503
                                                                        for s in hold_r["statuses"])
                 and pool_errors == 0,
                 f"mallory's {hold_r['calls']} holds: {hold_r['statuses']}; pool errors logged: {pool_errors}; "
                 f"bob's submits {attacked['statuses']}, p99 {attacked['p99_ms']:.0f} ms")
    o6 = Outcome("6", "32 threads reading a 4 MiB \\x01 log", bob_ok and growth < MAX_RSS_GROWTH_MB
                 and all(int(s) < 500 or int(s) == 503 for s in logs_r["statuses"]),
                 f"mallory's {logs_r['calls']} whole-log reads: {logs_r['statuses']}; daemon RSS "
                 f"{rss_before:.0f} -> peak {peak_rss[0]:.0f} MB; bob's p99 {attacked['p99_ms']:.0f} ms")
    return [o5, o6], phases


# -- the run ---------------------------------------------------------------------------------------

def _replay(step, w: World) -> Outcome:
    """One attack's outcome; an attack that could not be carried out or checked (a timeout,
    a client that failed) is reported as broken with what went wrong."""
    try:
        return step(w)
    except Exception as e:  # noqa: BLE001 - the rest of the attacks still run
        number = step.__name__.split("_")[1]
        return Outcome(number, step.__name__.split("_", 2)[2].replace("_", " "), False,
                       f"error: {str(e).splitlines()[0][:300]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite",
                        help="the store: SQLite in the state directory (default) or a temporary "
                             "PostgreSQL database on $CARBONSCHED_TEST_PG_URL's server")
    parser.add_argument("--submits", type=int, default=300,
                        help="bob's submits per latency phase (default 300, 50 ms apart)")
    parser.add_argument("--attacks", default="1,2,3,4,5,6,7,8,9,10",
                        help="which attacks to replay (comma-separated; 5 and 6 run together)")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (the daemon's log, the "
                                                                 "state dir) for a look afterwards")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("two_user_audit: needs root: it runs the daemon as the unit does and creates two "
              "throwaway users", file=sys.stderr)
        return 2
    if shutil.which("useradd") is None or shutil.which("runuser") is None:
        print("two_user_audit: needs useradd and runuser", file=sys.stderr)
        return 2
    w = World(Path(tempfile.mkdtemp(prefix="cs-audit-")), args.db, keep=args.keep)
    t0 = time.monotonic()
    outcomes: list[Outcome] = []
    phases: list[dict] = []
    try:
        w.set_up()
        say(f"daemon as the unit runs it: root, umask 077, state dir 0711, {FLEET} emulated, {args.db}; "
            f"users mallory={w.users['mallory']} bob={w.users['bob']}")
        w.start_daemon()
        steps = [attack_9_filters, attack_8_operator_hold, attack_2_config_secrets, attack_4_arrays,
                 attack_1_output_flood, attack_3_poisoned_profiles, attack_7_metrics]
        chosen = {a.strip() for a in args.attacks.split(",")}
        for step in [s for s in steps if s.__name__.split("_")[1] in chosen]:
            say(f"[{time.monotonic() - t0:5.0f} s] {step.__name__.replace('_', ' ')} ...")
            outcomes.append(_replay(step, w))
            say(f"        {'held' if outcomes[-1].held else 'BROKEN'}: {outcomes[-1].detail}")
        if chosen & {"5", "6"}:
            say(f"[{time.monotonic() - t0:5.0f} s] attacks 5 and 6 with bob's submits timed ...")
            try:
                flood_outcomes, phases = attacks_5_and_6(w, args.submits)
            except Exception as e:  # noqa: BLE001 - reported as broken, the other attacks still run
                flood_outcomes = [Outcome(n, "floods of holds and log reads", False, f"error: {e}") for n in "56"]
            outcomes.extend(flood_outcomes)
        if "10" in chosen:
            say(f"[{time.monotonic() - t0:5.0f} s] attack 10 remove running user ...")
            outcomes.append(_replay(attack_10_remove_running_user, w))
            say(f"        {'held' if outcomes[-1].held else 'BROKEN'}: {outcomes[-1].detail}")
    finally:
        w.tear_down()
    outcomes.sort(key=lambda o: int(o.number))
    say("")
    say(f"{'#':>2}  {'attack':<42} {'result':<7} detail")
    for o in outcomes:
        say(f"{o.number:>2}  {o.attack:<42} {'held' if o.held else 'BROKEN':<7} {o.detail}")
    held = sum(o.held for o in outcomes)
    target = bool(phases) and phases[1]["p99_ms"] < TARGET_P99_MS
    if phases:
        say("")
        say(f"bob's submits ({args.submits} per phase, 50 ms apart, one connection), {args.db}:")
        say(f"  {'phase':<12} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}  statuses")
        for p in phases:
            say(f"  {p['label']:<12} {p['p50_ms']:7.1f} {p['p99_ms']:7.1f} {p['max_ms']:7.1f}  {p['statuses']}")
    p99 = (f"; bob's submit p99 under attacks 5+6 {'<' if target else '>='} {TARGET_P99_MS:.0f} ms"
           if phases else "")
    say(f"{held}/{len(outcomes)} held{p99} ({time.monotonic() - t0:.0f} s in all)")
    if args.json:
        args.json.write_text(json.dumps({"db": args.db, "fleet": FLEET,
                                         "attacks": [o.__dict__ for o in outcomes], "submit_phases": phases,
                                         "target_p99_ms": TARGET_P99_MS}, indent=2))
    return 0 if held == len(outcomes) and (target or not phases) else 1


if __name__ == "__main__":
    sys.exit(main())
