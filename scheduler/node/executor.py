"""Starting job processes through their supervisors, and reading back what happened.

One run directory per job (`STATE_DIR/run/JOB_ID/`) is the only thing shared between
an agent and the supervisors it starts; see `scheduler.node.supervise` for the protocol. The
states a run can be found in after any crash are:

- NOT_LAUNCHED: no supervisor ever held the lock and no `launched.json`: the command never
  started, so the job may safely go back to the queue.
- RUNNING: the supervisor holds the lock.
- FINISHED: `result.json` exists.
- VANISHED: the command may have started but nobody holds the lock and there is no result
  (the supervisor itself was killed): the job is LOST, never restarted behind a user's back.
- REFUSED (Slurm only): the command never started because the backend refused the job's own
  request (an account, QOS or time limit Slurm does not allow): the job FAILED with that
  reason, for it would be refused again.
"""

from __future__ import annotations

import enum
import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from scheduler.node.job_metrics import metrics_path
from scheduler.node.supervise import write_json_atomic

log = logging.getLogger(__name__)


class RunState(enum.Enum):
    NOT_LAUNCHED = "not_launched"
    RUNNING = "running"
    FINISHED = "finished"
    VANISHED = "vanished"
    REFUSED = "refused"


@dataclass(frozen=True)
class LaunchSpec:
    job_id: int
    argv: list[str]
    cwd: str
    env: dict[str, str]
    uid: int
    gid: int
    groups: list[int]
    time_limit_s: float | None
    grace_s: float
    stdout: str
    stderr: str
    metrics_file: str | None = None  # created for the job by its supervisor (node.job_metrics)
    # Bytes of stdout and stderr together kept in the job's logs (scheduler.node.output_limit);
    # None: no limit, the job writes its log files itself.
    output_limit_bytes: int | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RunStatus:
    state: RunState
    result: dict | None = None
    spec: dict | None = None
    note: str | None = None  # why a run VANISHED, when the backend knows (e.g. Slurm's NODE_FAIL)


class JobExecutor(Protocol):
    """The agent's seam for "run this job on these GPUs": `local` (Executor below:
    supervised processes) or `slurm` (scheduler.node.slurm_executor). A run is found again
    after any restart by its job id alone."""

    def launch(self, spec: LaunchSpec) -> None: ...
    def status(self, job_id: int) -> RunStatus: ...
    def signal_cancel(self, job_id: int) -> bool: ...
    def forget(self, job_id: int) -> None: ...
    def reap(self) -> None: ...
    def known_runs(self) -> list[int]: ...
    def log_paths(self, job_id: int) -> tuple[Path, Path]: ...
    def metrics_path(self, job_id: int) -> Path: ...


