"""What a submit is charged to and under which rules: its account (`scheduler.accounts`), its
QOS (`scheduler.qos`), and the time limit those give it.

- `--account A`: A must exist and be one of the user's accounts (a user in none may use
  `default`); without it, the user's default account, else `default`.
- `--qos NAME`: a level of the site's QOS table; without it, `normal`.
- Every job gets a finite time limit: one given none at all (no `--time`, `--time-limit` or
  `--est-runtime`) gets its QOS's default, else the site's `default_time_limit`. An explicit
  limit above the QOS's maximum is refused with the maximum in the message; a limit derived
  from `--est-runtime` that would pass it is the maximum instead (an estimate above it is
  refused).
- A QOS's `max_jobs_queued_per_user` refuses a submit beyond it (429, like the site's
  `max_queued_per_user`).

Each refusal is one line: 400 for a mistake in the request (the CLI exits 2), 429 for a limit.
The accounts and associations are read at most every `TTL_S` (and at once after an operator
changes them through this daemon), so a submit costs no extra query.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from scheduler.accounts import AccountError, Associations, charge_account, read_associations
from scheduler.daemon.access import RequestError, ServiceConfig
from scheduler.jobs.usage import waiting_in_qos
from scheduler.qos import Qos
from scheduler.store import Store
from scheduler.timeparse import format_duration


class Tenancy:
    """Account, QOS and time limit of each submitted job (`apply`), and the per-QOS queue
    limit (`check_queued`)."""

    TTL_S = 5.0
    QUEUED_REFRESH_S = 2.0

    def __init__(self, store: Store, config: ServiceConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, Associations] | None = None
        self._queued: dict[tuple[int, str], tuple[int, float]] = {}  # (uid, QOS) -> (waiting, read at)

    def invalidate(self) -> None:
        """Forget the cached associations (an operator changed them)."""
        with self._lock:
            self._cached = None

    def _associations(self) -> Associations:
        with self._lock:
            cached = self._cached
        if cached is not None and self._clock() - cached[0] < self.TTL_S:
            return cached[1]
        with self.store.read() as conn:
            snapshot = read_associations(conn)
        with self._lock:
            self._cached = (self._clock(), snapshot)
        return snapshot

    def qos(self, body: dict) -> Qos:
        """The request's QOS level; 400 naming the known ones for an unknown name."""
        name = body.get("qos")
        if name is not None and not isinstance(name, str):
            raise RequestError(400, "--qos must be a QOS name")
        try:
            return self.config.qos.get(name)
        except KeyError as e:
            raise RequestError(400, f"--qos: {e.args[0]}") from None

    def apply(self, body: dict, row: dict) -> None:
        """Set the new job's `account`, `qos` and time limit in `row` (the checked request's
        row, `submit_checks.job_row`), or refuse it (RequestError, one line)."""
        qos = self.qos(body)
        try:
            row["account"] = charge_account(self._associations(), row["owner_name"], body.get("account"))
        except AccountError as e:
            raise RequestError(400, e.message) from None
        row["qos"] = qos.name
        self._time_limit(row, qos)

    def _time_limit(self, row: dict, qos: Qos) -> None:
        limit, derived = row.get("time_limit_s"), row.get("time_limit_factor") is not None
        longest = qos.max_time_limit_s
        if limit is None:
            row["time_limit_s"] = limit = qos.time_limit_for(self.config.default_time_limit_s)
        elif longest is not None and limit > longest:
            est = row.get("est_runtime_s")
            if not derived or (est is not None and est > longest):
                what = "--est-runtime" if derived else "the time limit"
                raise RequestError(400, f"{what} {format_duration(est if derived else limit)} is over QOS "
                                        f"{qos.name!r}'s maximum time limit of {format_duration(longest)}")
            row["time_limit_s"], row["time_limit_factor"] = longest, None  # binding at the maximum
        min_run = row.get("min_run_s")
        if min_run is not None and min_run > row["time_limit_s"]:
            raise RequestError(400, f"--min-run {format_duration(min_run)} is longer than the job's time limit of "
                                    f"{format_duration(row['time_limit_s'])}: no segment could be that long")

    def check_queued(self, uid: int, qos_name: str, jobs_added: int = 1) -> None:
        """Refuse (429, one line) a submit that would put `uid` over its QOS's
        `max_jobs_queued_per_user` (jobs waiting: PENDING or PLANNED; every array task counts).

        Each (uid, QOS) count is read at most every `QUEUED_REFRESH_S` and counted up by the
        submits admitted in between (as `submission.QueueLimit` does), so the limit errs on
        the strict side: jobs that started meanwhile, or a submit refused later on, count
        until the next read. A read per submit made an urgent submit 2.7x slower on SQLite."""
        limit = self.config.qos.get(qos_name).max_jobs_queued_per_user
        if limit is None:
            return
        key = (uid, qos_name)
        with self._lock:
            n, at = self._queued.get(key, (0, -1e18))
        if self._clock() - at > self.QUEUED_REFRESH_S:
            with self.store.read() as conn:
                n = waiting_in_qos(conn, uid, qos_name)
            at = self._clock()
        if n + jobs_added > limit:
            with self._lock:
                self._queued[key] = (n, at)
            adds = f"; this request adds {jobs_added}" if jobs_added > 1 else ""
            raise RequestError(429, f"uid {uid} already has {n} jobs waiting in QOS {qos_name!r}{adds} (limit "
                                    f"{limit}, its max_jobs_queued_per_user); submit more once some have started")
        with self._lock:
            self._queued[key] = (n + jobs_added, at)
            if len(self._queued) > 10_000:  # forget idle users
                self._queued = {key: self._queued[key]}
