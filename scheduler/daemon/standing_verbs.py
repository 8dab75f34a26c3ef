"""The API's view of where jobs stand (`carbonsched share`, like Slurm's `sshare`;
`carbonsched priority`, like `sprio`):

    GET /v1/share       every association's shares, usage, effective usage and fair-share factor,
                        and each account limit in force with what its subtree used this period
    GET /v1/priority    each waiting job's priority and its components, highest first

Computed as the planner computes them (`scheduler.standing`), from the store at the moment
asked. A user who is not an operator sees the accounts' rows and their own, and only their
own jobs' priorities (as `queue` shows them only their jobs).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from scheduler.daemon.access import Access, Caller, RequestError, account
from scheduler.daemon.plan_store import read_gpus
from scheduler.jobs.store import read_queue
from scheduler.standing import Standing
from scheduler.store import Store


class StandingVerbs:
    """`share` and `priority`, for everyone (their own part) and operators (all of it)."""

    def __init__(self, store: Store, access: Access, standing: Standing, *, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.access = access
        self.standing = standing
        self._clock = clock

    def route(self, method: str, parts: list[str], query: dict, body: object, caller: Caller) -> tuple[int, object]:
        if method == "GET" and parts == ["share"]:
            return 200, self.share(caller)
        if method == "GET" and parts == ["priority"]:
            return 200, self.priority(caller)
        raise RequestError(404, f"unknown API call {method} /{'/'.join(parts)}; use GET /share or GET /priority")

    def share(self, caller: Caller) -> dict:
        """Every association's line (accounts, and users: all for an operator, else only the
        caller's own), in tree order."""
        now = self._clock()
        with self.store.read() as conn:
            fs = self.standing.fair_share(conn, now)
            budgets = self.standing.budgets(conn, now)
        rows = fs.to_json(self.standing.settings.currency)
        if not self.access.is_admin(caller):
            me = account(caller.uid, caller.gid)[0]
            rows = [r for r in rows if r["user"] in (None, me)]
        return {"at": now.isoformat(timespec="seconds").replace("+00:00", "Z"),
                "currency": self.standing.settings.currency, "half_life_s": self.standing.settings.half_life_s,
                "associations": rows,
                "budgets": [] if budgets is None else [s.as_json() for s in budgets.standings()]}

    def priority(self, caller: Caller) -> dict:
        """The waiting jobs' priorities and components (the caller's own unless an operator)."""
        now = self._clock()
        with self.store.read() as conn:
            queued = list(read_queue(conn, now).values())
            if not self.access.is_admin(caller):
                me = account(caller.uid, caller.gid)[0]
                queued = [j for j in queued if j.owner_name == me]
            fleet = sum(1 for g in read_gpus(conn) if g.healthy) if queued else 0
            ranked = self.standing.priorities(conn, queued, now, fleet)
        weights = self.standing.settings.weights
        return {"at": now.isoformat(timespec="seconds").replace("+00:00", "Z"),
                "weights": {"fair_share": weights.fair_share, "qos": weights.qos, "age": weights.age,
                            "job_size": weights.job_size},
                "jobs": [b.to_dict() for b in ranked]}
