"""What the parts of one simulation run share: the clock, the jobs and their queue, the GPUs,
the power meters, what the planner knows, and the run's counters (`SimState`)."""

from __future__ import annotations

import math

import simpy

from scheduler.simulate.gpus import GpuLedger
from scheduler.simulate.intensity import ZoneIntensity
from scheduler.simulate.knowledge import Knowledge
from scheduler.simulate.power import SitePower
from scheduler.simulate.records import JobRecord
from scheduler.simulate.settings import SimSettings


class SimState:
    """The shared state of one `Simulation`: `records` sorted by arrival (then job id),
    `index` (job id -> record index), the `queue` (job id -> record index, in arrival order),
    the SimPy clock `env` (epoch seconds, from the tick before the first arrival) and the
    counters the outcome reports."""

    def __init__(self, settings: SimSettings, records: list[JobRecord], carbon: dict[str, ZoneIntensity],
                 pue: dict[str, float], gpus: GpuLedger, power: SitePower, knowledge: Knowledge) -> None:
        self.settings = settings
        self.records = records
        self.index = {r.job.id: i for i, r in enumerate(records)}
        self.queue: dict[int, int] = {}
        self.carbon = carbon
        self.pue = pue
        self.gpus = gpus
        self.power = power
        self.knowledge = knowledge
        self.events = 0
        self.done = 0
        self.failures = 0
        self.replanned_behind_overruns = 0
        self.changes = 0  # bumps with every change a plan depends on (a plan per state)
        first = records[0].arrival_s if records else 0.0
        self.t0 = math.floor(first / settings.plan_interval_s) * settings.plan_interval_s
        self.env = simpy.Environment(initial_time=self.t0)
        self.all_done = self.env.event()
        self.priorities = None  # SimPriorities where the run's jobs have more than one standing

    def next_tick(self, now_s: float) -> float:
        """The time of the first planner tick after `now_s`."""
        step = self.settings.plan_interval_s
        k = math.floor((now_s - self.t0) / step + 1e-9) + 1
        return self.t0 + k * step

    def requeue(self, idx: int) -> None:
        """Put record `idx` back in the queue, which stays in arrival order."""
        self.queue[self.records[idx].job.id] = idx
        self.queue = dict(sorted(self.queue.items(), key=lambda kv: kv[1]))

    def workload_of(self, job_id: int) -> str | None:
        """The workload class of a job, as the planner last saw it."""
        return self.records[self.index[job_id]].job.workload

    def job_done(self) -> None:
        """One more job finished; the run ends when all have."""
        self.done += 1
        if self.done == len(self.records) and not self.all_done.triggered:
            self.all_done.succeed()
