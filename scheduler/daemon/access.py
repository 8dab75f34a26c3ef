"""Who is asking, and what they may see: the caller as the kernel reported it (SO_PEERCRED),
operators (root, the daemon's user, `admin_groups`), the one refusal every part of the
service raises (`RequestError`), and the service's configuration.

Nothing in a request body can change who the caller is.
"""

from __future__ import annotations

import grp
import os
import pwd
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Row

from scheduler.jobs.store import read_job
from scheduler.qos import DEFAULT_TIME_LIMIT_S, QosTable


class RequestError(Exception):
    """A request carbonsched refuses; `status` follows HTTP (400, 403, 404, 409, 413, 422)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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
    # The QOS levels (scheduler.qos) and the time limit of a job given none whose QOS has no
    # default: every job has a finite limit.
    qos: QosTable = field(default_factory=QosTable)
    standing: Any = None  # scheduler.standing.StandingSettings ([priority], [fair_share]); None: defaults
    default_time_limit_s: float = DEFAULT_TIME_LIMIT_S
    # [accounting] flexible_grace_pct: how far a flexible-QOS job may take an account over a
    # limit (scheduler.budgets); 0: not at all.
    flexible_grace_pct: float = 0.0


class Access:
    """Who may see and change what: a job is its owner's, and every job is an operator's."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config

    def is_admin(self, caller: Caller) -> bool:
        """Root, the daemon's own user, or a member of one of `admin_groups`."""
        if caller.uid in (0, self.config.daemon_uid):
            return True
        if not self.config.admin_gids:
            return False
        return bool(self.config.admin_gids & set(_groups_of(caller.uid, caller.gid)))

    def visible_job(self, conn: Connection, caller: Caller, job_id: int) -> Row:
        """The job's row when the caller may see it; RequestError 404 (no such job) or 403."""
        row = read_job(conn, job_id)
        if row is None:
            raise RequestError(404, f"no job {job_id}")
        if row.owner_uid != caller.uid and not self.is_admin(caller):
            raise RequestError(403, f"job {job_id} belongs to another user")
        return row


# Account lookups read /etc/passwd and /etc/group (or NSS) on every call; a submit needs
# them, so they are cached for a minute: group changes reach new jobs within that time.
_ACCOUNT_TTL_S = 60.0
_accounts: dict[tuple[int, int], tuple[float, str, list[int]]] = {}


def account(uid: int, gid: int) -> tuple[str, list[int]]:
    """The user name and group ids of a uid (cached for `_ACCOUNT_TTL_S`)."""
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
    return account(uid, gid)[1]


def admin_gids(names: list[str]) -> frozenset[int]:
    """Resolve admin group names from the config; unknown names are a configuration error."""
    out = set()
    for name in names:
        try:
            out.add(grp.getgrnam(name).gr_gid)
        except KeyError:
            raise ValueError(f"admin group {name!r} does not exist") from None
    return frozenset(out)
