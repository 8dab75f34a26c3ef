"""The node agent: registers this node's GPUs, claims the jobs planned for them, runs them
through the executor, and records outcomes. The daemon runs one in-process on SQLite;
`carbonsched agent` runs one per GPU node. Either way it shares state only via the store.
"""

from __future__ import annotations

import logging
import os
import pwd
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import Connection, and_, func, insert, select, update

from scheduler.executor import Executor, LaunchSpec, RunState, RunStatus
from scheduler.lifecycle import State, transition, utcnow
from scheduler.store import Store
from scheduler.store.models import gpus, jobs, nodes
from telemetry.gpu import GpuBackend, GpuError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentConfig:
    node: str
    zone: str
    state_dir: Path
    grace_s: float = 10.0
    heartbeat_s: float = 5.0


class Agent:
    """Owns the GPUs of one node. `tick()` is called periodically and after wake-ups."""

    def __init__(self, store: Store, backend: GpuBackend, config: AgentConfig, *,
                 on_change: Callable[[], None] | None = None, clock=utcnow) -> None:
        self.store = store
        self.backend = backend
        self.config = config
        self.executor = Executor(config.state_dir, grace_s=config.grace_s)
        self._on_change = on_change or (lambda: None)
        self._clock = clock
        self._signalled: set[int] = set()
        self._last_heartbeat: datetime | None = None
        self._tick_lock = threading.Lock()
        self._uuid_of: dict[int, str] = {}

    # -- registration -------------------------------------------------------------------

    def register(self) -> None:
        """Upsert this node and its GPUs; GPUs that disappeared are marked unhealthy."""
        devices = self.backend.devices()
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
                fields = dict(node_name=self.config.node, index=d.index, model=d.model,
                              vendor=d.vendor, memory_gib=d.memory_gib, healthy=True)
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
                select(gpus.c.id, gpus.c.uuid).where(gpus.c.node_name == self.config.node))}
        self._last_heartbeat = None  # the first tick reports power readings right away
        log.info("node %s registered in zone %s with %d GPUs (%s backend)",
                 self.config.node, self.config.zone, len(devices), self.backend.name)

    # -- the periodic work --------------------------------------------------------------

    def tick(self) -> None:
        """Finish ended runs, pass on cancels, start due jobs, heartbeat. Never concurrent."""
        if not self._tick_lock.acquire(blocking=False):
            return
        try:
            self.executor.reap()
            changed = self._reconcile_running()
            changed |= self._claim_due()
            self._heartbeat()
            if changed:
                self._on_change()
        finally:
            self._tick_lock.release()

    def _running_jobs(self) -> list:
        with self.store.read() as conn:
            return list(conn.execute(
                select(jobs.c.id, jobs.c.cancel_requested_at, jobs.c.max_retries, jobs.c.attempts,
                       jobs.c.gpu_ids)
                .where(jobs.c.state == State.RUNNING.value, jobs.c.node == self.config.node)))

    def _reconcile_running(self) -> bool:
        changed = False
        for job in self._running_jobs():
            status = self.executor.status(job.id)
            if status.state is RunState.RUNNING:
                if job.cancel_requested_at is not None and job.id not in self._signalled:
                    if self.executor.signal_cancel(job.id):
                        self._signalled.add(job.id)
                        log.info("job %s: cancel requested, stopping it", job.id)
                continue
            changed = True
            if status.state is RunState.FINISHED:
                self._finish(job, status)
            elif status.state is RunState.NOT_LAUNCHED:
                self._requeue_unlaunched(job)
            else:
                self._lose(job, "its supervisor vanished without a result (killed?)")
        return changed

    def _finish(self, job, status: RunStatus) -> None:
        result = status.result or {}
        code = result.get("exit_code")
        if result.get("cancelled") or (job.cancel_requested_at is not None and code != 0):
            to, why = State.CANCELLED, "cancelled by user while running"
        elif result.get("timed_out"):
            limit = (status.spec or {}).get("time_limit_s")
            to, why = State.TIMEOUT, f"exceeded its time limit of {limit:g}s" if limit else "timed out"
        elif code == 0:
            to, why = State.COMPLETED, "exit code 0"
        elif result.get("error"):
            to, why = State.FAILED, result["error"]
        elif result.get("signal"):
            to, why = State.FAILED, f"killed by signal {result['signal']}"
        else:
            to, why = State.FAILED, f"exit code {code}"
        energy_j, method = self._job_energy(status)
        ended = _parse_time(result.get("ended_at")) or self._clock()

        def tx(conn: Connection) -> None:
            ok = transition(conn, job.id, to, actor_uid=None, reason=why, expect=State.RUNNING,
                            values=dict(ended_at=ended, exit_code=code, energy_j=energy_j,
                                        energy_method=method))
            if ok:
                conn.execute(update(gpus).where(gpus.c.job_id == job.id).values(job_id=None))

        self.store.transact(tx)
        self._release_gpus(job.gpu_ids or [])
        self.executor.forget(job.id)
        self._signalled.discard(job.id)
        log.info("job %s %s (%s)", job.id, to.value, why)

    def _requeue_unlaunched(self, job) -> None:
        def tx(conn: Connection) -> None:
            if transition(conn, job.id, State.PENDING, actor_uid=None, expect=State.RUNNING,
                          reason="agent stopped between claim and launch; the command never "
                                 "started, so it was put back in the queue",
                          values=dict(node=None, gpu_ids=None, gpu_indices=None, started_at=None,
                                      planned_node=None, planned_gpu_ids=None, planned_start=None,
                                      attempts=jobs.c.attempts - 1)):
                conn.execute(update(gpus).where(gpus.c.job_id == job.id).values(job_id=None))

        self.store.transact(tx)
        self.executor.forget(job.id)
        log.warning("job %s was claimed but never launched; re-queued", job.id)

    def _lose(self, job, why: str) -> None:
        retry = job.attempts <= job.max_retries

        def tx(conn: Connection) -> None:
            if retry:
                ok = transition(conn, job.id, State.PENDING, actor_uid=None, expect=State.RUNNING,
                                reason=f"{why}; retrying (attempt {job.attempts + 1} of "
                                       f"{job.max_retries + 1})",
                                values=dict(node=None, gpu_ids=None, gpu_indices=None,
                                            planned_node=None, planned_gpu_ids=None,
                                            planned_start=None))
            else:
                ok = transition(conn, job.id, State.LOST, actor_uid=None, reason=why,
                                expect=State.RUNNING, values=dict(ended_at=self._clock()))
            if ok:
                conn.execute(update(gpus).where(gpus.c.job_id == job.id).values(job_id=None))

        self.store.transact(tx)
        self._release_gpus(job.gpu_ids or [])
        self.executor.forget(job.id)
        log.error("job %s lost: %s", job.id, why)

    def _claim_due(self) -> bool:
        now = self._clock()
        with self.store.read() as conn:
            due = list(conn.execute(
                select(jobs).where(jobs.c.state == State.PLANNED.value,
                                   jobs.c.planned_node == self.config.node,
                                   jobs.c.planned_start <= now)
                .order_by(jobs.c.planned_start, jobs.c.id)))
            gpu_rows = {r.id: r for r in conn.execute(
                select(gpus).where(gpus.c.node_name == self.config.node))}
        busy = {i for i, g in gpu_rows.items() if g.job_id is not None or not g.healthy}
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
                                        attempts=jobs.c.attempts + 1))
            if not ok:
                conn.rollback()
            return ok

        if not self.store.transact(tx):
            return False
        energy_start = self._energy_counters(gpu_ids)
        try:
            self.executor.launch(self._launch_spec(job, vendor, indices, energy_start))
        except OSError as e:
            log.error("job %s: could not start its supervisor: %s", job.id, e)
            # Nothing was launched: the next tick finds NOT_LAUNCHED and re-queues it.
            return True
        for gid in gpu_ids:
            self._set_busy(gid, True)
        log.info("job %s started on %s GPUs %s", job.id, self.config.node, indices)
        return True

    def _launch_spec(self, job, vendor: str, indices: list[int], energy_start: dict) -> LaunchSpec:
        out, err = self.executor.log_paths(job.id)
        env = dict(job.env or {})
        env.update(_identity_env(job.owner_uid, job.owner_name))
        env.update(visible_devices_env(vendor, indices))
        env["CARBONSCHED_JOB_ID"] = str(job.id)
        env["CARBONSCHED_NODE"] = self.config.node
        return LaunchSpec(job_id=job.id, argv=list(job.argv), cwd=job.cwd, env=env,
                          uid=job.owner_uid, gid=job.owner_gid, groups=list(job.owner_groups or []),
                          time_limit_s=job.time_limit_s, grace_s=self.config.grace_s,
                          stdout=str(out), stderr=str(err),
                          extra={"energy_start_j": energy_start})

    # -- energy and GPU state -----------------------------------------------------------

    def _energy_counters(self, gpu_ids: list[int]) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for gid in gpu_ids:
            uuid = self._uuid_of.get(gid)
            try:
                out[str(gid)] = self.backend.read(uuid).energy_j if uuid else None
            except GpuError as e:
                log.warning("energy counter of GPU %s unreadable: %s", gid, e)
                out[str(gid)] = None
        return out

    def _job_energy(self, status: RunStatus) -> tuple[float | None, str | None]:
        start = ((status.spec or {}).get("extra") or {}).get("energy_start_j") or {}
        if not start:
            return None, None
        end = self._energy_counters([int(k) for k in start])
        total = 0.0
        for k, before in start.items():
            after = end.get(k)
            if before is None or after is None or after < before:
                return None, None  # counter missing or reset (e.g. emulator restarted)
            total += after - before
        return total, "counter"

    def _set_busy(self, gpu_id: int, busy: bool) -> None:
        uuid = self._uuid_of.get(gpu_id)
        if uuid:
            self.backend.set_busy(uuid, busy)

    def _release_gpus(self, gpu_ids: list[int]) -> None:
        for gid in gpu_ids:
            self._set_busy(gid, False)

    def _heartbeat(self) -> None:
        now = self._clock()
        if self._last_heartbeat and (now - self._last_heartbeat).total_seconds() < self.config.heartbeat_s:
            return
        readings = {}
        for gid, uuid in self._uuid_of.items():
            try:
                readings[gid] = self.backend.read(uuid)
            except GpuError as e:
                log.warning("GPU %s unreadable: %s", gid, e)

        def tx(conn: Connection) -> None:
            conn.execute(update(nodes).where(nodes.c.name == self.config.node)
                         .values(last_heartbeat=now))
            for gid, r in readings.items():
                conn.execute(update(gpus).where(gpus.c.id == gid)
                             .values(power_w=r.power_w, energy_j=r.energy_j))

        self.store.transact(tx)
        self._last_heartbeat = now

    def startup_reconcile(self) -> None:
        """After a restart: free GPUs held by jobs that are no longer running, adopt the rest."""
        def tx(conn: Connection) -> None:
            running = select(jobs.c.id).where(jobs.c.state == State.RUNNING.value)
            conn.execute(update(gpus).where(gpus.c.node_name == self.config.node,
                                            gpus.c.job_id.is_not(None),
                                            gpus.c.job_id.not_in(running)).values(job_id=None))

        self.store.transact(tx)
        running = self._running_jobs()
        for job in running:
            if self.executor.status(job.id).state is RunState.RUNNING:  # adopted as it is
                for gid in job.gpu_ids or []:
                    self._set_busy(gid, True)
        with self.store.read() as conn:
            ours = {r.id for r in conn.execute(select(jobs.c.id).where(
                jobs.c.node == self.config.node, jobs.c.state == State.RUNNING.value))}
        for job_id in self.executor.known_runs():
            if job_id not in ours and self.executor.status(job_id).state is not RunState.RUNNING:
                self.executor.forget(job_id)  # outcome already recorded before the crash
        log.info("reconciled %d running job(s) on %s", len(running), self.config.node)


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
