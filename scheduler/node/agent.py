"""The node agent: registers this node's GPUs, claims the jobs planned for them, runs them
through its launcher, and records outcomes. The daemon runs one in-process on SQLite;
`carbonsched agent` runs one per GPU node. Either way it shares state only via the store.

One `Agent` serves every node; what differs where Slurm runs the jobs is its launcher
(scheduler.node.launcher). Its parts: registration, claims, launch (the spec a job runs
with), reconcile (running jobs and their runs, at each tick and after a restart), job_ends
(how a run's end is recorded), run_energy, power_limits, heartbeat and disk.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Connection, select, update

from scheduler.clock import utcnow
from scheduler.jobs.store import planned_on, still_active
from scheduler.node import checkpoint, claims, slice_claims
from scheduler.node.config import AgentConfig
from scheduler.node.disk import DiskGuard, disk_places
from scheduler.node.heartbeat import write_heartbeat
from scheduler.node.job_ends import JobEnds, RunMarks
from scheduler.node.launch import launch_spec
from scheduler.node.launcher import Launcher, LocalLauncher
from scheduler.node.log_shipper import LogShipper
from scheduler.node.power_limits import ENV_POWER_LIMIT, PowerLimits
from scheduler.node.reconcile import Reconciler
from scheduler.node.registration import register_node
from scheduler.node.run_energy import RunEnergy
from scheduler.samples import SampleStore, StoredSample
from scheduler.store import Store
from scheduler.store.models import gpus
from telemetry.energy import integrate_power
from telemetry.gpu import GpuBackend
from telemetry.sampler import Reading, Sampler

log = logging.getLogger(__name__)

# Samples kept in memory while the store is unreachable: an hour of 64 GPUs at 1 Hz.
MAX_UNWRITTEN_SAMPLES = 64 * 3600
# Around a job's start the sampler reads faster for a while: the ramp from idle to load is
# where a 1 Hz series would misjudge energy the most.
BURST_HZ = 10.0
BURST_S = 5.0
# How often the agent removes the checkpoint directories of jobs that have ended.
CHECKPOINT_SWEEP_S = 30.0


class Agent:
    """Owns the GPUs of one node. `tick()` is called periodically and after wake-ups.

    `launcher`: how jobs run (None: supervised local processes); `emulation`: an emulated
    fleet's hidden truth (scheduler.node.emulation.JobEmulation), or None."""

    def __init__(self, store: Store, backend: GpuBackend, config: AgentConfig, *,
                 on_change: Callable[[], None] | None = None,
                 on_finished: Callable[[int, str | None], None] | None = None, clock=utcnow,
                 launcher: Launcher | None = None, emulation=None) -> None:
        self.store = store
        self.backend = backend
        self._emulation = emulation
        self.config = config
        self.launcher = launcher or LocalLauncher(backend, config)
        self.executor = self.launcher.executor
        self._on_change = on_change or (lambda: None)
        self._clock = clock
        self._last_heartbeat: datetime | None = None
        self._tick_lock = threading.Lock()
        # The registered GPUs: store id -> UUID and back (filled in place by `register`; the
        # parts below hold these same maps).
        self._uuid_of: dict[int, str] = {}
        self._gpu_of: dict[str, int] = {}
        # GPUs whose slices run jobs (MIG mode, or declared shares): one job's end does not idle them
        self._shared_gpus: set[int] = set()
        self.devices = []
        self.samples = SampleStore(store)
        self.sampler = Sampler(backend, hz=config.sample_hz, on_lost=self._on_gpu_lost)
        self._lost_pending: dict[str, str] = {}
        self._lost_lock = threading.Lock()
        self._swept_at: float | None = None
        self._prev_reading: dict[str, Reading] = {}
        self._day_j: dict[int, float] = {}
        self._warned_unknown: set[str] = set()
        self._unwritten: list[StoredSample] = []
        self.dropped_samples = 0
        self.power = PowerLimits(store, backend, self._uuid_of, self._gpu_of, clock)
        self.energy = RunEnergy(self.samples, backend, self._uuid_of, self.flush_samples, config.node_static_w)
        places = disk_places(config.state_dir, getattr(self.executor, "log_root", None))
        self.disk = DiskGuard(store, config.node, places, config.min_free_disk_mib)
        self.marks = RunMarks()
        # Called with (job id, energy note) once a run's end is recorded: the head prices its carbon.
        self.ends = JobEnds(store, config, self.launcher, self.energy, self.power, self.marks,
                            release=self._release_gpus, clock=clock,
                            on_finished=on_finished or (lambda job_id, note: None))
        logs = LogShipper(store, self.executor.log_paths) if config.ship_logs else None
        self.runs = Reconciler(store, config.node, self.launcher, self.marks, self.ends, self.power, logs,
                               set_busy=self._set_busy, emulation=emulation, uuid_of=self._uuid_of, clock=clock)

    # -- registration -------------------------------------------------------------------

    def register(self) -> None:
        """Upsert this node and its GPUs; GPUs that disappeared are marked unhealthy."""
        devices = self.backend.devices()
        self.devices = devices
        uuid_of = register_node(self.store, self.backend, devices, self.config.node, self.config.zone,
                                self._clock(), limits=self.power, warned=self._warned_unknown,
                                shares=self.config.gpu_shares)
        self._uuid_of.clear()
        self._uuid_of.update(uuid_of)
        self._gpu_of.clear()
        self._gpu_of.update({u: i for i, u in uuid_of.items()})
        self._shared_gpus = {self._gpu_of[d.uuid] for d in devices if d.uuid in self._gpu_of
                             and (d.mig_enabled or self.config.gpu_shares > 1)}
        self._last_heartbeat = None  # the first tick reports power readings right away
        log.info("node %s registered in zone %s with %d GPUs (%s backend)",
                 self.config.node, self.config.zone, len(devices), self.backend.name)
        self.launcher.registered(devices, self._uuid_of, self._gpu_of)

    # -- the periodic work --------------------------------------------------------------

    def tick(self) -> None:
        """Finish ended runs, pass on cancels, start due jobs, heartbeat; then follow what
        the launcher's backend did. Never concurrent."""
        if not self.launcher.refresh():  # the backend cannot be read: only say we are alive
            self._locked(self._heartbeat_only)
            return
        self._locked(self._tick)
        self._locked(self.launcher.follow)

    def _locked(self, work: Callable[[], bool | None]) -> None:
        """Run `work` unless a tick is running; tell `on_change` when it changed the store."""
        if not self._tick_lock.acquire(blocking=False):
            return
        try:
            if work():
                self._on_change()
        finally:
            self._tick_lock.release()

    def _tick(self) -> bool:
        self.executor.reap()
        self.flush_samples()
        changed = self._mark_lost_gpus()
        changed |= self.disk.check()
        changed |= self.runs.tick()
        changed |= self._claim_due()
        self._heartbeat()
        self._sweep_checkpoints()
        return changed

    def _heartbeat_only(self) -> None:
        self.flush_samples()
        self._heartbeat()

    def diagnose(self) -> list[str]:
        """What this agent sees when it would claim (SIGUSR2 diagnostics): its GPUs, the
        PLANNED jobs on this node with their start against now, whether a tick is running."""
        now = self._clock()
        out = [f"tick running={self._tick_lock.locked()}, lost pending={sorted(self._lost_pending)}"]
        with self.store.read() as conn:
            for g in conn.execute(select(gpus.c.id, gpus.c.job_id, gpus.c.healthy, gpus.c.drained)
                                  .where(gpus.c.node_name == self.config.node).order_by(gpus.c.id)):
                out.append(f"GPU {g.id}: job={g.job_id} healthy={g.healthy} drained={g.drained}")
            for j in planned_on(conn, self.config.node, 10):
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
                self.marks.stopped_by_agent[job_id] = f"GPU {uuid} was lost during the run: {why}"
                if self.executor.signal_cancel(job_id):  # else retried each tick until it takes
                    self.marks.signalled.add(job_id)
                    log.error("job %s: stopping it, its GPU %s is lost", job_id, uuid)
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
            active = still_active(conn, ids)
        for job_id in ids:
            if job_id not in active:
                checkpoint.remove_job_dir(root, job_id)
                log.info("job %s has ended: its checkpoint directory was removed", job_id)

    # -- claiming and starting ------------------------------------------------------------

    def _claim_due(self) -> bool:
        """Start the PLANNED jobs whose time has come and whose GPUs are free."""
        now = self._clock()
        gpu_rows, busy, due = claims.due_jobs(self.store, self.config.node, now)
        started = False
        for job in due:
            ids = list(job.planned_gpu_ids or [])
            if not ids or any(i not in gpu_rows or i in busy for i in ids):
                continue  # GPUs still busy (the previous job ran over its estimate)
            try:
                claimed = self._claim(job, ids, gpu_rows, now)
            finally:
                self.launcher.claim_ended(job.id)
            if claimed:
                started = True
                busy.update(ids)
        return self._claim_slices(gpu_rows, now) or started

    def _claim_slices(self, gpu_rows: dict, now: datetime) -> bool:
        """Start the waiting slice jobs on this node's free slices that fit them
        (scheduler.node.slice_claims). Only jobs this agent runs itself: a node whose jobs
        Slurm runs leaves slices to Slurm's own GRES (not done: slice jobs wait there)."""
        if not isinstance(self.launcher, LocalLauncher):
            return False
        started = False
        for job, chosen in slice_claims.ready_placements(self.store, self.config.node, now):
            try:
                if slice_claims.claim_slice(self.store, job, chosen, self.config.node, now):
                    started = True
                    self._launch(job, [chosen.gpu_id], gpu_rows, now, visible=chosen.visible_env())
            finally:
                self.launcher.claim_ended(job.id)
        return started

    def _claim(self, job, gpu_ids: list[int], gpu_rows: dict, now: datetime) -> bool:
        """PLANNED -> RUNNING and take the GPUs, atomically; then launch."""
        indices = [gpu_rows[i].index for i in gpu_ids]
        if not claims.claim(self.store, job, gpu_ids, indices, self.config.node, now):
            return False
        return self._launch(job, gpu_ids, gpu_rows, now)

    def _launch(self, job, gpu_ids: list[int], gpu_rows: dict, now: datetime,
                visible: dict[str, str] | None = None) -> bool:
        """Launch a claimed job on its GPUs (`visible`: the environment that confines it to
        a slice, instead of its whole GPUs)."""
        indices = [gpu_rows[i].index for i in gpu_ids]
        vendor = gpu_rows[gpu_ids[0]].vendor
        limit_w = self.power.apply(job, gpu_ids)
        energy_start = self.energy.read_now(gpu_ids)
        emulated_env = {} if self._emulation is None else self._emulation.begin(
            job, gpu_rows[gpu_ids[0]].model, [self._uuid_of[g] for g in gpu_ids if g in self._uuid_of],
            power_limit_w=limit_w)
        if limit_w is not None:
            emulated_env = {**emulated_env, ENV_POWER_LIMIT: f"{limit_w:g}"}
        try:
            spec = launch_spec(job, self.executor, self.config, vendor, indices, energy_start, emulated_env,
                               visible=visible)
            self.executor.launch(self.launcher.launch_spec(job, spec))
        except OSError as e:
            log.error("job %s: could not start its supervisor: %s", job.id, e)
            # Nothing was launched: the next tick finds NOT_LAUNCHED and re-queues it.
            return True
        for gid in gpu_ids:
            self._set_busy(gid, True)
        self.sampler.burst(BURST_HZ, BURST_S)  # the power ramp at a job's start, in detail
        log.info("job %s started on %s GPUs %s", job.id, self.config.node, indices)
        return True

    # -- GPU state ------------------------------------------------------------------------

    def _set_busy(self, gpu_id: int, busy: bool) -> None:
        uuid = self._uuid_of.get(gpu_id)
        if uuid:
            self.launcher.set_busy(uuid, busy)

    def _release_gpus(self, gpu_ids: list[int], job=None) -> None:
        # A GPU whose slices run other jobs (MIG instances, declared shares) stays loaded; the
        # running jobs are read only where a released GPU is shared.
        others = {int(g) for j in self.runs.running() if job is None or j.id != job.id
                  for g in (j.gpu_ids or [])} if self._shared_gpus.intersection(gpu_ids) else set()
        for gid in gpu_ids:
            if gid not in others:
                self._set_busy(gid, False)
        if job is not None and (getattr(job, "power_limit_w", None) is not None
                                or getattr(job, "planned_power_limit_w", None) is not None):
            self.power.restore(gpu_ids, f"job {job.id} ended")

    def _heartbeat(self) -> None:
        now = self._clock()
        if self._last_heartbeat and (now - self._last_heartbeat).total_seconds() < self.config.heartbeat_s:
            return
        latest = self.sampler.latest()
        if not latest:
            latest = {r.uuid: r for r in self.sampler.sample_once()}
        increments, self._day_j = self._day_j, {}
        write_heartbeat(self.store, self.config.node, now, latest, increments, self.power.fresh(now), self._gpu_of)
        self._last_heartbeat = now

    def startup_reconcile(self) -> None:
        """After a restart: free GPUs held by jobs that are no longer running, adopt the rest."""
        self.runs.startup()


def default_node_name() -> str:
    return socket.gethostname().split(".")[0] or "localhost"
