"""The node agent: registers this node's GPUs, claims the jobs planned for them, runs them
through the executor, and records outcomes. The daemon runs one in-process on SQLite;
`carbonsched agent` runs one per GPU node. Either way it shares state only via the store.
"""

from __future__ import annotations

import logging
import pwd
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import Connection, case, func, insert, select, update
from sqlalchemy.exc import SQLAlchemyError

from policies.catalog import match_device_name, nominal_memory_gib
from scheduler.clock import utcnow
from scheduler.lifecycle import UNPLACED, State, end_run, record_events, retry_or_end, transition
from scheduler import interruptible
from scheduler.node import checkpoint, job_metrics, segments
from scheduler.node.segment_clock import read_phase
from scheduler.node.executor import Executor, JobExecutor, LaunchSpec, RunState, RunStatus
from scheduler.node.log_shipper import LogShipper
from scheduler.profiles import learn_from_job
from scheduler.samples import SampleStore, StoredSample, energy_note_of
from scheduler.slurm.commands import SlurmError
from scheduler.store import Store
from scheduler.store.models import gpus, jobs, nodes
from scheduler.timeparse import format_duration
from telemetry.energy import MODELLED, Sample, integrate_power
from telemetry.gpu import GpuBackend, GpuError, GpuLost, GpuNotSupported, GpuPermissionDenied
from telemetry.sampler import Reading, Sampler

log = logging.getLogger(__name__)

# What an operator does about a power limit refused for privilege (issue 29).
NO_PRIVILEGE_HINT = ("setting GPU power limits needs root with CAP_SYS_ADMIN: under systemd install "
                     "systemd/power-limits.conf as a drop-in of the agent's unit")

DUE_PER_FREE_GPU = 8
# Samples kept in memory while the store is unreachable: an hour of 64 GPUs at 1 Hz.
MAX_UNWRITTEN_SAMPLES = 64 * 3600
# Around a job's start the sampler reads faster for a while: the ramp from idle to load is
# where a 1 Hz series would misjudge energy the most.
BURST_HZ = 10.0
BURST_S = 5.0
# How often the heartbeat re-reads the GPUs' power limits (an operator may change them).
POWER_LIMIT_REFRESH_S = 60.0
# A limit within this of the default is the default (drivers report mW/uW, shown rounded).
POWER_LIMIT_TOLERANCE_W = 0.5
ENV_POWER_LIMIT = "CARBONSCHED_POWER_LIMIT_W"
# How often the agent removes the checkpoint directories of jobs that have ended.
CHECKPOINT_SWEEP_S = 30.0


DEFAULT_OUTPUT_LIMIT_BYTES = 1024 * 2**20  # job_output_limit_mib's default


@dataclass(frozen=True)
class AgentConfig:
    node: str
    zone: str
    state_dir: Path
    grace_s: float = 10.0
    heartbeat_s: float = 2.0
    sample_hz: float = 1.0
    # Node power that is not the GPUs' (CPUs, fans, NICs), shared among jobs by GPU count.
    # 0 leaves it out of job energy.
    node_static_w: float = 0.0
    # Below this much free space where job logs and run records live, the node takes no new
    # jobs (its GPUs show as unhealthy with the reason) until space is freed.
    min_free_disk_mib: float = 256.0
    # Copy jobs' output into the store for `logs` on the head (scheduler.node.log_shipper);
    # off for the daemon's own agent, whose log files the daemon reads itself.
    ship_logs: bool = True
    # Where interruptible jobs' checkpoint directories live (scheduler.node.checkpoint);
    # None: STATE_DIR/checkpoints. Storage shared by the nodes lets a checkpoint job move.
    checkpoint_root: Path | None = None
    # Where job logs live (None: STATE_DIR/logs): a disk apart from the store's, so a full log
    # disk never stops the store; and how many bytes of stdout and stderr together each job
    # keeps there (scheduler.node.output_limit; None: no limit). Issue 48.
    log_dir: Path | None = None
    output_limit_bytes: int | None = DEFAULT_OUTPUT_LIMIT_BYTES

    @property
    def checkpoints(self) -> Path:
        return self.checkpoint_root or self.state_dir / "checkpoints"


# What the agent reads of its running jobs each tick (the Slurm agent adds its own).
RUNNING_COLUMNS = (jobs.c.id, jobs.c.cancel_requested_at, jobs.c.cancel_requested_by,
                   jobs.c.max_retries, jobs.c.attempts, jobs.c.gpu_ids, jobs.c.started_at, jobs.c.gpus,
                   jobs.c.power_limit_w, jobs.c.planned_power_limit_w, jobs.c.power_limit_note,
                   # interruptible jobs (issue 30)
                   jobs.c.interruptible, jobs.c.resume_count, jobs.c.done_fraction, jobs.c.resume_cost_s,
                   jobs.c.est_runtime_planned_s, jobs.c.est_runtime_s, jobs.c.planned_segments,
                   jobs.c.prompts, jobs.c.checkpoints_ignored)


def redirected_argv(job) -> list[str]:
    """The job's command, with `--output`/`--error` (issue 28) applied by a shell that runs
    as the job's owner in its working directory: the files are opened with the owner's
    rights, never root's. Without them, the command itself (its output goes to
    carbonsched's log)."""
    from scheduler.job_specs import expand_log_pattern

    argv = list(job.argv)
    if not getattr(job, "stdout_path", None) and not getattr(job, "stderr_path", None):
        return argv
    names = dict(job_id=job.id, user=job.owner_name, array_job_id=job.array_job_id,
                 array_task_id=job.array_task_id)
    out = expand_log_pattern(job.stdout_path, **names) if job.stdout_path else None
    err = expand_log_pattern(job.stderr_path, **names) if job.stderr_path else out
    if out is None:
        return ["/bin/sh", "-c", 'exec 2>"$1"; shift; exec "$@"', "carbonsched-redirect", err, *argv]
    if err == out:
        return ["/bin/sh", "-c", 'exec >"$1" 2>&1; shift; exec "$@"', "carbonsched-redirect", out, *argv]
    return ["/bin/sh", "-c", 'exec >"$1" 2>"$2"; shift 2; exec "$@"', "carbonsched-redirect", out, err, *argv]


