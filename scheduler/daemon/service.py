"""What the API does, independent of HTTP: validate requests, read and change the store.

Every method takes the caller's identity as the kernel reported it (SO_PEERCRED); nothing
in a request body can change who the caller is. A rejected request changes nothing.
"""

from __future__ import annotations

import difflib
import functools
import grp
import json
import logging
import os
import pwd
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import Connection, bindparam, case, func, insert, literal, null, or_, select, update

from policies.model import QueuedJob
from scheduler import interruptible
from scheduler.clock import utcnow
from scheduler.daemon.admission import MAX_GPUS, Admission, Refused
from scheduler.job_view import gpu_map, job_select, jobs_json, segment_rows
from scheduler.lifecycle import ACTIVE, TERMINAL, State, record_submit, transition
from scheduler.store import Store
from scheduler.store.models import gpus, job_events, jobs, nodes, workload_profiles
from scheduler.timeparse import iso

log = logging.getLogger(__name__)

MAX_ARGV = 4096
MAX_ARGV_BYTES = 256 * 1024
MAX_ENV = 256
MAX_RUNTIME_S = 30 * 86400
MIN_RUNTIME_S = 1.0  # shorter estimates and limits are typos (1e-300 s), not jobs
MAX_DEADLINE_AHEAD_S = 366 * 86400
MAX_LOG_BYTES = 4 * 1024 * 1024  # the longest tail `logs` shows
# What one `logs` reply carries at most: a 4 MiB log of control bytes is 25 MB of JSON
# (\u0001 per byte), and 32 of those at once took the daemon to 970 MB (issue 48). The rest
# is read on from `next_offset`, chunk by chunk (the CLI does).
MAX_LOG_CHUNK_BYTES = 256 * 1024
LEARNED_TTL_S = 5.0  # how long the learned workload names are cached for submit's check
_INSERT_JOB = insert(jobs).returning(jobs.c.id)


@functools.cache
def _submit_statement(columns: tuple[str, ...]):
    """INSERT the job and its "submitted" event in one statement (PostgreSQL)."""
    new_job = (insert(jobs).values({c: bindparam(c, type_=jobs.c[c].type) for c in columns})
               .returning(jobs.c.id, jobs.c.submitted_at).cte("new_job"))
    first_event = select(new_job.c.id, null(), literal(State.PENDING.value), bindparam("actor_uid"),
                         literal("submitted"), new_job.c.submitted_at)
    return (insert(job_events)
            .from_select(["job_id", "from_state", "to_state", "actor_uid", "reason", "at"], first_event)
            .returning(job_events.c.job_id))


WORKLOAD_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}\Z")
CUSTOM_WORKLOAD_RE = re.compile(r"^custom:[a-z0-9][a-z0-9_.-]{0,55}\Z")  # a class of one's own, no model
PARAMETRIC_WORKLOAD_RE = re.compile(r"^llm:[a-z0-9_.,=]{1,60}\Z")  # policies.operating_point.parse_spec
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
NAME_RE = re.compile(r"^[\w .,:@+=/-]{1,255}\Z")
# Set by carbonsched itself; a user may not override them.
RESERVED_ENV = {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                "CUDA_DEVICE_ORDER", "CARBONSCHED_JOB_ID", "CARBONSCHED_NODE", "CARBONSCHED_METRICS_FILE",
                "CARBONSCHED_MAX_BATCH", "CARBONSCHED_PRECISION", "CARBONSCHED_TP",
                "CARBONSCHED_ARRAY_TASK_ID", "CARBONSCHED_ARRAY_JOB_ID", "CARBONSCHED_ARRAY_TASK_COUNT",
                "HOME", "USER", "LOGNAME", "LD_PRELOAD", "LD_LIBRARY_PATH", *interruptible.ENV_NAMES}


