"""The suite leaves nothing behind: every temporary file, process and user it makes is gone
when it ends, also when a test fails, and the run fails when something is still there.

How (wired into pytest by `conftest.py`; on the controller only, pytest-xdist's workers
inherit what it sets up):

- One **run directory**, `/tmp/carbonsched-tests-XXXXXXXX` (0755, so throwaway users can
  reach the code copy and the world-writable state directories inside it). `TMPDIR` points
  there for the whole run, so pytest's `tmp_path`, `tempfile` in the tests and everything the
  daemons, agents and Slurm write land inside it; it is removed at the end.
- A **run tag** in the environment (`CARBONSCHED_TEST_RUN=<id>`), inherited by every process
  the suite starts. At the end no process may carry it, nor have its working directory in
  the run directory, nor belong to a throwaway user.
- **Throwaway users** are made by `make_user` and recorded in the run directory; at the end
  none may be left in `/etc/passwd` or `/etc/group`.
- A **munged** the suite had to start (`tests/slurm_cluster.ensure_munged`) is stopped.
- The **PostgreSQL databases** it made (`databases.make_pg_database`) are recorded; none may
  be left on the server.
- Finally no `/tmp` entry with one of the suite's names may be new since the start (code
  that ignores TMPDIR); those are reported only, as another run may own them.

What is found is cleaned up (processes killed, users deleted) and reported, and the run's
exit status becomes "tests failed".
"""

from __future__ import annotations

import os
import pwd
import grp
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

RUN_TAG_ENV = "CARBONSCHED_TEST_RUN"
RUN_DIR_ENV = "CARBONSCHED_TEST_RUN_DIR"
USERS_FILE = "throwaway-users"
DATABASES_FILE = "databases"
MUNGED_MARKER = "munged-started-by-the-suite"
# /tmp names the suite (or code it runs) uses; a new one at the end is a leak.
SUITE_TMP_NAMES = re.compile(r"^(carbonsched-code-|carbonsched-tests-munged|cs-|pytest-of-)")
EXIT_WAIT_S = 30.0  # processes still shutting down when the last test ended get this long


def run_dir() -> Path | None:
    """This run's directory, None outside a run set up by `start_run`."""
    value = os.environ.get(RUN_DIR_ENV)
    return Path(value) if value else None


# -- throwaway users ------------------------------------------------------------------------

def make_user() -> str:
    """A new local user without a home (and its own group), recorded for the end-of-run check;
    remove it with `remove_user`."""
    name = f"cs{uuid.uuid4().hex[:8]}"
    directory = run_dir()
    if directory is not None:
        with open(directory / USERS_FILE, "a") as f:
            f.write(name + "\n")
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True,
                   capture_output=True, timeout=60)
    return name


def remove_user(name: str, timeout_s: float = 30.0) -> None:
    """Kill what still runs as `name`, then delete the user and its group. Raises when the
    user is still there after `timeout_s`, so a leak is never silent."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            return
        for pid in pids_of_uid(uid):
            _kill(pid)
        done = subprocess.run(["userdel", name], capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"userdel {name} failed: {done.stderr.strip()}")
        time.sleep(0.2)  # a killed process of the user is still exiting: try again


def pids_of_uid(uid: int) -> list[int]:
    """The processes running as `uid`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.stat().st_uid == uid:
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def record_database(name: str) -> None:
    """Note a PostgreSQL database the run made, for the end-of-run check."""
    directory = run_dir()
    if directory is not None:
        with open(directory / DATABASES_FILE, "a") as f:
            f.write(name + "\n")


# -- the run: start and end -------------------------------------------------------------------

@dataclass
class Run:
    """What the controller knows at the start, to compare with at the end."""

    directory: Path
    tag: str
    tmp_before: set[str] = field(default_factory=set)
    users_before: set[str] = field(default_factory=set)
    groups_before: set[str] = field(default_factory=set)