class Executor:
    """Launches supervisors and inspects run directories under one state directory."""

    def __init__(self, state_dir: Path, *, grace_s: float = 10.0, log_dir: Path | None = None) -> None:
        self.run_root = Path(state_dir) / "run"
        # Job logs: STATE_DIR/logs unless the operator put them on a disk of their own
        # (`log_dir`), so that a full log disk never stops the store (issue 48).
        self.log_root = Path(log_dir) if log_dir is not None else Path(state_dir) / "logs"
        self.grace_s = grace_s
        # Explicit modes, whatever the umask: run records (the jobs' environments) are
        # root's alone; the logs directory lets each job reach its own 0600 files by name.
        self.run_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.run_root.chmod(0o700)
        self.log_root.mkdir(parents=True, exist_ok=True, mode=0o711)
        self.log_root.chmod(0o711)
        self._children: dict[int, subprocess.Popen] = {}

    def log_paths(self, job_id: int) -> tuple[Path, Path]:
        return self.log_root / f"{job_id}.out", self.log_root / f"{job_id}.err"

    def metrics_path(self, job_id: int) -> Path:
        """Where the job reports its prompts and tokens (`scheduler.node.job_metrics`)."""
        return metrics_path(self.log_root, job_id)

    def run_dir(self, job_id: int) -> Path:
        return self.run_root / str(job_id)

    def launch(self, spec: LaunchSpec) -> None:
        """Start the job's supervisor; it keeps running if this process dies."""
        run_dir = self.run_dir(spec.job_id)
        if run_dir.exists():
            # Left from a launch that never started (we only launch NOT_LAUNCHED runs).
            shutil.rmtree(run_dir)
        run_dir.mkdir(mode=0o700)
        write_json_atomic(run_dir / "spec.json", asdict(spec))
        lock_fd = os.open(run_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            proc = subprocess.Popen(
                [sys.executable, "-m", "scheduler.node.supervise", str(run_dir), str(lock_fd)],
                pass_fds=(lock_fd,),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd="/",
                env=_supervisor_env(),
            )
        finally:
            os.close(lock_fd)  # the supervisor holds the lock from here on
        self._children[spec.job_id] = proc

    def status(self, job_id: int) -> RunStatus:
        run_dir = self.run_dir(job_id)
        result = _read_json(run_dir / "result.json")
        if result is not None:
            return RunStatus(RunState.FINISHED, result, _read_json(run_dir / "spec.json"))
        if not run_dir.exists():
            return RunStatus(RunState.NOT_LAUNCHED)
        if _lock_held(run_dir / "lock"):
            return RunStatus(RunState.RUNNING)  # the common case, every tick: no file reads
        # Lock free: the supervisor is gone. It may have written its result just now.
        result = _read_json(run_dir / "result.json")
        spec = _read_json(run_dir / "spec.json")
        if result is not None:
            return RunStatus(RunState.FINISHED, result, spec)
        if (run_dir / "launched.json").exists():
            return RunStatus(RunState.VANISHED, spec=spec)
        return RunStatus(RunState.NOT_LAUNCHED, spec=spec)

    def signal_cancel(self, job_id: int) -> bool:
        """Ask the job's supervisor to stop the job (TERM, then KILL after the grace period)."""
        run_dir = self.run_dir(job_id)
        launched = _read_json(run_dir / "launched.json")
        if launched is None or not _lock_held(run_dir / "lock"):
            return False
        try:
            os.kill(int(launched["supervisor_pid"]), signal.SIGTERM)
        except ProcessLookupError:
            return False
        return True

    def kill_leftovers(self, job_id: int) -> int:
        """Kill what is left of a run whose supervisor vanished (its cgroup, else its run
        token's processes; stopped ones too): an interruptible job is resumed from its last
        checkpoint rather than lost, and must not run twice meanwhile. How many were left."""
        from scheduler.node import job_cgroup

        run_dir = self.run_dir(job_id)
        launched = _read_json(run_dir / "launched.json") or {}
        spec = _read_json(run_dir / "spec.json") or {}
        if launched.get("cgroup"):
            cgroup = job_cgroup.JobCgroup(Path(launched["cgroup"]), Path(launched["cgroup"]).parent)
            left = cgroup.kill_all() if cgroup.path.exists() else 0
            cgroup.remove()
            return left
        if launched.get("run_id") and spec.get("uid") is not None:
            return job_cgroup.kill_run(str(launched["run_id"]), int(spec["uid"]))
        return 0

    def forget(self, job_id: int) -> None:
        """Remove a finished run's directory (its outcome is in the store by now)."""
        proc = self._children.pop(job_id, None)
        if proc is not None:
            proc.poll()
        shutil.rmtree(self.run_dir(job_id), ignore_errors=True)

    def reap(self) -> None:
        """Collect exited supervisors so they do not linger as zombies."""
        for job_id, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[job_id]

    def known_runs(self) -> list[int]:
        """Job ids that have a run directory on this node."""
        return sorted(int(p.name) for p in self.run_root.iterdir() if p.name.isdigit())


def _supervisor_env() -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def _lock_held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops our lock if we took it
    return False


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        log.error("unreadable run file %s: %s", path, e)
        return None
