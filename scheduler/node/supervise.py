"""The per-job supervisor: `python -m scheduler.node.supervise RUN_DIR LOCK_FD`.

The agent starts one supervisor per job in a new session. The supervisor outlives the
daemon: it starts the command as its owner in its own process group, enforces the time
limit, turns SIGTERM into a graceful cancel of the whole group, and writes `result.json`
when the command ends. It holds an exclusive flock on RUN_DIR/lock for its whole life
(the agent locked it before spawning and passed the descriptor down), so a restarted
agent can tell "still running" (lock held) from "gone" (lock free) without guessing from
PIDs, which the kernel reuses.

The job's stdout and stderr go through pipes that the supervisor copies into the job's log
files, up to the job's output limit (`scheduler.node.output_limit`); result.json says which
streams were cut. Files in RUN_DIR: spec.json (input), launched.json (written just before the command is
started: from then on the job may have run), result.json (the outcome, atomically).
Only the standard library (and `job_metrics`, which needs no more) is imported here so it
starts fast.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from scheduler import interruptible
from scheduler.node import job_cgroup, job_metrics
from scheduler.node.output_limit import OutputCopier
from scheduler.node.segment_clock import SegmentClock, remove_request_file
from scheduler.slurm.commands import JOB_UMASK  # one umask for jobs, local or Slurm


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def open_job_log(path: str, uid: int, gid: int) -> int:
    """Open (append) a job's log file, 0600 and owned by the job's user.

    A file already there is reopened only when it is the same user's (this job's earlier
    attempt); one owned by anyone else belongs to another job and is replaced, never handed
    over: chowning it would give its owner's output to this job's user. Symlinks are not
    followed."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
    for _ in range(3):
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            fd = os.open(path, flags)
            if os.geteuid() == 0 and os.fstat(fd).st_uid != uid:
                os.close(fd)
                os.unlink(path)
                continue
        if os.geteuid() == 0:
            os.fchown(fd, uid, gid)
        return fd
    raise OSError(f"cannot create the job log {path}: it keeps coming back")


# Exit status of a job whose working directory its owner cannot enter (as sh's for a
# command found but not runnable).
CWD_EXIT = 126


def _enter_cwd(cwd: str):
    """The child's last step before exec, run after it has become the job's owner: enter the
    working directory with the owner's rights only. Entering it before the uid drops (what
    `Popen(cwd=...)` does) would let a user read another's directory through a job, and the
    outcome would tell them which paths exist where they cannot look."""

    def enter() -> None:
        try:
            os.chdir(cwd)
        except OSError as e:
            os.write(2, f"carbonsched: cannot enter working directory {cwd!r}: "
                        f"{e.strerror or e}\n".encode("utf-8", "replace"))
            os._exit(CWD_EXIT)

    return enter


def _child_setup(cwd: str, ignore_signal: int | None):
    """The child's set-up before exec: a checkpoint job starts with its checkpoint signal
    ignored (the disposition survives exec; the job's own handler replaces it), so a request
    that comes while it is still starting cannot kill it: the request file is there too, for
    a job that watches it. Then the working directory, entered as the owner (`_enter_cwd`)."""
    enter = _enter_cwd(cwd)

    def setup() -> None:
        if ignore_signal is not None:
            signal.signal(ignore_signal, signal.SIG_IGN)
        enter()

    return setup


