"""Keeping every process a job starts inside the job, so none outlives it.

A job's process group is not enough: `setsid sh -c 'sleep 120' &` leaves it, keeps the job's
`CUDA_VISIBLE_DEVICES`, and would still be running on the GPU after it is given to the next
job. So the supervisor (`scheduler.node.supervise`) contains each job in one of two ways and,
when the job ends (or is cancelled or times out), signals everything contained:

- **cgroup v2** (preferred): a cgroup of its own, `job-ID-PID`, made under the supervisor's
  own cgroup on the cgroup2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid
  host). Every process the job forks, in any session, is born in it and cannot leave it
  (moving needs write access to cgroup files, which only root has). The end is `cgroup.kill`
  (Linux 5.14+; before that, SIGKILL to each pid in `cgroup.procs` until it is empty). No
  controller is enabled, so nothing about the job's resources changes. Under systemd the unit
  says `Delegate=yes` (the daemon owns its subtree) and not `ProtectControlGroups=yes` (that
  makes /sys/fs/cgroup read-only).
- **fallback, by a run token** (no writable cgroup2: cgroup v1 only, a container without
  it, ProtectControlGroups): the job's environment carries `CARBONSCHED_RUN_ID`, unique to
  this run, and the end signals every process of the job's user whose environment has it
  (read from /proc as root). A process that clears its own environment escapes this, so the
  fallback covers accidents (`setsid`, `nohup`, daemonizing tools), not a user set on escaping.
  Under the shipped units it does not apply: they delegate the cgroup (and, with
  ProtectProc=invisible and no CAP_SYS_PTRACE, root could not read other users' /proc).
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

RUN_ID_ENV = "CARBONSCHED_RUN_ID"
KILL_WAIT_S = 5.0


def new_run_id(job_id: int) -> str:
    """A token naming one run of one job, unguessable, for the fallback."""
    return f"{job_id}-{os.getpid()}-{secrets.token_hex(8)}"


def cgroup2_root() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted, or None."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    mounts = []
    for line in lines:
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            mounts.append(Path(left.split()[4]))
    mounts.sort(key=lambda p: p != Path("/sys/fs/cgroup"))  # the unified layout first
    return mounts[0] if mounts else None


def own_cgroup(root: Path) -> Path | None:
    """This process's cgroup v2 directory."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return root / line[3:].strip().lstrip("/")
    except OSError:
        return None
    return None


class JobCgroup:
    """A cgroup v2 for one job. `create` returns None where none can be made (fallback)."""

    def __init__(self, path: Path, home: Path) -> None:
        self.path = path  # the job's cgroup
        self.home = home  # the supervisor's own, to return to

    @classmethod
    def create(cls, name: str) -> "JobCgroup | None":
        root = cgroup2_root()
        home = own_cgroup(root) if root is not None else None
        if home is None or not (home / "cgroup.procs").exists():
            return None
        path = home / name
        try:
            path.mkdir()
        except FileExistsError:
            pass
        except OSError:
            return None
        if not (path / "cgroup.procs").exists():
            return None
        return cls(path, home)

    def _move(self, where: Path, pid: int) -> bool:
        try:
            (where / "cgroup.procs").write_text(str(pid))
            return True
        except OSError:
            return False

    def enter(self) -> bool:
        """Move this process in, so the job's first process is born inside."""
        return self._move(self.path, os.getpid())

    def leave(self) -> bool:
        """Move this process back out: from here on only the job is in the cgroup."""
        return self._move(self.home, os.getpid())

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def signal(self, sig: int) -> None:
        for pid in self.pids():
            if pid != os.getpid():
                _kill(pid, sig)

    def kill_all(self) -> int:
        """SIGKILL everything in the cgroup and wait until it is empty; the count left (0)."""
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:  # before Linux 5.14
            pass
        deadline = time.monotonic() + KILL_WAIT_S
        while True:
            left = [p for p in self.pids() if p != os.getpid()]
            if not left or time.monotonic() > deadline:
                return len(left)
            for pid in left:
                _kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


def processes_of_run(run_id: str, uid: int) -> list[int]:
    """Pids of `uid` whose environment carries this run's token (the fallback)."""
    needle = f"{RUN_ID_ENV}={run_id}".encode()
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if os.stat(entry.path).st_uid != uid:
                continue
            with open(os.path.join(entry.path, "environ"), "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def signal_run(run_id: str, uid: int, sig: int) -> int:
    """Signal every process of the run (fallback); how many there were."""
    pids = processes_of_run(run_id, uid)
    for pid in pids:
        _kill(pid, sig)
    return len(pids)


def kill_run(run_id: str, uid: int) -> int:
    """SIGKILL the run's processes until none is left (fallback); the count left (0)."""
    deadline = time.monotonic() + KILL_WAIT_S
    while True:
        left = signal_run(run_id, uid, signal.SIGKILL)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
