"""The simulated cluster's GPUs: which are healthy, what is reserved and running on each,
and how the planner sees them (`GpuSlot.busy_until`), as the daemon shows its nodes' GPUs."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from policies.model.margin import OVERRUN_BUSY_S
from policies.types import GpuSlot, QueuedJob
from scheduler.simulate.cluster import ClusterSpec
from scheduler.simulate.records import EPS_S, JobRecord, at



class GpuLedger:
    """Per GPU (ids 0..N-1, the cluster's order): health, when the work given to it is planned
    to end (`free_at`), the jobs reserved on it in commit order and the job really running.

    `margin(record)` is the deadline margin a running job's planned runtime is stretched by
    (`policies.model.margin.job_margin`, with what the planner knows now).
    """

    def __init__(self, cluster: ClusterSpec, records: list[JobRecord], margin: Callable[[JobRecord], float]) -> None:
        self.slots: list[GpuSlot] = list(cluster.gpu_slots())
        self.records = records
        self.margin = margin
        n = len(self.slots)
        self._busy_key: list[float | str | None] = [None] * n  # what each cached slot shows
        self.free_at = [-math.inf] * n
        self.healthy = [True] * n
        self.reservations: list[list[int]] = [[] for _ in range(n)]  # job indices in commit order
        self.running_on: list[int | None] = [None] * n  # the job really running on each GPU

    def __len__(self) -> int:
        return len(self.slots)

    def view(self, now_s: float) -> tuple[GpuSlot, ...]:
        """The GPUs as a policy sees them at `now_s`: busy until the planned end of their work
        (a running job's with its deadline margin), down while failed."""
        slots = self.slots
        for g in range(len(slots)):
            fa = self.free_at[g]
            planned_end = fa
            if self.running_on[g] is not None:  # expected to run by its estimate + deadline margin
                r = self.records[self.running_on[g]]
                planned_end = r.start_s + r.planned_runtime_s * self.margin(r)
                fa = max(fa, planned_end)
            if self.running_on[g] is not None and fa <= now_s + EPS_S:
                # running past its estimate: "ends soon", as the daemon says, or, once it has
                # overrun by more than that, as long again as it has overrun so far (a job's
                # remaining time grows with its overrun when estimates err by factors)
                fa = now_s + max(OVERRUN_BUSY_S, now_s - planned_end)
            key = fa if fa > now_s + EPS_S else None
            if not self.healthy[g]:
                key = "down"
            if key != self._busy_key[g]:
                s = slots[g]
                slots[g] = replace(s, healthy=self.healthy[g],
                                   busy_until=at(fa) if (key is not None and key != "down") else None)
                self._busy_key[g] = key
        return tuple(slots)

    def refusal(self, job: QueuedJob, ids: tuple[int, ...], start_s: float) -> str | None:
        """Why `job` may not start on GPUs `ids` at `start_s` (an agent's claim check), or None."""
        if len(ids) != job.gpus or len(set(ids)) != len(ids) or any(not 0 <= g < len(self.slots) for g in ids):
            return f"needs {job.gpus} distinct known GPUs, got {ids}"
        first = self.slots[ids[0]]
        for g in ids:
            s = self.slots[g]
            if s.node != first.node or s.model != first.model:
                return "GPUs span nodes or models"
            if not self.healthy[g]:
                return f"GPU {g} is down"
            if self.free_at[g] > start_s + EPS_S:
                return f"GPU {g} busy until {at(self.free_at[g]).isoformat()}"
            if s.memory_gib < job.gpu_mem_gib:
                return f"GPU {g} has too little memory"
        return None

    def reserve(self, idx: int, ids: tuple[int, ...], end_s: float) -> None:
        """Give GPUs `ids` to job `idx` until its planned end."""
        for g in ids:
            self.free_at[g] = end_s
            self.reservations[g].append(idx)

    def blocker(self, idx: int, ids: tuple[int, ...]) -> int | None:
        """A GPU of `ids` still running another job than `idx`, or None."""
        return next((g for g in ids if self.running_on[g] not in (None, idx)), None)

    def occupy(self, idx: int, ids: tuple[int, ...], late: bool, end_s: float) -> None:
        """Job `idx` runs on `ids` from now; started `late`, the planner's view moves to `end_s`."""
        for g in ids:
            self.running_on[g] = idx
            if late:
                self.free_at[g] = max(self.free_at[g], end_s)

    def release(self, idx: int, ids: tuple[int, ...], now_s: float) -> None:
        """Free job `idx`'s GPUs (done or evicted): the planner's view goes back to the planned
        ends of the jobs still reserved there."""
        records = self.records
        for g in ids:
            res = self.reservations[g]
            if idx in res:
                res.remove(idx)
            ends = [records[i].start_s + records[i].planned_runtime_s for i in res
                    if records[i].start_s is not None]
            self.free_at[g] = max(ends + [now_s])
            if self.running_on[g] == idx:
                self.running_on[g] = None

    def behind_overruns(self, now_s: float) -> set[int]:
        """The committed jobs waiting on GPUs whose running job is past its planned end (with
        its deadline margin): their plans assumed GPUs that are not free."""
        behind: set[int] = set()
        for g, ridx in enumerate(self.running_on):
            if ridx is None or not self.reservations[g]:
                continue
            rr = self.records[ridx]
            planned_end = rr.start_s + rr.planned_runtime_s * self.margin(rr)
            if now_s <= planned_end + EPS_S:
                continue
            behind.update(i for i in self.reservations[g] if i != ridx and self.records[i].state == "committed")
        return behind

    def set_health(self, g: int, healthy: bool) -> None:
        """GPU `g` fails or is repaired (its cached slot is rebuilt at the next view)."""
        self.healthy[g] = healthy
        self._busy_key[g] = "x"  # force a fresh GpuSlot