class RequestError(Exception):
    """A request carbonsched refuses; `status` follows HTTP (400, 403, 404, 409, 413, 422)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class _Habits:
    """The validated Slurm-style options of a submit: plain columns, dependencies, array."""

    columns: dict
    deps: list
    array: object | None


@dataclass(frozen=True)
class Caller:
    """Who is asking, from the kernel: SO_PEERCRED on the socket."""

    uid: int
    gid: int
    pid: int = 0


@dataclass(frozen=True)
class ServiceConfig:
    daemon_uid: int
    admin_gids: frozenset[int] = frozenset()
    time_limit_factor: float = 2.0
    node_timeout_s: float = 60.0
    default_runtime_s: float = 3600.0  # the planner's runtime for a job with no estimate
    # Jobs one uid may have waiting (PENDING or PLANNED); None: no limit. One user's tens of
    # thousands of queued jobs would slow every plan for everyone.
    max_queued_per_user: int | None = None
    # Bytes one submit may store (command, environment, paths; x its array tasks), and one uid
    # in jobs not yet purged (issue 48); None: no limit.
    max_submit_stored_bytes: int | None = None
    max_stored_bytes_per_user: int | None = None


class QueueLimit:
    """What one uid may have in the store (issue 48), checked without a database round trip per
    submit: `max_queued_per_user` jobs waiting (every task of an array counts) and
    `max_stored_bytes_per_user` bytes of commands, environments and paths in jobs not yet
    purged. Each uid's figures are read at most every `REFRESH_S` and counted up by its own
    submits in between (so the limits err on the strict side: jobs that started or were
    purged meanwhile still count until the next read)."""

    REFRESH_S = 2.0

    def __init__(self, store: Store, limit: int | None, clock=time.monotonic, *,
                 max_stored_bytes: int | None = None) -> None:
        self.store = store
        self.limit = limit
        self.max_stored_bytes = max_stored_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[int, tuple[int, int, float]] = {}  # uid -> (waiting, stored bytes, read at)

    def _read(self, uid: int) -> tuple[int, int]:
        with self._lock:
            n, stored, at = self._counts.get(uid, (0, 0, -1e18))
        if self._clock() - at > self.REFRESH_S:
            waiting = case((jobs.c.state.in_([State.PENDING.value, State.PLANNED.value]), 1), else_=0)
            with self.store.read() as conn:
                n, stored = conn.execute(select(func.coalesce(func.sum(waiting), 0),
                                                func.coalesce(func.sum(jobs.c.stored_bytes), 0))
                                         .where(jobs.c.owner_uid == uid, jobs.c.purged_at.is_(None))).one()
            n, stored = int(n), int(stored)
            with self._lock:
                self._counts[uid] = (n, stored, self._clock())
                if len(self._counts) > 10_000:  # forget idle uids
                    self._counts = {uid: self._counts[uid]}
        return n, stored

    def check(self, uid: int, jobs_added: int = 1, bytes_added: int = 0) -> None:
        """Raise RequestError(429) naming the limit if `uid` may not add `jobs_added` waiting
        jobs storing `bytes_added` bytes in all."""
        if self.limit is None and self.max_stored_bytes is None:
            return
        n, stored = self._read(uid)
        if self.limit is not None and n + jobs_added > self.limit:
            adds = f"; this request adds {jobs_added}" if jobs_added > 1 else ""
            raise RequestError(429, f"uid {uid} already has {n} jobs waiting{adds} (limit {self.limit}, "
                                    "max_queued_per_user; every array task counts); "
                                    "submit more once some have started")
        if self.max_stored_bytes is not None and stored + bytes_added > self.max_stored_bytes:
            raise RequestError(429, f"uid {uid} already stores {_mib(stored)} of job commands and "
                                    f"environments; this request adds {_mib(bytes_added)} (limit "
                                    f"{_mib(self.max_stored_bytes)}, max_stored_mib_per_user); "
                                    "cancel jobs or wait for finished ones to be purged (job_retention)")

    def submitted(self, uid: int, jobs_added: int = 1, bytes_added: int = 0) -> None:
        if self.limit is None and self.max_stored_bytes is None:
            return
        with self._lock:
            n, stored, at = self._counts.get(uid, (0, 0, -1e18))
            self._counts[uid] = (n + jobs_added, stored + bytes_added, at)


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:.2f} MiB"


# Environment variables each array task gets besides the submitted ones (and their JSON).
ARRAY_ENV_BYTES = 128


def stored_bytes(row: dict) -> int:
    """The bytes one job's request puts in the store beyond its fixed columns: command,
    environment, working directory, name, output paths and dependency text (as JSON,
    roughly as the database keeps them). What `max_submit_stored_mib` and
    `max_stored_mib_per_user` count."""
    text = [row.get("cwd"), row.get("name"), row.get("stdout_path"), row.get("stderr_path"), row.get("dependency")]
    return (len(json.dumps(row.get("argv") or [], ensure_ascii=False).encode("utf-8"))
            + len(json.dumps(row.get("env") or {}, ensure_ascii=False).encode("utf-8"))
            + sum(len(t.encode("utf-8")) for t in text if isinstance(t, str)))


class JobService:
    def __init__(self, store: Store, config: ServiceConfig, *, log_dir: Path,
                 on_submit: Callable[[], None] | None = None,
                 on_cancel: Callable[[], None] | None = None, clock=utcnow) -> None:
        self.store = store
        self.config = config
        self.log_dir = Path(log_dir)
        self._on_submit = on_submit or (lambda: None)
        self._on_cancel = on_cancel or (lambda: None)
        self._clock = clock
        self.admission = Admission(store, node_timeout_s=config.node_timeout_s,
                                   default_runtime_s=config.default_runtime_s, clock=clock)
        self._queue_limit = QueueLimit(store, config.max_queued_per_user,
                                       max_stored_bytes=config.max_stored_bytes_per_user)

    # -- identity -----------------------------------------------------------------------

    def is_admin(self, caller: Caller) -> bool:
        if caller.uid in (0, self.config.daemon_uid):
            return True
        if not self.config.admin_gids:
            return False
        return bool(self.config.admin_gids & set(_groups_of(caller.uid, caller.gid)))

    # -- submit -------------------------------------------------------------------------

    def submit(self, caller: Caller, body: object) -> dict:
        if caller.uid != self.config.daemon_uid and self.config.daemon_uid != 0:
            raise RequestError(403, f"this daemon runs as uid {self.config.daemon_uid} and can "
                                    "only run jobs as that user; run it as root to serve others")
        now = self._clock()
        row = self._validate_submit(body, caller, now)
        warning = self._admit(row)
        extra = self._validate_slurm_habits(body, caller, now)
        n_tasks = len(extra.array.indices) if extra.array is not None else 1
        row["stored_bytes"] = stored_bytes({**row, **extra.columns}) + (ARRAY_ENV_BYTES if extra.array else 0)
        self._check_storage(caller.uid, n_tasks, row["stored_bytes"] * n_tasks)
        if extra.deps or extra.array is not None:
            return self._submit_with_habits(caller, row, extra)
        row.update(extra.columns)

        if self.store.dialect == "postgresql":
            # One statement, one round trip: the job row and its first event are inserted
            # together by a data-modifying CTE, atomic as any single statement.
            row["submitted_at"] = self._clock()
            job_id = self.store.execute_once(_submit_statement(tuple(row)),
                                             {**row, "actor_uid": caller.uid}).scalar_one()
        else:
            def tx(conn: Connection) -> int:
                # Stamped inside the write transaction, so queue order follows commit order
                # even when many clients submit at once.
                row["submitted_at"] = at = self._clock()
                job_id = conn.execute(_INSERT_JOB, row).scalar_one()
                record_submit(conn, job_id, caller.uid, at)
                return job_id

            job_id = self.store.transact(tx)
        self._queue_limit.submitted(caller.uid, 1, row["stored_bytes"])
        log.info("job %s submitted by uid %s: %s", job_id, caller.uid, row["name"])
        self._on_submit()
        out = {"id": job_id, "state": State.PENDING.value}
        if warning is not None:
            out["warning"] = warning
        return out

    def _check_storage(self, uid: int, n_jobs: int, n_bytes: int) -> None:
        """Refuse a request that would store too much (413: this request alone; 429: on top of
        what the uid has): an array multiplies its command and environment by its tasks."""
        limit = self.config.max_submit_stored_bytes
        if limit is not None and n_bytes > limit:
            per = f" ({n_jobs} tasks)" if n_jobs > 1 else ""
            raise RequestError(413, f"this request would store {_mib(n_bytes)} of commands and "
                                    f"environments{per} (limit {_mib(limit)}, max_submit_stored_mib); "
                                    "pass large inputs in files")
        self._queue_limit.check(uid, n_jobs, n_bytes)

    def _validate_slurm_habits(self, body: dict, caller: Caller, now: datetime) -> "_Habits":
        """--hold, --begin, --dependency, --array, --output/--error (issue 28), checked like
        every other field: a bad one is refused with the flag named and nothing stored."""
        from scheduler.job_specs import (BEGIN_REASON, HELD_REASON, check_log_pattern, dependency_text, parse_array,
                                         parse_dependency)

        cols: dict = {}
        hold = body.get("hold", False)
        if not isinstance(hold, bool):
            raise RequestError(400, "hold must be true or false")
        if hold:
            cols.update(held_at=now, held_by=caller.uid, hold_kind="user", reason=HELD_REASON)
        if body.get("begin") is not None:
            begin = _parse_iso(body["begin"], "begin")
            if begin > now + timedelta(seconds=MAX_RUNTIME_S * 12):
                raise RequestError(400, f"--begin {iso(begin)} is more than a year away")
            deadline = body.get("deadline")
            if deadline is not None and _parse_iso(deadline, "deadline") <= begin:
                raise RequestError(400, f"--begin {iso(begin)} is not before the deadline: it cannot be met")
            cols["begin_at"] = begin
            if begin > now and not hold:
                cols["reason"] = BEGIN_REASON
        for key, flag, col in (("stdout_path", "--output", "stdout_path"), ("stderr_path", "--error", "stderr_path")):
            if body.get(key) is not None:
                try:
                    cols[col] = check_log_pattern(body[key], flag)
                except ValueError as e:
                    raise RequestError(400, str(e)) from None
        deps = []
        if body.get("dependency") is not None:
            try:
                deps = parse_dependency(body["dependency"])
            except ValueError as e:
                raise RequestError(400, str(e)) from None
            with self.store.read() as conn:
                for d in deps:
                    self._visible_job(conn, caller, d.job_id)  # 404 / 403: no waiting on the unseen
            cols["dependency"] = dependency_text(deps)
        array = None
        if body.get("array") is not None:
            try:
                array = parse_array(body["array"])
            except ValueError as e:
                raise RequestError(400, str(e)) from None
        return _Habits(cols, deps, array)

    def _submit_with_habits(self, caller: Caller, row: dict, extra: "_Habits") -> dict:
        """A job with dependencies, or the tasks of a job array, in one transaction: the
        tasks share one deadline (the array's) and each gets its index in
        CARBONSCHED_ARRAY_TASK_ID; the array's id is its first task's job id."""
        from scheduler.store.models import job_dependencies

        indices = extra.array.indices if extra.array is not None else (None,)

        def tx(conn: Connection) -> list[int]:
            at = self._clock()
            ids: list[int] = []
            for index in indices:
                task = {**row, **extra.columns, "submitted_at": at}
                if index is not None:
                    env = {**row["env"], "CARBONSCHED_ARRAY_TASK_ID": str(index),
                           "CARBONSCHED_ARRAY_TASK_COUNT": str(len(indices))}
                    if ids:
                        env["CARBONSCHED_ARRAY_JOB_ID"] = str(ids[0])
                    task.update(env=env, array_task_id=index, array_max_running=extra.array.max_running,
                                array_job_id=ids[0] if ids else None)
                job_id = conn.execute(_INSERT_JOB, task).scalar_one()
                record_submit(conn, job_id, caller.uid, at)
                if index is not None and not ids:  # the first task: its id is the array's
                    conn.execute(update(jobs).where(jobs.c.id == job_id).values(
                        array_job_id=job_id, env={**task["env"], "CARBONSCHED_ARRAY_JOB_ID": str(job_id)}))
                ids.append(job_id)
            if extra.deps:
                conn.execute(insert(job_dependencies), [{"job_id": j, "on_job_id": d.job_id, "kind": d.kind}
                                                        for j in ids for d in extra.deps])
            return ids

        ids = self.store.transact(tx)
        self._queue_limit.submitted(caller.uid, len(ids), row["stored_bytes"] * len(ids))
        log.info("job %s submitted by uid %s: %s%s", ids[0], caller.uid, row["name"],
                 f" (array of {len(ids)} tasks)" if len(ids) > 1 else "")
        self._on_submit()
        out = {"id": ids[0], "state": State.PENDING.value}
        if extra.array is not None:
            out.update(array_job_id=ids[0], ids=ids, array=extra.array.text())
        return out

    def _validate_submit(self, body: object, caller: Caller, now: datetime) -> dict:
        if not isinstance(body, dict):
            raise RequestError(400, "request body must be a JSON object")
        known = {"argv", "name", "gpus", "gpu_mem_gib", "deadline", "latency_slo_ms", "ttft_slo_ms", "tpot_slo_ms",
                 "workload",
                 "prompts", "tokens", "est_runtime_s", "time_limit_s", "cwd", "env", "max_retries", "max_delay_s",
                 "hold", "begin", "dependency", "array", "stdout_path", "stderr_path",
                 "interruptible", "checkpoint_signal", "checkpoint_grace_s", "min_run_s", "resume_cost_s",
                 "max_segments"}
        unknown = sorted(set(body) - known)
        if unknown:
            raise RequestError(400, f"unknown field(s) in submit request: {', '.join(unknown)}")

        argv = body.get("argv")
        if not isinstance(argv, list) or not argv:
            raise RequestError(400, "empty command: give the command after --, e.g. "
                                    "`carbonsched submit -- python infer.py`")
        if not all(isinstance(a, str) for a in argv) or not argv[0].strip():
            raise RequestError(400, "command must be a list of strings with a non-empty program")
        if len(argv) > MAX_ARGV or sum(len(a) for a in argv) > MAX_ARGV_BYTES:
            raise RequestError(413, f"command too long (at most {MAX_ARGV} arguments, "
                                    f"{MAX_ARGV_BYTES // 1024} KiB)")
        if any("\x00" in a for a in argv):
            raise RequestError(400, "command arguments may not contain NUL bytes")

        name = body.get("name") or os.path.basename(argv[0])[:255]
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise RequestError(400, "job name must be 1-255 letters, digits, spaces or . , : @ + = / - _")

        n_gpus = _int(body.get("gpus", 1), "gpus")
        mem = _number(body.get("gpu_mem_gib", 0), "gpu_mem_gib")
        if mem < 0:
            raise RequestError(400, f"--gpu-mem must not be negative (got {mem:g})")
        if not 1 <= n_gpus <= MAX_GPUS:
            raise RequestError(400, f"--gpus must be between 1 and {MAX_GPUS} (got {n_gpus})")

        est = _optional_number(body.get("est_runtime_s"), "est_runtime_s")
        if est is not None and not MIN_RUNTIME_S <= est <= MAX_RUNTIME_S:
            raise RequestError(400, f"--est-runtime must be between 1s and 30d (got {est:g}s)")
        limit = _optional_number(body.get("time_limit_s"), "time_limit_s")
        if limit is not None and not MIN_RUNTIME_S <= limit <= MAX_RUNTIME_S:
            raise RequestError(400, f"--time-limit must be between 1s and 30d (got {limit:g}s)")
        factor = None
        if limit is None and est is not None:  # derived: follows the GPUs the planner chooses
            factor = self.config.time_limit_factor
            limit = est * factor

        deadline = None
        if body.get("deadline") is not None:
            deadline = _parse_iso(body["deadline"], "deadline")
            if deadline <= now:
                raise RequestError(400, f"deadline {iso(deadline)} is in the past")
            if deadline > now + timedelta(seconds=MAX_DEADLINE_AHEAD_S):
                raise RequestError(400, f"deadline {iso(deadline)} is more than a year ahead")
            if est is not None and deadline < now + timedelta(seconds=est):
                raise RequestError(400, f"deadline {iso(deadline)} is sooner than the estimated "
                                        f"runtime ({est:g}s) from now: it cannot be met")

        max_delay = _optional_number(body.get("max_delay_s"), "max_delay_s")
        if max_delay is not None and not 0 < max_delay <= MAX_RUNTIME_S:
            raise RequestError(400, f"--max-delay must be positive and at most 30d (got {max_delay:g}s): "
                                    "it is how long after submission the job may start at the latest")

        slos = {}
        for key, flag in (("latency_slo_ms", "--latency-slo"), ("ttft_slo_ms", "--ttft-slo"),
                          ("tpot_slo_ms", "--tpot-slo")):
            slos[key] = _optional_number(body.get(key), key)
            if slos[key] is not None and not 0 < slos[key] <= 3_600_000:
                raise RequestError(400, f"{flag} must be between 0 and 3600000 ms (got {slos[key]:g})")
        workload = body.get("workload")
        if workload is not None and (not isinstance(workload, str) or not (
                WORKLOAD_RE.match(workload) or PARAMETRIC_WORKLOAD_RE.match(workload)
                or CUSTOM_WORKLOAD_RE.match(workload))):
            raise RequestError(400, f"bad workload class {workload!r}: use lower-case letters, digits "
                                    "and . _ - (e.g. llm-inference, finetune, eval), llm:SIZE (e.g. llm:70b) "
                                    "or custom:NAME")
        _check_latency_model(workload, slos)
        if workload is not None and WORKLOAD_RE.match(workload):
            self._check_known_workload(workload)
        prompts = body.get("prompts")
        if prompts is not None:
            prompts = _int(prompts, "prompts")
            if not 1 <= prompts <= 10**12:
                raise RequestError(400, f"--prompts must be between 1 and 10^12 (got {prompts})")
        tokens = body.get("tokens")
        if tokens is not None:
            tokens = _int(tokens, "tokens")
            if not 1 <= tokens <= 10**15:
                raise RequestError(400, f"--tokens must be between 1 and 10^15 (got {tokens})")
        retries = _int(body.get("max_retries", 0), "max_retries")
        if not 0 <= retries <= 10:
            raise RequestError(400, "--retries must be between 0 and 10")

        cwd = body.get("cwd") or "/"
        if not isinstance(cwd, str) or not cwd.startswith("/") or "\x00" in cwd:
            raise RequestError(400, "working directory must be an absolute path")
        env = body.get("env") or {}
        if not isinstance(env, dict) or len(env) > MAX_ENV:
            raise RequestError(400, f"env must be an object of at most {MAX_ENV} variables")
        for k, v in env.items():
            if not ENV_NAME_RE.match(k) or not isinstance(v, str) or "\x00" in v:
                raise RequestError(400, f"bad environment variable {k!r}")
            if k in RESERVED_ENV:
                raise RequestError(400, f"environment variable {k} is set by carbonsched and "
                                        "cannot be overridden")

        pieces = _validate_interruptible(body, est, limit if factor is None else None)
        owner, groups = _account(caller.uid, caller.gid)
        return dict(**pieces,
            name=name, state=State.PENDING.value, reason="waiting for the planner",
            owner_uid=caller.uid, owner_gid=caller.gid,
            owner_groups=groups, owner_name=owner,
            argv=argv, cwd=cwd, env=env, gpus=n_gpus, gpu_mem_gib=mem, deadline=deadline,
            latency_slo_ms=slos["latency_slo_ms"], ttft_slo_ms=slos["ttft_slo_ms"],
            tpot_slo_ms=slos["tpot_slo_ms"], workload=workload, prompts=prompts, tokens=tokens, est_runtime_s=est,
            time_limit_s=limit, time_limit_factor=factor, max_retries=retries, attempts=0, submitted_at=now,
            plan_rev=0,
            max_delay_s=max_delay,
        )

    def _admit(self, row: dict) -> str | None:
        """Refuse (422) a job no GPU of the cluster can ever run, with the reason per GPU
        model; return a warning for one only GPUs out of service can run
        (`scheduler.daemon.admission`). The job as the planner will see it decides."""
        limit, factor = row["time_limit_s"], row["time_limit_factor"]
        from policies.feasibility import planning_runtime_s

        job = QueuedJob(0, row["gpus"], row["gpu_mem_gib"], row["submitted_at"],
                        planning_runtime_s(row["est_runtime_s"], limit, self.config.default_runtime_s),
                        row["deadline"], row["latency_slo_ms"], row["workload"], row["prompts"],
                        max_delay_s=row["max_delay_s"],
                        # an explicit --time-limit binds the plan; a derived one follows it
                        time_limit_s=limit if factor is None else None, time_limit_factor=factor,
                        ttft_slo_ms=row["ttft_slo_ms"], tpot_slo_ms=row["tpot_slo_ms"])
        try:
            return self.admission.check(job, estimated=row["est_runtime_s"] is not None or row["prompts"] is not None)
        except Refused as e:
            raise RequestError(e.status, e.message) from None

    def _learned_workloads(self) -> set[str]:
        """Workload classes this cluster has learned profiles of (cached like the inventory)."""
        now = time.monotonic()
        cached = getattr(self, "_learned", None)
        if cached is not None and now - cached[0] < LEARNED_TTL_S:
            return cached[1]
        with self.store.read() as conn:
            names = set(conn.execute(select(workload_profiles.c.workload).distinct()).scalars())
        self._learned = (now, names)
        return names

    def _check_known_workload(self, workload: str) -> None:
        """A plain workload name must be one the model or this cluster knows: a typo
        (`llm-chat-7b`) would otherwise be planned as nothing in particular while `show`
        promised the workload's defaults (issue 28). Own classes are `custom:NAME`."""
        from policies.perf_model import preset_names

        known = set(preset_names()) | self._learned_workloads()
        if workload in known:
            return
        close = difflib.get_close_matches(workload, sorted(known), n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise RequestError(400, f"unknown workload {workload!r}: {hint}known: {', '.join(sorted(known))}; "
                                f"or llm:SIZE (e.g. llm:70b), or custom:{workload} for a class of your own "
                                "(planned without a performance model, learned from its runs)")

    # -- reading ------------------------------------------------------------------------

    def list_jobs(self, caller: Caller, *, include_done: bool = False,
                  states: list[str] | None = None, limit: int | None = None,
                  users: list[str] | None = None, names: list[str] | None = None,
                  since: datetime | None = None, until: datetime | None = None,
                  array_job_id: int | None = None) -> list[dict]:
        """The caller's jobs (everyone's for an admin), active ones unless asked otherwise;
        `users` (names or uids), `names` (exact, or globs with * and ?) and a submission
        window [since, until) narrow it, like squeue's --user/--name and sacct's -S/-E."""
        q = job_select(self.store.dialect).order_by(jobs.c.id)
        if users:
            uids = [int(u) for u in users if u.isdigit()]
            q = q.where(jobs.c.owner_name.in_([u for u in users if not u.isdigit()]) | jobs.c.owner_uid.in_(uids))
        if names:
            conds = []
            for n in names:
                if "*" in n or "?" in n:
                    like = n.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
                    conds.append(jobs.c.name.like(like.replace("*", "%").replace("?", "_"), escape="\\"))
                else:
                    conds.append(jobs.c.name == n)
            q = q.where(or_(*conds))
        if since is not None:
            q = q.where(jobs.c.submitted_at >= since)
        if until is not None:
            q = q.where(jobs.c.submitted_at < until)
        if array_job_id is not None:
            q = q.where(jobs.c.array_job_id == array_job_id)
        if (since is not None or until is not None) and not states:
            include_done = True  # a period asks for history, as sacct does
        if states:
            bad = [s for s in states if s not in State.__members__]
            if bad:
                raise RequestError(400, f"unknown state(s) {', '.join(bad)}; known: "
                                        f"{', '.join(State.__members__)}")
            q = q.where(jobs.c.state.in_(states))
        elif not include_done:
            q = q.where(jobs.c.state.in_([s.value for s in ACTIVE]))
        if not self.is_admin(caller):
            q = q.where(jobs.c.owner_uid == caller.uid)
        if limit is not None:
            q = q.limit(limit)
        with self.store.read() as conn:
            return jobs_json(conn.execute(q), gpu_map(conn))

    def get_job(self, caller: Caller, job_id: int) -> dict:
        with self.store.read() as conn:
            self._visible_job(conn, caller, job_id)
            q = job_select(self.store.dialect).where(jobs.c.id == job_id)
            out = jobs_json(conn.execute(q), gpu_map(conn))[0]
            from policies.operating_point import has_latency_model

            # whether the workload's latency is modelled (its preset's SLOs apply); for `show`
            out["latency_model"] = has_latency_model(out["workload"])
            out["events"] = [
                {"at": iso(e.at), "from": e.from_state, "to": e.to_state,
                 "actor_uid": e.actor_uid, "reason": e.reason}
                for e in conn.execute(select(job_events).where(job_events.c.job_id == job_id)
                                      .order_by(job_events.c.id))]
            out["segments"] = segment_rows(conn, job_id)
        return out

    def _visible_job(self, conn: Connection, caller: Caller, job_id: int):
        row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
        if row is None:
            raise RequestError(404, f"no job {job_id}")
        if row.owner_uid != caller.uid and not self.is_admin(caller):
            raise RequestError(403, f"job {job_id} belongs to another user")
        return row

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
            row = self._visible_job(conn, caller, job_id)
        redirected = row.stdout_path if stream == "stdout" else (row.stderr_path or row.stdout_path)
        if redirected:
            from scheduler.job_specs import expand_log_pattern

            redirected = expand_log_pattern(redirected, job_id=row.id, user=row.owner_name,
                                            array_job_id=row.array_job_id, array_task_id=row.array_task_id)
            # written by the job itself, as its owner, on its node: the daemon does not read a
            # path a user chose (it could be swapped for a link to a file only root may read)
            raise RequestError(404, f"job {job_id}'s {stream} went to {redirected} on node {row.node or '?'} "
                                    f"(--{'output' if stream == 'stdout' or not row.stderr_path else 'error'}); "
                                    "read it there")
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
                else:
                    raise RequestError(404, f"no {stream} log for job {job_id} on this host or in the store "
                                            f"(it ran on node {row.node or '?'})") from None
        if start + len(data) < size:
            data = _whole_utf8(data)  # the next chunk starts with the character cut here
        return {"job": job_id, "stream": stream, "size": size, "offset": start,
                "next_offset": start + len(data), "truncated": start > 0 and offset is None,
                "text": data.decode("utf-8", errors="replace")}

    def _stored_log(self, job_id: int, stream: str, limit: int,
                    offset: int | None) -> tuple[int | None, int, bytes]:
        """(size, start, bytes) of the output the agent copied into the store; size None: none."""
        from scheduler.store.models import job_log_chunks as c

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
        now = self._clock()
        today = now.astimezone().date().isoformat()
        admin = self.is_admin(caller)
        with self.store.read() as conn:
            node_rows = list(conn.execute(select(nodes).order_by(nodes.c.name)))
            gpu_rows = list(conn.execute(select(gpus).where(gpus.c.index >= 0)
                                         .order_by(gpus.c.node_name, gpus.c.vendor, gpus.c.index)))
            holders = {r.id: r.owner_uid for r in conn.execute(
                select(jobs.c.id, jobs.c.owner_uid).where(jobs.c.state == State.RUNNING.value))}
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
                "gpus": [
                    {"id": g.id, "index": g.index, "uuid": g.uuid, "model": g.model,
                     "vendor": g.vendor, "memory_gib": g.memory_gib,
                     "memory_reported_gib": g.memory_reported_gib, "power_w": g.power_w,
                     "power_limit_w": g.power_limit_w, "power_limit_min_w": g.power_limit_min_w,
                     "power_limit_max_w": g.power_limit_max_w,
                     "energy_j": g.energy_j, "utilization_pct": g.utilization_pct,
                     "energy_today_j": g.energy_day_j if g.energy_day == today else 0.0,
                     "healthy": bool(g.healthy) and up, "unhealthy_reason": g.unhealthy_reason,
                     "busy": g.job_id is not None, "drained": bool(g.drained),
                     "drain_reason": g.drain_reason, "drained_at": iso(g.drained_at), "drained_by": g.drained_by,
                     "name": f"{n.name}:{g.vendor}:{g.index}",
                     "state": ("DOWN" if not up else "DRAINING" if g.drained and g.job_id is not None
                               else "DRAINED" if g.drained else "UNHEALTHY" if not g.healthy
                               else "BUSY" if g.job_id is not None else "IDLE"),
                     "job": g.job_id if g.job_id is not None and (admin or holders.get(g.job_id) == caller.uid) else None}
                    for g in gpu_rows if g.node_name == n.name],
            })
        return out

    # -- drain / resume -----------------------------------------------------------------

    def drain(self, caller: Caller, body: object, *, drained: bool) -> dict:
        """Close GPUs to new work (drain) or open them again (resume); root and admins only.

        The target is a node name (all its GPUs), `NODE:INDEX` or a GPU UUID. Running jobs
        finish; jobs planned on drained GPUs are planned elsewhere at the next tick, and an
        agent never starts a job on a drained GPU.
        """
        verb = "drain" if drained else "resume"
        if not self.is_admin(caller):
            raise RequestError(403, f"only root or members of admin_groups may {verb} GPUs")
        if not isinstance(body, dict) or not isinstance(body.get("target"), str) or not body["target"].strip():
            raise RequestError(400, f'{verb} body must be {{"target": "NODE" | "NODE:INDEX" | "GPU-UUID"}}')
        target = body["target"].strip()
        reason = body.get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 500):
            raise RequestError(400, "reason must be text of at most 500 characters")
        where = _gpu_target(target)
        now = self._clock()
        values = (dict(drained=True, drain_reason=reason, drained_at=now, drained_by=caller.uid) if drained
                  else dict(drained=False, drain_reason=None, drained_at=None, drained_by=None))

        def tx(conn: Connection) -> list:
            hit = list(conn.execute(select(gpus.c.id, gpus.c.node_name, gpus.c.vendor, gpus.c.index, gpus.c.job_id)
                                    .where(where, gpus.c.index >= 0).order_by(gpus.c.vendor, gpus.c.index)))
            vendors = {h.vendor for h in hit}
            if len(vendors) > 1 and target.count(":") == 1 and target.rpartition(":")[2].isdigit():
                names = " and ".join(f"{h.node_name}:{h.vendor}:{h.index}" for h in hit)
                raise RequestError(409, f"{target} is ambiguous on a mixed-vendor node: it names {names}; "
                                        "give NODE:VENDOR:INDEX as `carbonsched nodes` prints it")
            if hit:
                conn.execute(update(gpus).where(gpus.c.id.in_([h.id for h in hit])).values(**values))
            return hit

        hit = self.store.transact(tx)
        if not hit:
            raise RequestError(404, f"no node or GPU {target!r} (give a node name, NODE:VENDOR:INDEX as "
                                    "`carbonsched nodes` prints it, NODE:INDEX or a GPU UUID)")
        log.warning("%s of %d GPU(s) (%s) by uid %s%s", verb, len(hit), target, caller.uid,
                    f": {reason}" if reason else "")
        self.admission.invalidate()
        self._on_submit()  # re-plan now: jobs planned on drained GPUs move, resumed GPUs take work
        return {"target": target, "drained": drained, "reason": reason,
                "gpus": [{"id": h.id, "node": h.node_name, "vendor": h.vendor, "index": h.index,
                          "name": f"{h.node_name}:{h.vendor}:{h.index}", "running_job": h.job_id}
                         for h in hit]}

    # -- learned profiles -----------------------------------------------------------------

    def reset_profiles(self, caller: Caller, body: object) -> dict:
        """Forget learned workload profiles (`carbonsched profiles reset`); root and admins only.

        Body: {"workload": W, "model": M}, either or both left out for all. The planner goes
        back to the seed profiles of what is forgotten from its next tick; admission at once.
        """
        if not self.is_admin(caller):
            raise RequestError(403, "only an operator (root or a member of admin_groups) may reset learned profiles")
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise RequestError(400, 'profiles reset body must be {"workload": W, "model": MODEL} (both optional)')
        for key in ("workload", "model"):
            v = body.get(key)
            if v is not None and (not isinstance(v, str) or not v.strip() or len(v) > 64):
                raise RequestError(400, f"{key} must be a name of at most 64 characters")
        from scheduler.profiles import reset_profiles

        workload, model = body.get("workload"), body.get("model")
        n = self.store.transact(lambda conn: reset_profiles(conn, workload, model))
        log.warning("learned profiles reset by uid %s: %s on %s (%d row(s))", caller.uid, workload or "every workload",
                    model or "every GPU model", n)
        self.admission.invalidate()
        self._on_submit()  # re-plan now with the seeds
        return {"reset": n, "workload": workload, "model": model}

    # -- hold / release -----------------------------------------------------------------

    def hold(self, caller: Caller, job_ids: list[int], *, held: bool) -> list[dict]:
        """Keep jobs from being planned (hold) or let them be planned again (release), like
        `scontrol hold/release`. A PLANNED job that is held goes back to PENDING, its plan
        withdrawn; a running or ended job cannot be held. All or nothing, every refusal named.

        An operator (root, an admin group) holding another user's job places an operator
        hold, as Slurm's admin hold (issue 48): only an operator releases it, and the owner's
        release is refused. The owner's hold of a job an operator holds leaves it so."""
        from scheduler.job_specs import HELD_REASON, OPERATOR_HELD_REASON

        verb = "hold" if held else "release"
        admin = self.is_admin(caller)
        if not job_ids:
            raise RequestError(400, f"give at least one job id to {verb}")
        refused: dict[int, RequestError] = {}
        rows = []
        with self.store.read() as conn:
            for j in dict.fromkeys(job_ids):
                try:
                    row = self._visible_job(conn, caller, j)
                except RequestError as e:
                    refused[j] = e
                    continue
                if row.state not in (State.PENDING.value, State.PLANNED.value):
                    refused[j] = RequestError(409, f"job {j} is {row.state}: only a job that has not started "
                                                   f"can be {'held' if held else 'released'}")
                elif not held and row.hold_kind == "operator" and not admin:
                    refused[j] = RequestError(403, f"job {j} is held by an operator (uid {row.held_by}): "
                                                   "only root or an admin_groups member may release it")
                else:
                    rows.append(row)
        if refused:
            first = next(iter(refused.values()))
            raise RequestError(first.status, "; ".join(e.message for e in refused.values()))
        now = self._clock()
        results = []
        for r in rows:
            def tx(conn: Connection, r=r) -> dict:
                if not held:
                    where = [jobs.c.id == r.id, jobs.c.held_at.is_not(None)]
                    if not admin:  # an operator's hold placed since the read stays
                        where.append(or_(jobs.c.hold_kind.is_(None), jobs.c.hold_kind != "operator"))
                    n = conn.execute(update(jobs).where(*where)
                                     .values(held_at=None, held_by=None, hold_kind=None, plan_rev=jobs.c.plan_rev + 1,
                                             reason="released; waiting for the planner")).rowcount
                    if not n and not admin and conn.execute(select(jobs.c.hold_kind).where(
                            jobs.c.id == r.id)).scalar_one() == "operator":
                        raise RequestError(403, f"job {r.id} is held by an operator: only root or an "
                                                "admin_groups member may release it")
                    return {"id": r.id, "held": False, "changed": bool(n)}
                operator = admin and caller.uid != r.owner_uid
                if r.hold_kind == "operator" and not operator:
                    # the owner (or an operator on their own job) holding again: the operator's hold stays
                    return {"id": r.id, "held": True, "changed": False}
                kind = "operator" if operator else "user"
                values = dict(held_at=now, held_by=caller.uid, hold_kind=kind, plan_rev=jobs.c.plan_rev + 1)
                why = OPERATOR_HELD_REASON if operator else HELD_REASON
                # bumping plan_rev makes a tick planned from before the hold write nothing
                if transition(conn, r.id, State.PENDING, actor_uid=caller.uid, expect=(State.PLANNED,),
                              reason=f"held by {'an operator, ' if operator else ''}uid {caller.uid}: plan withdrawn",
                              values={**values, "planned_node": None, "planned_gpu_ids": None,
                                      "planned_start": None}):
                    conn.execute(update(jobs).where(jobs.c.id == r.id).values(reason=why))  # queue's REASON
                    return {"id": r.id, "held": True, "changed": True}
                where = [jobs.c.id == r.id, jobs.c.state == State.PENDING.value]
                if not operator:  # never turn an operator's hold placed since the read into a user's
                    where.append(or_(jobs.c.hold_kind.is_(None), jobs.c.hold_kind != "operator"))
                n = conn.execute(update(jobs).where(*where).values(**values, reason=why)).rowcount
                if not n:
                    now_row = conn.execute(select(jobs.c.state, jobs.c.hold_kind).where(jobs.c.id == r.id)).one()
                    if now_row.hold_kind == "operator" and now_row.state == State.PENDING.value:
                        return {"id": r.id, "held": True, "changed": False}
                    raise RequestError(409, f"job {r.id} is {now_row.state}: it started before it could be held")
                return {"id": r.id, "held": True, "changed": r.held_at is None or r.hold_kind != kind}
            results.append(self.store.transact(tx))
        log.info("%s of job(s) %s by uid %s", verb, ", ".join(str(r.id) for r in rows), caller.uid)
        self._on_submit()  # released jobs are plannable now
        return results

    # -- cancel -------------------------------------------------------------------------

    def cancel(self, caller: Caller, job_ids: list[int]) -> list[dict]:
        if not job_ids:
            raise RequestError(400, "give at least one job id to cancel")
        # All or nothing (a mistyped id cancels none of the others), but every refused id is
        # named, not only the first (`cancel 6 999`: 999 does not exist, 6 was left alone).
        rows, refused = [], {}
        with self.store.read() as conn:
            for j in dict.fromkeys(job_ids):
                try:
                    row = self._visible_job(conn, caller, j)
                except RequestError as e:
                    refused[j] = e
                    continue
                if row.state in TERMINAL:
                    refused[j] = RequestError(409, f"job {row.id} already ended ({row.state})")
                else:
                    rows.append(row)
        if refused:
            first = next(iter(refused.values()))
            left = f"; nothing cancelled ({', '.join(f'job {r.id}' for r in rows)} left as is)" if rows else ""
            raise RequestError(first.status, "; ".join(e.message for e in refused.values()) + left)
        now = self._clock()
        results = []
        for r in rows:
            def tx(conn: Connection, r=r) -> str:
                if transition(conn, r.id, State.CANCELLED, actor_uid=caller.uid,
                              expect=(State.PENDING, State.PLANNED),
                              reason=f"cancelled by uid {caller.uid} before it started",
                              values=dict(ended_at=now)):
                    return State.CANCELLED.value
                n = conn.execute(update(jobs).where(jobs.c.id == r.id,
                                                    jobs.c.state == State.RUNNING.value)
                                 .values(cancel_requested_at=now, cancel_requested_by=caller.uid,
                                         reason=f"cancel requested by uid {caller.uid}")).rowcount
                if n:
                    return "CANCELLING"
                return conn.execute(select(jobs.c.state).where(jobs.c.id == r.id)).scalar_one()
            results.append({"id": r.id, "state": self.store.transact(tx)})
        self._on_cancel()
        return results

    def health(self) -> dict:
        with self.store.read() as conn:
            counts = dict(conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state)).all())
        return {"ok": True, "jobs": counts, "time": iso(self._clock())}


