"""The API's account and user verbs (`carbonsched account ...`, `carbonsched user ...`, as
Slurm's `sacctmgr`): operators change them, everyone may list them.

    GET  /v1/accounts                 the tree; a user sees only themselves among its users
    POST /v1/accounts/add             {"name", "parent"?, "shares"?, "description"?}
    POST /v1/accounts/modify          {"name", "shares"?, "description"?, "parent"?, "limits"?}
    POST /v1/accounts/delete          {"name"}
    GET  /v1/users[?user=U]           associations; a user sees only their own
    POST /v1/users/add                {"user", "account", "default"?}
    POST /v1/users/modify             {"user", "default_account"}
    POST /v1/users/delete             {"user", "account"?}

Account names hold `/` (`research/nlp`), so they travel in the body, never in the path.
Each change is one transaction, logged with the operator's uid, and drops submit's cached
associations (`on_change`), so the next submit sees it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from scheduler import accounts as core
from scheduler.daemon.access import Access, Caller, RequestError, account
from scheduler.store import Store

log = logging.getLogger(__name__)

_STATUS = {"invalid": 400, "missing": 404, "conflict": 409}
_FIELDS = {
    ("accounts", "add"): {"name", "parent", "shares", "description"},
    ("accounts", "modify"): {"name", "parent", "shares", "description", "limits"},
    ("accounts", "delete"): {"name"},
    ("users", "add"): {"user", "account", "default"},
    ("users", "modify"): {"user", "default_account"},
    ("users", "delete"): {"user", "account"},
}


class AccountVerbs:
    """account/user add, modify, delete (operators) and list (everyone, their own part)."""

    def __init__(self, store: Store, access: Access, *, on_change: Callable[[], None],
                 clock: Callable[[], datetime]) -> None:
        self.store = store
        self.access = access
        self._on_change = on_change
        self._clock = clock

    def route(self, method: str, parts: list[str], query: dict, body: object, caller: Caller) -> tuple[int, object]:
        """(HTTP status, answer) of a request whose path (after `v1`) is `parts`."""
        kind = parts[0]
        if method == "GET" and len(parts) == 1:
            if kind == "accounts":
                return 200, self.list_accounts(caller)
            return 200, self.list_users(caller, query.get("user", [None])[0])
        if method == "POST" and len(parts) == 2 and (kind, parts[1]) in _FIELDS:
            return (201 if parts[1] == "add" else 200), self.change(caller, kind, parts[1], body)
        raise RequestError(404, f"unknown API call {method} /{'/'.join(parts)}; use GET /{kind} or "
                                f"POST /{kind}/add|modify|delete")

    def list_accounts(self, caller: Caller) -> list[dict]:
        """Every account in tree order; a user who is not an operator sees only their own
        name among each account's users."""
        with self.store.read() as conn:
            rows = core.list_accounts(conn)
        if not self.access.is_admin(caller):
            me = account(caller.uid, caller.gid)[0]
            rows = [{**r, "users": [u for u in r["users"] if u == me]} for r in rows]
        return rows

    def list_users(self, caller: Caller, user: str | None) -> list[dict]:
        """Associations of `user` (None: all); a user who is not an operator sees only their own."""
        if not self.access.is_admin(caller):
            me = account(caller.uid, caller.gid)[0]
            if user not in (None, me):
                raise RequestError(403, "only an operator (root or a member of admin_groups) may list other "
                                        "users' accounts")
            user = me
        with self.store.read() as conn:
            return core.list_users(conn, user)

    def change(self, caller: Caller, kind: str, verb: str, body: object) -> object:
        """add / modify / delete an account or an association; operators only."""
        noun = "account" if kind == "accounts" else "user"
        if not self.access.is_admin(caller):
            raise RequestError(403, f"only an operator (root or a member of admin_groups) may {verb} {noun}s")
        if not isinstance(body, dict):
            raise RequestError(400, f"{noun} {verb} body must be a JSON object")
        unknown = sorted(set(body) - _FIELDS[(kind, verb)])
        if unknown:
            raise RequestError(400, f"unknown field(s) in {noun} {verb}: {', '.join(unknown)}")
        do = getattr(self, f"_{noun}_{verb}")
        try:
            out = self.store.transact(lambda conn: do(conn, body))
        except core.AccountError as e:
            raise RequestError(_STATUS[e.kind], e.message) from None
        log.warning("%s %s by uid %s: %s", noun, verb, caller.uid,
                    ", ".join(f"{k}={v}" for k, v in sorted(body.items())))
        self._on_change()
        return out

    def _account_add(self, conn, body: dict) -> dict:
        return core.add_account(conn, body.get("name"), parent=body.get("parent"), shares=body.get("shares", 1),
                                description=body.get("description"), now=self._clock())

    def _account_modify(self, conn, body: dict) -> dict:
        return core.modify_account(conn, body.get("name"), shares=body.get("shares"),
                                   description=body.get("description"), parent=body.get("parent"),
                                   limits=body.get("limits"), now=self._clock())

    def _account_delete(self, conn, body: dict) -> dict:
        return core.delete_account(conn, body.get("name"))

    def _user_add(self, conn, body: dict) -> dict:
        default = body.get("default", False)
        if not isinstance(default, bool):
            raise core.AccountError("invalid", "default must be true or false")
        return core.add_user(conn, body.get("user"), body.get("account"), default=default, now=self._clock())

    def _user_modify(self, conn, body: dict) -> dict:
        return core.modify_user(conn, body.get("user"), default_account=body.get("default_account"))

    def _user_delete(self, conn, body: dict) -> list[dict]:
        return core.delete_user(conn, body.get("user"), body.get("account"))
