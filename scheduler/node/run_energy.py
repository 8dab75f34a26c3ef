"""The energy of a job's run on this node: its GPUs' stored samples between its start and its
end, with exact readings at both ends, plus its share of the node's static power where
configured. Emulated GPUs are a power model, never a meter: their energy is "modelled".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

from scheduler.samples import SampleStore, energy_note_of
from scheduler.node.executor import RunStatus
from telemetry.energy import MODELLED, Sample
from telemetry.gpu import GpuBackend, GpuError

log = logging.getLogger(__name__)


class RunEnergy:
    """Measures runs' energy on one node. `flush` writes the sampler's buffered readings to
    the store (the agent's); `uuid_of` is the agent's store GPU id -> UUID map, shared."""

    def __init__(self, samples: SampleStore, backend: GpuBackend, uuid_of: dict[int, str],
                 flush: Callable[[], object], node_static_w: float) -> None:
        self.samples = samples
        self.backend = backend
        self._uuid_of = uuid_of
        self.flush = flush
        self.node_static_w = node_static_w

    def read_now(self, gpu_ids: list[int]) -> dict[str, list]:
        """[t_s, power_w, energy_j] of each GPU now, for exact job start and end points."""
        out: dict[str, list] = {}
        for gid in gpu_ids:
            uuid = self._uuid_of.get(gid)
            if uuid is None:
                continue
            try:
                r = self.backend.read(uuid)
            except GpuError as e:
                log.warning("GPU %s unreadable: %s", gid, e)
                continue
            out[str(gid)] = [time.time(), r.power_w, r.energy_j]
        return out

    def measure(self, job, status: RunStatus, ended: datetime) -> tuple[float | None, str | None, str | None]:
        """Energy of the job's GPUs over its run from samples and the start/end readings,
        plus its share of the node's static power when configured; with the method and a
        note on why GPUs were not measured by their counter. `job`: the run as measured
        (its id, GPUs and start)."""
        gpu_ids = [int(g) for g in (job.gpu_ids or [])]
        if not gpu_ids or job.started_at is None:
            return None, None, None
        self.flush()
        start_s, end_s = job.started_at.timestamp(), ended.timestamp()
        extra: dict[int, list[Sample]] = {}
        start = ((status.spec or {}).get("extra") or {}).get("start_readings") or {}
        for gid, (t, p, e) in start.items():
            extra.setdefault(int(gid), []).append(Sample(t, p, e))
        for gid, (t, p, e) in self.read_now(gpu_ids).items():
            extra.setdefault(int(gid), []).append(Sample(t, p, e))
        measured = self.samples.job_energy(gpu_ids, start_s, end_s, extra)
        if measured.energy_j is None:
            return None, None, None
        energy, method = measured.energy_j, measured.method
        if self.backend.emulated:  # the emulator's power model, not a meter: never "counter"
            method = MODELLED
        if self.node_static_w > 0 and self._uuid_of:
            share = len(gpu_ids) / len(self._uuid_of)
            energy += self.node_static_w * share * max(0.0, end_s - start_s)
            method += "+static"
        return energy, method, energy_note_of(measured.per_gpu)

    def of_pieces(self, job) -> Callable[[datetime, datetime], float | None]:
        """Energy of the job's GPUs over a part of its run, from the stored samples (the
        pieces of a pause job's run; scaled to the run's measured total by the caller)."""
        gpu_ids = [int(g) for g in (job.gpu_ids or [])]

        def energy_of(a: datetime, b: datetime) -> float | None:
            return self.samples.job_energy(gpu_ids, a.timestamp(), b.timestamp(), {}).energy_j

        return energy_of

    def gpus_only(self, job, ended: datetime, energy_j: float, method: str | None) -> float:
        """A run's energy without the node's static share (what workload profiles hold)."""
        if method and method.endswith("+static") and job.started_at is not None and self._uuid_of:
            share = len(job.gpu_ids or []) / len(self._uuid_of)
            run_s = max(0.0, (ended - job.started_at).total_seconds())
            return max(0.0, energy_j - self.node_static_w * share * run_s)
        return energy_j
