"""The agent's reconciliation of the store's RUNNING jobs on its node with their runs: each
tick (a run that ended is recorded, a stop asked for is passed on, a pause job's phase and a
governed power limit are followed) and after a restart (live runs are adopted, GPUs held by
jobs that ended are freed, GPUs that run no job of ours get their default power limit back).

A job is never lost and never runs twice: a run of a job this node no longer owns is
stopped, and a job whose run vanished without a result is re-queued or LOST.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Connection, select, update
from sqlalchemy.exc import SQLAlchemyError

from scheduler import interruptible
from scheduler.jobs.job import RunningJob
from scheduler.jobs.store import rows_of, running_ids, running_jobs
from scheduler.lifecycle import State, record_events
from scheduler.node.executor import RunState
from scheduler.node.job_ends import JobEnds, RunMarks
from scheduler.node.launcher import Launcher
from scheduler.node.log_shipper import LogShipper
from scheduler.node.power_limits import PowerLimits
from scheduler.node.segment_clock import read_phase
from scheduler.slurm.commands import SlurmError
from scheduler.store import Store
from scheduler.store.models import gpu_instances, gpus

log = logging.getLogger(__name__)

class Reconciler:
    """Keeps one node's RUNNING jobs and their runs in step. `set_busy(gpu id, busy)` loads a
    GPU (the launcher's way); `emulation`: an emulated fleet's truth (None: none); `uuid_of`:
    the agent's store GPU id -> UUID map, shared."""

    def __init__(self, store: Store, node: str, launcher: Launcher, marks: RunMarks, ends: JobEnds,
                 power: PowerLimits, logs: LogShipper | None, *, set_busy: Callable[[int, bool], None],
                 emulation, uuid_of: dict[int, str], clock: Callable[[], datetime]) -> None:
        self.store = store
        self.node = node
        self.launcher = launcher
        self.executor = launcher.executor
        self.marks = marks
        self.ends = ends
        self.power = power
        self._logs = logs
        self._set_busy = set_busy
        self._emulation = emulation
        self._uuid_of = uuid_of
        self._clock = clock

    def running(self) -> list[RunningJob]:
        return running_jobs(self.store, self.node)

    def tick(self) -> bool:
        """Record the runs that ended, pass on stops, follow pause phases and governed power
        limits, copy live output; whether the store changed."""
        changed = False
        running = self.running()
        self.stop_orphans({j.id for j in running})
        alive = []
        for job in running:
            status = self.executor.status(job.id)
            if status.state is RunState.RUNNING:
                alive.append(job.id)
                changed |= self._follow(job)
                continue
            changed = True
            if status.state is RunState.FINISHED:
                self._ship_logs(job.id, final=True)  # all of its output, before it shows as ended
                self.ends.finish(job, status)
            elif status.state is RunState.NOT_LAUNCHED:
                self.ends.requeue_unlaunched(job)
            elif status.state is RunState.REFUSED:
                self.ends.refused(job, status.note or "the backend refused the job")
            elif (job.interruptible and hasattr(self.executor, "kill_leftovers")
                  and (job.resume_count or 0) < interruptible.MAX_SEGMENTS):
                self.ends.resume_vanished(job, status)
            else:
                self.ends.lose(job, status.note or "its supervisor vanished without a result (killed?)")
        if self._logs is not None and alive:
            try:
                self._logs.tick(alive)
            except (OSError, SQLAlchemyError) as e:  # output copies are best effort; jobs go on
                log.warning("copying job output into the store failed: %s", e)
        return changed

    def _follow(self, job: RunningJob) -> bool:
        """One live run: its governed power limit, a stop asked for, its interruptible plan."""
        if job.planned_power_limit_w != job.power_limit_w and job.power_limit_note is None:
            self.power.follow(job)
        # A stop asked for (by its user, or by this agent for a lost GPU) is passed on
        # once the supervisor can take it: one still starting cannot yet.
        stop_why = ("cancel requested" if job.cancel_requested_at is not None
                    else self.marks.stopped_by_agent.get(job.id))
        if stop_why and job.id not in self.marks.signalled and self.executor.signal_cancel(job.id):
            self.marks.signalled.add(job.id)
            log.info("job %s: %s, stopping it", job.id, stop_why)
        if job.interruptible == interruptible.PAUSE:
            return self._follow_pause(job)
        if job.interruptible == interruptible.CHECKPOINT and hasattr(self.executor, "keep_timetable"):
            try:  # the Slurm backend: no supervisor of ours keeps it
                self.executor.keep_timetable(job.id)
            except (OSError, SlurmError) as e:
                log.warning("job %s: checkpoint request through the executor failed: %s", job.id, e)
        return False

    def _follow_pause(self, job: RunningJob) -> bool:
        """Mirror a pause job's phase (its supervisor stops and continues it by the plan) on
        its GPUs: idle while stopped (an emulated GPU then draws idle power), busy again after."""
        run_dir = getattr(self.executor, "run_dir", None)
        if run_dir is None:
            return False
        phase = read_phase(run_dir(job.id))
        paused = bool(phase and phase.get("paused"))
        if paused == (job.id in self.marks.paused):
            return False
        for gid in job.gpu_ids or []:
            self._set_busy(gid, not paused)
        if paused:
            self.marks.paused.add(job.id)
            why = f"paused by its plan until {phase.get('until')}"
        else:
            self.marks.paused.discard(job.id)
            why = "continued by its plan"
        now = self._clock()
        self.store.transact(lambda conn: record_events(conn, [{
            "job_id": job.id, "from_state": State.RUNNING.value, "to_state": State.RUNNING.value,
            "actor_uid": None, "at": now, "reason": why}]))
        log.info("job %s %s", job.id, why)
        return True

    def _ship_logs(self, job_id: int, *, final: bool = False) -> None:
        if self._logs is None:
            return
        try:
            self._logs.ship(job_id)
        except (OSError, SQLAlchemyError) as e:
            log.warning("copying job %s's output into the store failed: %s", job_id, e)
        if final:
            self._logs.forget(job_id)

    def stop_orphans(self, running_here: set[int]) -> None:
        """Stop processes of jobs this node no longer owns (declared LOST while it was away),
        and clear run directories whose outcome is recorded: a job must never run twice."""
        self.launcher.forget_orphans(running_here)
        for job_id in self.executor.known_runs():
            if job_id in running_here:
                continue
            status = self.executor.status(job_id)
            if status.state is RunState.RUNNING:
                if job_id not in self.marks.signalled and self.executor.signal_cancel(job_id):
                    self.marks.signalled.add(job_id)
                    log.error("job %s is not RUNNING here any more (declared lost while this node "
                              "was away?); stopping its leftover process", job_id)
            else:
                self.executor.forget(job_id)
                self.marks.signalled.discard(job_id)

    def startup(self) -> None:
        """After a restart: free GPUs held by jobs that are no longer running, adopt the rest."""
        node = self.node

        def tx(conn: Connection) -> None:
            running = running_ids()
            conn.execute(update(gpus).where(gpus.c.node_name == node,
                                            gpus.c.job_id.is_not(None),
                                            gpus.c.job_id.not_in(running)).values(job_id=None))
            conn.execute(update(gpu_instances).where(gpu_instances.c.node_name == node,
                                                     gpu_instances.c.job_id.is_not(None),
                                                     gpu_instances.c.job_id.not_in(running))
                         .values(job_id=None))

        self.store.transact(tx)
        running = self.running()
        adopted = [j for j in running if self.executor.status(j.id).state is RunState.RUNNING]
        if self._emulation is not None and adopted:
            self._emulate_adopted([j.id for j in adopted])
        for job in adopted:
            for gid in job.gpu_ids or []:
                self._set_busy(gid, True)
        # Crash recovery: a limit outlives the agent that set it, so every GPU that runs no
        # job of ours goes back to its default limit (an adopted job keeps its own).
        ours = {int(g) for j in adopted for g in (j.gpu_ids or [])}
        restored = self.power.restore([g for g in self._uuid_of if g not in ours],
                                      "at start-up, no job of ours runs on it")
        if restored:
            log.warning("restored the default power limit of %d GPU(s) that ran no job of ours "
                        "(left capped by an agent that stopped without restoring them?)", restored)
        self.stop_orphans({j.id for j in running})
        log.info("reconciled %d running job(s) on %s", len(running), node)

    def _emulate_adopted(self, job_ids: list[int]) -> None:
        """Give the GPUs of jobs adopted after a restart the truth's power again (a fresh
        emulator starts blank); each job keeps the pace it was told at launch."""
        with self.store.read() as conn:
            models = dict(conn.execute(select(gpus.c.id, gpus.c.model).where(
                gpus.c.node_name == self.node)).all())
            rows = rows_of(conn, job_ids)
        for job in rows:
            gpu_ids = [int(g) for g in job.gpu_ids or []]
            if gpu_ids and gpu_ids[0] in models:
                self._emulation.begin(job, models[gpu_ids[0]],
                                      [self._uuid_of[g] for g in gpu_ids if g in self._uuid_of])
