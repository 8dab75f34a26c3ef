"""Who each simulated job belongs to: its user, account and QOS, read from the trace's
`user`, `account` and `qos` columns (a trace without them is one account, `default`, and
every job `normal`, as a one-user install is). The simulator prices and plans the same
jobs whoever owns them; ownership decides priority (fair share, QOS) and how the run's
figures are reported per account and per QOS.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.simulate.traces import JobTrace

DEFAULT_ACCOUNT = "default"
DEFAULT_QOS = "normal"


@dataclass(frozen=True, slots=True)
class Tenant:
    """The owner of one job: who submitted it (None: the trace does not say), the account it
    is charged to and its QOS."""

    user: str | None = None
    account: str = DEFAULT_ACCOUNT
    qos: str = DEFAULT_QOS


def tenants_of(trace: JobTrace) -> dict[int, Tenant]:
    """Each job's owner by the id the scenario gives it (1..N in trace order)."""
    return {i + 1: Tenant(tj.user, tj.account or DEFAULT_ACCOUNT, tj.qos or DEFAULT_QOS)
            for i, tj in enumerate(trace.jobs)}


def account_shares(tenants: dict[int, Tenant], shares: dict[str, int] | None = None) -> dict[str, int]:
    """The raw shares of every account that owns a job: those `shares` gives (a scenario's
    choice), 1 for the rest (a trace's accounts are equal unless told otherwise)."""
    given = shares or {}
    bad = {a: s for a, s in given.items() if not isinstance(s, int) or s < 0}
    if bad:
        raise ValueError(f"account shares must be whole numbers >= 0: {bad}")
    return {a: given.get(a, 1) for a in sorted({t.account for t in tenants.values()} | set(given))}