class Agent:
    """Owns the GPUs of one node. `tick()` is called periodically and after wake-ups."""

    def __init__(self, store: Store, backend: GpuBackend, config: AgentConfig, *,
                 on_change: Callable[[], None] | None = None,
                 on_finished: Callable[[int, str | None], None] | None = None, clock=utcnow,
                 executor: JobExecutor | None = None, emulation=None) -> None:
        self.store = store
        self.backend = backend
        # An emulated fleet's hidden truth (scheduler.node.emulation.JobEmulation), or None.
        self._emulation = emulation
        self.config = config
        # How jobs run: supervised local processes unless another backend is given (Slurm).
        self.executor = executor or Executor(config.state_dir, grace_s=config.grace_s,
                                                   log_dir=config.log_dir)
        self._logs = LogShipper(store, self.executor.log_paths) if config.ship_logs else None
        self._on_change = on_change or (lambda: None)
        # Called with (job id, energy note) once a run's end is recorded: the head prices its carbon.
        self._on_finished = on_finished or (lambda job_id, note: None)
        self._clock = clock
        self._signalled: set[int] = set()
        self._last_heartbeat: datetime | None = None
        self._tick_lock = threading.Lock()
        self._uuid_of: dict[int, str] = {}
        self._gpu_of: dict[str, int] = {}
        self.devices = []
        self.samples = SampleStore(store)
        self.sampler = Sampler(backend, hz=config.sample_hz, on_lost=self._on_gpu_lost)
        self._lost_pending: dict[str, str] = {}
        self._lost_lock = threading.Lock()
        self._stopped_by_agent: dict[int, str] = {}
        self._paused: set[int] = set()  # pause jobs stopped now (their GPUs idle)
        self._swept_at: float | None = None
        self._prev_reading: dict[str, Reading] = {}
        self._day_j: dict[int, float] = {}
        self._disk_full = False
        self._limits_read_at: datetime | None = None
        # The latest power limit of each GPU (by UUID), for the metrics.
        self.power_limits: dict[str, object] = {}
        self._warned_unknown: set[str] = set()
        # Kinds of power-limit failure already logged at WARNING (each is logged once per agent).
        self._cap_warned: set[str] = set()
        self._unwritten: list[StoredSample] = []
        self.dropped_samples = 0

    # -- registration -------------------------------------------------------------------

    def register(self) -> None:
        """Upsert this node and its GPUs; GPUs that disappeared are marked unhealthy."""
        devices = self.backend.devices()
        self.devices = devices
        now = self._clock()

        def tx(conn: Connection) -> None:
            existing = conn.execute(select(nodes.c.name).where(nodes.c.name == self.config.node)).first()
            values = dict(zone=self.config.zone, backend=self.backend.name,
                          emulated=self.backend.emulated, last_heartbeat=now)
            if existing:
                conn.execute(update(nodes).where(nodes.c.name == self.config.node).values(**values))
            else:
                conn.execute(insert(nodes).values(name=self.config.node, registered_at=now, **values))
            known = {r.uuid: r for r in conn.execute(
                select(gpus.c.id, gpus.c.uuid, gpus.c.node_name).where(gpus.c.node_name == self.config.node))}
            seen = set()
            for d in devices:
                seen.add(d.uuid)
                fields = dict(node_name=self.config.node, index=d.index, vendor=d.vendor,
                              healthy=True, **self._describe(d))
                if d.uuid in known:
                    conn.execute(update(gpus).where(gpus.c.uuid == d.uuid).values(**fields))
                else:
                    # Free the (node, vendor, index) slot if a different card used to sit there.
                    conn.execute(update(gpus).where(
                        gpus.c.node_name == self.config.node, gpus.c.vendor == d.vendor,
                        gpus.c.index == d.index).values(index=-1 - d.index, healthy=False))
                    conn.execute(insert(gpus).values(uuid=d.uuid, **fields))
            gone = [u for u in known if u not in seen]
            if gone:
                conn.execute(update(gpus).where(gpus.c.uuid.in_(gone)).values(healthy=False))

        self.store.transact(tx)
        with self.store.read() as conn:
            self._uuid_of = {r.id: r.uuid for r in conn.execute(
                select(gpus.c.id, gpus.c.uuid).where(gpus.c.node_name == self.config.node,
                                                     gpus.c.uuid.in_([d.uuid for d in devices])))}
        self._gpu_of = {u: i for i, u in self._uuid_of.items()}
        self._last_heartbeat = None  # the first tick reports power readings right away
        log.info("node %s registered in zone %s with %d GPUs (%s backend)",
                 self.config.node, self.config.zone, len(devices), self.backend.name)

    def _describe(self, d) -> dict:
        """The store's view of one device: its catalog part (or its driver name when the
        catalog does not know it), nominal and reported memory, and power limits. Tells the
        backend the part's rated power so impossible readings are dropped."""
        known = match_device_name(d.model) or match_device_name(d.name)
        if known is None and d.name not in self._warned_unknown:
            self._warned_unknown.add(d.name)
            limit = d.power_limit.current_w if d.power_limit else None
            log.warning("GPU model %r is not in the catalog: it is planned generically from what "
                        "the driver reports (%.1f GiB, power limit %s), never as another part; add "
                        "a row to policies/data/catalog.toml for accurate plans", d.name,
                        d.memory_gib, f"{limit:.0f} W" if limit else "unknown")
        self.backend.set_rated_power_w(d.uuid, known.tdp_w / max(1, d.partitions) if known else None)
        limit = d.power_limit
        if limit is not None:
            self.power_limits[d.uuid] = limit
        return dict(model=known.name if known else d.name,
                    memory_gib=nominal_memory_gib(known, d.memory_gib, d.partitions),
                    memory_reported_gib=d.memory_gib,
                    power_limit_w=limit.current_w if limit else None,
                    power_limit_min_w=limit.min_w if limit else None,
                    power_limit_max_w=limit.max_w if limit else None,
                    power_limit_default_w=limit.default_w if limit else None)

    def _fresh_power_limits(self, now: datetime) -> dict[str, object]:
        """The GPUs' current power limits, read at most every POWER_LIMIT_REFRESH_S."""
        if self._limits_read_at and (now - self._limits_read_at).total_seconds() < POWER_LIMIT_REFRESH_S:
            return {}
        self._limits_read_at = now
        out: dict[str, object] = {}
        for uuid in self._gpu_of:
            try:
                out[uuid] = self.power_limits[uuid] = self.backend.power_limit(uuid)
            except GpuError:
                continue  # not reported, or the GPU is failing: its reads report that
        return out

    # -- the periodic work --------------------------------------------------------------

    def tick(self) -> None:
        """Finish ended runs, pass on cancels, start due jobs, heartbeat. Never concurrent."""
        if not self._tick_lock.acquire(blocking=False):
            return
        try:
            self.executor.reap()
            self.flush_samples()
            changed = self._mark_lost_gpus()
            changed |= self._check_disk()
            changed |= self._reconcile_running()
            changed |= self._claim_due()
            self._heartbeat()
            self._sweep_checkpoints()
            if changed:
                self._on_change()
        finally:
            self._tick_lock.release()

    def diagnose(self) -> list[str]:
        """What this agent sees when it would claim (SIGUSR2 diagnostics): its GPUs, the
        PLANNED jobs on this node with their start against now, whether a tick is running."""
        now = self._clock()
        out = [f"tick running={self._tick_lock.locked()}, lost pending={sorted(self._lost_pending)}"]
        with self.store.read() as conn:
            for g in conn.execute(select(gpus.c.id, gpus.c.job_id, gpus.c.healthy, gpus.c.drained)
                                  .where(gpus.c.node_name == self.config.node).order_by(gpus.c.id)):
                out.append(f"GPU {g.id}: job={g.job_id} healthy={g.healthy} drained={g.drained}")
            for j in conn.execute(select(jobs.c.id, jobs.c.planned_start, jobs.c.planned_gpu_ids, jobs.c.plan_rev)
                                  .where(jobs.c.state == State.PLANNED.value,
                                         jobs.c.planned_node == self.config.node)
                                  .order_by(jobs.c.planned_start).limit(10)):
                due = (now - j.planned_start).total_seconds() if j.planned_start else None
                out.append(f"PLANNED job {j.id}: GPUs {j.planned_gpu_ids}, rev {j.plan_rev}, "
                           + (f"due {due:.1f}s ago" if due is not None and due >= 0 else f"starts in {-due:.1f}s"
                              if due is not None else "no start"))
        return out

    def start_sampling(self) -> None:
        self.sampler.start()

    def stop(self) -> None:
        self.sampler.stop()
        self.flush_samples()

    def flush_samples(self) -> int:
        """Write the sampler's buffered readings to the store in one batch.

        When the store cannot take them (database down), they are kept for the next flush,
        up to MAX_UNWRITTEN_SAMPLES (then the oldest are dropped, and counted).
        """
        readings = self.sampler.drain()
        rows = self._unwritten
        self._unwritten = []
        for r in readings:
            gid = self._gpu_of.get(r.uuid)
            if gid is None:
                continue
            rows.append((gid, r))
            prev = self._prev_reading.get(r.uuid)
            step_j = integrate_power((prev, r)) if prev is not None and r.t_s > prev.t_s else None
            if step_j is not None:
                self._day_j[gid] = self._day_j.get(gid, 0.0) + step_j
            self._prev_reading[r.uuid] = r
        try:
            return self.samples.write(rows)
        except Exception:
            keep = rows[-MAX_UNWRITTEN_SAMPLES:]
            self.dropped_samples += len(rows) - len(keep)
            self._unwritten = keep
            raise

    def _on_gpu_lost(self, uuid: str, why: str) -> None:
        # Called on the sampler thread: only note it; the next tick acts on it.
        with self._lost_lock:
            self._lost_pending[uuid] = why

    def _mark_lost_gpus(self) -> bool:
        """Take lost GPUs out of service and stop the jobs running on them."""
        with self._lost_lock:
            pending, self._lost_pending = self._lost_pending, {}
        changed = False
        for uuid, why in pending.items():
            gid = self._gpu_of.get(uuid)
            if gid is None:
                continue

            def tx(conn: Connection, gid=gid, why=why):
                conn.execute(update(gpus).where(gpus.c.id == gid)
                             .values(healthy=False, unhealthy_reason=f"lost: {why}"))
                return conn.execute(select(gpus.c.job_id).where(gpus.c.id == gid)).scalar_one_or_none()

            job_id = self.store.transact(tx)
            changed = True
            log.error("GPU %s (id %s) marked unhealthy: %s", uuid, gid, why)
            if job_id is not None:
                self._stopped_by_agent[job_id] = f"GPU {uuid} was lost during the run: {why}"
                if self.executor.signal_cancel(job_id):  # else retried each tick until it takes
                    self._signalled.add(job_id)
                    log.error("job %s: stopping it, its GPU %s is lost", job_id, uuid)
        return changed

    def _disk_places(self) -> list[tuple[Path, str]]:
        """The directories whose disks a new job needs space on: its logs, and the state
        directory (run records, and the SQLite store where there is one) where `log_dir`
        puts the logs elsewhere."""
        state = Path(self.config.state_dir)
        logs = Path(getattr(self.executor, "log_root", state / "logs"))
        if logs == state / "logs":
            return [(state, "job logs")]
        return [(logs, "job logs"), (state, "run records and the store")]

    def _check_disk(self) -> bool:
        """Stop taking jobs while the log disk is (nearly) full, and take them again after.

        A job started now could not write its output, and its outcome might not be
        recordable: better to leave it queued (the planner moves it to other nodes, these
        GPUs show as unhealthy with the reason) and say so loudly. Running jobs go on; their
        supervisors wait for space to record how they ended.
        """
        full, why = False, ""
        for place, what in self._disk_places() if self.config.min_free_disk_mib > 0 else []:
            try:
                free_mib = disk_free_bytes(place) / 2**20
            except OSError as e:
                problem = f"disk full: cannot check free space of {place}: {e}"
            else:
                problem = (f"disk full: {free_mib:.0f} MiB free for {what} in {place} (need "
                           f"{self.config.min_free_disk_mib:g} MiB, min_free_disk_mib)"
                           if free_mib < self.config.min_free_disk_mib else None)
            if problem and not full:  # the first one found is the one named
                full, why = True, problem
        if full == self._disk_full:
            return False
        self._disk_full = full
        node = self.config.node

        def tx(conn: Connection) -> None:
            if full:
                conn.execute(update(gpus).where(gpus.c.node_name == node, gpus.c.healthy.is_(True))
                             .values(healthy=False, unhealthy_reason=why))
            else:
                conn.execute(update(gpus).where(gpus.c.node_name == node,
                                                gpus.c.unhealthy_reason.like("disk full:%"))
                             .values(healthy=True, unhealthy_reason=None))

        self.store.transact(tx)
        if full:
            log.error("node %s takes no new jobs: %s", node, why)
        else:
            log.warning("node %s has disk space again (%.0f MiB free); taking jobs", node, free_mib)
        return True

    def _running_jobs(self) -> list:
        with self.store.read() as conn:
            return list(conn.execute(
                select(*RUNNING_COLUMNS)
                .where(jobs.c.state == State.RUNNING.value, jobs.c.node == self.config.node)))

    def _reconcile_running(self) -> bool:
        changed = False
        running = self._running_jobs()
        self._stop_orphans({j.id for j in running})
        alive = []
        for job in running:
            status = self.executor.status(job.id)
            if status.state is RunState.RUNNING:
                alive.append(job.id)
                if job.planned_power_limit_w != job.power_limit_w and job.power_limit_note is None:
                    self._follow_power_limit(job)
                # A stop asked for (by its user, or by this agent for a lost GPU) is passed on
                # once the supervisor can take it: one still starting cannot yet.
                stop_why = ("cancel requested" if job.cancel_requested_at is not None
                            else self._stopped_by_agent.get(job.id))
                if stop_why and job.id not in self._signalled and self.executor.signal_cancel(job.id):
                    self._signalled.add(job.id)
                    log.info("job %s: %s, stopping it", job.id, stop_why)
                if job.interruptible == interruptible.PAUSE:
                    changed |= self._follow_pause(job)
                elif job.interruptible == interruptible.CHECKPOINT and hasattr(self.executor, "keep_timetable"):
                    try:  # the Slurm backend: no supervisor of ours keeps it
                        self.executor.keep_timetable(job.id)
                    except (OSError, SlurmError) as e:
                        log.warning("job %s: checkpoint request through the executor failed: %s", job.id, e)
                continue
            changed = True
            if status.state is RunState.FINISHED:
                self._ship_logs(job.id, final=True)  # all of its output, before it shows as ended
                self._finish(job, status)
            elif status.state is RunState.NOT_LAUNCHED:
                self._requeue_unlaunched(job)
            elif (job.interruptible and hasattr(self.executor, "kill_leftovers")
                  and (job.resume_count or 0) < interruptible.MAX_SEGMENTS):
                self._resume_vanished(job, status)
            else:
                self._lose(job, status.note or "its supervisor vanished without a result (killed?)")
        if self._logs is not None and alive:
            try:
                self._logs.tick(alive)
            except (OSError, SQLAlchemyError) as e:  # output copies are best effort; jobs go on
                log.warning("copying job output into the store failed: %s", e)
        return changed

    def _sweep_checkpoints(self) -> None:
        """Remove the checkpoint directories of jobs that have ended elsewhere than on this
        agent's watch (cancelled while queued between segments, ended on another node), every
        CHECKPOINT_SWEEP_S. A directory of an active job is kept."""
        now = time.monotonic()
        if self._swept_at is not None and now - self._swept_at < CHECKPOINT_SWEEP_S:
            return
        self._swept_at = now
        root = self.config.checkpoints
        try:
            ids = [int(p.name) for p in root.iterdir() if p.name.isdigit()]
        except FileNotFoundError:
            return
        if not ids:
            return
        with self.store.read() as conn:
            active = set(conn.execute(select(jobs.c.id).where(
                jobs.c.id.in_(ids), jobs.c.state.in_([s.value for s in (State.PENDING, State.PLANNED,
                                                                       State.RUNNING)]))).scalars())
        for job_id in ids:
            if job_id not in active:
                checkpoint.remove_job_dir(root, job_id)
                log.info("job %s has ended: its checkpoint directory was removed", job_id)

    def _follow_pause(self, job) -> bool:
        """Mirror a pause job's phase (its supervisor stops and continues it by the plan) on
        its GPUs: idle while stopped (an emulated GPU then draws idle power), busy again after."""
        run_dir = getattr(self.executor, "run_dir", None)
        if run_dir is None:
            return False
        phase = read_phase(run_dir(job.id))
        paused = bool(phase and phase.get("paused"))
        if paused == (job.id in self._paused):
            return False
        for gid in job.gpu_ids or []:
            self._set_busy(gid, not paused)
        if paused:
            self._paused.add(job.id)
            why = f"paused by its plan until {phase.get('until')}"
        else:
            self._paused.discard(job.id)
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

    def _finish(self, job, status: RunStatus) -> None:
        result = status.result or {}
        code = result.get("exit_code")
        stopped_why = self._stopped_by_agent.pop(job.id, None)
        self._paused.discard(job.id)
        if stopped_why and code != 0:
            self._lose(job, stopped_why, status)
            return
        run = segments.classify(job, result)
        if run.requeue and job.cancel_requested_at is None:
            self._requeue_segment(job, status, run.outcome)
            return
        if result.get("cancelled_outside"):  # stopped by the executor's own tools (scancel)
            to, why = State.CANCELLED, result["cancelled_outside"]
        elif result.get("cancelled") and job.cancel_requested_at is None:
            to, why = State.FAILED, "stopped by its node agent (GPU lost or node shutting down)"
        elif result.get("cancelled") or (job.cancel_requested_at is not None and code != 0):
            to, why = State.CANCELLED, "cancelled by user while running"
        elif result.get("timed_out"):
            limit = (status.spec or {}).get("time_limit_s")
            to, why = State.TIMEOUT, f"exceeded its time limit of {format_duration(limit)}" if limit else "timed out"
        elif code == 0:
            to, why = State.COMPLETED, "exit code 0"
        elif result.get("error"):
            to, why = State.FAILED, result["error"]
        elif result.get("signal"):
            to, why = State.FAILED, f"killed by signal {result['signal']}"
        else:
            to, why = State.FAILED, f"exit code {code}"
        ended = _parse_time(result.get("ended_at")) or self._clock()
        energy_j, method, energy_note = self._job_energy(job, status, ended)
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
            energies = segments.piece_energies(parts, energy_j, self._piece_energy(job))

        def tx(conn: Connection) -> bool:
            total = energy_j
            if parts is not None:
                total = segments.record(conn, job.id, parts, energies, node=self.config.node,
                                        gpu_ids=job.gpu_ids or [], outcome=to.value.lower(), method=method)
            return end_run(conn, job.id, to, actor_uid=actor, reason=why,
                           values=dict(ended_at=ended, exit_code=code, energy_j=total, energy_method=method,
                                       output_truncated=cut, **work.values()))

        self.store.transact(tx)
        self._release_gpus(job.gpu_ids or [], job)
        self.executor.forget(job.id)
        self._signalled.discard(job.id)
        if job.interruptible:
            checkpoint.remove_job_dir(self.config.checkpoints, job.id)
        log.info("job %s %s (%s)", job.id, to.value, why)
        segmented = bool(job.interruptible) and (bool(job.resume_count) or len(parts or []) > 1)
        if to is State.COMPLETED and energy_j is not None and not segmented:
            self._learn_profile(job, ended, energy_j, method)
        try:  # its carbon receipt; the head's accounting backfill prices it if this fails
            self._on_finished(job.id, energy_note)
        except Exception:
            log.exception("job %s: pricing its carbon failed; the accounting backfill will retry", job.id)

    def _piece_energy(self, job):
        """Energy of the job's GPUs over a part of its run, from the stored samples (the
        pieces of a pause job's run; scaled to the run's measured total by the caller)."""
        gpu_ids = [int(g) for g in (job.gpu_ids or [])]

        def energy_of(a: datetime, b: datetime) -> float | None:
            return self.samples.job_energy(gpu_ids, a.timestamp(), b.timestamp(), {}).energy_j

        return energy_of

    def _requeue_segment(self, job, status: RunStatus, outcome: str) -> None:
        """A checkpoint job's run ended at a segment's end: back to the queue to be resumed,
        its segment recorded. Checkpointed (exit 75): its done share moves on
        (scheduler.interruptible.next_done_fraction). Killed after ignoring the request: it
        resumes from its last checkpoint, the segment's work is counted lost, and its rest
        is planned in one piece (asking it again would lose its work again). Not a retry: its
        attempts are not used up."""
        result = status.result or {}
        ended = _parse_time(result.get("ended_at")) or self._clock()
        self.flush_samples()
        energy_j, method, _note = self._job_energy(job, status, ended)
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
                UNPLACED, planned_segments=None, planned_interrupt_at=None, planned_resume_at=None,
                attempts=jobs.c.attempts - 1, resume_count=jobs.c.resume_count + 1, done_fraction=done,
                checkpoints_ignored=jobs.c.checkpoints_ignored + (1 if outcome == segments.KILLED else 0),
                energy_j=total, energy_method=method, exit_code=result.get("exit_code"),
                power_limit_w=None, power_limit_note=None, **work.values()))

        self.store.transact(tx)
        self._release_gpus(job.gpu_ids or [], job)
        self.executor.forget(job.id)
        self._signalled.discard(job.id)
        log.info("job %s segment %s: %s", job.id, outcome, why)

    def _resume_vanished(self, job, status: RunStatus) -> None:
        """An interruptible job whose supervisor vanished (killed with it): whatever is left
        of it is killed (a paused one is never left stopped), and it goes back to the queue to
        resume from its last checkpoint, the run counted as lost work, instead of being LOST."""
        left = self.executor.kill_leftovers(job.id)
        ended = self._clock()
        energy_j, method, _note = self._job_energy(job, status, ended)
        run_s = max(0.0, (ended - job.started_at).total_seconds()) if job.started_at else 0.0
        why = ("its supervisor vanished without a result (killed?)"
               + (f"; {left} process(es) could not be killed" if left else "")
               + f": back in the queue to resume from its last checkpoint ({format_duration(run_s)} of work lost)")
        parts = [("run", job.started_at or ended, ended)]

        def tx(conn: Connection) -> bool:
            total = segments.record(conn, job.id, parts, [energy_j], node=self.config.node,
                                    gpu_ids=job.gpu_ids or [], outcome=segments.VANISHED, method=method,
                                    lost_s=run_s, done_fraction=job.done_fraction)
            return end_run(conn, job.id, State.PENDING, actor_uid=None, reason=why, values=dict(
                UNPLACED, planned_segments=None, planned_interrupt_at=None, planned_resume_at=None,
                attempts=jobs.c.attempts - 1, resume_count=jobs.c.resume_count + 1, energy_j=total,
                energy_method=method, power_limit_w=None, power_limit_note=None))

        self.store.transact(tx)
        self._release_gpus(job.gpu_ids or [], job)
        self._paused.discard(job.id)
        self.executor.forget(job.id)
        self._signalled.discard(job.id)
        log.error("job %s: %s", job.id, why)

    def _reported_work(self, job, status: RunStatus) -> job_metrics.ReportedWork:
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

    def _learn_profile(self, job, ended: datetime, energy_j: float, method: str | None) -> None:
        """Fold a completed job's measured runtime and GPU energy into its workload profile
        (profiles hold GPU power only: the node's static share is taken back out). Never
        fails the completion, which is already recorded."""
        gpu_energy_j = energy_j
        if method and method.endswith("+static") and job.started_at is not None and self._uuid_of:
            share = len(job.gpu_ids or []) / len(self._uuid_of)
            run_s = max(0.0, (ended - job.started_at).total_seconds())
            gpu_energy_j = max(0.0, energy_j - self.config.node_static_w * share * run_s)
        learn_from_job(self.store, job.id, gpu_energy_j=gpu_energy_j, clock=self._clock)

    def _requeue_unlaunched(self, job) -> None:
        self.store.transact(lambda conn: end_run(
            conn, job.id, State.PENDING, actor_uid=None,
            reason="agent stopped between claim and launch; the command never started, so it "
                   "was put back in the queue",
            values=dict(UNPLACED, started_at=None, attempts=jobs.c.attempts - 1,
                        power_limit_w=None, power_limit_note=None)))
        self._restore_power_limits(job.gpu_ids or [], f"job {job.id} never launched")
        self.executor.forget(job.id)
        log.warning("job %s was claimed but never launched; re-queued", job.id)

    def _lose(self, job, why: str, status: RunStatus | None = None) -> None:
        """Re-queue (retries left) or end a job that did not finish by itself: FAILED when its
        supervisor reported how it ended, LOST when nobody knows."""
        if status is not None and status.result is not None:
            end, values = State.FAILED, dict(
                ended_at=_parse_time(status.result.get("ended_at")) or self._clock(),
                exit_code=status.result.get("exit_code"))
        else:
            end, values = State.LOST, dict(ended_at=self._clock())
        self.store.transact(lambda conn: retry_or_end(conn, job, why, end=end, values=values))
        self._release_gpus(job.gpu_ids or [], job)
        self.executor.forget(job.id)
        log.error("job %s lost: %s", job.id, why)

    def _claim_due(self) -> bool:
        """Start the PLANNED jobs whose time has come and whose GPUs are free.

        Only as many due jobs are read as the free GPUs could possibly take (a few per free
        GPU, earliest first): a long queue stuck behind a job that overran its estimate is
        all "due", and reading it whole every tick would cost the daemon dearly.
        """
        now = self._clock()
        with self.store.read() as conn:
            gpu_rows = {r.id: r for r in conn.execute(
                select(gpus).where(gpus.c.node_name == self.config.node))}
            busy = {i for i, g in gpu_rows.items() if g.job_id is not None or not g.healthy or g.drained}
            free = len(gpu_rows) - len(busy)
            if free == 0:
                return False
            due = list(conn.execute(
                select(jobs).where(jobs.c.state == State.PLANNED.value,
                                   jobs.c.planned_node == self.config.node,
                                   jobs.c.planned_start <= now)
                .order_by(jobs.c.planned_start, jobs.c.id).limit(DUE_PER_FREE_GPU * free)))
        started = False
        for job in due:
            ids = list(job.planned_gpu_ids or [])
            if not ids or any(i not in gpu_rows or i in busy for i in ids):
                continue  # GPUs still busy (the previous job ran over its estimate)
            if self._claim(job, ids, gpu_rows, now):
                started = True
                busy.update(ids)
        return started

    def _claim(self, job, gpu_ids: list[int], gpu_rows: dict, now: datetime) -> bool:
        """PLANNED -> RUNNING and take the GPUs, atomically; then launch."""
        indices = [gpu_rows[i].index for i in gpu_ids]
        vendor = gpu_rows[gpu_ids[0]].vendor

        def tx(conn: Connection) -> bool:
            taken = conn.execute(
                update(gpus).where(gpus.c.id.in_(gpu_ids), gpus.c.job_id.is_(None),
                                   gpus.c.healthy.is_(True)).values(job_id=job.id)).rowcount
            if taken != len(gpu_ids):
                conn.rollback()
                return False
            ok = transition(conn, job.id, State.RUNNING, actor_uid=None, expect=State.PLANNED,
                            where=(jobs.c.plan_rev == job.plan_rev,),
                            reason=f"claimed by {self.config.node}",
                            values=dict(node=self.config.node, gpu_ids=gpu_ids,
                                        gpu_indices=indices, started_at=now,
                                        first_started_at=func.coalesce(jobs.c.first_started_at, now),
                                        attempts=jobs.c.attempts + 1))
            if not ok:
                conn.rollback()
            return ok

        if not self.store.transact(tx):
            return False
        limit_w = self._apply_power_limit(job, gpu_ids)
        energy_start = self._read_now(gpu_ids)
        emulated_env = {} if self._emulation is None else self._emulation.begin(
            job, gpu_rows[gpu_ids[0]].model, [self._uuid_of[g] for g in gpu_ids if g in self._uuid_of],
            power_limit_w=limit_w)
        if limit_w is not None:
            emulated_env = {**emulated_env, ENV_POWER_LIMIT: f"{limit_w:g}"}
        try:
            self.executor.launch(self._launch_spec(job, vendor, indices, energy_start, emulated_env))
        except OSError as e:
            log.error("job %s: could not start its supervisor: %s", job.id, e)
            # Nothing was launched: the next tick finds NOT_LAUNCHED and re-queues it.
            return True
        for gid in gpu_ids:
            self._set_busy(gid, True)
        self.sampler.burst(BURST_HZ, BURST_S)  # the power ramp at a job's start, in detail
        log.info("job %s started on %s GPUs %s", job.id, self.config.node, indices)
        return True

    def _launch_spec(self, job, vendor: str, indices: list[int], energy_start: dict,
                     emulated_env: dict[str, str] | None = None) -> LaunchSpec:
        out, err = self.executor.log_paths(job.id)
        env = dict(job.env or {})
        env.update(emulated_env or {})  # the emulation seam (scheduler.node.emulation)
        env.update(_identity_env(job.owner_uid, job.owner_name))
        env.update(visible_devices_env(vendor, indices))
        env["CARBONSCHED_JOB_ID"] = str(job.id)
        env["CARBONSCHED_NODE"] = self.config.node
        metrics = self.executor.metrics_path(job.id)
        env[job_metrics.ENV_VAR] = str(metrics)
        env.update(operating_point_env(job.planned_max_batch, job.planned_precision, job.planned_tp))
        extra = {"start_readings": energy_start}
        if job.interruptible:
            env_i, extra_i = self._interruptible_launch(job, out.parent)
            env.update(env_i)
            extra.update(extra_i)
        return LaunchSpec(job_id=job.id, argv=redirected_argv(job), cwd=job.cwd, env=env,
                          uid=job.owner_uid, gid=job.owner_gid, groups=list(job.owner_groups or []),
                          time_limit_s=job.time_limit_s, grace_s=self.config.grace_s,
                          stdout=str(out), stderr=str(err), metrics_file=str(metrics),
                          output_limit_bytes=self.config.output_limit_bytes, extra=extra)

    def _interruptible_launch(self, job, log_dir: Path) -> tuple[dict[str, str], dict]:
        """What an interruptible job's run is told (CARBONSCHED_RESUME_COUNT, its checkpoint
        directory, the checkpoint request file) and what its supervisor keeps for it: when to
        ask it to checkpoint, with which signal and grace period, or when to stop and continue it."""
        ckdir = checkpoint.ensure_job_dir(self.config.checkpoints, job.id, job.owner_uid, job.owner_gid)
        env = {interruptible.ENV_INTERRUPTIBLE: job.interruptible,
               interruptible.ENV_RESUME_COUNT: str(job.resume_count or 0),
               interruptible.ENV_CHECKPOINT_DIR: str(ckdir)}
        extra: dict = {"interruptible": job.interruptible}
        if job.interruptible == interruptible.CHECKPOINT:
            request = log_dir / f"{job.id}.checkpoint"
            env[interruptible.ENV_CHECKPOINT_FILE] = str(request)
            extra.update(checkpoint_file=str(request),
                         checkpoint_signal=interruptible.signal_number(job.checkpoint_signal or "SIGUSR1"),
                         checkpoint_grace_s=float(job.checkpoint_grace_s or interruptible.DEFAULT_GRACE_S),
                         checkpoint_at=job.planned_interrupt_at.isoformat() if job.planned_interrupt_at else None,
                         min_run_s=job.min_run_s)
        elif job.planned_segments:
            extra["pause_segments"] = job.planned_segments
        return env, extra

    # -- energy and GPU state -----------------------------------------------------------

    def _read_now(self, gpu_ids: list[int]) -> dict[str, list]:
        """[t_s, power_w, energy_j] of each GPU now, for exact job start and end points."""
        out: dict[str, list] = {}
        for gid in gpu_ids:
            uuid = self._uuid_of.get(gid)
            if uuid is None:
                continue
            try:
                r = self.backend.read(uuid)
            except GpuError as e:
                log.warning("GPU %s unreadable: %s", gid, e)
                continue
            out[str(gid)] = [time.time(), r.power_w, r.energy_j]
        return out

    def _job_energy(self, job, status: RunStatus, ended: datetime) -> tuple[float | None, str | None, str | None]:
        """Energy of the job's GPUs over its run from samples and the start/end readings,
        plus its share of the node's static power when configured; with the method and a
        note on why GPUs were not measured by their counter."""
        gpu_ids = [int(g) for g in (job.gpu_ids or [])]
        if not gpu_ids or job.started_at is None:
            return None, None, None
        self.flush_samples()
        start_s, end_s = job.started_at.timestamp(), ended.timestamp()
        extra: dict[int, list[Sample]] = {}
        start = ((status.spec or {}).get("extra") or {}).get("start_readings") or {}
        for gid, (t, p, e) in start.items():
            extra.setdefault(int(gid), []).append(Sample(t, p, e))
        for gid, (t, p, e) in self._read_now(gpu_ids).items():
            extra.setdefault(int(gid), []).append(Sample(t, p, e))
        measured = self.samples.job_energy(gpu_ids, start_s, end_s, extra)
        if measured.energy_j is None:
            return None, None, None
        energy, method = measured.energy_j, measured.method
        if self.backend.emulated:  # the emulator's power model, not a meter: never "counter"
            method = MODELLED
        if self.config.node_static_w > 0 and self._uuid_of:
            share = len(gpu_ids) / len(self._uuid_of)
            energy += self.config.node_static_w * share * max(0.0, end_s - start_s)
            method += "+static"
        return energy, method, energy_note_of(measured.per_gpu)

    def _set_busy(self, gpu_id: int, busy: bool) -> None:
        uuid = self._uuid_of.get(gpu_id)
        if uuid:
            self.backend.set_busy(uuid, busy)

    def _release_gpus(self, gpu_ids: list[int], job=None) -> None:
        for gid in gpu_ids:
            self._set_busy(gid, False)
        if job is not None and (getattr(job, "power_limit_w", None) is not None
                                or getattr(job, "planned_power_limit_w", None) is not None):
            self._restore_power_limits(gpu_ids, f"job {job.id} ended")

    # -- power limits (issue 29) --------------------------------------------------------

    def _apply_power_limit(self, job, gpu_ids: list[int]) -> float | None:
        """Set the plan's power limit on the job's GPUs before it starts; the limit set (W
        per GPU), or None when the plan has none or it could not be set. Then the job runs at
        the default limit on all of its GPUs (never capped on some only), the reason is a job
        event and in `power_limit_note`, and the kind of failure is logged once per agent."""
        planned = getattr(job, "planned_power_limit_w", None)
        if planned is None:
            return None
        uuids = [self._uuid_of[g] for g in gpu_ids if g in self._uuid_of]
        done: list[str] = []
        note = None
        try:
            for uuid in uuids:
                self.backend.set_power_limit(uuid, planned)
                done.append(uuid)
        except GpuError as e:
            kind = ("no privilege" if isinstance(e, GpuPermissionDenied) else
                    "not supported" if isinstance(e, GpuNotSupported) else
                    "GPU lost" if isinstance(e, GpuLost) else "driver error")
            note = (f"runs uncapped: the planned power limit of {planned:g} W per GPU could not be "
                    f"set ({kind}: {e})" + (f"; {NO_PRIVILEGE_HINT}" if kind == "no privilege" else ""))
            if kind not in self._cap_warned:
                self._cap_warned.add(kind)
                log.warning("job %s %s; further '%s' failures are logged at debug level", job.id, note, kind)
            else:
                log.debug("job %s %s", job.id, note)
            self._restore_power_limits([self._gpu_of[u] for u in done], f"job {job.id} runs uncapped")
        applied = None if note else float(planned)
        self._store_power_limit(job.id, applied, note, note or f"GPU power limit set to {planned:g} W per GPU "
                                                               f"on {len(uuids)} GPU(s) before the start")
        if applied is not None:
            self._limits_read_at = None  # the next heartbeat stores the limit set (`nodes`)
            log.info("job %s: power limit %g W set on GPUs %s", job.id, applied, gpu_ids)
        return applied

    def _follow_power_limit(self, job) -> None:
        """Set a running job's GPUs to the limit it should run at now: the head node's power
        governor lowers or raises `planned_power_limit_w` while it runs (None: the default).
        A limit that cannot be set leaves the job as it is, with the reason (not retried)."""
        target = job.planned_power_limit_w
        gpu_ids = [int(g) for g in (job.gpu_ids or [])]
        note = None
        try:
            if target is None:
                self._restore_power_limits(gpu_ids, f"job {job.id}: the governor raised it to the default")
            else:
                for gid in gpu_ids:
                    uuid = self._uuid_of.get(gid)
                    if uuid is not None:
                        self.backend.set_power_limit(uuid, target)
        except GpuError as e:
            note = f"the governor's limit of {target:g} W per GPU could not be set: {e}"
            log.warning("job %s: %s", job.id, note)
        applied = job.power_limit_w if note else target
        self._store_power_limit(job.id, applied, note, note or (
            "GPU power limit back to the default" if target is None
            else f"GPU power limit set to {target:g} W per GPU while running"))
        self._limits_read_at = None

    def _store_power_limit(self, job_id: int, applied_w: float | None, note: str | None, reason: str) -> None:
        """Record the limit a job's GPUs run at (and why none, `note`) with a job event."""
        now = self._clock()

        def tx(conn: Connection) -> None:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(power_limit_w=applied_w, power_limit_note=note))
            record_events(conn, [{"job_id": job_id, "from_state": State.RUNNING.value,
                                  "to_state": State.RUNNING.value, "actor_uid": None, "at": now, "reason": reason}])

        self.store.transact(tx)

    def _restore_power_limits(self, gpu_ids: list[int], why: str) -> int:
        """Put each GPU whose limit is not its default back to the default; how many were."""
        restored = 0
        for gid in gpu_ids:
            uuid = self._uuid_of.get(gid)
            if uuid is not None and self._restore_power_limit(uuid, why):
                restored += 1
        return restored

    def _restore_power_limit(self, uuid: str, why: str) -> bool:
        try:
            limit = self.backend.power_limit(uuid)
        except GpuError:
            return False  # no limit reported (or a failing GPU, whose reads say so)
        if (limit.current_w is None or limit.default_w is None
                or abs(limit.current_w - limit.default_w) <= POWER_LIMIT_TOLERANCE_W):
            return False
        try:
            self.backend.restore_power_limit(uuid)
        except GpuError as e:
            log.error("GPU %s: could not restore its power limit from %.0f W to the default %.0f W "
                      "(%s): %s", uuid, limit.current_w, limit.default_w, why, e)
            return False
        self.power_limits.pop(uuid, None)
        self._limits_read_at = None  # the next heartbeat stores the restored limit
        log.info("GPU %s: power limit restored from %.0f W to its default %.0f W (%s)", uuid,
                 limit.current_w, limit.default_w, why)
        return True

    def _heartbeat(self) -> None:
        now = self._clock()
        if self._last_heartbeat and (now - self._last_heartbeat).total_seconds() < self.config.heartbeat_s:
            return
        latest = self.sampler.latest()
        if not latest:
            latest = {r.uuid: r for r in self.sampler.sample_once()}
        day = now.astimezone().date().isoformat()
        increments, self._day_j = self._day_j, {}
        limits = self._fresh_power_limits(now)

        def tx(conn: Connection) -> None:
            conn.execute(update(nodes).where(nodes.c.name == self.config.node)
                         .values(last_heartbeat=now))
            for uuid, r in latest.items():
                gid = self._gpu_of.get(uuid)
                if gid is None:
                    continue
                inc = increments.get(gid, 0.0)
                limit = limits.get(uuid)
                extra = {} if limit is None else dict(
                    power_limit_w=limit.current_w, power_limit_min_w=limit.min_w,
                    power_limit_max_w=limit.max_w)
                conn.execute(update(gpus).where(gpus.c.id == gid).values(
                    power_w=r.power_w, energy_j=r.energy_j, utilization_pct=r.utilization_pct,
                    energy_day=day,
                    energy_day_j=case((gpus.c.energy_day == day, gpus.c.energy_day_j + inc), else_=inc),
                    **extra))

        self.store.transact(tx)
        self._last_heartbeat = now

    def _stop_orphans(self, running_here: set[int]) -> None:
        """Stop processes of jobs this node no longer owns (declared LOST while it was away),
        and clear run directories whose outcome is recorded: a job must never run twice."""
        for job_id in self.executor.known_runs():
            if job_id in running_here:
                continue
            status = self.executor.status(job_id)
            if status.state is RunState.RUNNING:
                if job_id not in self._signalled and self.executor.signal_cancel(job_id):
                    self._signalled.add(job_id)
                    log.error("job %s is not RUNNING here any more (declared lost while this node "
                              "was away?); stopping its leftover process", job_id)
            else:
                self.executor.forget(job_id)
                self._signalled.discard(job_id)

    def startup_reconcile(self) -> None:
        """After a restart: free GPUs held by jobs that are no longer running, adopt the rest."""
        def tx(conn: Connection) -> None:
            running = select(jobs.c.id).where(jobs.c.state == State.RUNNING.value)
            conn.execute(update(gpus).where(gpus.c.node_name == self.config.node,
                                            gpus.c.job_id.is_not(None),
                                            gpus.c.job_id.not_in(running)).values(job_id=None))

        self.store.transact(tx)
        running = self._running_jobs()
        adopted = [j for j in running if self.executor.status(j.id).state is RunState.RUNNING]
        if self._emulation is not None and adopted:
            self._emulate_adopted([j.id for j in adopted])
        for job in adopted:
            for gid in job.gpu_ids or []:
                self._set_busy(gid, True)
        # Crash recovery: a limit outlives the agent that set it, so every GPU that runs no
        # job of ours goes back to its default limit (an adopted job keeps its own).
        ours = {int(g) for j in adopted for g in (j.gpu_ids or [])}
        restored = self._restore_power_limits([g for g in self._uuid_of if g not in ours],
                                              "at start-up, no job of ours runs on it")
        if restored:
            log.warning("restored the default power limit of %d GPU(s) that ran no job of ours "
                        "(left capped by an agent that stopped without restoring them?)", restored)
        self._stop_orphans({j.id for j in running})
        log.info("reconciled %d running job(s) on %s", len(running), self.config.node)


    def _emulate_adopted(self, job_ids: list[int]) -> None:
        """Give the GPUs of jobs adopted after a restart the truth's power again (a fresh
        emulator starts blank); each job keeps the pace it was told at launch."""
        with self.store.read() as conn:
            models = dict(conn.execute(select(gpus.c.id, gpus.c.model).where(
                gpus.c.node_name == self.config.node)).all())
            rows = conn.execute(select(jobs).where(jobs.c.id.in_(job_ids))).all()
        for job in rows:
            gpu_ids = [int(g) for g in job.gpu_ids or []]
            if gpu_ids and gpu_ids[0] in models:
                self._emulation.begin(job, models[gpu_ids[0]],
                                      [self._uuid_of[g] for g in gpu_ids if g in self._uuid_of])


