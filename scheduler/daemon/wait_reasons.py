"""Why a queued job waits, in Slurm's words: `Priority` or `Resources`, added to the REASON
the planner stores for it (what `carbonsched show` prints, and `queue` for a pending job).

A policy's explanation says where and when a job runs and what carbon chose; it does not say
whose work a job waits behind. One rule, per queued job not pinned, from the snapshot and the
committed plan alone (pure; no store, no clock):

1. Its *earliest start*: the first time at which some GPUs that fit it (a model, memory and
   count the planner's own rules accept, `policies.pricing.feasibility`) on one node are free
   of the running jobs, every plan ignored (`GpuSlot.busy_until`; healthy, not drained).
2. A job planned to start within one planning slot (`Snapshot.slot_s`) of that start waits
   for nothing but running work: `Resources` if that start is more than a slot away, else
   no word (it starts now).
3. A job planned later than that (or left unplaced) is looked at on the GPUs free of running
   jobs at its earliest start, over its run there: if some node has enough of them that no
   other plan holds, it waits by choice (carbon: the policy's explanation says why) and gets
   no word; else if some node has enough that no plan of a *higher priority* holds, it waits
   behind work of its own priority or below (`Resources`); else it waits because jobs of a
   higher priority are planned on the GPUs it would get (`Priority`).

The words name no other job: a user reads their own job's reason, never another user's job.
Only the earliest start is looked at (cheap: a few GPUs per job); a job blocked there by a
higher priority and free later only for carbon's sake still says `Priority`, which is the
reason it is not starting then. Power budgets are not counted: they show in the explanation.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timedelta

from policies.model.energy import ProfileBook
from policies.pricing.feasibility import GpuKind, estimated_runtime_s, kind_verdict
from policies.types import Assignment, GpuSlot, Plan, QueuedJob, Snapshot
from scheduler.job_specs import PRIORITY_WORD as PRIORITY, RESOURCES_WORD as RESOURCES, wait_word


CLAUSE = "waits: "  # how the clause starts; it ends with the word in brackets
Interval = tuple[datetime, datetime, float, int]  # start, end, priority, job id of a plan on one GPU


def _clock(now: datetime, t: datetime) -> str:
    """`t` as the policies' explanations write a time: 14:00, or 14:00 (+1d) on a later day."""
    days = (t.date() - now.date()).days
    return f"{t:%H:%M}" + (f" (+{days}d)" if days else "")


def _at(now: datetime, t: datetime) -> str:
    return "now" if (t - now).total_seconds() < 1 else f"at {_clock(now, t)}"


class _Fleet:
    """The GPUs a job may take, by (node, model, memory), with when each is free of running
    work, and the plans that hold each GPU, sorted by start."""

    def __init__(self, snapshot: Snapshot, plan: Plan, priority: dict[int, float]) -> None:
        self.now = snapshot.now
        groups: dict[tuple[str, str, float], list[GpuSlot]] = defaultdict(list)
        for g in snapshot.gpus:
            if g.healthy and not g.drained:
                groups[(g.node, g.model, float(g.memory_gib))].append(g)
        # each group's GPUs by when they are free of running jobs
        self.groups = {key: sorted(gs, key=self.free_at) for key, gs in groups.items()}
        held: dict[int, list[Interval]] = defaultdict(list)
        pause = {j.id for j in snapshot.jobs if j.interruptible == "pause"}
        for a in plan.assignments:
            p = priority.get(a.job_id, 0.0)
            for start, end in _spans(a, snapshot, a.job_id in pause):
                for gid in a.gpu_ids:
                    held[gid].append((start, end, p, a.job_id))
        self.held = {gid: sorted(iv) for gid, iv in held.items()}
        self.ends = {gid: [iv[1] for iv in ivs] for gid, ivs in self.held.items()}
        self._windows: dict[tuple, tuple[int, frozenset[int], int]] = {}

    def free_at(self, g: GpuSlot) -> datetime:
        return self.now if g.busy_until is None or g.busy_until < self.now else g.busy_until

    def holders(self, gid: int, start: datetime, end: datetime, priority: float,
                but: int | None = None) -> tuple[bool, bool]:
        """Whether plans (but job `but`'s) hold GPU `gid` over [start, end): (any plan, a
        plan of a priority above `priority`)."""
        intervals = self.held.get(gid)
        if not intervals:
            return False, False
        # plans on one GPU do not overlap: their ends rise with their starts
        i = bisect.bisect_right(self.ends[gid], start)
        anyone = higher = False
        for s, e, p, job_id in intervals[i:]:
            if s >= end:
                break
            if job_id == but or e <= start:
                continue
            anyone = True
            higher = higher or p > priority
        return anyone, higher

    def window(self, key: tuple[str, str, float], start: datetime, end: datetime,
               priority: float) -> tuple[int, frozenset[int], int]:
        """Group `key`'s GPUs free of running jobs at `start`: how many, those a plan holds
        over [start, end), and how many no plan of a priority above `priority` holds then.
        Asked once per group, window and priority (jobs of one shape share them)."""
        ask = (key, start, end, priority)
        got = self._windows.get(ask)
        if got is None:
            free = [g.id for g in self.groups[key] if self.free_at(g) <= start]
            flags = [self.holders(gid, start, end, priority) for gid in free]
            got = self._windows[ask] = (len(free), frozenset(gid for gid, (anyone, _) in zip(free, flags) if anyone),
                                        sum(not higher for _, higher in flags))
        return got


