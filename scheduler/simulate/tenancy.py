"""Who each simulated job belongs to: its user, account and QOS, read from the trace's
`user`, `account` and `qos` columns. A job without an account is the `default` account's
(a trace without the column is one account, as a one-user install is). A job with a QOS
follows that level's rules (`scheduler.qos`: how far carbon may defer it, the least saving
worth a wait, its priority and usage factor); a job without one follows the scenario's slack
alone, as every simulated job did before QOS existed, and is reported under `none`. The
simulator prices and plans the same jobs whoever owns them; ownership decides priority
(fair share, QOS) and how the run's figures are reported per account and per QOS.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.fair_share import jain_index, water_fill
from scheduler.simulate.metrics import percentile
from scheduler.simulate.traces import JobTrace

DEFAULT_ACCOUNT = "default"
NO_QOS = "none"  # the report's name for jobs the trace gives no QOS


@dataclass(frozen=True, slots=True)
class Tenant:
    """The owner of one job: who submitted it (None: the trace does not say), the account it
    is charged to and its QOS (None: the scenario's slack alone)."""

    user: str | None = None
    account: str = DEFAULT_ACCOUNT
    qos: str | None = None


def tenants_of(trace: JobTrace) -> dict[int, Tenant]:
    """Each job's owner by the id the scenario gives it (1..N in trace order)."""
    return {i + 1: Tenant(tj.user, tj.account or DEFAULT_ACCOUNT, tj.qos) for i, tj in enumerate(trace.jobs)}


def account_shares(tenants: dict[int, Tenant], shares: dict[str, int] | None = None) -> dict[str, int]:
    """The raw shares of every account that owns a job: those `shares` gives (a scenario's
    choice), 1 for the rest (a trace's accounts are equal unless told otherwise)."""
    given = shares or {}
    bad = {a: s for a, s in given.items() if not isinstance(s, int) or s < 0}
    if bad:
        raise ValueError(f"account shares must be whole numbers >= 0: {bad}")
    return {a: given.get(a, 1) for a in sorted({t.account for t in tenants.values()} | set(given))}


def _runs(r) -> list[tuple[float, float]]:
    """The spans (epoch s) a finished or running record held its GPUs doing work."""
    if r.segment_log:
        return [(s, e) for s, e, _, _ in r.segment_log]
    if r.start_s is not None and r.end_s is not None:
        return [(r.start_s, r.end_s)]
    return []


def tenant_figures(records: list, tenants: dict[int, Tenant], shares: dict[str, int]) -> dict:
    """The run's figures per account and per QOS, and Jain's fairness index over accounts.

    The busy period is from the first arrival to the last: while jobs keep arriving, the
    cluster's GPU-hours are what accounts compete for. Per account, `gpu_hours` is the work
    its jobs ran within that period, `share_delivered` its part of all that work, and
    `share_target` its fair part (`water_fill`: split by shares, none above what the account
    asked for: the GPU-hours of its jobs that arrived in the period); waits (start - submit)
    and `kgco2` are over all its finished jobs. `fairness.jain` is over accounts'
    delivered / target ratios (1: every account got its fair part)."""
    if not records:
        return {"accounts": {}, "qos": {}, "fairness": {"jain": None}}
    t0 = min(r.arrival_s for r in records)
    t1 = max(r.arrival_s for r in records)
    delivered: dict[str, float] = {a: 0.0 for a in shares}
    asked: dict[str, float] = {a: 0.0 for a in shares}
    waits: dict[str, list[float]] = {a: [] for a in shares}
    qos_waits: dict[str, list[float]] = {}
    grams: dict[str, float] = {a: 0.0 for a in shares}
    for r in records:
        owner = tenants.get(r.job.id, Tenant())
        gpus = len(r.gpu_ids) or r.job.gpus
        asked[owner.account] = asked.get(owner.account, 0.0) + gpus * (r.runtime_s or r.planned_runtime_s)
        delivered[owner.account] = delivered.get(owner.account, 0.0) + gpus * sum(
            max(0.0, min(e, t1) - max(s, t0)) for s, e in _runs(r))
        grams[owner.account] = grams.get(owner.account, 0.0) + r.gco2 + r.lost_gco2
        if r.state == "done" and r.start_s is not None:
            waits.setdefault(owner.account, []).append(r.start_s - r.arrival_s)
            qos_waits.setdefault(owner.qos or NO_QOS, []).append(r.start_s - r.arrival_s)
    total = sum(delivered.values())
    targets = water_fill(total, {a: float(s) for a, s in shares.items()}, asked)
    accounts = {}
    for a in sorted(delivered):
        target = targets.get(a, 0.0) / total if total else None
        accounts[a] = {"shares": shares.get(a, 0), "gpu_hours": delivered[a] / 3600.0,
                       "share_target": target, "share_delivered": delivered[a] / total if total else None,
                       "wait_p50_s": percentile(waits.get(a, []), 50), "wait_p95_s": percentile(waits.get(a, []), 95),
                       "kgco2": grams[a] / 1000.0}
    ratios = [v["share_delivered"] / v["share_target"] for v in accounts.values()
              if v["share_target"] and v["share_delivered"] is not None]
    return {"accounts": accounts,
            "qos": {q: {"jobs": len(w), "wait_p50_s": percentile(w, 50), "wait_p95_s": percentile(w, 95)}
                    for q, w in sorted(qos_waits.items())},
            "fairness": {"jain": jain_index(ratios)}}