def disk_free_bytes(path: Path) -> int:
    """Free bytes for unprivileged writers on the filesystem holding `path` (the seam tests fake)."""
    return shutil.disk_usage(path).free


def visible_devices_env(vendor: str, indices: list[int]) -> dict[str, str]:
    """The environment that confines a process to its GPUs.

    NVIDIA: CUDA_VISIBLE_DEVICES lists NVML/PCI-order indices (CUDA_DEVICE_ORDER=PCI_BUS_ID
    makes CUDA count the same way). AMD: ROCR_VISIBLE_DEVICES selects the physical GPUs;
    HIP and CUDA_VISIBLE_DEVICES then count within that selection, so they get 0..n-1.
    """
    physical = ",".join(str(i) for i in indices)
    renumbered = ",".join(str(i) for i in range(len(indices)))
    if vendor == "amd":
        return {"ROCR_VISIBLE_DEVICES": physical, "HIP_VISIBLE_DEVICES": renumbered,
                "CUDA_VISIBLE_DEVICES": renumbered}
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": physical}


def _identity_env(uid: int, name: str) -> dict[str, str]:
    try:
        pw = pwd.getpwuid(uid)
        return {"HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name,
                "SHELL": pw.pw_shell or "/bin/sh"}
    except KeyError:
        return {"USER": name, "LOGNAME": name}


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def default_node_name() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


def operating_point_env(max_batch: int | None, precision: str | None, tp: int | None) -> dict[str, str]:
    """The planned operating point for the job's serving engine (policies.operating_point):
    CARBONSCHED_MAX_BATCH (vLLM max_num_seqs), CARBONSCHED_PRECISION (bf16, fp8, fp4) and
    CARBONSCHED_TP (tensor-parallel degree; the job's GPUs / TP are data-parallel replicas).
    Empty when the plan has none (no performance-model workload)."""
    if max_batch is None:
        return {}
    return {"CARBONSCHED_MAX_BATCH": str(max_batch), "CARBONSCHED_PRECISION": str(precision or ""),
            "CARBONSCHED_TP": str(tp or 1)}
