"""The supervisor's clock for an interruptible job (issue 30): when to ask a checkpoint job
to save its state, when to kill one that does not exit, and when to stop and continue a
pause job.

It lives in the supervisor, which outlives the node agent: whatever happens to the agent,
a checkpoint job is asked once at its planned time and a paused job is continued at its
next segment's start, never left stopped. What happened goes into result.json (see
`result`); while a pause job is stopped, RUN_DIR/phase.json says so, for the agent (its
GPUs draw idle power then) and `show`.

The plan's times are wall-clock (epoch) times; durations (the grace period, paused time)
are measured on the monotonic clock. Standard library only: the supervisor starts fast.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from scheduler import interruptible

Signaller = Callable[[int], None]

PHASE_FILE = "phase.json"


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat()


def _epoch(text: str) -> float:
    t = datetime.fromisoformat(text)
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def create_request_file(path: str, uid: int, gid: int) -> None:
    """Create the checkpoint request file the job watches, owned by the job's user. Never
    through a symlink and never over a file already there (O_EXCL): it sits in the root-owned
    logs directory, so a job can neither plant nor replace it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        return
    try:
        os.write(fd, f"checkpoint requested at {_iso(time.time())}\n".encode())
        if os.geteuid() == 0:
            os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def remove_request_file(path: str | None) -> None:
    """Remove a checkpoint request file left by an earlier segment (the next run starts unasked)."""
    if not path:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class SegmentClock:
    """One job's interruptions; a job that is not interruptible gets one that does nothing."""

    def __init__(self, *, kind: str | None = None, run_dir: Path | None = None, checkpoint_at_s: float | None = None,
                 checkpoint_signal: int = signal.SIGUSR1, checkpoint_grace_s: float = 60.0,
                 checkpoint_file: str | None = None, pauses: list[tuple[float, float]] | None = None,
                 uid: int = 0, gid: int = 0, wall: Callable[[], float] = time.time) -> None:
        self.kind = kind
        self.run_dir = run_dir
        self.checkpoint_at_s = checkpoint_at_s
        self.checkpoint_signal = checkpoint_signal
        self.checkpoint_grace_s = checkpoint_grace_s
        self.checkpoint_file = checkpoint_file
        # The pauses between the plan's segments: (end of one, start of the next), epoch s.
        self.pauses = sorted(pauses or [])
        self.uid, self.gid = uid, gid
        self._wall = wall
        self.requested_mono: float | None = None
        self.requested_at: str | None = None
        self.killed = False
        self.paused = False
        self._paused_since: float | None = None
        self._paused_total_s = 0.0
        self.pause_log: list[list[str | None]] = []

    @classmethod
    def from_spec(cls, spec: dict, run_dir: Path, uid: int, gid: int) -> "SegmentClock":
        extra = spec.get("extra") or {}
        kind = extra.get("interruptible")
        if kind is None:
            return cls()
        at = extra.get("checkpoint_at")
        segments = [(_epoch(a), _epoch(b)) for a, b in extra.get("pause_segments") or []]
        pauses = [(segments[i][1], segments[i + 1][0]) for i in range(len(segments) - 1)]
        # The run starts now: the request waits until it has lasted its --min-run.
        ask_at = interruptible.checkpoint_request_at_s(_epoch(at), time.time(), extra.get("min_run_s")) if at else None
        return cls(kind=kind, run_dir=run_dir, checkpoint_at_s=ask_at,
                   checkpoint_signal=interruptible.launch_signal(extra),
                   checkpoint_grace_s=float(extra.get("checkpoint_grace_s") or 60.0),
                   checkpoint_file=extra.get("checkpoint_file"), pauses=pauses, uid=uid, gid=gid)

    def paused_s(self, now_mono: float) -> float:
        """Seconds the job has spent stopped so far (not counted against its time limit)."""
        extra = now_mono - self._paused_since if self.paused and self._paused_since is not None else 0.0
        return self._paused_total_s + extra

    def _pause_until(self, wall_s: float) -> float | None:
        for end, start in self.pauses:
            if end <= wall_s < start:
                return start
        return None

    def tick(self, now_mono: float, signal_all: Signaller, signal_group: Signaller) -> None:
        """Act on the plan at this moment: ask for the checkpoint, kill after the grace period,
        stop or continue. `signal_all` reaches every process of the job, `signal_group` its
        process group (the checkpoint signal goes there, as a shell's job control would)."""
        if self.kind is None:
            return
        wall = self._wall()
        if self.checkpoint_at_s is not None:
            if self.requested_mono is None and wall >= self.checkpoint_at_s:
                if self.checkpoint_file:
                    create_request_file(self.checkpoint_file, self.uid, self.gid)
                signal_group(self.checkpoint_signal)
                self.requested_mono, self.requested_at = now_mono, _iso(wall)
            elif (self.requested_mono is not None and not self.killed
                  and now_mono - self.requested_mono >= self.checkpoint_grace_s):
                signal_all(signal.SIGKILL)  # it ignored the request: its work since its last checkpoint is lost
                self.killed = True
        if self.pauses:
            until = self._pause_until(wall)
            if until is not None and not self.paused:
                signal_all(signal.SIGSTOP)
                self.paused, self._paused_since = True, now_mono
                self.pause_log.append([_iso(wall), None])
                self._write_phase({"paused": True, "since": _iso(wall), "until": _iso(until)})
            elif until is None and self.paused:
                self.resume(now_mono, signal_all, why="next segment")

    def resume(self, now_mono: float, signal_all: Signaller, *, why: str) -> None:
        """Continue a stopped job (its next segment began, or it is being stopped for good)."""
        if not self.paused:
            return
        signal_all(signal.SIGCONT)
        self.paused = False
        if self._paused_since is not None:
            self._paused_total_s += now_mono - self._paused_since
        self._paused_since = None
        if self.pause_log and self.pause_log[-1][1] is None:
            self.pause_log[-1][1] = _iso(self._wall())
        self._write_phase({"paused": False, "since": _iso(self._wall()), "why": why})

    def _write_phase(self, data: dict) -> None:
        if self.run_dir is None:
            return
        tmp = self.run_dir / (PHASE_FILE + ".tmp")
        try:
            tmp.write_text(json.dumps(data), "utf-8")
            os.replace(tmp, self.run_dir / PHASE_FILE)
        except OSError:
            pass  # informational only; result.json holds the record

    def result(self, now_mono: float) -> dict:
        """What result.json records: when the checkpoint was asked for, whether the job was
        killed for ignoring it, and the pauses [[start, end], ...] (ISO)."""
        if self.kind is None:
            return {}
        if self.paused and self.pause_log and self.pause_log[-1][1] is None:
            self.pause_log[-1][1] = _iso(self._wall())
        return {"interruptible": self.kind, "checkpoint_requested_at": self.requested_at,
                "checkpoint_killed": self.killed, "pauses": self.pause_log,
                "paused_s": self.paused_s(now_mono)}


def read_phase(run_dir: Path) -> dict | None:
    """The current phase of a pause job (None: never paused, or unreadable)."""
    try:
        return json.loads((run_dir / PHASE_FILE).read_text("utf-8"))
    except (OSError, ValueError):
        return None