def _spans(a: Assignment, snapshot: Snapshot, pause: bool) -> list[tuple[datetime, datetime]]:
    """When a plan holds its GPUs: its run, or a checkpoint job's segments (a `pause` job
    holds them through its pauses)."""
    if a.segments:
        if pause:
            return [(a.segments[0][0], a.segments[-1][1])]
        return list(a.segments)
    if a.estimate.finish_at is not None:
        return [(a.start_at, a.estimate.finish_at)]
    if a.estimate.runtime_s is not None:
        return [(a.start_at, a.start_at + timedelta(seconds=a.estimate.runtime_s))]
    return [(a.start_at, snapshot.now + timedelta(seconds=snapshot.horizon_s))]


def _job_key(j: QueuedJob) -> tuple:
    return (j.workload, j.gpus, j.gpu_mem_gib, j.ttft_slo_ms, j.tpot_slo_ms, j.latency_slo_ms, j.time_limit_s,
            j.prompts, j.est_runtime_s, j.seed_profile)


def wait_reasons(snapshot: Snapshot, plan: Plan, book: ProfileBook | None = None) -> dict[int, str]:
    """The queued jobs that wait for `Priority` or `Resources` (the module's rule), with the
    clause to add to their reason, e.g. "waits: the GPUs free for it now are planned for
    jobs of a higher priority (Priority)"."""
    placed = plan.by_job()
    tol = timedelta(seconds=snapshot.slot_s)
    # a job planned to start within a slot waits for nothing (its earliest start is now or later)
    jobs = [j for j in snapshot.jobs if not j.pinned
            and (j.id not in placed or placed[j.id].start_at > snapshot.now + tol)]
    if not jobs or not snapshot.gpus:
        return {}
    fleet = _Fleet(snapshot, plan, {j.id: float(j.priority) for j in snapshot.jobs})
    shapes = _Shapes(fleet, book if book is not None else ProfileBook(snapshot.profiles), snapshot.default_runtime_s)
    out = {}
    for j in jobs:
        word = _word(j, placed.get(j.id), shapes, fleet, tol)
        if word is not None:
            out[j.id] = word
    return out