class _Stop:
    requested = False


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def supervise(run_dir: Path) -> int:
    spec = json.loads((run_dir / "spec.json").read_text("utf-8"))
    stop = _Stop()

    def on_term(signum, frame):
        stop.requested = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    uid, gid = spec["uid"], spec["gid"]
    out_fd, err_fd, copier = _open_outputs(spec, uid, gid)
    if spec.get("metrics_file"):
        job_metrics.create(Path(spec["metrics_file"]), uid, gid)
    remove_request_file((spec.get("extra") or {}).get("checkpoint_file"))  # this run starts unasked
    result: dict = {"exit_code": None, "signal": None, "timed_out": False, "cancelled": False,
                    "error": None}
    run_id, cgroup = _contain(spec)
    env = {**spec["env"], job_cgroup.RUN_ID_ENV: run_id}
    contained = {"cgroup": str(cgroup.path) if cgroup else None, "run_id": run_id}

    write_json_atomic(run_dir / "launched.json", {"supervisor_pid": os.getpid(), "at": _now(), **contained})
    started = time.monotonic()
    result["started_at"] = _now()
    try:
        proc = _start(spec, env, out_fd, err_fd)
    except (OSError, subprocess.SubprocessError) as e:
        if cgroup is not None:
            cgroup.leave()
            cgroup.remove()
        msg = f"carbonsched: could not start {spec['argv'][0]!r}: {e}\n"
        os.write(err_fd, msg.encode())
        if copier is not None:
            result["output_truncated"] = copier.finish()
        result.update(exit_code=127 if isinstance(e, FileNotFoundError) else 126, error=msg.strip(),
                      ended_at=_now())
        write_json_atomic(run_dir / "result.json", result)
        return 0
    finally:
        if copier is not None:
            copier.close_child_ends()
        else:
            os.close(out_fd)
            os.close(err_fd)

    if cgroup is not None and not cgroup.leave():
        # We cannot step out, so we cannot kill the cgroup without killing ourselves: fall
        # back to the run token (the job's processes carry it all the same).
        sys.stderr.write(f"carbonsched supervisor: cannot leave {cgroup.path}; containing by run token\n")
        cgroup = None

    def signal_job(sig: int) -> None:
        _kill_group(proc.pid, sig)
        if cgroup is not None:
            cgroup.signal(sig)
        else:
            job_cgroup.signal_run(run_id, uid, sig)

    write_json_atomic(run_dir / "pid.json", {"pid": proc.pid, "pgid": proc.pid, "at": _now(), **contained})
    # Interruptible jobs: the checkpoint request and the pauses are kept by the supervisor,
    # which outlives the agent, so an agent crash never leaves a job stopped or unasked; the
    # agent reads what happened from result.json (and phase.json meanwhile).
    clock = SegmentClock.from_spec(spec, run_dir, uid, gid)
    rc = _wait(proc, spec, stop, started, result, clock, signal_job)
    # The job has ended: so has everything it started, whatever session it moved to.
    _kill_group(proc.pid, signal.SIGKILL)
    if cgroup is not None:
        left = cgroup.kill_all()
        cgroup.remove()
    else:
        left = job_cgroup.kill_run(run_id, uid)
    if left:  # to the daemon's log (the journal): the job itself ended as it did
        sys.stderr.write(f"carbonsched supervisor: job {spec.get('job_id')}: {left} process(es) "
                         f"still alive {job_cgroup.KILL_WAIT_S:g}s after SIGKILL\n")
    if copier is not None:  # the last of its output, before its end is recorded
        result["output_truncated"] = copier.finish()
    result["ended_at"] = _now()
    result.update(clock.result(time.monotonic()))
    if rc < 0:
        result["signal"] = -rc
    result["exit_code"] = rc
    _write_result_patiently(run_dir, result)
    return 0


def _open_outputs(spec: dict, uid: int, gid: int) -> tuple[int, int, OutputCopier | None]:
    """The descriptors the job writes its stdout and stderr to: its log files, or pipes that
    a copier empties into them up to its output limit (the copier, else None)."""
    out_fd = open_job_log(spec["stdout"], uid, gid)
    err_fd = open_job_log(spec["stderr"], uid, gid)
    copier = None
    if spec.get("output_limit_bytes") is not None:
        copier = OutputCopier(out_fd, err_fd, int(spec["output_limit_bytes"]))
        out_fd, err_fd = copier.child_fds
    return out_fd, err_fd, copier


