"""Submitting jobs: a request checked (`submit_checks`), admitted (a job no GPU of the cluster
can ever run is refused, `admission`; one alone over its account's limit, `submit_budget`), held to the uid's limits on what it may store and have
waiting (`QueueLimit`), and stored with its "submitted" event in one transaction (one
statement on PostgreSQL); a job array's tasks and a job's dependencies together.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Connection

from scheduler.daemon.access import Access, Caller, RequestError, ServiceConfig
from scheduler.daemon.admission import Admission, Refused
from scheduler.daemon.slice_admission import check_slice
from scheduler.daemon.submit_budget import SubmitBudget
from scheduler.daemon.submit_checks import Habits, KnownWorkloads, job_row, slurm_habits
from scheduler.daemon.submit_tenancy import Tenancy
from scheduler.jobs.job import job_from_request, queued_job
from scheduler.jobs.store import add_dependencies, insert_job, name_array, store_job, waiting_and_stored
from scheduler.lifecycle import State
from scheduler.store import Store

log = logging.getLogger(__name__)

class Submissions:
    """`submit`: a request checked, admitted, within the uid's limits, stored; the planner
    woken (`on_submit`)."""

    def __init__(self, store: Store, config: ServiceConfig, access: Access, admission: Admission, *,
                 on_submit: Callable[[], None], clock: Callable[[], datetime], carbon=None) -> None:
        self.store = store
        self.config = config
        self.access = access
        self.admission = admission
        self.known_workloads = KnownWorkloads(store)
        self.queue_limit = QueueLimit(store, config.max_queued_per_user,
                                      max_stored_bytes=config.max_stored_bytes_per_user)
        self.tenancy = Tenancy(store, config)
        self.budget = SubmitBudget(store, config, clock=clock, carbon=carbon)  # a job alone over a limit
        self._on_submit = on_submit
        self._clock = clock

    def job_row(self, body: object, caller: Caller, now: datetime) -> dict:
        """The request's job row, every field checked (`submit_checks.job_row`)."""
        return job_row(body, caller, now, time_limit_factor=self.config.time_limit_factor,
                       check_workload=self.known_workloads.check)

    def _see_jobs(self, caller: Caller, job_ids: list[int]) -> dict[int, str]:
        """The states of `job_ids`; refused (404 / 403) when the caller may not see one."""
        with self.store.read() as conn:
            return {job_id: self.access.visible_job(conn, caller, job_id).state for job_id in job_ids}

    def submit(self, caller: Caller, body: object) -> dict:
        """Store a new job (or a job array's tasks): {"id", "state"} and a warning when only
        GPUs out of service can run it."""
        if caller.uid != self.config.daemon_uid and self.config.daemon_uid != 0:
            raise RequestError(403, f"this daemon runs as uid {self.config.daemon_uid} and can "
                                    "only run jobs as that user; run it as root to serve others")
        now = self._clock()
        row = self.job_row(body, caller, now)
        self.tenancy.apply(body, row)  # account, QOS, a finite time limit
        self.budget.check(row)  # not alone over a whole limit of its account
        warning = self._admit(row)
        extra = slurm_habits(body, caller, now, lambda ids: self._see_jobs(caller, ids))
        n_tasks = len(extra.array.indices) if extra.array is not None else 1
        row["stored_bytes"] = stored_bytes({**row, **extra.columns}) + (ARRAY_ENV_BYTES if extra.array else 0)
        self._check_storage(caller.uid, n_tasks, row["stored_bytes"] * n_tasks)
        self.tenancy.check_queued(caller.uid, row["qos"], n_tasks)
        if extra.deps or extra.array is not None:
            return self._submit_with_habits(caller, row, extra)
        row.update(extra.columns)

        job_id = store_job(self.store, row, caller.uid, self._clock)
        self.queue_limit.submitted(caller.uid, 1, row["stored_bytes"])
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
        self.queue_limit.check(uid, n_jobs, n_bytes)

    def _submit_with_habits(self, caller: Caller, row: dict, extra: Habits) -> dict:
        """A job with dependencies, or the tasks of a job array, in one transaction: the
        tasks share one deadline (the array's) and each gets its index in
        CARBONSCHED_ARRAY_TASK_ID; the array's id is its first task's job id."""
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
                job_id = insert_job(conn, task, caller.uid, at)
                if index is not None and not ids:  # the first task: its id is the array's
                    name_array(conn, job_id, {**task["env"], "CARBONSCHED_ARRAY_JOB_ID": str(job_id)})
                ids.append(job_id)
            if extra.deps:
                add_dependencies(conn, ids, [(d.job_id, d.kind) for d in extra.deps])
            return ids

        ids = self.store.transact(tx)
        self.queue_limit.submitted(caller.uid, len(ids), row["stored_bytes"] * len(ids))
        log.info("job %s submitted by uid %s: %s%s", ids[0], caller.uid, row["name"],
                 f" (array of {len(ids)} tasks)" if len(ids) > 1 else "")
        self._on_submit()
        out = {"id": ids[0], "state": State.PENDING.value}
        if extra.array is not None:
            out.update(array_job_id=ids[0], ids=ids, array=extra.array.text())
        return out

    def _admit(self, row: dict) -> str | None:
        """Refuse (422) a job no GPU of the cluster can ever run, with the reason per GPU
        model; return a warning for one only GPUs out of service can run
        (`scheduler.daemon.admission`). The job as the planner will see it decides."""
        if row.get("gpu_fraction") is not None or row.get("mig_profile") is not None:
            check_slice(self.store, row["gpu_fraction"], row["mig_profile"], row["gpu_mem_gib"])
            return None
        # as one piece: admission asks whether any GPU can run the job at all
        job = queued_job(job_from_request(row), self.config.default_runtime_s, as_one_piece=True)
        try:
            return self.admission.check(job, estimated=row["est_runtime_s"] is not None or row["prompts"] is not None)
        except Refused as e:
            raise RequestError(e.status, e.message) from None


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
            with self.store.read() as conn:
                n, stored = waiting_and_stored(conn, uid)
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
