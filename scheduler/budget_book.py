"""The budgets of one store at one moment (`scheduler.budgets.Budgets`): the accounts' limits
and tree, and every job's usage that counts against them, each times its QOS's usage factor.
The planner, `carbonsched share` and submit's check read them through here.

What a job is charged: a finished job its measured GPU-hours (GPUs x the time it ran), kWh
(its `energy_j`) and kgCO2e (its `gco2`, as its receipt prices it), or where a figure is
not measured yet its plan's estimate, summed per account and QOS in the database for each
period in force; a running job its plan's estimates (energy, grams, and GPUs x its planned
runtime, else its own estimate, else its time limit), charged now, whenever it ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import Connection, select

from scheduler.account_limits import read_limits
from scheduler.budgets import Budgets, Charged, Usage, period_window
from scheduler.jobs.usage import budget_finished, budget_running
from scheduler.store.account_models import accounts


def running_usage(row) -> Usage:
    """A running job's charge (a `scheduler.jobs.usage.budget_running` row), before its usage factor."""
    gpus = len(row.gpu_ids) if row.gpu_ids else int(row.gpus or 1)
    runtime_s = row.est_runtime_planned_s or row.est_runtime_s or row.time_limit_s or 0.0
    return Usage.of(gpus * runtime_s, row.est_energy_j or 0.0, row.est_gco2 or 0.0)


def read_budgets(conn: Connection, now: datetime, usage_factors: Mapping[str, float], *,
                 flexible_grace_pct: float = 0.0) -> Budgets | None:
    """The budgets at `now`, or None when no account has a limit (then nothing more is read)."""
    limits = read_limits(conn)
    if not limits:
        return None
    parents = {r.name: r.parent for r in conn.execute(select(accounts.c.name, accounts.c.parent))}
    windows = {w for by in limits.values() for lim in by.values() if (w := period_window(lim.period, now))}
    charges = []
    for window in sorted(windows):  # one summed read per period in force (most sites: one or two)
        for r in budget_finished(conn, *window):
            usage = Usage.of(float(r.gpu_s or 0.0), float(r.energy_j or 0.0), float(r.gco2 or 0.0))
            charges.append(Charged(r.account, window[0], usage.times(usage_factors.get(r.qos, 1.0)), window))
    if windows:
        for r in budget_running(conn):
            charges.append(Charged(r.account, now, running_usage(r).times(usage_factors.get(r.qos, 1.0))))
    return Budgets(limits, parents, now, charges, flexible_grace_pct=flexible_grace_pct)