def _gpu_target(target: str):
    """The GPUs a drain/resume target names: a node (all its GPUs), NODE:VENDOR:INDEX (as
    `nodes` prints a GPU: node, then vendor:index), NODE:INDEX (every vendor's GPU of that
    index, refused by the caller when that is more than one vendor) or a GPU UUID."""
    parts = target.split(":")
    if len(parts) >= 3 and parts[-1].isdigit() and parts[-2].isalpha():
        node = ":".join(parts[:-2])
        return (gpus.c.node_name == node) & (gpus.c.vendor == parts[-2]) & (gpus.c.index == int(parts[-1]))
    node, sep, index = target.rpartition(":")
    if sep and index.isdigit():
        return (gpus.c.node_name == node) & (gpus.c.index == int(index))
    return (gpus.c.node_name == target) | (gpus.c.uuid == target)


def _int(v: object, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(400, f"{field} must be an integer (got {v!r})")
    return v


def _number(v: object, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
        raise RequestError(400, f"{field} must be a finite number (got {v!r})")
    return float(v)


def _check_latency_model(workload: str | None, slos: dict[str, float | None]) -> None:
    """A parametric workload must parse, and an SLO needs a workload with a latency model:
    planned without one, the SLO would bind nothing (issue 18), so such a job is refused."""
    from policies.operating_point import WorkloadSpecError, has_latency_model, latency_model_names, parse_spec

    if workload is not None and workload.startswith("llm:"):
        try:
            spec = parse_spec(workload)
            if not spec.total_params_b > 0:
                raise WorkloadSpecError(f"{workload!r} has no parameters; give the model's size, e.g. llm:70b")
        except WorkloadSpecError as e:
            raise RequestError(400, f"bad workload: {e}") from None
    given = [k for k, v in slos.items() if v is not None]
    if given and not has_latency_model(workload):
        flags = ", ".join("--" + k.removesuffix("_ms").replace("_", "-") for k in given)
        what = f"workload {workload!r} has" if workload else "a job without --workload has"
        raise RequestError(400, f"{flags}: {what} no latency model, so the SLO could not be planned for; "
                                f"workloads with one: {', '.join(latency_model_names())}")


def _optional_number(v: object, field: str) -> float | None:
    return None if v is None else _number(v, field)


def _parse_iso(v: object, field: str) -> datetime:
    if not isinstance(v, str):
        raise RequestError(400, f"{field} must be an ISO 8601 time")
    try:
        t = datetime.fromisoformat(v)
    except ValueError:
        raise RequestError(400, f"{field} {v!r} is not an ISO 8601 time") from None
    if t.tzinfo is None:
        raise RequestError(400, f"{field} {v!r} has no time zone; send UTC, e.g. 2026-12-01T02:00:00Z")
    try:
        return t.astimezone(timezone.utc)
    except OverflowError:  # e.g. 9999-12-31T23:59:59-23:59: past year 9999 in UTC
        raise RequestError(400, f"{field} {v!r} is out of range") from None


# Account lookups read /etc/passwd and /etc/group (or NSS) on every call; a submit needs
# them, so they are cached for a minute: group changes reach new jobs within that time.
_ACCOUNT_TTL_S = 60.0
_accounts: dict[tuple[int, int], tuple[float, str, list[int]]] = {}


def _account(uid: int, gid: int) -> tuple[str, list[int]]:
    now = time.monotonic()
    hit = _accounts.get((uid, gid))
    if hit is not None and now - hit[0] < _ACCOUNT_TTL_S:
        return hit[1], hit[2]
    try:
        name = pwd.getpwuid(uid).pw_name
        groups = sorted(set(os.getgrouplist(name, gid)))
    except KeyError:
        name, groups = str(uid), [gid]
    _accounts[(uid, gid)] = (now, name, groups)
    return name, groups


def _groups_of(uid: int, gid: int) -> list[int]:
    return _account(uid, gid)[1]


def admin_gids(names: list[str]) -> frozenset[int]:
    """Resolve admin group names from the config; unknown names are a configuration error."""
    out = set()
    for name in names:
        try:
            out.add(grp.getgrnam(name).gr_gid)
        except KeyError:
            raise ValueError(f"admin group {name!r} does not exist") from None
    return frozenset(out)


def _validate_interruptible(body: dict, est_runtime_s: float | None, time_limit_s: float | None) -> dict:
    """The interruptible-job fields of a submit (issue 30) as job columns, each refused with
    a one-line reason naming its flag: an unknown kind, a signal a job cannot catch, a
    segment longer than the job, knobs given without --interruptible."""
    kind = body.get("interruptible")
    knobs = {k: body.get(k) for k in ("checkpoint_signal", "checkpoint_grace_s", "min_run_s", "resume_cost_s",
                                      "max_segments") if body.get(k) is not None}
    if kind is None:
        if knobs:
            flags = ", ".join("--" + k.removesuffix("_s").replace("_", "-") for k in knobs)
            raise RequestError(400, f"{flags} need --interruptible checkpoint|pause")
        return {}
    if kind not in interruptible.KINDS:
        raise RequestError(400, f"--interruptible must be one of {', '.join(interruptible.KINDS)} (got {kind!r})")
    if kind == interruptible.PAUSE:
        for k, flag in (("checkpoint_signal", "--checkpoint-signal"), ("checkpoint_grace_s", "--checkpoint-grace")):
            if k in knobs:
                raise RequestError(400, f"{flag} is for --interruptible checkpoint; a pause job is stopped "
                                        "and continued in place")
    out: dict = {"interruptible": kind}
    if kind == interruptible.CHECKPOINT:
        sig = body.get("checkpoint_signal", interruptible.DEFAULT_SIGNAL)
        if not isinstance(sig, (str, int)) or isinstance(sig, bool):
            raise RequestError(400, "--checkpoint-signal must be a signal name such as SIGUSR1")
        try:
            out["checkpoint_signal"] = interruptible.signal_name(str(sig))
        except ValueError as e:
            raise RequestError(400, str(e)) from None
        grace = _optional_number(body.get("checkpoint_grace_s"), "checkpoint_grace_s")
        if grace is None:
            grace = interruptible.DEFAULT_GRACE_S
        if not 1 <= grace <= interruptible.MAX_GRACE_S:
            raise RequestError(400, f"--checkpoint-grace must be between 1s and 1h (got {grace:g}s)")
        out["checkpoint_grace_s"] = grace
    min_run = _optional_number(body.get("min_run_s"), "min_run_s")
    if min_run is not None:
        if not MIN_RUNTIME_S <= min_run <= MAX_RUNTIME_S:
            raise RequestError(400, f"--min-run must be between 1s and 30d (got {min_run:g}s)")
        longest = est_runtime_s if est_runtime_s is not None else time_limit_s
        if longest is not None and min_run > longest:
            what = "--est-runtime" if est_runtime_s is not None else "--time-limit"
            raise RequestError(400, f"--min-run {min_run:g}s is longer than the job's {what} of {longest:g}s: "
                                    "no segment could be that long")
    out["min_run_s"] = min_run
    cost = _optional_number(body.get("resume_cost_s"), "resume_cost_s")
    cost = 0.0 if cost is None else cost
    if not 0 <= cost <= MAX_RUNTIME_S:
        raise RequestError(400, f"--resume-cost must be between 0s and 30d (got {cost:g}s)")
    if est_runtime_s is not None and cost >= est_runtime_s:
        raise RequestError(400, f"--resume-cost {cost:g}s is not shorter than the job's --est-runtime of "
                                f"{est_runtime_s:g}s: every resume would cost more than the whole job")
    out["resume_cost_s"] = cost
    segs = body.get("max_segments")
    if segs is not None:
        segs = _int(segs, "max_segments")
        if not 1 <= segs <= interruptible.MAX_SEGMENTS:
            raise RequestError(400, f"--max-segments must be between 1 and {interruptible.MAX_SEGMENTS} "
                                    f"(got {segs})")
    out["max_segments"] = segs
    return out


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
