"""How a run that ended is recorded: the job's end state and reason, its measured energy and
reported work, its GPUs released; or, for an interruptible job between segments, back to the
queue to resume; or, for a run nobody saw end, re-queued (retries left) or LOST.

The agent (scheduler.node.agent) decides that a run has ended; `JobEnds` writes what follows
in one transaction per job, then releases its GPUs and forgets its run directory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import Connection

from scheduler import interruptible
from scheduler.jobs.job import RunningJob
from scheduler.jobs.store import resumed_values, unlaunched_values
from scheduler.lifecycle import State, end_run, retry_or_end
from scheduler.node import checkpoint, job_metrics, segments
from scheduler.node.config import AgentConfig
from scheduler.node.executor import JobExecutor, RunStatus
from scheduler.node.launcher import Launcher
from scheduler.node.power_limits import PowerLimits
from scheduler.node.run_energy import RunEnergy
from scheduler.profiles import learn_from_job
from scheduler.store import Store
from scheduler.timeparse import format_duration

log = logging.getLogger(__name__)


@dataclass
class RunMarks:
    """What the agent notes of its runs between ticks."""

    # Runs whose stop was passed on to their supervisor (or Slurm).
    signalled: set[int] = field(default_factory=set)
    # Runs this agent stopped itself (a lost GPU), with why: they end FAILED or re-queued, not CANCELLED.
    stopped_by_agent: dict[int, str] = field(default_factory=dict)
    # Pause jobs stopped now (their GPUs idle).
    paused: set[int] = field(default_factory=set)


class JobEnds:
    """Records the ends of one node's runs. `release(gpu_ids, job)` frees a job's GPUs on the
    node (their load and power limit); `on_finished(job id, energy note)` is told once a run's
    end is recorded (the head prices its carbon)."""

    def __init__(self, store: Store, config: AgentConfig, launcher: Launcher, energy: RunEnergy,
                 power: PowerLimits, marks: RunMarks, *, release: Callable[[list[int], object], None],
                 on_finished: Callable[[int, str | None], None], clock: Callable[[], datetime]) -> None:
        self.store = store
        self.config = config
        self.launcher = launcher
        self.executor: JobExecutor = launcher.executor
        self.energy = energy
        self.power = power
        self.marks = marks
        self._release = release
        self._on_finished = on_finished
        self._clock = clock

    def finish(self, job: RunningJob, status: RunStatus) -> None:
        """A run that ended with a result: the job's end state (or its next segment)."""
        result = status.result or {}
        code = result.get("exit_code")
        stopped_why = self.marks.stopped_by_agent.pop(job.id, None)
        self.marks.paused.discard(job.id)
        if stopped_why and code != 0:
            self.lose(job, stopped_why, status)
            return
        run = segments.classify(job, result)
        if run.requeue and job.cancel_requested_at is None:
            self.requeue_segment(job, status, run.outcome)
            return
        to, why = _end_state(job, status)
        ended = parse_time(result.get("ended_at")) or self._clock()
        energy_j, method, energy_note = self._energy(job, status, ended)
        work = self._reported_work(job, status)
        if work.note:
            why = f"{why}; {work.note}"
        cut = ",".join(result.get("output_truncated") or []) or None
        if cut:
            limit = (status.spec or {}).get("output_limit_bytes")
            why = (f"{why}; output truncated ({cut.replace(',', ' and ')}"
                   + (f" past {limit / 2**20:g} MiB, job_output_limit_mib" if limit else "") + ")")

        actor = job.cancel_requested_by if to is State.CANCELLED else None
        parts = energies = None
        if job.interruptible:  # the last segment: the job's energy is the sum over its segments
            parts = segments.pieces(job.started_at, ended, result.get("pauses") or [])
            energies = segments.piece_energies(parts, energy_j, self.energy.of_pieces(job))

        def tx(conn: Connection) -> bool:
            total = energy_j
            if parts is not None:
                total = segments.record(conn, job.id, parts, energies, node=self.config.node,
                                        gpu_ids=job.gpu_ids or [], outcome=to.value.lower(), method=method)
            return end_run(conn, job.id, to, actor_uid=actor, reason=why,
                           values=dict(ended_at=ended, exit_code=code, energy_j=total, energy_method=method,
                                       output_truncated=cut, **work.values()))

        self.store.transact(tx)
        self._release(job.gpu_ids or [], job)
        self.executor.forget(job.id)
        self.marks.signalled.discard(job.id)
        if job.interruptible:
            checkpoint.remove_job_dir(self.config.checkpoints, job.id)
        log.info("job %s %s (%s)", job.id, to.value, why)
        segmented = bool(job.interruptible) and (bool(job.resume_count) or len(parts or []) > 1)
        if to is State.COMPLETED and energy_j is not None and not segmented:
            learn_from_job(self.store, job.id, gpu_energy_j=self.energy.gpus_only(job, ended, energy_j, method),
                           clock=self._clock)  # never fails the completion, which is recorded
        try:  # its carbon receipt; the head's accounting backfill prices it if this fails
            self._on_finished(job.id, energy_note)
        except Exception:
            log.exception("job %s: pricing its carbon failed; the accounting backfill will retry", job.id)

    def requeue_segment(self, job: RunningJob, status: RunStatus, outcome: str) -> None:
        """A checkpoint job's run ended at a segment's end: back to the queue to be resumed,
        its segment recorded. Checkpointed (exit 75): its done share moves on
        (scheduler.interruptible.next_done_fraction). Killed after ignoring the request: it
        resumes from its last checkpoint, the segment's work is counted lost, and its rest
        is planned in one piece (asking it again would lose its work again). Not a retry: its
        attempts are not used up."""
        result = status.result or {}
        ended = parse_time(result.get("ended_at")) or self._clock()
        self.energy.flush()
        energy_j, method, _note = self._energy(job, status, ended)
        work = self._reported_work(job, status)
        run_s = max(0.0, (ended - job.started_at).total_seconds() - float(result.get("paused_s") or 0.0))
        done = float(job.done_fraction or 0.0)
        lost_s = 0.0
        if outcome == segments.CHECKPOINTED:
            plan = interruptible.segments_from_json(job.planned_segments)
            done = interruptible.next_done_fraction(
                done, run_s=run_s, resume_count=job.resume_count or 0, resume_cost_s=job.resume_cost_s or 0.0,
                plan_runtime_s=job.est_runtime_planned_s or job.est_runtime_s, plan_segments=max(1, len(plan)),
                prompts=job.prompts, reported_prompts=work.prompts)
            why = (f"checkpointed (exit {interruptible.CHECKPOINT_EXIT_CODE}) after {format_duration(run_s)}: "
                   f"{100 * done:.0f}% done; back in the queue to resume")
        else:
            lost_s = run_s
            why = (f"ignored its checkpoint request and was killed after its grace period: the "
                   f"{format_duration(run_s)} since its last checkpoint are lost; back in the queue to "
                   "resume from its last checkpoint, its rest in one piece")
        parts = [("run", job.started_at, ended)]

        def tx(conn: Connection) -> bool:
            total = segments.record(conn, job.id, parts, [energy_j], node=self.config.node,
                                    gpu_ids=job.gpu_ids or [], outcome=outcome, method=method, lost_s=lost_s,
                                    done_fraction=done)
            return end_run(conn, job.id, State.PENDING, actor_uid=None, reason=why, values=dict(
                resumed_values(done_fraction=done, ignored_checkpoint=outcome == segments.KILLED),
                energy_j=total, energy_method=method, exit_code=result.get("exit_code"), **work.values()))

        self.store.transact(tx)
        self._release(job.gpu_ids or [], job)
        self.executor.forget(job.id)
        self.marks.signalled.discard(job.id)
        log.info("job %s segment %s: %s", job.id, outcome, why)

    def resume_vanished(self, job: RunningJob, status: RunStatus) -> None:
        """An interruptible job whose supervisor vanished (killed with it): whatever is left
        of it is killed (a paused one is never left stopped), and it goes back to the queue to
        resume from its last checkpoint, the run counted as lost work, instead of being LOST."""
        left = self.executor.kill_leftovers(job.id)
        ended = self._clock()
        energy_j, method, _note = self._energy(job, status, ended)
        run_s = max(0.0, (ended - job.started_at).total_seconds()) if job.started_at else 0.0
        why = ("its supervisor vanished without a result (killed?)"
               + (f"; {left} process(es) could not be killed" if left else "")
               + f": back in the queue to resume from its last checkpoint ({format_duration(run_s)} of work lost)")
        parts = [("run", job.started_at or ended, ended)]

        def tx(conn: Connection) -> bool:
            total = segments.record(conn, job.id, parts, [energy_j], node=self.config.node,
                                    gpu_ids=job.gpu_ids or [], outcome=segments.VANISHED, method=method,
                                    lost_s=run_s, done_fraction=job.done_fraction)
            return end_run(conn, job.id, State.PENDING, actor_uid=None, reason=why,
                           values=dict(resumed_values(), energy_j=total, energy_method=method))

        self.store.transact(tx)
        self._release(job.gpu_ids or [], job)
        self.marks.paused.discard(job.id)
        self.executor.forget(job.id)
        self.marks.signalled.discard(job.id)
        log.error("job %s: %s", job.id, why)

    def requeue_unlaunched(self, job: RunningJob) -> None:
        """A job claimed whose command never started (the agent stopped between claim and
        launch): back in the queue, the attempt not counted; unless the launcher finds it
        launched after all (a Slurm job of its own)."""
        if self.launcher.launched_anyway(job):
            return
        self.store.transact(lambda conn: end_run(
            conn, job.id, State.PENDING, actor_uid=None,
            reason="agent stopped between claim and launch; the command never started, so it "
                   "was put back in the queue",
            values=unlaunched_values()))
        self.power.restore(job.gpu_ids or [], f"job {job.id} never launched")
        self.executor.forget(job.id)
        log.warning("job %s was claimed but never launched; re-queued", job.id)

    def refused(self, job: RunningJob, why: str) -> None:
        """A job whose own request the backend refused (Slurm: its account, QOS or time
        limit): FAILED with the backend's words, never retried, for it would be refused
        again; its command never started."""
        self.store.transact(lambda conn: end_run(
            conn, job.id, State.FAILED, actor_uid=None, reason=why,
            values=dict(unlaunched_values(), ended_at=self._clock())))
        self.power.restore(job.gpu_ids or [], f"job {job.id} refused")
        self.executor.forget(job.id)
        log.error("job %s: %s", job.id, why)

    def lose(self, job: RunningJob, why: str, status: RunStatus | None = None) -> None:
        """Re-queue (retries left) or end a job that did not finish by itself: FAILED when its
        supervisor reported how it ended, LOST when nobody knows."""
        if status is not None and status.result is not None:
            end, values = State.FAILED, dict(
                ended_at=parse_time(status.result.get("ended_at")) or self._clock(),
                exit_code=status.result.get("exit_code"))
        else:
            end, values = State.LOST, dict(ended_at=self._clock())
        self.store.transact(lambda conn: retry_or_end(conn, job, why, end=end, values=values))
        self._release(job.gpu_ids or [], job)
        self.executor.forget(job.id)
        log.error("job %s lost: %s", job.id, why)

    def _energy(self, job: RunningJob, status: RunStatus,
                ended: datetime) -> tuple[float | None, str | None, str | None]:
        """The run's energy, over the run as its launcher saw it (Slurm's start and GPUs)."""
        run = self.launcher.measured_run(job, status)
        if run is None:  # it never ran (cancelled before Slurm started it): no GPU used
            return None, None, None
        return self.energy.measure(run, status, ended)

    def _reported_work(self, job: RunningJob, status: RunStatus) -> job_metrics.ReportedWork:
        """The prompts and tokens the job wrote into its metrics file (none for a run
        launched before metrics files existed). Never fails the job's end."""
        spec = status.spec or {}
        path = spec.get("metrics_file")
        if not path:
            return job_metrics.ReportedWork()
        try:
            return job_metrics.read(Path(path), int(spec["uid"]))
        except OSError as e:
            log.warning("job %s: reading its metrics file %s failed: %s", job.id, path, e)
            return job_metrics.ReportedWork(note=f"metrics file not read: {e.strerror or e}")


def _end_state(job: RunningJob, status: RunStatus) -> tuple[State, str]:
    """How a run that ended by itself (or by a stop asked for) ends its job, and why."""
    result = status.result or {}
    code = result.get("exit_code")
    if result.get("cancelled_outside"):  # stopped by the executor's own tools (scancel)
        return State.CANCELLED, result["cancelled_outside"]
    if result.get("cancelled") and job.cancel_requested_at is None:
        return State.FAILED, "stopped by its node agent (GPU lost or node shutting down)"
    if result.get("cancelled") or (job.cancel_requested_at is not None and code != 0):
        return State.CANCELLED, "cancelled by user while running"
    if result.get("timed_out"):
        limit = (status.spec or {}).get("time_limit_s")
        return State.TIMEOUT, f"exceeded its time limit of {format_duration(limit)}" if limit else "timed out"
    if code == 0:
        return State.COMPLETED, "exit code 0"
    if result.get("error"):
        return State.FAILED, result["error"]
    if result.get("signal"):
        return State.FAILED, f"killed by signal {result['signal']}"
    return State.FAILED, f"exit code {code}"


def parse_time(text: str | None) -> datetime | None:
    """An ISO time from a run's records (UTC where it names no offset); None for none."""
    if not text:
        return None
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
