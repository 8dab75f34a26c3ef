"""The budgets of one store at one moment (`scheduler.budgets.Budgets`): the accounts' limits
and tree, and every job's usage that counts against them, each times its QOS's usage factor.
The planner, `carbonsched share` and submit's check read them through here.

What a job is charged (`job_usage`): a finished job its measured GPU-hours (GPUs x the time
it ran), kWh (its `energy_j`) and kgCO2e (its `gco2`, as its receipt prices it), or where a
figure is not measured yet its plan's estimate; a running job its plan's estimates (energy,
grams, and GPUs x its planned runtime, else its own estimate, else its time limit), charged
now, whenever it ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import Connection, select

from scheduler.account_limits import read_limits
from scheduler.budgets import Budgets, Charged, Usage, period_window
from scheduler.jobs.usage import budget_usage
from scheduler.lifecycle import State
from scheduler.store.account_models import accounts


def _gpus(row) -> int:
    return len(row.gpu_ids) if row.gpu_ids else int(row.gpus or 1)


def job_usage(row) -> Usage:
    """A `scheduler.jobs.usage.budget_usage` row's usage, before its usage factor."""
    if row.state == State.RUNNING.value or row.ended_at is None:
        runtime_s = row.est_runtime_planned_s or row.est_runtime_s or row.time_limit_s or 0.0
        energy_j, gco2 = row.est_energy_j, row.est_gco2
    else:
        runtime_s = max(0.0, (row.ended_at - row.started_at).total_seconds())
        energy_j = row.energy_j if row.energy_j is not None else row.est_energy_j
        gco2 = row.gco2 if row.gco2 is not None else row.est_gco2
    return Usage(_gpus(row) * runtime_s / 3600.0, (energy_j or 0.0) / 3.6e6, (gco2 or 0.0) / 1000.0)


def read_budgets(conn: Connection, now: datetime, usage_factors: Mapping[str, float], *,
                 flexible_grace_pct: float = 0.0) -> Budgets | None:
    """The budgets at `now`, or None when no account has a limit (then nothing is read)."""
    limits = read_limits(conn)
    if not limits:
        return None
    parents = {r.name: r.parent for r in conn.execute(select(accounts.c.name, accounts.c.parent))}
    windows = [w for by in limits.values() for lim in by.values() if (w := period_window(lim.period, now))]
    charges = []
    if windows:
        for r in budget_usage(conn, min(start for start, _ in windows)):
            at = now if r.state == State.RUNNING.value or r.ended_at is None else r.ended_at
            charges.append(Charged(r.account, min(at, now), job_usage(r).times(usage_factors.get(r.qos, 1.0))))
    return Budgets(limits, parents, now, charges, flexible_grace_pct=flexible_grace_pct)
