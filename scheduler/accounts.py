"""Accounts and their users, as Slurm's `sacctmgr` keeps them: a tree of accounts with
fair-share `shares`, users associated with accounts, and one default account per user.

Every function works inside the caller's transaction (a `Connection`), so a verb is one
transaction. Mistakes are `AccountError`s with one line and a `kind`: "invalid" (a bad
name or value), "missing" (no such account or association) or "conflict" (it exists
already, or is in use), which the daemon answers as 400, 404 and 409.

Which account a job is charged to (`charge_account`): the one asked for, which must exist and
be one of the user's associations (a user without any may use `default`); without `--account`
the user's default, else `default`, the built-in account every install has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection, delete, insert, select, update

from scheduler.account_limits import read_limits, set_limits
from scheduler.budgets import BudgetError
from scheduler.jobs.usage import active_in_account
from scheduler.store.account_models import DEFAULT_ACCOUNT, account_limits, account_users, accounts

ACCOUNT_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}(/[a-z0-9][a-z0-9_.-]{0,62}){0,3}\Z")
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}\Z")
MAX_SHARES = 1_000_000
MAX_DESCRIPTION = 500


class AccountError(ValueError):
    """A refused account or user change, one line; `kind`: invalid | missing | conflict."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


# -- checks ----------------------------------------------------------------------------------

def check_account_name(name: object) -> str:
    """An account name: lower-case letters, digits, `_ . -`, up to four `/`-separated levels
    (`research`, `research/nlp`)."""
    if not isinstance(name, str) or not ACCOUNT_RE.match(name):
        raise AccountError("invalid", f"bad account name {name!r}: use lower-case letters, digits, _ . - "
                                      "and / between levels (e.g. research/nlp)")
    return name


def check_user_name(name: object) -> str:
    """A user name as jobs record their owner (a login name, or a uid where it has none)."""
    if not isinstance(name, str) or not USER_RE.match(name):
        raise AccountError("invalid", f"bad user name {name!r}")
    return name


def check_shares(shares: object) -> int:
    if isinstance(shares, bool) or not isinstance(shares, int) or not 1 <= shares <= MAX_SHARES:
        raise AccountError("invalid", f"shares must be a whole number from 1 to {MAX_SHARES} (got {shares!r})")
    return shares


def check_description(text: object) -> str | None:
    if text is None:
        return None
    if not isinstance(text, str) or len(text) > MAX_DESCRIPTION or any(c < " " for c in text):
        raise AccountError("invalid", f"description must be one line of at most {MAX_DESCRIPTION} characters")
    return text


# -- accounts --------------------------------------------------------------------------------

def _account(conn: Connection, name: str):
    return conn.execute(select(accounts).where(accounts.c.name == name)).first()


def _require_account(conn: Connection, name: str):
    row = _account(conn, name)
    if row is None:
        raise AccountError("missing", f"no account {name!r} (carbonsched account list shows them)")
    return row


def _account_json(row, users: list[str], limits: dict | None = None) -> dict:
    return {"name": row.name, "parent": row.parent, "shares": row.shares, "description": row.description,
            "created_at": row.created_at.isoformat(timespec="seconds").replace("+00:00", "Z"), "users": users,
            "limits": {c: limit.as_json() for c, limit in sorted((limits or {}).items())}}


def add_account(conn: Connection, name: object, *, parent: object = None, shares: object = 1,
                description: object = None, now: datetime) -> dict:
    """Create an account. A name with `/` is under the account before its last `/` unless
    `parent` says otherwise; the parent must exist."""
    name = check_account_name(name)
    if parent is None and "/" in name:
        parent = name.rpartition("/")[0]
    if parent is not None:
        _require_account(conn, check_account_name(parent))
    shares, description = check_shares(shares), check_description(description)
    if _account(conn, name) is not None:
        raise AccountError("conflict", f"account {name!r} exists already (account modify changes it)")
    conn.execute(insert(accounts).values(name=name, parent=parent, shares=shares, description=description,
                                         created_at=now))
    return _account_json(_account(conn, name), [])


