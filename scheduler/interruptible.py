"""Interruptible jobs (issue 30): the kinds, their submit-time rules, the environment a
job is told, and how its progress is reckoned between segments.

A job submitted with `--interruptible checkpoint` saves its state when told and exits with
CHECKPOINT_EXIT_CODE (75, EX_TEMPFAIL: "checkpointed, resume me"); it is told by its
checkpoint signal (default SIGUSR1) sent to its process group and by the file named in
$CARBONSCHED_CHECKPOINT_FILE appearing, and it has `checkpoint_grace_s` to exit before it is
killed. A `--interruptible pause` job is stopped in place (SIGSTOP) between its planned
segments and continued (SIGCONT); its GPUs stay held.

Used by the daemon (validation), the node agent and the supervisor, so it needs only the
standard library.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from datetime import datetime

CHECKPOINT = "checkpoint"
PAUSE = "pause"
KINDS = (CHECKPOINT, PAUSE)

# The exit status meaning "checkpointed, resume me" (sysexits.h EX_TEMPFAIL).
CHECKPOINT_EXIT_CODE = 75
DEFAULT_SIGNAL = "SIGUSR1"
DEFAULT_GRACE_S = 60.0
MAX_GRACE_S = 3600.0
DEFAULT_MAX_SEGMENTS = 4
MAX_SEGMENTS = 32
# The share of a job's work counted as done never reaches 1 before it completes.
MAX_DONE_FRACTION = 0.99

ENV_RESUME_COUNT = "CARBONSCHED_RESUME_COUNT"
ENV_CHECKPOINT_DIR = "CARBONSCHED_CHECKPOINT_DIR"
ENV_CHECKPOINT_FILE = "CARBONSCHED_CHECKPOINT_FILE"
ENV_INTERRUPTIBLE = "CARBONSCHED_INTERRUPTIBLE"
ENV_NAMES = frozenset({ENV_RESUME_COUNT, ENV_CHECKPOINT_DIR, ENV_CHECKPOINT_FILE, ENV_INTERRUPTIBLE})

# Signals a job may ask to be told by: the ones a program can catch and that mean nothing
# else to carbonsched (SIGTERM is its cancel; SIGKILL and SIGSTOP cannot be caught).
ALLOWED_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGQUIT", "SIGALRM", "SIGXCPU",
                   "SIGWINCH", "SIGURG", "SIGPWR")


def checkpoint_request_at_s(planned_s: float, started_s: float, min_run_s: float | None) -> float:
    """When a segment's checkpoint request is due (epoch s): at the plan's end of the
    segment, but never before the run has lasted the job's `--min-run`. A segment that
    started late (a busy Slurm, a slow launch) is not cut below the shortest length the user
    called useful, and a job is not asked before it has had time to start listening."""
    return max(planned_s, started_s + (min_run_s or 0.0))


def launch_signal(extra: dict | None) -> int:
    """The checkpoint signal a launch spec's `extra` names (SIGUSR1 where it names none)."""
    return int((extra or {}).get("checkpoint_signal") or signal.SIGUSR1)


def startup_ignored_signal(extra: dict | None) -> int | None:
    """The signal a run starts with ignored: a checkpoint job's checkpoint signal (from the
    launch spec's `extra`), so that a request during its start-up cannot kill it before it
    has installed its handler; None for any other job."""
    if (extra or {}).get("interruptible") != CHECKPOINT:
        return None
    return launch_signal(extra)


def signal_number(name: str) -> int:
    """The number of an allowed checkpoint signal given by name (USR1, SIGUSR1, sigusr1) or
    number; ValueError with a one-line reason otherwise."""
    text = str(name).strip().upper()
    if text.isdigit():
        try:
            text = signal.Signals(int(text)).name
        except ValueError:
            raise ValueError(f"--checkpoint-signal {name!r}: no such signal") from None
    if not text.startswith("SIG"):
        text = "SIG" + text
    if text not in ALLOWED_SIGNALS or not hasattr(signal, text):
        raise ValueError(f"--checkpoint-signal {name!r}: use one a job can catch, one of "
                         f"{', '.join(s for s in ALLOWED_SIGNALS if hasattr(signal, s))}")
    return int(getattr(signal, text))


def signal_name(name: str) -> str:
    """The canonical name (SIGUSR1) of an allowed checkpoint signal."""
    return signal.Signals(signal_number(name)).name


def segments_to_json(segments: Sequence[tuple[datetime, datetime]]) -> list[list[str]] | None:
    """A plan's segments as stored in `jobs.planned_segments` (None: one piece)."""
    if len(segments) <= 1:
        return None
    return [[a.isoformat(), b.isoformat()] for a, b in segments]


def segments_from_json(data: object) -> list[tuple[datetime, datetime]]:
    """The stored segments back as aware datetimes ([] for none)."""
    out: list[tuple[datetime, datetime]] = []
    for pair in data or []:
        a, b = (datetime.fromisoformat(x) for x in pair)
        out.append((a, b))
    return out


def paused_until(segments: Sequence[tuple[datetime, datetime]], now: datetime) -> datetime | None:
    """When a pause job whose plan is `segments` continues, if `now` falls in a pause."""
    for (_, end), (start, _) in zip(segments, segments[1:]):
        if end <= now < start:
            return start
    return None


def next_done_fraction(done: float, *, run_s: float, resume_count: int, resume_cost_s: float,
                       plan_runtime_s: float | None, plan_segments: int, prompts: int | None,
                       reported_prompts: int | None) -> float:
    """The share of a checkpoint job's whole work done after a segment that ran `run_s`
    and checkpointed.

    The rule: when the job declared `--prompts` and reported its running total of prompts
    done (its metrics file), that share, reported / declared. Otherwise by time: the segment's
    useful time (run_s less the resume cost it paid, when it was a resume) over the work the
    plan had left, which is the plan's runtime less the resume costs it counted (one per later
    segment, and one for the first when the job was a resume), and that remaining work was
    (1 - done) of the whole. Capped at MAX_DONE_FRACTION; never goes down.
    """
    if prompts and reported_prompts is not None:
        return min(MAX_DONE_FRACTION, max(done, reported_prompts / prompts))
    if not plan_runtime_s or plan_runtime_s <= 0:
        return done
    resuming = resume_count > 0 or done > 0
    resumes_in_plan = max(0, plan_segments - 1) + (1 if resuming else 0)
    remaining_s = plan_runtime_s - resume_cost_s * resumes_in_plan
    if remaining_s <= 0:
        return done
    useful_s = max(0.0, run_s - (resume_cost_s if resuming else 0.0))
    return min(MAX_DONE_FRACTION, max(done, done + (1.0 - done) * useful_s / remaining_s))