def start_run() -> Run:
    """Make the run directory and tag, and point TMPDIR there (for this process and, through
    the environment, every worker and child)."""
    tmp_before = set(os.listdir("/tmp"))
    directory = Path(tempfile.mkdtemp(prefix="carbonsched-tests-", dir="/tmp"))
    directory.chmod(0o755)
    tag = directory.name
    os.environ[RUN_TAG_ENV] = tag
    os.environ[RUN_DIR_ENV] = str(directory)
    os.environ["TMPDIR"] = str(directory)
    tempfile.tempdir = None  # forget the cached /tmp
    return Run(directory, tag, tmp_before, {p.pw_name for p in pwd.getpwall()},
               {g.gr_name for g in grp.getgrall()})


def end_run(run: Run, drop_databases=lambda names: []) -> list[str]:
    """Clean up what the run left, and say what that was (empty: nothing).
    `drop_databases(names)` drops those of the run's databases still there and returns them."""
    from slurm_cluster import stop_munged

    problems: list[str] = []
    if (run.directory / MUNGED_MARKER).exists():
        stop_munged()
    recorded = set()
    try:
        recorded = set((run.directory / USERS_FILE).read_text().split())
    except FileNotFoundError:
        pass
    users_now = {p.pw_name for p in pwd.getpwall()}
    left_users = sorted((users_now - run.users_before) & recorded)
    left_uids = {pwd.getpwnam(u).pw_uid for u in left_users}
    deadline = time.monotonic() + EXIT_WAIT_S
    while True:
        procs = _suite_processes(run, left_uids)
        if not procs or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for pid, what in procs.items():
        problems.append(f"process {pid} still running: {what}")
        _kill(pid)
    for user in left_users:
        problems.append(f"throwaway user {user} still in /etc/passwd")
        try:
            remove_user(user)
        except RuntimeError as e:
            problems.append(str(e))
    left_groups = sorted(({g.gr_name for g in grp.getgrall()} - run.groups_before) & recorded)
    for group in left_groups:
        problems.append(f"throwaway group {group} still in /etc/group")
        subprocess.run(["groupdel", group], capture_output=True, timeout=60)
    try:
        made = (run.directory / DATABASES_FILE).read_text().split()
    except FileNotFoundError:
        made = []
    try:
        for name in drop_databases(made):
            problems.append(f"PostgreSQL database {name} still there")
    except Exception as e:  # the server went away: say so, it is not the run's leak
        problems.append(f"could not check the run's PostgreSQL databases: {type(e).__name__}: {e}")
    shutil.rmtree(run.directory, ignore_errors=True)
    for name in sorted(set(os.listdir("/tmp")) - run.tmp_before):
        # Reported, not removed: another run on this machine may own it.
        if SUITE_TMP_NAMES.match(name):
            problems.append(f"/tmp/{name} was made during the run, outside its directory")
    return problems


def _suite_processes(run: Run, uids: set[int]) -> dict[int, str]:
    """Live processes the suite started: tagged, working in the run directory, or run as one
    of its throwaway users (this process and its ancestors aside)."""
    mine = set()
    pid = os.getpid()
    while pid > 1:
        mine.add(pid)
        pid = _parent(pid)
    tag = f"{RUN_TAG_ENV}={run.tag}".encode()
    found: dict[int, str] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        if pid in mine:
            continue
        try:
            if proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # exited; only its parent's wait is missing
            ours = (tag in proc.joinpath("environ").read_bytes().split(b"\0")
                    or proc.stat().st_uid in uids)
            if ours and _parent(pid) == os.getpid() and b"resource_tracker" in proc.joinpath("cmdline").read_bytes():
                continue  # multiprocessing's tracker for a pool a test ran in this process: exits with it
            if not ours:
                try:
                    ours = Path(os.readlink(proc / "cwd")).is_relative_to(run.directory)
                except OSError:
                    pass
            if ours:
                cmd = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found[pid] = cmd.strip()[:200] or proc.joinpath("comm").read_text().strip()
        except (OSError, IndexError):
            continue  # gone meanwhile, or a kernel thread
    return found


def _parent(pid: int) -> int:
    """The parent's pid (0 when unknown)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0