def _contain(spec: dict) -> tuple[str, job_cgroup.JobCgroup | None]:
    """Contain the job (scheduler.node.job_cgroup): its own cgroup, which this supervisor
    enters so that the job starts in it, where cgroup v2 lets us (else None), and a run
    token for its environment either way. Nothing the job starts outlives it."""
    run_id = job_cgroup.new_run_id(int(spec.get("job_id") or 0))
    cgroup = None
    if (spec.get("extra") or {}).get("contain", "auto") == "auto":
        cgroup = job_cgroup.JobCgroup.create(f"job-{spec.get('job_id')}-{os.getpid()}")
        if cgroup is not None and not cgroup.enter():
            cgroup.remove()
            cgroup = None
    return run_id, cgroup


def _start(spec: dict, env: dict, out_fd: int, err_fd: int) -> subprocess.Popen:
    """Start the job's command in a session of its own, as its owner (when the supervisor is
    root and the owner is not: a non-root daemon only runs its own jobs)."""
    uid, gid = spec["uid"], spec["gid"]
    as_other = os.geteuid() == 0 and uid != 0
    return subprocess.Popen(
        spec["argv"],
        cwd="/",  # the job's own cwd is entered by _enter_cwd, as the job's owner
        preexec_fn=_child_setup(spec["cwd"], interruptible.startup_ignored_signal(spec.get("extra"))),
        umask=JOB_UMASK,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=out_fd,
        stderr=err_fd,
        start_new_session=True,
        close_fds=True,
        **({"user": uid, "group": gid, "extra_groups": spec["groups"]} if as_other else {}),
    )


def _wait(proc: subprocess.Popen, spec: dict, stop: _Stop, started: float, result: dict,
          clock: SegmentClock, signal_job) -> int:
    """Wait for the job to end while keeping its time limit (paused time not counted), a
    cancel (SIGTERM to us: TERM to the job, KILL after the grace period) and its segment
    clock; its return code. Marks `result` cancelled or timed out."""
    limit_s = spec.get("time_limit_s")
    grace_s = float(spec.get("grace_s", 10.0))
    term_sent_at: float | None = None
    while True:
        try:
            return proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if term_sent_at is None:
            if stop.requested:
                result["cancelled"] = True
            elif limit_s is not None and now - started - clock.paused_s(now) >= limit_s:
                result["timed_out"] = True  # paused time does not count against the limit
            if result["cancelled"] or result["timed_out"]:
                signal_job(signal.SIGTERM)
                if clock.paused:  # a stopped job gets its TERM only once continued
                    clock.resume(now, signal_job, why="stopping")
                term_sent_at = now
            else:
                clock.tick(now, signal_job, lambda sig: _kill_group(proc.pid, sig))
        elif now - term_sent_at >= grace_s:
            signal_job(signal.SIGKILL)
            term_sent_at = float("inf")  # sent both; just wait now


RESULT_RETRY_S = 2.0


def _write_result_patiently(run_dir: Path, result: dict) -> None:
    """Write result.json, waiting out a full disk: the outcome of a job that ran is never
    dropped. While we wait we still hold the run's lock, so the agent sees the job as
    RUNNING (not VANISHED, which would make it LOST) until the result is on disk."""
    complained = False
    while True:
        try:
            write_json_atomic(run_dir / "result.json", result)
            return
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            if not complained:
                sys.stderr.write(f"carbonsched supervisor: disk full writing the result of "
                                 f"{run_dir.name}; retrying every {RESULT_RETRY_S:g}s\n")
                complained = True
            time.sleep(RESULT_RETRY_S)


def main() -> None:
    if len(sys.argv) != 3:
        print("usage: python -m scheduler.node.supervise RUN_DIR LOCK_FD", file=sys.stderr)
        raise SystemExit(2)
    lock_fd = int(sys.argv[2])  # held (flocked) for as long as this process lives
    os.set_inheritable(lock_fd, False)
    raise SystemExit(supervise(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