class _Shapes:
    """Which GPU groups take a job, and its runtime on a model, asked once per job shape and
    GPU kind (a queue has few shapes; a fleet few kinds)."""

    def __init__(self, fleet: _Fleet, book: ProfileBook, default_runtime_s: float) -> None:
        self.fleet, self.book, self.default_runtime_s = fleet, book, default_runtime_s
        self._kinds: dict[GpuKind, list[tuple[str, str, float]]] = defaultdict(list)
        for key, gs in fleet.groups.items():
            self._kinds[GpuKind(key[1], key[2], len(gs))].append(key)
        self._fitting: dict[tuple, tuple[list[tuple[str, str, float]], datetime | None]] = {}
        self._runtime: dict[tuple, float] = {}

    def fitting(self, j: QueuedJob) -> tuple[list[tuple[str, str, float]], datetime | None]:
        """The GPU groups (node, model, memory) that can take `j`, and the earliest time at
        which one of them has `j.gpus` GPUs free of running jobs (None: none can take it)."""
        key = _job_key(j)
        got = self._fitting.get(key)
        if got is None:
            groups = [g for kind, keys in self._kinds.items()
                      if kind_verdict(j, kind, self.book, self.default_runtime_s) is None for g in keys]
            k, fleet = max(1, j.gpus), self.fleet
            earliest = min((fleet.free_at(fleet.groups[g][k - 1]) for g in groups), default=None)
            got = self._fitting[key] = (groups, earliest)
        return got

    def runtime_s(self, j: QueuedJob, model: str) -> float:
        key = (_job_key(j), model)
        got = self._runtime.get(key)
        if got is None:
            got = self._runtime[key] = estimated_runtime_s(j, model, self.book, self.default_runtime_s)
        return got


def _word(j: QueuedJob, a: Assignment | None, shapes: _Shapes, fleet: _Fleet, tol: timedelta) -> str | None:
    """`j`'s clause by the module's rule, or None."""
    k = max(1, j.gpus)
    fitting, earliest = shapes.fitting(j)
    if earliest is None:
        return None
    if a is not None and a.start_at <= earliest + tol:
        if earliest - fleet.now > tol:
            return f"{CLAUSE}the GPUs that fit it are busy with running jobs until {_clock(fleet.now, earliest)} " \
                   f"({RESOURCES})"
        return None
    free_of_higher = False
    priority = float(j.priority)
    ends: dict[str, datetime] = {}  # by GPU model
    for key in fitting:
        end = ends.get(key[1])
        if end is None:
            end = ends[key[1]] = earliest + timedelta(seconds=shapes.runtime_s(j, key[1]))
        free, held, not_higher = fleet.window(key, earliest, end, priority)
        if free < k:
            continue
        unheld = free - len(held)
        if a is not None and a.node == key[0]:  # its own plan is not work it waits behind
            unheld += sum(1 for gid in a.gpu_ids
                          if gid in held and not fleet.holders(gid, earliest, end, priority, but=j.id)[0])
        if unheld >= k:
            return None  # it could start there: it waits by choice (carbon), as its explanation says
        free_of_higher = free_of_higher or not_higher >= k
    when = _at(fleet.now, earliest)
    if free_of_higher:
        return f"{CLAUSE}the GPUs free for it {when} are planned for other jobs of its priority ({RESOURCES})"
    return f"{CLAUSE}the GPUs free for it {when} are planned for jobs of a higher priority ({PRIORITY})"


def without_clause(text: str) -> str:
    """`text` without the clause a tick added (a kept or pinned plan comes back from the store
    with the explanation stored, clause and all)."""
    if wait_word(text) is None:
        return text
    at = text.rfind(f"; {CLAUSE}")
    return text[:at] if at >= 0 else "" if text.startswith(CLAUSE) else text


def _with(text: str, clause: str | None) -> str:
    text = without_clause(text)
    if clause is None:
        return text
    return f"{text}; {clause}" if text else clause


def with_wait_reasons(snapshot: Snapshot, plan: Plan, book: ProfileBook | None = None) -> Plan:
    """`plan` with each waiting job's clause (`wait_reasons`) added to its explanation or its
    unplaced reason, and an earlier tick's clause taken off every other."""
    words = wait_reasons(snapshot, plan, book)
    assignments = tuple(replace(a, explanation=_with(a.explanation, words.get(a.job_id)))
                        if a.job_id in words or wait_word(a.explanation) else a for a in plan.assignments)
    unplaced = {i: (_with(str(why), words.get(i)) if i in words or wait_word(str(why)) else why)
                for i, why in plan.unplaced.items()}
    return Plan(assignments=assignments, unplaced=unplaced)
