"""FIFO: the carbon-agnostic baseline.

Jobs are taken in submission order; each gets the earliest start on one node with enough
GPUs that each have enough memory. Later jobs may start earlier on GPUs the head of the
queue cannot use (list scheduling), but never delay an earlier job's planned start.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from policies.model import Assignment, Estimate, GpuSlot, Plan, QueuedJob, Snapshot


@dataclass
class FifoPolicy:
    name: str = "fifo"

    def plan(self, snapshot: Snapshot) -> Plan:
        free_at: dict[int, datetime] = {}
        by_node: dict[str, list[GpuSlot]] = defaultdict(list)
        for gpu in snapshot.gpus:
            if not gpu.healthy:
                continue
            by_node[gpu.node].append(gpu)
            busy = gpu.busy_until
            free_at[gpu.id] = max(busy, snapshot.now) if busy else snapshot.now

        assignments: list[Assignment] = []
        unplaced: dict[int, str] = {}
        for job in sorted(snapshot.jobs, key=lambda j: (j.submitted_at, j.id)):
            best = _earliest_slot(job, by_node, free_at)
            if best is None:
                unplaced[job.id] = _why_unplaceable(job, by_node)
                continue
            start, node, gpus = best
            runtime_s = job.est_runtime_s or snapshot.default_runtime_s
            finish = start + timedelta(seconds=runtime_s)
            for gpu in gpus:
                free_at[gpu.id] = finish
            wait_s = (start - snapshot.now).total_seconds()
            when = "now" if wait_s < 1 else f"in {_human(wait_s)}"
            assignments.append(
                Assignment(
                    job_id=job.id,
                    node=node,
                    gpu_ids=tuple(g.id for g in gpus),
                    start_at=start,
                    estimate=Estimate(finish_at=finish if job.est_runtime_s else None),
                    explanation=(
                        f"fifo: {len(gpus)}x{gpus[0].model} on {node} {when}, "
                        "first free GPUs in submission order"
                    ),
                )
            )
        return Plan(assignments=tuple(assignments), unplaced=unplaced)


def _earliest_slot(
    job: QueuedJob, by_node: dict[str, list[GpuSlot]], free_at: dict[int, datetime]
) -> tuple[datetime, str, list[GpuSlot]] | None:
    """The earliest start for a job on GPUs of one model on one node (no mixed-model jobs)."""
    best: tuple[datetime, str, list[GpuSlot]] | None = None
    for node in sorted(by_node):
        by_model: dict[str, list[GpuSlot]] = defaultdict(list)
        for g in by_node[node]:
            if g.memory_gib >= job.gpu_mem_gib:
                by_model[g.model].append(g)
        for model in sorted(by_model):
            fitting = sorted(by_model[model], key=lambda g: (free_at[g.id], g.index))
            if len(fitting) < job.gpus:
                continue
            chosen = fitting[: job.gpus]
            start = max(free_at[g.id] for g in chosen)
            if best is None or start < best[0]:
                best = (start, node, sorted(chosen, key=lambda g: g.index))
    return best


def _why_unplaceable(job: QueuedJob, by_node: dict[str, list[GpuSlot]]) -> str:
    if not by_node:
        return "no healthy GPUs"
    most = max(sum(1 for g in gs if g.model == m) for gs in by_node.values() for m in {g.model for g in gs})
    if job.gpus > most:
        return f"needs {job.gpus} GPUs of one model on one node; the most any node has is {most}"
    return f"no node has {job.gpus} healthy GPUs with >= {job.gpu_mem_gib:g} GiB each"


def _human(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
