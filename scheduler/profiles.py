"""Workload profiles learned from this cluster's completed jobs, kept in the store.

The planner estimates a job's runtime and power from a profile per (workload class, GPU
model). The packaged seed profiles (`policies.model.energy.seed_profiles()`) come from public
measurements or a roofline scaling; every COMPLETED job with a workload class, a prompt
count (the one the job reported, else the declared one) and measured energy on one GPU model
adds a run to its (workload, model) row, and `policies.model.learning.estimate` turns the recent
runs into the profile (a median, so one stalled run does not drag it). One user cannot
poison a profile for everyone (issue 48): a run far off the seed model is not learned from,
each run keeps its owner's uid so that no user's runs outweigh or crowd out the others'
(`policies.model.learning`), and operators forget a profile with `reset_profiles`
(`carbonsched profiles reset`). What a workload
taught on some GPU models corrects its seeds on the others until they have runs of their
own. The planner lays these profiles over the seeds.

Learning is bookkeeping next to a job's completion: it never fails the completion, and a
profile row is updated read-modify-write under a row lock (PostgreSQL) or the single
writer (SQLite), so two agents finishing jobs of the same class at once both count.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from types import SimpleNamespace

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from policies.model.learning import Run, is_outlier, keep, learned_by_model
from policies.types import Profile, QueuedJob
from scheduler.clock import utcnow
from scheduler.jobs.history import run_to_learn_from
from scheduler.lifecycle import State
from scheduler.store import Store
from scheduler.store.models import gpus, workload_profiles
from scheduler.timeparse import iso

log = logging.getLogger(__name__)

# Shorter runs say more about start-up than about throughput: they are not learned from.
MIN_LEARN_RUNTIME_S = 1.0


@dataclass(frozen=True)
class CompletedRun:
    """What one completed job measured: its GPUs, runtime, energy and prompts."""

    job_id: int
    workload: str
    model: str
    gpus: int
    runtime_s: float
    energy_j: float
    prompts: int
    owner_uid: int | None = None
    # the operating point it was planned at, and its SLOs (to restate it at the seed's point)
    max_batch: int | None = None
    precision: str | None = None
    tp: int | None = None
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    latency_slo_ms: float | None = None


def learned_profiles(conn: Connection) -> tuple[Profile, ...]:
    """Every learned profile, ordered by (workload, model): one per stored row, and one per
    seeded GPU model of a workload that has runs on other models only (its seed corrected
    by those runs)."""
    from policies.model.energy import seed_profiles

    rows = conn.execute(select(workload_profiles).order_by(workload_profiles.c.workload,
                                                           workload_profiles.c.model))
    seeds = {(p.workload, p.model): p for p in seed_profiles()}
    by_workload: dict[str, dict[str, object]] = {}
    for r in rows:
        by_workload.setdefault(r.workload, {})[r.model] = r
    return tuple(p for workload, here in by_workload.items()
                 for p in _profiles_of(workload, here, seeds).values())


def _runs(row) -> list[Run]:
    if row is None:
        return []
    if row.runs is None:  # learned before runs were kept: its figures stand for one run
        return [Run(row.prompts_per_s, row.power_w)] if row.samples else []
    # [prompts_per_s, power_w, owner uid]; runs learned before owners were kept have no uid
    return [Run(float(r[0]), float(r[1]), int(r[2]) if len(r) > 2 and r[2] is not None else None)
            for r in row.runs]


def _stored(r: Run) -> list:
    return [r.prompts_per_s, r.power_w, r.user]


def _profiles_of(workload: str, rows: dict, seeds: dict) -> dict[str, Profile]:
    """`policies.model.learning.learned_by_model` over the workload's stored rows, each profile
    counting the row's runs ever (0: a seed corrected by the other models' runs)."""
    learned = learned_by_model(workload, {m: _runs(r) for m, r in rows.items()}, seeds)
    return {m: replace(p, samples=rows[m].samples if m in rows else 0) for m, p in learned.items()}


def _nan_if_none(v: float | None) -> float:
    return math.nan if v is None else v


def _none_if_nan(v: float) -> float | None:
    return None if v is None or math.isnan(v) else v


def completed_run(conn: Connection, job_id: int, *, gpu_energy_j: float | None = None) -> CompletedRun | None:
    """The measurement a completed job offers for learning, or None when it offers none
    (not COMPLETED, no workload class or prompts, no measured energy, mixed GPU models)."""
    job = run_to_learn_from(conn, job_id)
    if job is None or job.state != State.COMPLETED.value:
        return None
    if job.power_limit_w is not None:
        # Observations at different power limits are kept apart (issue 29): a run under a
        # cap is slower and draws less than the same work at the default limit, so folding
        # it into the (workload, model) profile would teach the planner a GPU that is not
        # there. The planner's capped estimates come from the cap response instead.
        return None
    energy_j = gpu_energy_j if gpu_energy_j is not None else job.energy_j
    prompts = job.reported_prompts or job.prompts
    if not job.workload or not prompts or not energy_j or energy_j <= 0:
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
                        prompts=int(prompts), owner_uid=job.owner_uid, max_batch=job.planned_max_batch, precision=job.planned_precision,
                        tp=job.planned_tp, ttft_slo_ms=job.ttft_slo_ms, tpot_slo_ms=job.tpot_slo_ms,
                        latency_slo_ms=job.latency_slo_ms)


def fold_run(conn: Connection, run: CompletedRun, now: datetime) -> Profile | None:
    """Add one measured run to its (workload, model) row in the store and return the
    profile it now gives (`policies.model.learning.estimate` over the row's recent runs); None,
    storing nothing, for a run more than `policies.model.learning.MAX_SEED_FACTOR` off its seed."""
    from policies.model.energy import seed_equivalent_run, seed_profiles
    from policies.model.perf_model import OperatingPoint

    q = select(workload_profiles).where(workload_profiles.c.workload == run.workload)
    if conn.dialect.name == "postgresql":
        q = q.with_for_update()
    rows = {r.model: r for r in conn.execute(q)}
    row = rows.get(run.model)
    measured = seed_equivalent_run(
        QueuedJob(run.job_id, run.gpus, 0.0, now, workload=run.workload, latency_slo_ms=run.latency_slo_ms,
                  ttft_slo_ms=run.ttft_slo_ms, tpot_slo_ms=run.tpot_slo_ms),
        run.model, Run.of(gpus=run.gpus, runtime_s=run.runtime_s, energy_j=run.energy_j, prompts=run.prompts,
                          user=run.owner_uid),
        OperatingPoint(run.max_batch, run.precision or "bf16", run.tp or 1) if run.max_batch else None)
    seeds = {(p.workload, p.model): p for p in seed_profiles()}
    seed = seeds.get((run.workload, run.model))
    if is_outlier(measured, seed):
        log.warning("job %s: not learned from: %.3g prompts/s at %.0f W per GPU on %s is far off the seed "
                    "model's %.3g prompts/s at %.0f W for %s (a wrong --prompts, a stall, another program?)",
                    run.job_id, measured.prompts_per_s, measured.power_w, run.model, seed.prompts_per_s,
                    seed.power_w, run.workload)
        return None
    runs = keep(_runs(row), measured)
    samples = (row.samples if row is not None else 0) + 1
    pending = SimpleNamespace(runs=[_stored(r) for r in runs], samples=samples)
    new = _profiles_of(run.workload, {**rows, run.model: pending}, seeds)[run.model]
    values = dict(prompts_per_s=new.prompts_per_s, power_w=new.power_w,
                  latency_p50_ms=_none_if_nan(new.latency_p50_ms),
                  latency_p95_ms=_none_if_nan(new.latency_p95_ms),
                  samples=samples, source=new.source, updated_at=now, runs=pending.runs)
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


def _figures(p: Profile) -> dict:
    """One profile's figures per GPU, JSON-ready (NaN as None)."""
    return {"prompts_per_s": p.prompts_per_s, "power_w": p.power_w,
            "j_per_prompt": p.power_w / p.prompts_per_s if p.prompts_per_s > 0 else None,
            "latency_p95_ms": _none_if_nan(p.latency_p95_ms), "source": p.source or None}


def learned_view(conn: Connection, workload: str | None = None) -> list[dict]:
    """Every learned profile beside the seed it corrects, JSON-ready, ordered by (workload,
    model): what `carbonsched profiles` shows and GET /v1/profiles returns.

    Each entry: `workload`, `model`, `runs` (completed runs ever folded into this row; 0 for
    a seed corrected only by the workload's runs on other GPU models), `runs_kept` (the
    recent runs the estimate is the median of, at most `policies.model.learning.WINDOW`),
    `rel_uncertainty` (of throughput; None below two runs), `updated_at` (ISO 8601 UTC or
    None), `seed` and `learned`: per GPU `prompts_per_s`, `power_w`, `j_per_prompt`,
    `latency_p95_ms`, `source` (`seed` is None for a workload without a seed profile).
    """
    from policies.model.energy import seed_profiles

    q = select(workload_profiles.c.workload, workload_profiles.c.model, workload_profiles.c.runs,
               workload_profiles.c.samples, workload_profiles.c.updated_at)
    if workload is not None:
        q = q.where(workload_profiles.c.workload == workload)
    stored = {(r.workload, r.model): r for r in conn.execute(q)}
    seeds = {(p.workload, p.model): p for p in seed_profiles()}
    out = []
    for p in learned_profiles(conn):
        if workload is not None and p.workload != workload:
            continue
        row = stored.get((p.workload, p.model))
        seed = seeds.get((p.workload, p.model))
        out.append({"workload": p.workload, "model": p.model, "runs": p.samples,
                    "runs_kept": len(_runs(row)),
                    "rel_uncertainty": _none_if_nan(p.rel_uncertainty),
                    "updated_at": None if row is None else iso(row.updated_at),
                    "seed": None if seed is None else _figures(seed), "learned": _figures(p)})
    return out


def reset_profiles(conn: Connection, workload: str | None = None, model: str | None = None) -> int:
    """Forget the learned profiles of `workload` on `model` (None: every one), so the planner
    goes back to the seeds; returns how many (workload, model) rows were deleted. What
    `carbonsched profiles reset` does, for operators only (the API checks)."""
    q = delete(workload_profiles)
    if workload is not None:
        q = q.where(workload_profiles.c.workload == workload)
    if model is not None:
        q = q.where(workload_profiles.c.model == model)
    return conn.execute(q).rowcount
