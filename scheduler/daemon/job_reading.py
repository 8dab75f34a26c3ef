"""Reading jobs and nodes: `queue`/`sacct`-style listings, one job with its events and
segments (`show`), a job's output (`logs`, from this host's file or the copy its agent keeps
in the store), the nodes and their GPUs, and the daemon's health. The caller sees their own
jobs; an operator sees every job.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from sqlalchemy import func, select

from scheduler.daemon.access import Access, Caller, RequestError, ServiceConfig
from scheduler.job_specs import expand_log_pattern
from scheduler.job_view import gpu_map, jobs_json, segment_rows
from scheduler.jobs.store import count_by_state, list_views, owner_names_known, running_owners, view_of
from scheduler.lifecycle import ACTIVE, State
from scheduler.store import Store
from scheduler.store.models import gpu_instances, gpus, job_events, job_log_chunks, nodes
from scheduler.timeparse import iso

MAX_LOG_BYTES = 4 * 1024 * 1024  # the longest tail `logs` shows
# What one `logs` reply carries at most: a 4 MiB log of control bytes is 25 MB of JSON
# (\u0001 per byte), and 32 of those at once took the daemon to 970 MB (issue 48). The rest
# is read on from `next_offset`, chunk by chunk (the CLI does).
MAX_LOG_CHUNK_BYTES = 256 * 1024


class JobReading:
    """What a caller may read of the jobs, their logs and the nodes."""

    def __init__(self, store: Store, config: ServiceConfig, access: Access, *, log_dir: Path,
                 clock: Callable[[], datetime]) -> None:
        self.store = store
        self.config = config
        self.access = access
        self.log_dir = log_dir
        self._clock = clock

    def list_jobs(self, caller: Caller, *, include_done: bool = False,
                  states: list[str] | None = None, limit: int | None = None,
                  users: list[str] | None = None, names: list[str] | None = None,
                  since: datetime | None = None, until: datetime | None = None,
                  array_job_id: int | None = None) -> list[dict]:
        """The caller's jobs (everyone's for an admin), active ones unless asked otherwise;
        `users` (names or uids), `names` (exact, or globs with * and ?) and a submission
        window [since, until) narrow it, like squeue's --user/--name and sacct's -S/-E."""
        if (since is not None or until is not None) and not states:
            include_done = True  # a period asks for history, as sacct does
        if states:
            bad = [s for s in states if s not in State.__members__]
            if bad:
                raise RequestError(400, f"unknown state(s) {', '.join(bad)}; known: "
                                        f"{', '.join(State.__members__)}")
        elif not include_done:
            states = [s.value for s in ACTIVE]
        uids = [int(u) for u in users if u.isdigit()] if users else []
        unknown = [u for u in users or [] if not u.isdigit() and not _system_user(u)]
        with self.store.read() as conn:
            unknown = sorted(set(unknown) - owner_names_known(conn, unknown)) if unknown else []
            if unknown:  # as squeue: a name that is nobody is a mistake, not an empty queue
                raise RequestError(400, f"--user: no user {', '.join(map(repr, unknown))} on this system or in the queue")
            rows = list_views(conn, self.store.dialect, uids=uids,
                              user_names=[u for u in users if not u.isdigit()] if users else [],
                              names=names or (), since=since, until=until, array_job_id=array_job_id,
                              states=states or None,
                              owner_uid=None if self.access.is_admin(caller) else caller.uid, limit=limit)
            return jobs_json(rows, gpu_map(conn))

    def get_job(self, caller: Caller, job_id: int) -> dict:
        """One job as `show` prints it: its row, whether its workload has a latency model, its
        events and its segments."""
        with self.store.read() as conn:
            row = self.access.visible_job(conn, caller, job_id)
            out = jobs_json(view_of(conn, self.store.dialect, job_id), gpu_map(conn))[0]
            from policies.model.operating_point import has_latency_model

            # whether the workload's latency is modelled (its preset's SLOs apply); for `show`
            out["latency_model"] = has_latency_model(out["workload"])
            out["events"] = [
                {"at": iso(e.at), "from": e.from_state, "to": e.to_state,
                 "actor_uid": e.actor_uid, "reason": e.reason}
                for e in conn.execute(select(job_events).where(job_events.c.job_id == job_id)
                                      .order_by(job_events.c.id))]
            out["segments"] = segment_rows(conn, job_id)
        return out

    def logs(self, caller: Caller, job_id: int, *, stream: str = "stdout",
             tail_bytes: int | None = None, offset: int | None = None) -> dict:
        """A job's stdout or stderr: the tail (`tail_bytes`, at most MAX_LOG_BYTES), or from
        `offset` on (`logs --follow` reads on from `next_offset`), at most MAX_LOG_CHUNK_BYTES
        of it per reply (`next_offset` < `size`: there is more to read). From this host's log file
        when the job ran here, else from the copy its node's agent keeps in the store
        (`job_log_chunks`), so a job run by another node's agent can be read on the head."""
        if stream not in ("stdout", "stderr"):
            raise RequestError(400, "stream must be stdout or stderr")
        with self.store.read() as conn:
            row = self.access.visible_job(conn, caller, job_id)
        redirected = row.stdout_path if stream == "stdout" else (row.stderr_path or row.stdout_path)
        never_ran = RequestError(404, f"job {job_id} never ran ({row.state}): it has no {stream}") \
            if row.node is None and row.state not in (State.PENDING.value, State.PLANNED.value,
                                                      State.RUNNING.value) else None
        if redirected and never_ran:
            raise never_ran
        if redirected:
            redirected = expand_log_pattern(redirected, job_id=row.id, user=row.owner_name,
                                            array_job_id=row.array_job_id, array_task_id=row.array_task_id)
            flag = f"--{'output' if stream == 'stdout' or not row.stderr_path else 'error'}"
            if row.node is None:
                raise RequestError(409, f"job {job_id} has not started yet ({row.state}); its {stream} will go "
                                        f"to {redirected} ({flag}) on the node it runs on")
            # written by the job itself, as its owner, on its node: the daemon does not read a
            # path a user chose (it could be swapped for a link to a file only root may read)
            raise RequestError(404, f"job {job_id}'s {stream} went to {redirected} on node {row.node} "
                                    f"({flag}); read it there")
        limit = min(tail_bytes or MAX_LOG_BYTES, MAX_LOG_BYTES)
        path = self.log_dir / f"{job_id}.{'out' if stream == 'stdout' else 'err'}"
        try:
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                start = max(0, size - limit) if offset is None else min(offset, size)
                f.seek(start)
                data = f.read(MAX_LOG_CHUNK_BYTES)
        except FileNotFoundError:
            size, start, data = self._stored_log(job_id, stream, limit, offset)
            if size is None:
                if row.state in (State.PENDING.value, State.PLANNED.value):
                    raise RequestError(409, f"job {job_id} has not started yet ({row.state})") from None
                if row.state == State.RUNNING.value:  # its agent has not copied any output yet
                    size, start, data = 0, 0, b""
                elif never_ran:
                    raise never_ran from None
                else:
                    raise RequestError(404, f"no {stream} log for job {job_id} on this host or in the store "
                                            f"(it ran on node {row.node})") from None
        if start + len(data) < size:
            data = _whole_utf8(data)  # the next chunk starts with the character cut here
        return {"job": job_id, "stream": stream, "size": size, "offset": start,
                "next_offset": start + len(data), "truncated": start > 0 and offset is None,
                "text": data.decode("utf-8", errors="replace")}

    def _stored_log(self, job_id: int, stream: str, limit: int,
                    offset: int | None) -> tuple[int | None, int, bytes]:
        """(size, start, bytes) of the output the agent copied into the store; size None: none."""
        c = job_log_chunks
        with self.store.read() as conn:
            size = conn.execute(select(func.max(c.c.offset + func.length(c.c.data)))
                                .where(c.c.job_id == job_id, c.c.stream == stream)).scalar()
            if size is None:
                return None, 0, b""
            start = max(0, size - limit) if offset is None else min(offset, size)
            chunks = conn.execute(select(c.c.offset, c.c.data)
                                  .where(c.c.job_id == job_id, c.c.stream == stream,
                                         c.c.offset + func.length(c.c.data) > start,
                                         c.c.offset < start + MAX_LOG_CHUNK_BYTES)
                                  .order_by(c.c.offset)).all()
        buf = bytearray()
        for at, data in chunks:
            data = bytes(data)
            if at < start:
                data = data[start - at:]
            buf += data
        return int(size), start, bytes(buf[:MAX_LOG_CHUNK_BYTES])

    def nodes(self, caller: Caller) -> list[dict]:
        """Every node and its GPUs, with their state; a GPU's job is shown to its owner and operators."""
        now = self._clock()
        today = now.astimezone().date().isoformat()
        admin = self.access.is_admin(caller)
        with self.store.read() as conn:
            node_rows = list(conn.execute(select(nodes).order_by(nodes.c.name)))
            gpu_rows = list(conn.execute(select(gpus).where(gpus.c.index >= 0)
                                         .order_by(gpus.c.node_name, gpus.c.vendor, gpus.c.index)))
            holders = running_owners(conn)
            slices = instances_by_gpu(conn)
        def shown(job_id: int | None) -> int | None:
            return job_id if job_id is not None and (admin or holders.get(job_id) == caller.uid) else None

        def gpu_json(n, g, up: bool) -> dict:
            held = g.job_id is not None or any(i["busy"] for i in slices.get(g.id, []))  # a slice's job too
            return {"id": g.id, "index": g.index, "uuid": g.uuid, "model": g.model,
                    "vendor": g.vendor, "memory_gib": g.memory_gib,
                    "memory_reported_gib": g.memory_reported_gib, "power_w": g.power_w,
                    "power_limit_w": g.power_limit_w, "power_limit_min_w": g.power_limit_min_w,
                    "power_limit_max_w": g.power_limit_max_w,
                    # the device's own counter (since its driver started counting: it
                    # restarts with it, so it may be below today's), beside today's energy
                    "energy_counter_j": g.energy_j, "utilization_pct": g.utilization_pct,
                    "energy_today_j": g.energy_day_j if g.energy_day == today else 0.0,
                    "healthy": bool(g.healthy) and up, "unhealthy_reason": g.unhealthy_reason,
                    "busy": held, "drained": bool(g.drained),
                    "drain_reason": g.drain_reason, "drained_at": iso(g.drained_at), "drained_by": g.drained_by,
                    "name": f"{n.name}:{g.vendor}:{g.index}",
                    "state": ("DOWN" if not up else "DRAINING" if g.drained and held
                              else "DRAINED" if g.drained else "UNHEALTHY" if not g.healthy
                              else "BUSY" if held else "IDLE"),
                    "job": shown(g.job_id),
                    "partition_mode": g.partition_mode, "partitions": g.partitions,
                    "memory_partition": g.memory_partition, "mig_enabled": bool(g.mig_enabled),
                    "instances": [{**i, "job": shown(i["job"])} for i in slices.get(g.id, [])]}

        out = []
        for n in node_rows:
            node_gpus = [g for g in gpu_rows if g.node_name == n.name]
            up = n.last_heartbeat is not None and (now - n.last_heartbeat).total_seconds() <= self.config.node_timeout_s
            out.append({
                "name": n.name, "zone": n.zone, "backend": n.backend, "emulated": n.emulated,
                "up": up, "last_heartbeat": iso(n.last_heartbeat),
                # DRAINED: every GPU drained (like `sinfo`'s drain); reasons per GPU below
                "state": "DOWN" if not up else (
                    "DRAINED" if node_gpus and all(g.drained for g in node_gpus) else
                    "MIXED-DRAINED" if any(g.drained for g in node_gpus) else "UP"),
                "gpus": [gpu_json(n, g, up) for g in node_gpus],
            })
        return out

    def health(self) -> dict:
        """The daemon answers: its jobs by state, and its time."""
        with self.store.read() as conn:
            counts = count_by_state(conn)
        return {"ok": True, "jobs": counts, "time": iso(self._clock())}


