"""What completed jobs did, for the code that learns from them: the workload profiles
(`scheduler.profiles`: one finished job's measured run) and shadow mode
(`scheduler.simulate.shadow`: a period's completed jobs, replayed with other policies).
Reads only."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, Row, select

from scheduler.lifecycle import State
from scheduler.store.models import jobs


def run_to_learn_from(conn: Connection, job_id: int) -> Row | None:
    """The columns of one job that a workload profile learns from (state, workload and
    prompt counts, GPUs and run times, measured energy, its planned operating point, SLOs,
    power limit and owner); None: no such job."""
    return conn.execute(select(jobs.c.state, jobs.c.workload, jobs.c.prompts, jobs.c.reported_prompts,
                               jobs.c.gpu_ids, jobs.c.started_at, jobs.c.ended_at, jobs.c.energy_j,
                               jobs.c.planned_max_batch, jobs.c.planned_precision, jobs.c.planned_tp,
                               jobs.c.ttft_slo_ms, jobs.c.tpot_slo_ms, jobs.c.latency_slo_ms,
                               jobs.c.power_limit_w, jobs.c.owner_uid)
                        .where(jobs.c.id == job_id)).first()


def completed_submitted_in(conn: Connection, since: datetime, until: datetime) -> list[Row]:
    """The COMPLETED jobs submitted in [since, until), by submit time then id: what each
    asked for (GPUs, memory, deadline, latency SLO, workload, prompts) and how it ran
    (start, end, GPU ids)."""
    return conn.execute(
        select(jobs.c.id, jobs.c.name, jobs.c.gpus, jobs.c.gpu_mem_gib, jobs.c.deadline,
               jobs.c.latency_slo_ms, jobs.c.workload, jobs.c.prompts, jobs.c.submitted_at,
               jobs.c.started_at, jobs.c.ended_at, jobs.c.gpu_ids)
        .where(jobs.c.state == str(State.COMPLETED.value))
        .where(jobs.c.submitted_at >= since, jobs.c.submitted_at < until)
        .order_by(jobs.c.submitted_at, jobs.c.id)).all()
