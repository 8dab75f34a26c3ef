"""What the node agent records when a run of an interruptible job ends (issue 30): how the
run ended as a segment outcome, the segment rows (runs and pauses, each with its energy),
and the job's columns for going back to the queue.

The job's energy is the sum over its segments: every run of an interruptible job is a
segment row, so a job resumed twice has three run segments, and a pause job has a pause
segment between each two runs (its GPUs' idle power while stopped counts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import Connection, func, insert, select

from scheduler import interruptible
from scheduler.store.models import job_segments

CHECKPOINTED = "checkpointed"
KILLED = "killed"  # it ignored its checkpoint request and was killed after the grace period
VANISHED = "vanished"  # its supervisor died with it: resumed from its last checkpoint


@dataclass(frozen=True)
class RunOutcome:
    """How one run of an interruptible job ended, as far as its segments are concerned:
    `requeue` when it goes back to the queue to be resumed (checkpointed or killed)."""

    outcome: str | None
    requeue: bool


def classify(job, result: dict) -> RunOutcome:
    """A checkpoint job that exited 75 checkpointed (asked or on its own); one killed after
    ignoring the request, or killed by the request itself (it died of its checkpoint signal:
    it had no handler, or had not installed it yet), is re-queued from its last checkpoint:
    carbonsched's interrupt ended it, not a fault of its own. Anything else ends the job as
    usual (exit 75 of a non-checkpoint job is a plain failure)."""
    if getattr(job, "interruptible", None) != interruptible.CHECKPOINT:
        return RunOutcome(None, False)
    if result.get("cancelled") or result.get("timed_out") or result.get("cancelled_outside"):
        return RunOutcome(None, False)
    if result.get("exit_code") == interruptible.CHECKPOINT_EXIT_CODE:
        return RunOutcome(CHECKPOINTED, True)
    if result.get("checkpoint_killed") or _died_of_the_request(job, result):
        return RunOutcome(KILLED, True)
    return RunOutcome(None, False)


def _died_of_the_request(job, result: dict) -> bool:
    """Whether the run was ended by the checkpoint signal carbonsched sent it."""
    if not result.get("checkpoint_requested_at") or not result.get("signal"):
        return False
    try:
        wanted = interruptible.signal_number(getattr(job, "checkpoint_signal", None) or interruptible.DEFAULT_SIGNAL)
    except ValueError:
        return False
    return int(result["signal"]) == wanted


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def pieces(start: datetime, end: datetime, pauses: list) -> list[tuple[str, datetime, datetime]]:
    """The run window [start, end] cut at the recorded pauses into ("run"|"pause", a, b)."""
    out: list[tuple[str, datetime, datetime]] = []
    cur = start
    for a_text, b_text in pauses or []:
        a, b = _parse(a_text), _parse(b_text) or end
        if a is None or b <= cur:
            continue
        a = max(a, cur)
        if a > cur:
            out.append(("run", cur, a))
        out.append(("pause", a, min(b, end)))
        cur = min(b, end)
    if end > cur or not out:
        out.append(("run", cur, end))
    return out


def piece_energies(parts: list[tuple[str, datetime, datetime]], total_energy_j: float | None,
                   energy_of: Callable[[datetime, datetime], float | None]) -> list[float | None]:
    """Each piece's energy: from `energy_of` (samples over the piece), scaled so the pieces
    sum to the run's measured `total_energy_j`; one piece is the whole run's."""
    if len(parts) == 1:
        return [total_energy_j]
    raw = [energy_of(a, b) for _, a, b in parts]
    known = sum(e for e in raw if e is not None)
    if total_energy_j is not None and known > 0:
        raw = [None if e is None else e * total_energy_j / known for e in raw]
    return raw


def record(conn: Connection, job_id: int, parts: list[tuple[str, datetime, datetime]],
           energies: list[float | None], *, node: str, gpu_ids: list[int], outcome: str,
           method: str | None, lost_s: float = 0.0, done_fraction: float | None = None) -> float | None:
    """Write the segment rows of one run (its run and pause pieces; the last gets `outcome`,
    a run piece before a pause "paused", a pause "continued") and return the job's energy
    over all its segments so far."""
    seq = conn.execute(select(func.coalesce(func.max(job_segments.c.seq), 0))
                       .where(job_segments.c.job_id == job_id)).scalar_one()
    rows = []
    for i, ((kind, a, b), e) in enumerate(zip(parts, energies)):
        last = i == len(parts) - 1
        rows.append({"job_id": job_id, "seq": seq + i + 1, "kind": kind,
                     "outcome": outcome if last else ("paused" if kind == "run" else "continued"),
                     "started_at": a, "ended_at": b, "node": node, "gpu_ids": list(gpu_ids), "energy_j": e,
                     "energy_method": method, "gco2": None, "lost_s": lost_s if last else 0.0,
                     "done_fraction": done_fraction})
    conn.execute(insert(job_segments), rows)
    return conn.execute(select(func.sum(job_segments.c.energy_j))
                        .where(job_segments.c.job_id == job_id)).scalar_one()