def instances_by_gpu(conn) -> dict[int, list[dict]]:
    """The slices of each shared GPU (MIG instances, declared shares), by GPU id, in order;
    `job` is the holder's id (the caller decides whom to show it)."""
    out: dict[int, list[dict]] = {}
    for i in conn.execute(select(gpu_instances).order_by(gpu_instances.c.gpu_id, gpu_instances.c.id)):
        out.setdefault(i.gpu_id, []).append(
            {"uuid": i.uuid, "kind": i.kind, "profile": i.profile, "fraction": round(i.fraction, 4),
             "memory_gib": i.memory_gib, "slices": i.slices, "gpu_instance_id": i.gpu_instance_id,
             "device": i.device, "healthy": bool(i.healthy), "busy": i.job_id is not None, "job": i.job_id})
    return out


def _system_user(name: str) -> bool:
    """Whether `name` is a user of this system (passwd, or NSS where configured)."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _whole_utf8(data: bytes) -> bytes:
    """`data` less a UTF-8 character cut at its end (at most 3 bytes), so a log read in
    chunks decodes as it would whole."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 == 0x80:  # a continuation byte: look further back for the lead
            continue
        if b >= 0xC0:  # the lead byte: cut if its character needs more than is here
            needed = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return data[:-back] if back < needed else data
        return data
    return data
