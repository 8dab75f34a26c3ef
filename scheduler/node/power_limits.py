"""The GPUs' power limits on one node, as the agent sets and restores them.

A plan may run a job under a power limit (`planned_power_limit_w`, W per GPU): it is set on
the job's GPUs before the job starts, followed while it runs (the head node's power governor
lowers or raises it), and the default is restored when the job ends or never started. A limit
outlives the agent that set it, so a restarted agent restores the default on every GPU that
runs no job of its own. What each GPU's limit is now is kept for the heartbeat (the `gpus`
rows) and the metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Connection

from scheduler.jobs.job import RunningJob
from scheduler.jobs.store import set_power_limit
from scheduler.lifecycle import State, record_events
from scheduler.store import Store
from telemetry.gpu import GpuBackend, GpuError, GpuLost, GpuNotSupported, GpuPermissionDenied

log = logging.getLogger(__name__)

# What an operator does about a power limit refused for privilege.
NO_PRIVILEGE_HINT = ("setting GPU power limits needs root with CAP_SYS_ADMIN: under systemd install "
                     "systemd/power-limits.conf as a drop-in of the agent's unit")
# How often the heartbeat re-reads the GPUs' power limits (an operator may change them).
POWER_LIMIT_REFRESH_S = 60.0
# A limit within this of the default is the default (drivers report mW/uW, shown rounded).
POWER_LIMIT_TOLERANCE_W = 0.5
# What a job is told of the limit it runs under.
ENV_POWER_LIMIT = "CARBONSCHED_POWER_LIMIT_W"


class PowerLimits:
    """Sets, follows and restores the power limits of one node's GPUs.

    `uuid_of` (store GPU id -> UUID) and `gpu_of` (UUID -> store GPU id) are the agent's
    maps of its registered GPUs, shared (the agent fills them in place when it registers).
    """

    def __init__(self, store: Store, backend: GpuBackend, uuid_of: dict[int, str], gpu_of: dict[str, int],
                 clock: Callable[[], datetime]) -> None:
        self.store = store
        self.backend = backend
        self._uuid_of = uuid_of
        self._gpu_of = gpu_of
        self._clock = clock
        # The latest power limit of each GPU (by UUID), for the metrics.
        self.current: dict[str, object] = {}
        self._read_at: datetime | None = None
        # Kinds of power-limit failure already logged at WARNING (each is logged once per agent).
        self._warned: set[str] = set()

    def note(self, uuid: str, limit) -> None:
        """Keep a limit read elsewhere (at registration); None: the GPU reports none."""
        if limit is not None:
            self.current[uuid] = limit

    def fresh(self, now: datetime) -> dict[str, object]:
        """The GPUs' current power limits, read at most every POWER_LIMIT_REFRESH_S."""
        if self._read_at and (now - self._read_at).total_seconds() < POWER_LIMIT_REFRESH_S:
            return {}
        self._read_at = now
        out: dict[str, object] = {}
        for uuid in self._gpu_of:
            try:
                out[uuid] = self.current[uuid] = self.backend.power_limit(uuid)
            except GpuError:
                continue  # not reported, or the GPU is failing: its reads report that
        return out

    def apply(self, job, gpu_ids: list[int]) -> float | None:
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
            if kind not in self._warned:
                self._warned.add(kind)
                log.warning("job %s %s; further '%s' failures are logged at debug level", job.id, note, kind)
            else:
                log.debug("job %s %s", job.id, note)
            self.restore([self._gpu_of[u] for u in done], f"job {job.id} runs uncapped")
        applied = None if note else float(planned)
        self._record(job.id, applied, note, note or f"GPU power limit set to {planned:g} W per GPU "
                                                    f"on {len(uuids)} GPU(s) before the start")
        if applied is not None:
            self._read_at = None  # the next heartbeat stores the limit set (`nodes`)
            log.info("job %s: power limit %g W set on GPUs %s", job.id, applied, gpu_ids)
        return applied

    def follow(self, job: RunningJob) -> None:
        """Set a running job's GPUs to the limit it should run at now: the head node's power
        governor lowers or raises `planned_power_limit_w` while it runs (None: the default).
        A limit that cannot be set leaves the job as it is, with the reason (not retried)."""
        target = job.planned_power_limit_w
        gpu_ids = [int(g) for g in (job.gpu_ids or [])]
        note = None
        try:
            if target is None:
                self.restore(gpu_ids, f"job {job.id}: the governor raised it to the default")
            else:
                for gid in gpu_ids:
                    uuid = self._uuid_of.get(gid)
                    if uuid is not None:
                        self.backend.set_power_limit(uuid, target)
        except GpuError as e:
            note = f"the governor's limit of {target:g} W per GPU could not be set: {e}"
            log.warning("job %s: %s", job.id, note)
        applied = job.power_limit_w if note else target
        self._record(job.id, applied, note, note or (
            "GPU power limit back to the default" if target is None
            else f"GPU power limit set to {target:g} W per GPU while running"))
        self._read_at = None

    def _record(self, job_id: int, applied_w: float | None, note: str | None, reason: str) -> None:
        """Record the limit a job's GPUs run at (and why none, `note`) with a job event."""
        now = self._clock()

        def tx(conn: Connection) -> None:
            set_power_limit(conn, job_id, applied_w, note)
            record_events(conn, [{"job_id": job_id, "from_state": State.RUNNING.value,
                                  "to_state": State.RUNNING.value, "actor_uid": None, "at": now, "reason": reason}])

        self.store.transact(tx)

    def restore(self, gpu_ids: list[int], why: str) -> int:
        """Put each GPU whose limit is not its default back to the default; how many were."""
        restored = 0
        for gid in gpu_ids:
            uuid = self._uuid_of.get(gid)
            if uuid is not None and self._restore_one(uuid, why):
                restored += 1
        return restored

    def _restore_one(self, uuid: str, why: str) -> bool:
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
        self.current.pop(uuid, None)
        self._read_at = None  # the next heartbeat stores the restored limit
        log.info("GPU %s: power limit restored from %.0f W to its default %.0f W (%s)", uuid,
                 limit.current_w, limit.default_w, why)
        return True
