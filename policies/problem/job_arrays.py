"""The queued jobs against every GPU group at once, as (jobs x groups) arrays.

What the planning problem (`policies.problem.instance`) knows of each job on each group of the
fleet's `policies.problem.topology`, compiled for all jobs at once from the energy model
(`energy.shape_arrays`) and the estimate margins (`policies.model.margin`): whether it fits and
why not, its runtime, power and grams per g/kWh x s there, its duration in slots and its
start window. The joint choice of GPU power limits (`policies.problem.joint_caps`) then rewrites
the arrays of the jobs it caps, before the policies read them as `Problem.job_*`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Sequence

import numpy as np

from policies.model.energy import ProfileBook, shape_arrays
from policies.model.margin import duration_slots, latest_start_slots, margin_arrays
from policies.types import J_PER_KWH, QueuedJob, Snapshot
from policies.problem.slot_grid import SlotGrid
from policies.problem.topology import Group

WHY = {1: "memory", 2: "slo", 3: "gang", 4: "time limit"}  # JobArrays.job_why codes


@dataclass
class JobArrays:
    """(jobs x groups) arrays, unless said per job; named as `Problem` exposes them.

    `job_fit[j, g]`: the job can run on pools of group g (memory, its operating point's
    memory and latency SLOs (`energy.shape_arrays`), its explicit time limit, and some pool
    with at least k usable GPUs); `job_why` says why not (`WHY`: 1 memory, 2 slo, 3 gang,
    4 time limit). `job_runtime_s`, `job_power_w` (IT, k GPUs), `job_scale` (power x PUE /
    3.6e6), `job_duration` (slots) and `job_latest` (last start slot) hold for every pair,
    fit or not. The window's two ends apart: `job_hard_latest` (max delay, horizon) per job,
    and `job_on_time_latest`, the last on-time start per (job, group) (may lie before
    `job_earliest`, or past the horizon). `margin` and `deadline_s` (per job, NaN: none)
    are what the joint caps re-price windows with; the `job_cap_w` / `job_uncapped_*`
    arrays are theirs (`policies.problem.joint_caps.choose`)."""

    job_runtime_s: np.ndarray
    job_power_w: np.ndarray
    job_resumed: np.ndarray  # per job: an interrupted job, resuming
    job_scale: np.ndarray
    job_k: np.ndarray  # per job: GPUs
    job_why: np.ndarray
    job_fit: np.ndarray
    group_largest_pool: np.ndarray  # per group: GPUs of its largest pool (node)
    job_earliest: np.ndarray  # per job: first start slot (release)
    job_duration: np.ndarray
    job_latest: np.ndarray
    job_hard_latest: np.ndarray
    job_on_time_latest: np.ndarray
    margin: np.ndarray
    deadline_s: np.ndarray
    job_cap_w: np.ndarray | None = None  # NaN: the default limit
    job_uncapped_runtime_s: np.ndarray | None = None
    job_uncapped_power_w: np.ndarray | None = None


def compile_job_arrays(snapshot: Snapshot, jobs: Sequence[QueuedJob], groups: Sequence[Group],
                       pool_size: np.ndarray, book: ProfileBook, grid: SlotGrid) -> JobArrays:
    """Every job against every group at once (see `JobArrays`)."""
    n_jobs, n_groups = len(jobs), len(groups)
    # one column per (model, power limit): a capped GPU never draws more than its cap
    kinds = sorted({(g.model, g.power_limit_w or 0.0) for g in groups})
    kind_index = {m: i for i, m in enumerate(kinds)}
    gm = np.array([kind_index[(g.model, g.power_limit_w or 0.0)] for g in groups], dtype=np.int64)
    shapes = shape_arrays(jobs, [m for m, _ in kinds], book, snapshot.default_runtime_s,
                          [cap or None for _, cap in kinds])
    job_runtime_s = shapes.runtime_s[:, gm].reshape(n_jobs, n_groups)
    job_power_w = shapes.power_w[:, gm].reshape(n_jobs, n_groups)
    # an interrupted job has only the rest of its work left, plus one resume
    job_resumed = np.array([j.done_fraction > 0 or j.resume_count > 0 for j in jobs], dtype=bool)
    if job_resumed.any():
        left = np.array([max(0.0, 1.0 - j.done_fraction) for j in jobs])
        resume = np.array([j.resume_cost_s if r else 0.0 for j, r in zip(jobs, job_resumed)])
        job_runtime_s = np.maximum(1.0, job_runtime_s * left[:, None] + resume[:, None])
    pue = np.array([g.pue for g in groups], dtype=np.float64)
    job_scale = job_power_w * pue[None, :] / J_PER_KWH
    job_k = np.array([max(1, j.gpus) for j in jobs], dtype=np.int64)

    mem = np.array([j.gpu_mem_gib for j in jobs], dtype=np.float64)
    group_mem = np.array([g.memory_gib for g in groups], dtype=np.float64)
    # the operating point's verdict (1: no point fits in memory, 2: none meets the SLOs)
    why = shapes.why[:, gm].reshape(n_jobs, n_groups).copy()
    why[group_mem[None, :] < mem[:, None]] = 1  # the job's own --gpu-mem is checked first
    # an explicit time limit binds: no option that runs longer by the model's own estimate
    limit_s = np.array([np.inf if j.time_limit_s is None else j.time_limit_s for j in jobs], dtype=np.float64)
    why[(why == 0) & (job_runtime_s > limit_s[:, None] * (1 + 1e-9))] = 4
    largest = np.array([int(pool_size[list(g.pools)].max()) for g in groups], dtype=np.int64)
    why[(why == 0) & (largest[None, :] < job_k[:, None])] = 3

    earliest, limit, deadline_s = _release_and_limits(jobs, grid)
    job_duration = duration_slots(job_runtime_s, grid.slot_s)
    has = ~np.isnan(deadline_s)
    # the deadline with a margin for the estimate's uncertainty (policies.model.margin)
    margin = margin_arrays(jobs, [m for m, _ in kinds], book,
                           estimates=getattr(snapshot, "estimate_margin", True))[:, gm].reshape(n_jobs, n_groups)
    by_deadline = latest_start_slots(deadline_s, job_runtime_s, margin, earliest, grid.slot_s)
    by_deadline = np.where(has[:, None], by_deadline, float(grid.n_slots))
    return JobArrays(job_runtime_s=job_runtime_s, job_power_w=job_power_w, job_resumed=job_resumed,
                     job_scale=job_scale, job_k=job_k, job_why=why, job_fit=why == 0, group_largest_pool=largest,
                     job_earliest=earliest, job_duration=job_duration,
                     job_latest=np.minimum(limit[:, None], by_deadline).astype(np.int64),
                     job_hard_latest=limit, job_on_time_latest=np.clip(by_deadline, -1e9, 1e9),
                     margin=margin, deadline_s=deadline_s)


def _release_and_limits(jobs: Sequence[QueuedJob], grid: SlotGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per job: its first start slot (release), its last start slot by its maximum delay and
    the horizon, and its deadline in seconds from now (NaN: none)."""
    n_jobs = len(jobs)
    earliest = np.empty(n_jobs, dtype=np.int64)
    limit = np.full(n_jobs, grid.n_slots - 1, dtype=np.int64)
    deadline_s = np.full(n_jobs, np.nan)
    for i, job in enumerate(jobs):
        earliest[i] = grid.ceil(max(grid.now, job.submitted_at))
        # a job resuming after a checkpoint has started: its maximum delay is met
        if job.max_delay_s is not None and not (job.done_fraction > 0 or job.resume_count > 0):
            limit[i] = min(limit[i], grid.floor(job.submitted_at + timedelta(seconds=job.max_delay_s)))
        if job.deadline is not None:
            deadline_s[i] = (job.deadline - grid.now).total_seconds()
    return earliest, limit, deadline_s
