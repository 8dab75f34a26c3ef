"""Oracle: the offline lower bound for the simulator.

It is given every arrival of the trace in one snapshot (jobs with `submitted_at` in the
future are released then, never earlier) and the actual intensity as its "forecast", and
plans them all at once with the cpsat machinery over a horizon that covers the last arrival
plus the usual look-ahead, with a longer time limit. Not for the daemon: it needs the future.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from policies.solvers.cpsat import CpsatPolicy
from policies.pricing.lateness import DEFAULT_LATENESS_G_PER_GPU_H
from policies.types import Plan, Snapshot


@dataclass
class OraclePolicy:
    name: str = "oracle"
    max_time_s: float = 60.0
    workers: int = 1
    neighbourhood: int = 60
    candidates: int = 48
    # grams per GPU-hour late (policies.pricing.lateness); "strict"/inf: misses first, then grams
    lateness_g_per_gpu_h: float | str = DEFAULT_LATENESS_G_PER_GPU_H

    def plan(self, snapshot: Snapshot) -> Plan:
        last = max((j.submitted_at for j in snapshot.jobs), default=snapshot.now)
        span_s = max(0.0, (last - snapshot.now).total_seconds()) + snapshot.horizon_s
        wide = replace(snapshot, horizon_s=max(snapshot.horizon_s, span_s))
        inner = CpsatPolicy(name=self.name, max_time_s=self.max_time_s, workers=self.workers,
                            neighbourhood=self.neighbourhood, candidates=self.candidates,
                            lateness_g_per_gpu_h=self.lateness_g_per_gpu_h)
        return inner.plan(wide)
