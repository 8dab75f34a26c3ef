"""Run the real `carbonsched daemon` as a subprocess for end-to-end tests.

The state directory lives in a world-traversable temporary directory so that throwaway
non-root users can reach the socket and their jobs' working directory.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


from databases import DB_KINDS, database_for  # noqa: F401  (re-exported for the e2e tests)
from scheduler.cli.client import ApiError, Client, DaemonUnreachable

REPO = Path(__file__).resolve().parent.parent
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "LOST"}


def world_dir(prefix: str) -> Path:
    """A temporary directory everyone can traverse and write into (like /tmp itself), inside
    the test run's own directory (TMPDIR, tests/suite_hygiene.py)."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    d.chmod(0o1777)
    return d


_CODE_COPY: Path | None = None


def readable_code_copy() -> Path:
    """A copy of the packages in a directory every user can read, made once per test process,
    for commands run as throwaway users: a clone in a 0700 directory (`mktemp -d`, /root)
    cannot be read by them, so `PYTHONPATH=<clone>` would give "No module named scheduler"."""
    global _CODE_COPY
    if _CODE_COPY is None or not _CODE_COPY.exists():
        dst = Path(tempfile.mkdtemp(prefix="carbonsched-code-"))
        for pkg in ("scheduler", "policies", "telemetry"):
            shutil.copytree(REPO / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for path in [dst, *dst.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        _CODE_COPY = dst
        atexit.register(shutil.rmtree, dst, True)
    return _CODE_COPY


PLANNER_LOAD_WAIT_S = 90.0  # beyond the daemon's readiness: its planner process on a loaded host
# Until the daemon answers: seconds on a quiet host, but 30 s were not enough with four test
# workers and two CPU busy loops on 2 cores (fixtures failed at set-up).
START_TIMEOUT_S = 120.0


class DaemonProcess:
    def __init__(self, root: Path, db_url: str | None, *, emulate: str | None = "4xH100",
                 extra: list[str] | None = None, grace: str = "1s", local_agent: bool = True,
                 env: dict[str, str] | None = None, umask: int | None = None) -> None:
        self.root = root
        self.umask = -1 if umask is None else umask  # the daemon's umask (-1: this process's)
        self.state_dir = root / "state"
        self.socket = root / "carbonsched.sock"
        self.db_url = db_url
        self.emulate = emulate
        self.extra = extra or []
        self.local_agent = local_agent
        self.env = env or {}
        self.config = root / "carbonsched.toml"
        self.config.write_text(f'grace = "{grace}"\n')
        self.proc: subprocess.Popen | None = None
        self.log_path = root / "daemon.log"
        self.starts = 0

    def start(self, *, wait: bool = True, timeout_s: float = START_TIMEOUT_S) -> None:
        cmd = [sys.executable, "-m", "scheduler", "--config", str(self.config), "daemon",
               "--state-dir", str(self.state_dir), "--socket", str(self.socket),
               *(["--db", self.db_url] if self.db_url else []),  # None: from the config (db_file)
               "--plan-interval", "1s", "--dispatch-interval", "0.2s",
               "--local-agent" if self.local_agent else "--no-local-agent",
               *(["--emulate", self.emulate] if self.emulate else []), *self.extra]
        log = open(self.log_path, "a")
        log.write(f"\n==== start {self.starts} ====\n")
        log.flush()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, umask=self.umask,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})
        log.close()
        self.starts += 1
        if wait:
            try:
                self.wait_ready(timeout_s)
            except BaseException:  # never leave a daemon behind that no fixture will stop
                self.stop()
                raise

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            try:
                Client(self.socket, timeout=2).request("GET", "/health")
            except (DaemonUnreachable, ApiError, OSError):
                time.sleep(0.05)
                continue
            self._wait_planner_loaded(PLANNER_LOAD_WAIT_S)
            return
        # Stop it: a fixture whose start() raises never reaches its cleanup, and daemons left
        # behind by timed-out starts load a busy host further (issue 28's full run left 41).
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        raise TimeoutError(f"daemon not ready after {timeout_s}s:\n{self.log()}")

    def _wait_planner_loaded(self, timeout_s: float) -> None:
        """A daemon serves at once, before its planner process has loaded its policy; on a
        loaded host the child can take long to import OR-Tools, and a test that submits then
        would wait on a planner that has not planned yet. So wait for its "ready" line (this
        start's part of the log only); carry on when it does not come."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                this_start = self.log_path.read_text(errors="replace").rsplit("==== start ", 1)[-1]
            except FileNotFoundError:
                return
            if "planner process started" not in this_start or "planner process ready" in this_start:
                return
            if self.proc and self.proc.poll() is not None:
                return
            time.sleep(0.1)

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout_s: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def dump_stacks(self, timeout_s: float = 10.0) -> str:
        """Have the daemon write its threads' stacks into its log (SIGUSR2), so that a test
        that timed out shows where the daemon was; returns what it wrote ("" if nothing came
        within `timeout_s`)."""
        if not self.proc or self.proc.poll() is not None:
            return ""
        try:
            before = self.log_path.stat().st_size
        except FileNotFoundError:
            before = 0
        self.proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(before)
                new = f.read().decode(errors="replace")
            if "stacks of" in new and "end of stacks" in new:
                return new
            time.sleep(0.05)
        return ""

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-20000:]
        except FileNotFoundError:
            return ""

    def client(self) -> Client:
        return Client(self.socket)

    def cli(self, *args: str, user: str | None = None, check: bool = False,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        """Run `carbonsched ARGS` as a user would, optionally as another (throwaway) user."""
        python = sys.executable
        if user is not None:
            # The user-facing CLI needs only the standard library; another user may not be
            # able to execute this virtualenv's interpreter (it can live under /root).
            python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or python
        cmd = [python, "-m", "scheduler", "--socket", str(self.socket), *args]
        code = REPO
        if user is not None:
            cmd = ["runuser", "-u", user, "--", *cmd]
            code = readable_code_copy()  # the clone may be one other users cannot enter (0700)
        env = {k: v for k, v in os.environ.items() if k not in ("CARBONSCHED_SOCKET",)}
        env["PYTHONPATH"] = str(code)
        return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd or self.root,
                              env=env, check=check, timeout=60)

    def wait_states(self, job_ids, states=TERMINAL, timeout_s: float = 60.0) -> dict[int, dict]:
        """Wait until every job is in one of `states`; return the jobs by id."""
        deadline = time.monotonic() + timeout_s
        client = self.client()
        jobs: dict[int, dict] = {}
        while time.monotonic() < deadline:
            jobs = {j["id"]: j for j in client.jobs(include_done=True)}
            if all(i in jobs and jobs[i]["state"] in states for i in job_ids):
                return jobs
            time.sleep(0.1)
        pending = {i: jobs.get(i, {}).get("state") for i in job_ids
                   if jobs.get(i, {}).get("state") not in states}
        self.dump_stacks()
        raise TimeoutError(f"jobs not in {sorted(states)} after {timeout_s}s: {pending}\n{self.log()}")

    def wait_any_running(self, job_ids, timeout_s: float = 60.0) -> bool:
        """Wait until one of the jobs is RUNNING; False once all are terminal first.

        A crash test kills "while a job runs" only after this says so, so that a slow host
        (its planner's first tick late) cannot leave every kill landing between jobs.
        """
        deadline = time.monotonic() + timeout_s
        client = self.client()
        while time.monotonic() < deadline:
            jobs = {j["id"]: j for j in client.jobs(include_done=True)}
            states = [jobs.get(i, {}).get("state") for i in job_ids]
            if "RUNNING" in states:
                return True
            if all(s in TERMINAL for s in states):
                return False
            time.sleep(0.05)
        return False

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
