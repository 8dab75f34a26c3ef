"""The SQL of pricing finished jobs (`scheduler.accounting.ledger`): one job's accounting
columns, the write of its carbon, and which finished jobs are still to be priced (never
priced, or priced before full actual intensity data was in)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, or_, select, update

from scheduler.lifecycle import TERMINAL
from scheduler.store.models import jobs

#: The states of a finished job, as stored: only these are priced and summed.
FINISHED = tuple(sorted(s.value for s in TERMINAL))

#: The columns of a job that pricing reads and its receipt shows.
ACCOUNTING_COLUMNS = ("id", "name", "state", "owner_uid", "owner_name", "workload", "gpus", "gpu_ids", "node",
                      "zone", "gpu_model", "submitted_at", "started_at", "ended_at", "deadline", "prompts",
                      "tokens", "reported_prompts", "reported_input_tokens", "reported_output_tokens",
                      "energy_j", "energy_method", "energy_note", "gco2", "pue", "gco2_signal", "gco2_basis",
                      "gco2_coverage", "est_energy_j", "est_gco2", "est_gco2_if_now", "explanation",
                      "accounted_at", "planned_max_batch", "planned_precision", "planned_tp",
                      "planned_power_limit_w", "power_limit_w", "power_limit_note", "est_uncapped_energy_j",
                      "est_uncapped_gco2", "est_uncapped_runtime_s", "est_runtime_planned_s", "interruptible",
                      "first_started_at", "resume_count", "done_fraction", "checkpoints_ignored",
                      "output_truncated", "purged_at")


def accounting_row(conn: Connection, job_id: int) -> dict | None:
    """One job's ACCOUNTING_COLUMNS by name; None: no such job."""
    row = conn.execute(select(*(jobs.c[c] for c in ACCOUNTING_COLUMNS))
                       .where(jobs.c.id == job_id)).mappings().first()
    return None if row is None else dict(row)


def record_carbon(conn: Connection, job_id: int, values: dict[str, Any]) -> None:
    """Write a job's priced carbon and what priced it (gco2, zone, model, PUE, signal, basis,
    coverage, accounted_at, and any energy note or token count)."""
    conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))


def never_priced(conn: Connection, limit: int) -> list[int]:
    """Up to `limit` finished jobs that were never priced, the earliest ended first."""
    j = jobs.c
    return list(conn.execute(select(j.id).where(
        j.accounted_at.is_(None), j.ended_at.is_not(None), j.state.in_(FINISHED))
        .order_by(j.ended_at).limit(limit)).scalars())


def priced_without_actuals(conn: Connection, ended_since: datetime, priced_before: datetime,
                           limit: int) -> list[int]:
    """Up to `limit` measured finished jobs that ended at or after `ended_since`, were last
    priced before `priced_before` and not wholly on actual intensity (more data may be in
    now), the earliest ended first."""
    j = jobs.c
    return list(conn.execute(select(j.id).where(
        j.ended_at >= ended_since, j.state.in_(FINISHED), j.energy_j.is_not(None),
        j.accounted_at < priced_before,
        or_(j.gco2_basis.is_(None), j.gco2_basis != "actual"))
        .order_by(j.ended_at).limit(limit)).scalars())


def never_priced_where(conn: Connection, where: Any, limit: int) -> list[int]:
    """Up to `limit` jobs matching `where` (a condition on `jobs`, e.g.
    `scheduler.jobs.sums.period_filter`) that were never priced."""
    j = jobs.c
    return list(conn.execute(select(j.id).where(where, j.accounted_at.is_(None)).limit(limit)).scalars())
