"""The store's side of account limits (`scheduler.budgets`): read them all, and set or remove
an account's limits from `--limit` texts, inside the caller's transaction."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, delete, insert, select

from scheduler.budgets import Limit, parse_limit
from scheduler.store.account_models import account_limits


def read_limits(conn: Connection) -> dict[str, dict[str, Limit]]:
    """account -> {currency: Limit}, for every account that has any."""
    out: dict[str, dict[str, Limit]] = {}
    for r in conn.execute(select(account_limits)):
        out.setdefault(r.account, {})[r.currency] = Limit(r.currency, r.amount, r.period)
    return out


def set_limits(conn: Connection, account: str, texts: list[str], now: datetime) -> None:
    """Apply `--limit` texts to `account` (each `KEY=AMOUNT/PERIOD` replaces that currency's
    limit, `KEY=none` removes it); a malformed one raises `BudgetError` before any is applied."""
    parsed = [parse_limit(t) for t in texts]
    for currency, limit in parsed:
        conn.execute(delete(account_limits).where(account_limits.c.account == account,
                                                  account_limits.c.currency == currency))
        if limit is not None:
            conn.execute(insert(account_limits).values(account=account, currency=currency, amount=limit.amount,
                                                       period=limit.period, created_at=now))