def modify_account(conn: Connection, name: object, *, shares: object = None, description: object = None,
                   parent: object = None, limits: object = None, now: datetime | None = None) -> dict:
    """Change an account's shares, description or parent (not into its own subtree), or its
    limits (`--limit` texts, `scheduler.budgets.parse_limit`)."""
    row = _require_account(conn, check_account_name(name))
    if limits is not None:
        if not isinstance(limits, list) or not limits or not all(isinstance(t, str) for t in limits):
            raise AccountError("invalid", "limits must be a list of KEY=AMOUNT/PERIOD texts, e.g. co2=500kg/month")
        try:
            set_limits(conn, row.name, limits, now or row.created_at)
        except BudgetError as e:
            raise AccountError("invalid", str(e)) from None
    values: dict = {}
    if shares is not None:
        values["shares"] = check_shares(shares)
    if description is not None:
        values["description"] = check_description(description) or None
    if parent is not None:
        parent = check_account_name(parent)
        _require_account(conn, parent)
        if parent == row.name or parent in _subtree(conn, row.name):
            raise AccountError("conflict", f"account {parent!r} is {row.name!r} or under it: the tree would "
                                           "have a cycle")
        values["parent"] = parent
    if not values and limits is None:
        raise AccountError("invalid", "nothing to change: give --shares, --description, --parent or --limit")
    if values:
        conn.execute(update(accounts).where(accounts.c.name == row.name).values(**values))
    return _account_json(_account(conn, row.name), _users_of(conn, row.name), read_limits(conn).get(row.name))


def _subtree(conn: Connection, name: str) -> set[str]:
    """The accounts under `name` (children, their children, ...)."""
    children: dict[str, list[str]] = {}
    for child, parent in conn.execute(select(accounts.c.name, accounts.c.parent)):
        children.setdefault(parent, []).append(child)
    out, todo = set(), [name]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def delete_account(conn: Connection, name: object) -> dict:
    """Delete an account and its users' associations; refused for `default`, an account with
    children, or one with jobs waiting or running (finished jobs keep its name)."""
    row = _require_account(conn, check_account_name(name))
    if row.name == DEFAULT_ACCOUNT:
        raise AccountError("conflict", f"account {DEFAULT_ACCOUNT!r} is built in and cannot be deleted")
    children = list(conn.execute(select(accounts.c.name).where(accounts.c.parent == row.name)
                                 .order_by(accounts.c.name)).scalars())
    if children:
        raise AccountError("conflict", f"account {row.name!r} has sub-accounts ({', '.join(children)}): "
                                       "delete or move them first")
    active = active_in_account(conn, row.name)
    if active:
        raise AccountError("conflict", f"account {row.name!r} has {active} job(s) waiting or running: "
                                       "let them finish or cancel them first")
    users = _users_of(conn, row.name)
    conn.execute(delete(account_users).where(account_users.c.account == row.name))
    conn.execute(delete(account_limits).where(account_limits.c.account == row.name))
    conn.execute(delete(accounts).where(accounts.c.name == row.name))
    return {**_account_json(row, users), "deleted": True}


def _users_of(conn: Connection, account: str) -> list[str]:
    return list(conn.execute(select(account_users.c.user_name).where(account_users.c.account == account)
                             .order_by(account_users.c.user_name)).scalars())


def list_accounts(conn: Connection) -> list[dict]:
    """Every account in tree order (parents before children, siblings by name), with its users
    and limits."""
    users: dict[str, list[str]] = {}
    for user, account in conn.execute(select(account_users.c.user_name, account_users.c.account)
                                      .order_by(account_users.c.user_name)):
        users.setdefault(account, []).append(user)
    rows = list(conn.execute(select(accounts).order_by(accounts.c.name)))
    limits = read_limits(conn)
    children: dict[str | None, list] = {}
    for r in rows:
        children.setdefault(r.parent, []).append(r)
    out: list[dict] = []

    def walk(parent: str | None, depth: int) -> None:
        for r in children.get(parent, []):
            out.append({**_account_json(r, users.get(r.name, []), limits.get(r.name)), "depth": depth})
            walk(r.name, depth + 1)

    walk(None, 0)
    return out


# -- users (associations) ----------------------------------------------------------------------

def _association_json(row) -> dict:
    return {"user": row.user_name, "account": row.account, "default": bool(row.is_default)}


def _associations(conn: Connection, user: str | None = None) -> list:
    q = select(account_users).order_by(account_users.c.user_name, account_users.c.account)
    if user is not None:
        q = q.where(account_users.c.user_name == user)
    return list(conn.execute(q))


