"""Committing a planned assignment in the simulated cluster: the agent's claim check, and what
the job will really do on those GPUs (the truth, a power limit, interruptible segments)."""

from __future__ import annotations

import logging

from policies.model.energy import job_shape
from policies.types import Assignment, GpuSlot
from scheduler.simulate.execution import Execution
from scheduler.simulate.records import EPS_S, JobRecord
from scheduler.simulate.state import SimState
from scheduler.simulate.truth import Truth

log = logging.getLogger(__name__)


class Dispatcher:
    """Commits the assignments of a simulation run's plans: reserves the GPUs and has
    `execution` start the job at its time.

    `truth` (`scheduler.simulate.truth`) says how a job really runs; only `commit` reads it,
    never the planner.
    """

    def __init__(self, state: SimState, truth: Truth, execution: Execution) -> None:
        self.state = state
        self.truth = truth
        self.execution = execution
        self.rejected = 0

    def commit(self, a: Assignment, start_s: float) -> int:
        """Reserve the GPUs and schedule the start, if the assignment is valid (1) else 0."""
        state = self.state
        idx = state.index.get(a.job_id)
        if idx is None:
            return self._reject(a, "unknown job")
        r = state.records[idx]
        if r.state not in ("queued", "future"):
            return self._reject(a, f"job is {r.state}")
        job = r.job
        ids = a.gpu_ids
        why = state.gpus.refusal(job, ids, start_s)
        if why is not None:
            return self._reject(a, why)
        first = state.gpus.slots[ids[0]]
        if start_s < r.arrival_s - EPS_S:
            return self._reject(a, "starts before the job is submitted")
        knowledge = state.knowledge
        default_runtime_s = state.settings.default_runtime_s
        shape = knowledge.shape(job, first.model)
        r.state = "committed"
        r.node, r.zone, r.model, r.gpu_ids = first.node, first.zone, first.model, tuple(ids)
        r.planned_runtime_s, r.planned_power_w = shape.runtime_s, shape.power_w
        r.committed_s = state.env.now
        # the truth is anchored on the real job and the scenario's own profiles, never on the
        # estimate or on what was learned since
        real = r.real or job
        base = shape if not knowledge.learned and real is job else job_shape(real, first.model, knowledge.base_book,
                                                                              default_runtime_s)
        r.runtime_s, r.power_w = self.truth.actual(real, first.model, base, default_runtime_s)
        r.power_limit_w = a.estimate.power_limit_w
        if r.power_limit_w is not None:
            _run_capped(r, first, len(ids), shape)
        r.pue = self._gpu_pue(first)
        # an interrupted job has only the rest of its work left, plus one resume
        resumed = job.done_fraction > 0 or job.resume_count > 0
        if resumed:
            left = max(0.0, 1.0 - job.done_fraction)
            r.planned_runtime_s = r.planned_runtime_s * left + job.resume_cost_s
            # its progress is a share of the work: on other GPUs, of their runtime
            r.work_done_s = job.done_fraction * r.runtime_s
        _plan_segments(r, a, first, len(ids), start_s)
        r.start_s = start_s
        r.est_gco2 = a.estimate.gco2
        r.explanation = a.explanation
        r.token += 1
        state.gpus.reserve(idx, ids, start_s + r.planned_runtime_s)
        state.queue.pop(job.id, None)
        state.changes += 1
        token = r.token
        ev = state.env.timeout(max(0.0, start_s - state.env.now))
        start = self.execution.start
        ev.callbacks.append(lambda _e, idx=idx, token=token: start(idx, token))
        return 1

    def _gpu_pue(self, gpu: GpuSlot) -> float:
        """The PUE of the site of a GPU's node (its zone's default when it has none)."""
        return float(gpu.pue) if gpu.pue is not None else float(self.state.pue.get(gpu.zone, 1.0))

    def _reject(self, a: Assignment, why: str) -> int:
        self.rejected += 1
        log.debug("assignment of job %s rejected: %s", a.job_id, why)
        return 0


def _run_capped(r: JobRecord, first: GpuSlot, n_gpus: int, shape) -> None:
    """The agent sets the job's GPU power limit; the job runs (and was planned) by the cap response."""
    from policies.model.catalog import lookup
    from policies.pricing.power_cap import capped

    vendor = lookup(first.model).vendor
    n = max(1, n_gpus)
    plan_factor, plan_w = capped(shape.power_w / n, r.power_limit_w, vendor)
    r.planned_runtime_s, r.planned_power_w = shape.runtime_s * plan_factor, plan_w * n
    factor, per_gpu_w = capped(r.power_w / n, r.power_limit_w, vendor)
    r.runtime_s, r.power_w = r.runtime_s * factor, per_gpu_w * n


def _plan_segments(r: JobRecord, a: Assignment, first: GpuSlot, n_gpus: int, start_s: float) -> None:
    """An interruptible job planned in segments: the segments of this commit (a checkpoint
    job's first one, a pause job's whole list) and the GPUs held to their end."""
    job = r.job
    r.segments = []
    r.seg_index = 0
    if len(a.segments) > 1 and job.interruptible in ("checkpoint", "pause"):
        segs = [(x.timestamp(), y.timestamp()) for x, y in a.segments]
        segs[0] = (start_s, max(start_s + EPS_S, segs[0][1]))
        r.segments = segs if job.interruptible == "pause" else segs[:1]
        # the planner sees the GPUs held to the first segment's end (checkpoint) or the
        # last one's (pause)
        r.planned_runtime_s = r.segments[-1][1] - start_s
        if job.interruptible == "pause":
            from policies.problem.segments import idle_power_w

            r.idle_w = idle_power_w(first.model, n_gpus)
