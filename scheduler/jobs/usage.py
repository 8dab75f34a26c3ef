"""Questions of accounts and QOS asked of `jobs`: the usage fair share charges (finished and
running jobs by account, user and QOS, behind `scheduler.standing`), an account's active
jobs (`account delete`) and a user's jobs waiting in a QOS (its queue limit)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, Row, func, select

from scheduler.lifecycle import ACTIVE, State
from scheduler.store.models import jobs

_USAGE_COLUMNS = (jobs.c.id, jobs.c.account, jobs.c.owner_name, jobs.c.qos, jobs.c.started_at, jobs.c.ended_at,
                  jobs.c.gpu_ids, jobs.c.gpus, jobs.c.energy_j, jobs.c.gco2)


def finished_usage(conn: Connection, since: datetime) -> list[Row]:
    """Every job that ran and ended at or after `since` (its account, owner, QOS, when it ran,
    its GPUs and its measured energy and grams, None where not known yet)."""
    return list(conn.execute(select(*_USAGE_COLUMNS).where(
        jobs.c.ended_at >= since, jobs.c.started_at.is_not(None), jobs.c.state.not_in([s.value for s in ACTIVE]))))


def running_usage(conn: Connection) -> list[Row]:
    """Every RUNNING job with what its usage so far is made of."""
    return list(conn.execute(select(*_USAGE_COLUMNS).where(jobs.c.state == State.RUNNING.value,
                                                            jobs.c.started_at.is_not(None))))


def active_in_account(conn: Connection, account: str) -> int:
    """How many jobs of `account` are queued or running (an account with any is not deleted)."""
    return conn.execute(select(func.count()).select_from(jobs).where(
        jobs.c.account == account, jobs.c.state.in_([s.value for s in ACTIVE]))).scalar_one()


def waiting_in_qos(conn: Connection, uid: int, qos: str) -> int:
    """How many of `uid`'s jobs wait (PENDING or PLANNED) in QOS `qos` (its queue limit)."""
    return conn.execute(select(func.count()).select_from(jobs).where(
        jobs.c.owner_uid == uid, jobs.c.qos == qos,
        jobs.c.state.in_([State.PENDING.value, State.PLANNED.value]))).scalar_one()



_RUNNING_COLUMNS = (jobs.c.account, jobs.c.qos, jobs.c.gpus, jobs.c.gpu_ids, jobs.c.est_energy_j, jobs.c.est_gco2,
                    jobs.c.est_runtime_planned_s, jobs.c.est_runtime_s, jobs.c.time_limit_s)


def budget_finished(conn: Connection, since: datetime, until: datetime) -> list[Row]:
    """What budgets charge the jobs that ran and ended in [`since`, `until`), summed per
    account and QOS in the database (a quarter holds tens of thousands of jobs): `gpu_s`
    (GPUs x the time run), `energy_j` and `gco2` as measured, else the plan's estimate."""
    from scheduler.jobs.sums import gpu_seconds

    j = jobs.c
    return list(conn.execute(
        select(j.account, j.qos, func.sum(gpu_seconds(conn.dialect.name)).label("gpu_s"),
               func.sum(func.coalesce(j.energy_j, j.est_energy_j, 0.0)).label("energy_j"),
               func.sum(func.coalesce(j.gco2, j.est_gco2, 0.0)).label("gco2"))
        .where(j.ended_at >= since, j.ended_at < until, j.started_at.is_not(None),
               j.state.not_in([s.value for s in ACTIVE]))
        .group_by(j.account, j.qos)))


def budget_running(conn: Connection) -> list[Row]:
    """Every RUNNING job with its plan's estimates (what budgets charge it while it runs)."""
    return list(conn.execute(select(*_RUNNING_COLUMNS).where(jobs.c.state == State.RUNNING.value,
                                                             jobs.c.started_at.is_not(None))))
