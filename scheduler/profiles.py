"""Workload profiles learned from this cluster's completed jobs, kept in the store.

The planner estimates a job's runtime and power from a profile per (workload class, GPU
model). The packaged seed profiles (`policies.energy.seed_profiles()`) come from public
measurements or a roofline scaling; every COMPLETED job with a workload class, a prompt
count and measured energy on one GPU model is folded into the learned profile of its
(workload, model) with `policies.energy.learn`, so estimates converge to what this
cluster really does. The planner lays the learned rows over the seeds.

Learning is bookkeeping next to a job's completion: it never fails the completion, and a
profile row is updated read-modify-write under a row lock (PostgreSQL) or the single
writer (SQLite), so two agents finishing jobs of the same class at once both count.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from policies.model import Profile
from scheduler.lifecycle import State, utcnow
from scheduler.store import Store
from scheduler.store.models import gpus, jobs, workload_profiles

log = logging.getLogger(__name__)

# Shorter runs say more about start-up than about throughput: they are not learned from.
MIN_LEARN_RUNTIME_S = 1.0


@dataclass(frozen=True)
class CompletedRun:
    """What one completed job measured, as `policies.energy.learn` takes it."""

    job_id: int
    workload: str
    model: str
    gpus: int
    runtime_s: float
    energy_j: float
    prompts: int


def learned_profiles(conn: Connection) -> tuple[Profile, ...]:
    """Every learned profile in the store, ordered by (workload, model)."""
    rows = conn.execute(select(workload_profiles).order_by(workload_profiles.c.workload,
                                                           workload_profiles.c.model))
    return tuple(_profile(r) for r in rows)


def _profile(r) -> Profile:
    return Profile(workload=r.workload, model=r.model, prompts_per_s=r.prompts_per_s,
                   power_w=r.power_w, latency_p50_ms=_nan_if_none(r.latency_p50_ms),
                   latency_p95_ms=_nan_if_none(r.latency_p95_ms), source=r.source or "measured here",
                   samples=r.samples)


def _nan_if_none(v: float | None) -> float:
    return math.nan if v is None else v


def _none_if_nan(v: float) -> float | None:
    return None if v is None or math.isnan(v) else v


def _seed(workload: str, model: str) -> Profile | None:
    from policies.energy import ProfileBook, seed_profiles

    return ProfileBook(seed_profiles()).get(workload, model)


def completed_run(conn: Connection, job_id: int, *, gpu_energy_j: float | None = None) -> CompletedRun | None:
    """The measurement a completed job offers for learning, or None when it offers none
    (not COMPLETED, no workload class or prompts, no measured energy, mixed GPU models)."""
    job = conn.execute(select(jobs.c.state, jobs.c.workload, jobs.c.prompts, jobs.c.gpu_ids,
                              jobs.c.started_at, jobs.c.ended_at, jobs.c.energy_j)
                       .where(jobs.c.id == job_id)).first()
    if job is None or job.state != State.COMPLETED.value:
        return None
    energy_j = gpu_energy_j if gpu_energy_j is not None else job.energy_j
    if not job.workload or not job.prompts or not energy_j or energy_j <= 0:
        return None
    if job.started_at is None or job.ended_at is None or not job.gpu_ids:
        return None
    runtime_s = (job.ended_at - job.started_at).total_seconds()
    if runtime_s < MIN_LEARN_RUNTIME_S:
        return None
    models = set(conn.execute(select(gpus.c.model).where(gpus.c.id.in_(list(job.gpu_ids)))).scalars())
    if len(models) != 1:
        return None
    return CompletedRun(job_id=job_id, workload=job.workload, model=models.pop(),
                        gpus=len(job.gpu_ids), runtime_s=runtime_s, energy_j=float(energy_j),
                        prompts=int(job.prompts))


def fold_run(conn: Connection, run: CompletedRun, now: datetime) -> Profile:
    """Fold one measured run into its (workload, model) profile in the store; return it.

    The prior is the learned row if there is one, else the seed profile (so the first run
    refines the public figure instead of replacing it outright; `learn` decides the weights).
    """
    from policies.energy import learn

    q = select(workload_profiles).where(workload_profiles.c.workload == run.workload,
                                        workload_profiles.c.model == run.model)
    if conn.dialect.name == "postgresql":
        q = q.with_for_update()
    row = conn.execute(q).first()
    prior = _profile(row) if row is not None else _seed(run.workload, run.model)
    new = learn(prior, workload=run.workload, model=run.model, gpus=run.gpus,
                runtime_s=run.runtime_s, energy_j=run.energy_j, prompts=run.prompts)
    values = dict(prompts_per_s=new.prompts_per_s, power_w=new.power_w,
                  latency_p50_ms=_none_if_nan(new.latency_p50_ms),
                  latency_p95_ms=_none_if_nan(new.latency_p95_ms),
                  samples=new.samples, source=new.source, updated_at=now)
    if row is None:
        conn.execute(insert(workload_profiles).values(workload=run.workload, model=run.model, **values))
    else:
        conn.execute(update(workload_profiles).where(workload_profiles.c.id == row.id).values(**values))
    return new


def learn_from_job(store: Store, job_id: int, *, gpu_energy_j: float | None = None,
                   clock: Callable[[], datetime] = utcnow) -> Profile | None:
    """Fold a just-completed job into the learned profiles; None when it teaches nothing.

    `gpu_energy_j` is the job's GPU energy when the stored figure includes other power
    (the node's static share): profiles hold GPU power only. Never raises for bad data or
    a database error: the job's completion is already recorded and must stay so.
    """
    for attempt in (1, 2):
        try:
            def tx(conn: Connection) -> Profile | None:
                run = completed_run(conn, job_id, gpu_energy_j=gpu_energy_j)
                return None if run is None else fold_run(conn, run, clock())

            profile = store.transact(tx)
        except IntegrityError:
            # Another process inserted the first row of this (workload, model) meanwhile:
            # the second try updates it.
            if attempt == 2:
                log.error("job %s: could not update its workload profile (conflicting writes)", job_id)
                return None
            continue
        except Exception:
            log.exception("job %s: updating its workload profile failed; the job's outcome is "
                          "recorded regardless", job_id)
            return None
        if profile is not None:
            log.info("job %s: learned %s on %s: %.3g prompts/s, %.0f W per GPU (%s)", job_id,
                     profile.workload, profile.model, profile.prompts_per_s, profile.power_w,
                     profile.source)
        return profile
    return None