def add_user(conn: Connection, user: object, account: object, *, default: bool = False, now: datetime) -> dict:
    """Let `user` charge `account`; their first account, or one added with `default`, becomes
    their default."""
    user, account = check_user_name(user), check_account_name(account)
    _require_account(conn, account)
    existing = _associations(conn, user)
    if any(r.account == account for r in existing):
        raise AccountError("conflict", f"user {user!r} is already in account {account!r}")
    make_default = default or not any(r.is_default for r in existing)
    if make_default:
        conn.execute(update(account_users).where(account_users.c.user_name == user).values(is_default=False))
    conn.execute(insert(account_users).values(user_name=user, account=account, is_default=make_default,
                                              created_at=now))
    return {"user": user, "account": account, "default": make_default}


def modify_user(conn: Connection, user: object, *, default_account: object) -> dict:
    """Make `default_account` (one of the user's accounts) their default."""
    user, account = check_user_name(user), check_account_name(default_account)
    existing = _associations(conn, user)
    if not existing:
        raise AccountError("missing", f"user {user!r} is in no account (user add {user} --account A)")
    if not any(r.account == account for r in existing):
        raise AccountError("missing", f"user {user!r} is not in account {account!r}; their accounts: "
                                      f"{', '.join(r.account for r in existing)}")
    conn.execute(update(account_users).where(account_users.c.user_name == user)
                 .values(is_default=account_users.c.account == account))
    return {"user": user, "default_account": account}


def delete_user(conn: Connection, user: object, account: object = None) -> list[dict]:
    """Remove `user` from `account`, or from every account (None). Their default goes last:
    removing it while they have others is refused (make another the default first)."""
    user = check_user_name(user)
    existing = _associations(conn, user)
    if account is not None:
        account = check_account_name(account)
        existing_in = [r for r in existing if r.account == account]
        if not existing_in:
            raise AccountError("missing", f"user {user!r} is not in account {account!r}")
        if existing_in[0].is_default and len(existing) > 1:
            raise AccountError("conflict", f"account {account!r} is {user!r}'s default: make another one the "
                                           f"default first (user modify {user} --default-account A)")
        existing = existing_in
    elif not existing:
        raise AccountError("missing", f"user {user!r} is in no account")
    conn.execute(delete(account_users).where(account_users.c.id.in_([r.id for r in existing])))
    return [_association_json(r) for r in existing]


def list_users(conn: Connection, user: str | None = None) -> list[dict]:
    """Associations (user, account, default), of one user or all, by user then account."""
    return [_association_json(r) for r in _associations(conn, user)]


# -- charging a job ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Associations:
    """A snapshot of the accounts and who may charge them, for submit's check."""

    accounts: frozenset[str]
    by_user: dict[str, tuple[str, ...]] = field(default_factory=dict)  # user -> accounts
    defaults: dict[str, str] = field(default_factory=dict)  # user -> default account


def read_associations(conn: Connection) -> Associations:
    names = frozenset(conn.execute(select(accounts.c.name)).scalars())
    by_user: dict[str, list[str]] = {}
    defaults: dict[str, str] = {}
    for r in _associations(conn):
        by_user.setdefault(r.user_name, []).append(r.account)
        if r.is_default:
            defaults[r.user_name] = r.account
    return Associations(names, {u: tuple(a) for u, a in by_user.items()}, defaults)


def charge_account(snapshot: Associations, user: str, requested: str | None) -> str:
    """The account a job of `user` is charged to: `requested` when it exists and the user may
    charge it, else AccountError ("missing" / "invalid", one line); without one, the user's
    default, else their first account, else `default`."""
    mine = snapshot.by_user.get(user, ())
    if requested is None:
        return snapshot.defaults.get(user) or (mine[0] if mine else DEFAULT_ACCOUNT)
    if not isinstance(requested, str) or not ACCOUNT_RE.match(requested):
        raise AccountError("invalid", f"--account: bad account name {requested!r}")
    if requested not in snapshot.accounts:
        raise AccountError("missing", f"--account: no account {requested!r}")
    if mine and requested not in mine:
        raise AccountError("invalid", f"--account: user {user!r} is not in account {requested!r}; "
                                      f"theirs: {', '.join(mine)}")
    if not mine and requested != DEFAULT_ACCOUNT:
        raise AccountError("invalid", f"--account: user {user!r} is in no account, so only {DEFAULT_ACCOUNT!r}; "
                                      f"an operator adds them: carbonsched user add {user} --account {requested}")
    return requested
