"""Jobs shorter than a planning slot, packed on the GPUs' continuous timelines.

The slot-indexed model (`problem.py`) gives every job at least one whole slot (15 minutes) on
each of its GPUs. That is the right grain for carbon: intensity changes hourly. But a queue
of short jobs (tests, evaluations, small batches) would be spread one job per GPU per slot:
fifty 2-second jobs on four GPUs would take three hours. So greedy and cpsat plan only the
jobs that run for at least a slot on every GPU model that can take them, or that must start
within the hour (`TIGHT_START_S`: after the long plan they may find no GPU in time); this
module then places the short ones, in deadline order, after the long jobs' plan:

- a short job's candidate starts are its release time, every slot boundary in the horizon,
  and every moment one of its GPUs comes free; at each, k GPUs of one model on one node
  must be free for the whole run (running jobs, pinned plans, the long jobs' plan and the
  short jobs placed before it all count);
- the cheapest candidate wins: gCO2 = power x PUE x intensity over the run (the carbon curve
  of the GPUs' zone), but a later start must save more than `DELAY_WORTH` (0.5 %) of the
  earliest one's grams: waiting a day to save rounding noise on a flat curve helps nobody,
  and a carbon-blind queue simply runs back to back as soon as GPUs free up;
- deadline and maximum delay limit the candidates; a job that fits no candidate runs as soon
  as possible and is flagged (`deadline_miss`), like the slot planner's.

Site power caps (`Snapshot.power_caps`) are hard: a start is a candidate only if the zone's
running jobs (at the documented running-GPU power), the planned jobs and this job stay under
the cap over the whole run.
"""

from __future__ import annotations

import bisect
import itertools
import math

import numpy as np
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from policies.pricing.blind import blind_price, priced_curves
from policies.pricing.carbon_tail import extended
from policies.pricing.counterfactual import choose
from policies.pricing.deferral import Deferral
from policies.model.energy import (ProfileBook, fits, gang_power_limit_w, generic_power_w, job_gco2, job_shape,
                             seed_profiles, within_time_limit)
from policies.model.length_spread import expected, multipliers
from policies.model.margin import job_margin, latest_start_s
from policies.types import (J_PER_KWH, Assignment, CarbonCurve, Estimate, GpuSlot, Plan, QueuedJob, Snapshot,
                            budget_of, grams)
from policies.pricing.worth import bounded, has_threshold, latest_deferred_s, worth_deferring
from policies.solvers.placement import Score, deferred_misses, late_gpu_h


# A later start is worth it only if it saves more than this share of the grams of every
# earlier feasible start.
DELAY_WORTH = 0.005
# A job shorter than a slot that must start within this long (its deadline less its run, or
# its maximum delay) is planned with the long jobs, in slots: packed after the long plan, it
# finds its few possible GPUs taken (bench/planner 5000x1024: two 15-minute jobs with 25
# minutes to spare, on the MI325X/MI355X they alone fit, ran late behind cpsat's plan).
TIGHT_START_S = 3600.0


def book_of(snapshot: Snapshot) -> ProfileBook:
    return ProfileBook(snapshot.profiles) if snapshot.profiles else ProfileBook(seed_profiles())


def _fit_models(job: QueuedJob, kinds: list[tuple[str, float]], book: ProfileBook) -> list[str]:
    return [m for m, mem in kinds if fits(job, m, mem, book) is None]


def is_short(job: QueuedJob, snapshot: Snapshot, book: ProfileBook,
             kinds: list[tuple[str, float]] | None = None) -> bool:
    """Whether the job runs for less than one slot on every GPU model that could take it and
    need not start within `TIGHT_START_S`. `kinds`: the fleet's distinct usable (model,
    memory) pairs (computed when None)."""
    if job.id in snapshot.pinned or job.id in snapshot.keep:  # planned already: the slot planner holds it
        return False
    if kinds is None:
        kinds = sorted({(g.model, g.memory_gib) for g in snapshot.gpus if g.healthy and not g.drained})
    models = set(_fit_models(job, kinds, book))
    if not models:
        return False
    runtimes = [job_shape(job, m, book, snapshot.default_runtime_s).runtime_s for m in models]
    if max(runtimes) >= snapshot.slot_s:
        return False
    latest = [job.deadline - timedelta(seconds=max(runtimes))] if job.deadline is not None else []
    if job.max_delay_s is not None:
        latest.append(job.submitted_at + timedelta(seconds=job.max_delay_s))
    return not latest or (min(latest) - snapshot.now).total_seconds() >= TIGHT_START_S


def plan_with_short_jobs(snapshot: Snapshot, plan_long: Callable[[Snapshot], Plan], policy: str,
                         also: Callable[[], list[Plan]] | None = None,
                         final: Callable[[Plan], Plan] | None = None,
                         lateness_g_per_gpu_h: float = math.inf) -> Plan:
    """`plan_long` for the jobs of a slot or more, then the short jobs packed around them.

    `also` (called after `plan_long`) may name other plans of the long jobs (cpsat: greedy's,
    when it chose another): the short jobs are packed around each, and the best whole plan
    wins (fewer unplaced, then fewer deadline misses, then fewer grams), so a cheaper long
    plan that leaves the short jobs worse off does not make the whole plan worse. `final`
    then sees the whole plan (greedy and cpsat compare it with fifo's); both apply only when
    there are short jobs (otherwise the long plan is the whole plan).
    """
    book = book_of(snapshot)
    kinds = sorted({(g.model, g.memory_gib) for g in snapshot.gpus if g.healthy and not g.drained})
    short = [j for j in snapshot.jobs if is_short(j, snapshot, book, kinds)]
    if not short:
        return plan_long(snapshot)
    short_ids = {j.id for j in short}
    long_plan = plan_long(replace(snapshot, jobs=tuple(j for j in snapshot.jobs if j.id not in short_ids)))
    best: Plan | None = None
    for base in [long_plan, *(also() if also else [])]:
        packed, unplaced = pack(snapshot, base, short, book, policy)
        whole = Plan(assignments=base.assignments + tuple(packed), unplaced={**base.unplaced, **unplaced})
        if best is None or whole_score(whole, snapshot, lateness_g_per_gpu_h).better_than(
                whole_score(best, snapshot, lateness_g_per_gpu_h)):
            best = whole
    starved = _starved(best, short, snapshot)
    if starved:
        first = _short_first(snapshot, plan_long, short, book, policy)
        if not whole_score(best, snapshot, lateness_g_per_gpu_h).better_than(
                whole_score(first, snapshot, lateness_g_per_gpu_h)) and \
                len(_starved(first, short, snapshot)) < len(starved):
            best = first
    return final(best) if final is not None else best


def _starved(plan: Plan, short: list[QueuedJob], snapshot: Snapshot) -> set[int]:
    """The short jobs `plan` leaves unplaced or starts past the planning horizon: behind a
    long job that took their GPUs first."""
    end = snapshot.now + timedelta(seconds=snapshot.horizon_s)
    starts = {a.job_id: a.start_at for a in plan.assignments}
    return {j.id for j in short if j.id not in starts or starts[j.id] > end}


def _short_first(snapshot: Snapshot, plan_long: Callable[[Snapshot], Plan], short: list[QueuedJob],
                 book: ProfileBook, policy: str) -> Plan:
    """The other order: the short jobs packed first (around what runs and is pinned), then
    the long jobs planned around them (the packed ones pinned). Asked only when packing
    after the long plan starved a short job: a job of seconds that no GPU takes within the
    horizon because a job of days took the only gang of GPUs it fits first."""
    packed, unplaced = pack(snapshot, Plan(assignments=()), short, book, policy)
    held = {a.job_id: a for a in packed}
    short_ids = {j.id for j in short}
    jobs = tuple(j for j in snapshot.jobs if j.id not in short_ids) + tuple(
        replace(j, pinned=True) for j in short if j.id in held)
    around = plan_long(replace(snapshot, jobs=jobs, pinned={**snapshot.pinned, **held}))
    placed = {a.job_id for a in around.assignments}
    missing = [a for a in packed if a.job_id not in placed]  # a policy that drops pinned plans
    return Plan(assignments=around.assignments + tuple(missing), unplaced={**around.unplaced, **unplaced})


def whole_score(plan: Plan, snapshot: Snapshot | None = None, lateness_g_per_gpu_h: float = math.inf) -> Score:
    """A whole plan's Score from its own estimates (every job of the snapshot in it), with
    the lateness priced at `lateness_g_per_gpu_h` (inf: strict, misses ranked first).

    Every policy's estimate has grams (a zone without a forecast is priced blind by
    `policies.pricing.blind`, never 0); only a pinned plan stored without an estimate has none, and it
    is the same in every plan compared, so it adds nothing to either."""
    late = 0.0
    if snapshot is not None:
        jobs = {j.id: j for j in snapshot.jobs}
        late = sum(late_gpu_h(jobs[a.job_id], a.estimate.finish_at) for a in plan.assignments
                   if a.estimate.deadline_miss and a.job_id in jobs)
    # a job left to wait for GPUs past the horizon counts as its miss (policies.pricing.deferral)
    waiting, waiting_late = deferred_misses(plan.unplaced, snapshot.jobs) if snapshot is not None else (
        sum(isinstance(why, Deferral) for why in plan.unplaced.values()), 0.0)
    return Score(len(plan.unplaced) - waiting, sum(a.estimate.deadline_miss for a in plan.assignments) + waiting,
                 sum(a.estimate.gco2 for a in plan.assignments if a.estimate.gco2 is not None),
                 late + waiting_late, lateness_g_per_gpu_h)


class _Timeline:
    """Busy intervals of one GPU (epoch seconds), sorted by start, with the running maximum
    of their ends (intervals may overlap: a plan can start a job on a GPU whose running job
    is expected to end just before), and the ends sorted (where a gap opens)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self._max_end: list[float] = []
        self.sorted_ends: list[float] = []

    def free(self, t0: float, t1: float) -> bool:
        """No busy interval overlaps [t0, t1)."""
        i = bisect.bisect_left(self.starts, t1 - 1e-6)  # intervals starting before t1
        return i == 0 or self._max_end[i - 1] <= t0 + 1e-6

    def extend(self, spans: list[tuple[float, float]]) -> None:
        """Add many intervals at once (one sort instead of an insert each)."""
        merged = sorted([*zip(self.starts, self.ends), *spans] if self.starts else spans)
        self.starts, self.ends = (list(x) for x in zip(*merged)) if merged else ([], [])
        self.sorted_ends = sorted(self.ends)
        self._max_end = list(itertools.accumulate(self.ends, max))

    def add(self, t0: float, t1: float) -> None:
        i = bisect.bisect_right(self.starts, t0)
        self.starts.insert(i, t0)
        self.ends.insert(i, t1)
        bisect.insort(self.sorted_ends, t1)
        self._max_end[i:] = []
        m = self._max_end[-1] if self._max_end else -math.inf
        for e in self.ends[i:]:
            m = max(m, e)
            self._max_end.append(m)

    def first_gap(self, t: float, run_s: float) -> float:
        """The earliest start >= t at which no busy interval overlaps the run. Jumping to the
        latest end among the intervals that start before the run would end never skips a gap:
        each of those overlaps every start before its end."""
        starts, max_end = self.starts, self._max_end
        while True:
            i = bisect.bisect_left(starts, t + run_s - 1e-6)
            if i == 0 or max_end[i - 1] <= t + 1e-6:
                return t
            t = max_end[i - 1]

    def ends_within(self, lo: float, hi: float) -> list[float]:
        """Ends of busy intervals in (lo, hi]: the moments this GPU may come free."""
        return self.sorted_ends[bisect.bisect_right(self.sorted_ends, lo):bisect.bisect_right(self.sorted_ends, hi)]


class _Timelines(dict):
    """Timelines by GPU id, each made from its busy spans on first use (a tick's few short
    jobs look at a few nodes; the plan has spans on most GPUs)."""

    def __init__(self, spans: Mapping[int, list[tuple[float, float]]]) -> None:
        super().__init__()
        self._spans = spans

    def __missing__(self, gpu_id: int) -> _Timeline:
        line = self[gpu_id] = _Timeline()
        spans = self._spans.get(gpu_id)
        if spans:
            line.extend(spans)
        return line


_ARRAYS: dict[int, tuple[CarbonCurve, np.ndarray, np.ndarray]] = {}


def _curve_arrays(curve: CarbonCurve) -> tuple[np.ndarray, np.ndarray]:
    """The curve's values and their prefix sums, kept while the same curve object is in use."""
    hit = _ARRAYS.get(id(curve))
    if hit is None or hit[0] is not curve:
        values = np.asarray(curve.values_g_per_kwh, dtype=float)
        if len(_ARRAYS) > 64:
            _ARRAYS.clear()
        hit = _ARRAYS[id(curve)] = (curve, values, np.concatenate(([0.0], np.cumsum(values))))
    return hit[1], hit[2]


def _slot_costs(curve: CarbonCurve | None, starts: np.ndarray, run_s: np.ndarray, power_w: np.ndarray,
                pue: float) -> np.ndarray:
    """gCO2 of each option's run (`run_s[o]` at `power_w[o]`) starting at each of `starts`
    (epoch s), one row per option, integrated exactly over the step curve by its prefix sums
    (past the forecast: its tail where it has one, else its last value); inf where there is
    no forecast (carbon-blind: every start costs the same, so the earliest wins)."""
    if curve is None or not curve.values_g_per_kwh:
        return np.full((len(run_s), len(starts)), np.inf)
    run_s, power_w = run_s[:, None], power_w[:, None]
    step = curve.step_s
    x0 = (starts - curve.start.timestamp()) / step
    x1 = x0 + run_s / step
    if curve.tail is not None:  # past the forecast: the zone's typical values (policies.pricing.carbon_tail)
        ext = extended(curve)
        return power_w * pue * (ext.steps_array(x1) - ext.steps_array(x0)) * step / J_PER_KWH
    values, prefix = _curve_arrays(curve)
    n = len(values)

    def steps(x: np.ndarray) -> np.ndarray:  # integral of the step function from 0 to x, in steps
        # minimum/maximum, not np.clip: the same integers without np.clip's per-call bound
        # checks (two np.iinfo per call, 3,184 at 5,000 jobs)
        i = np.minimum(np.maximum(np.floor(x).astype(np.int64), 0), n - 1)
        inside = prefix[i] + (x - i) * values[i]
        return np.where(x <= 0, x * values[0], np.where(x >= n, prefix[n] + (x - n) * values[-1], inside))

    return power_w * pue * (steps(x1) - steps(x0)) * step / J_PER_KWH


class _AloneStarts:
    """The first moment k GPUs of one node of a kind are free for good, with only running and
    pinned jobs holding GPUs (cached per (kind, k): the same for every job of a tick)."""

    def __init__(self, free_at: Mapping[int, float]) -> None:
        self.free_at = free_at
        self._cache: dict[tuple[str, str, int], float] = {}

    def first(self, kind: "_Kind", k: int) -> float:
        key = (kind.zone, kind.model, k)
        hit = self._cache.get(key)
        if hit is None:
            hit = min((sorted(self.free_at[g.id] for g in members)[k - 1]
                       for _, members in kind.nodes if len(members) >= k), default=math.inf)
            self._cache[key] = hit
        return hit


def _if_now(job: QueuedJob, options: list, alone: _AloneStarts, release: float, horizon_end: float,
            curves: Mapping[str, CarbonCurve], snapshot: Snapshot):
    """The job's "if run now" counterfactual (`policies.pricing.counterfactual`) over its options (one
    per (zone, model, site PUE)): each one's earliest start with the job alone (`alone`), then
    the earliest, the fastest, the mean of the tied grams."""
    found = []
    for kind, shape in options:
        t = max(release, alone.first(kind, max(1, job.gpus)))
        if t <= horizon_end:
            found.append((kind, shape, t))
    if not found:
        return None
    tz = snapshot.now.tzinfo
    spread = multipliers(job)
    return choose([(k.zone, k.model) for k, _, _ in found], np.array([t for _, _, t in found]),
                  np.array([sh.runtime_s for _, sh, _ in found]),
                  np.array([job_gco2(curves[k.zone], datetime.fromtimestamp(t, tz), sh.runtime_s, sh.power_w,
                                     k.pue, spread) for k, sh, t in found]))


def _earliest_on_nodes(kind: "_Kind", lines: dict[int, _Timeline], k: int, run_s: float, lo: float,
                       hi: float) -> tuple[float, str, tuple[int, ...]] | None:
    """The earliest start in [lo, hi] with k GPUs of one node of `kind` free for the run (no
    power cap), with the node and GPUs (the lowest ids of those free then); None if there is
    none.

    Per node, from t = lo: the GPUs in id order, each one's first gap from t; the first k
    free at t are the answer, and the scan stops there (in a pool with room, after a few GPUs
    of a node of hundreds). Else no start before the k-th smallest gap can have k GPUs free (a
    GPU whose first gap is later is busy until then), so t moves there.
    """
    best: tuple[float, str, tuple[int, ...]] | None = None
    for node, members in kind.nodes:
        if len(members) < k:
            continue
        ids = kind.ids_of(node, members)
        limit = hi if best is None else min(hi, best[0] - 1e-6)
        t = lo
        while t <= limit:
            free: list[int] = []
            gaps: list[float] = []
            for gid in ids:
                gap = lines[gid].first_gap(t, run_s)
                gaps.append(gap)
                if gap <= t + 1e-6:
                    free.append(gid)
                    if len(free) == k:
                        break
            if len(free) == k:
                best = (t, node, tuple(free))
                break
            t = min(gaps) if k == 1 else sorted(gaps)[k - 1]  # every GPU was looked at
        if best is not None and best[0] <= lo + 1e-6:
            break  # nothing starts earlier than lo
    return best


@dataclass
class _Kind:
    """The GPUs of one (zone, model, site PUE, power limit, power budget), by node: a short
    job's cost and room depend on these only."""

    zone: str
    model: str
    memory_gib: float
    nodes: list[tuple[str, list[GpuSlot]]]
    pue: float = 1.0
    power_limit_w: float | None = None  # each node's GPUs all report one: the highest
    budget: str = ""  # the power budget its GPUs draw against (policies.types.budget_of)
    _ids: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)

    def ids_of(self, node: str, members: list[GpuSlot]) -> tuple[int, ...]:
        """The node's GPU ids in ascending order (sorted once per plan)."""
        ids = self._ids.get(node)
        if ids is None:
            ids = self._ids[node] = tuple(sorted(g.id for g in members))
        return ids


def _hold_later_segments(later: list[tuple[float, float, str, tuple[int, ...]]],
                         per_gpu: dict[int, list[tuple[float, float]]], usable: list[GpuSlot]) -> None:
    """Hold GPUs of its node for each later segment of a checkpoint job, in start order, as
    many as its first segment has, piece by piece between the node's other runs' ends: its own
    GPUs where they are free, else others of the node. Why: the slot plan reserves a later
    segment as k GPUs of the node, not as given GPUs (the job may move at its resume), so two
    cut jobs may share their first segment's GPUs in their rests; held on those ids, their
    rests looked like fewer GPUs than they take, and short jobs were packed onto the node's
    others over them. Held piece by piece, the node's count is kept even where no k GPUs are
    free over the whole segment; a piece with fewer than k free holds its own GPUs (as
    before)."""
    by_node: dict[str, list[int]] = defaultdict(list)
    for g in usable:
        by_node[g.node].append(g.id)
    for t0, t1, node, own in sorted(later):
        gids = by_node[node]
        mine = [gid for gid in own if gid in gids]
        order = mine + [gid for gid in gids if gid not in own]
        cuts = sorted({t0, t1} | {x for gid in gids for span in per_gpu[gid] for x in span if t0 < x < t1})
        for a, b in zip(cuts, cuts[1:]):
            free = [gid for gid in order if all(e <= a or s >= b for s, e in per_gpu[gid])]
            for gid in (free[:len(own)] if len(free) >= len(own) else mine):
                per_gpu[gid].append((a, b))


def pack(snapshot: Snapshot, base: Plan, short: list[QueuedJob], book: ProfileBook,
         policy: str) -> tuple[list[Assignment], dict[int, str]]:
    """Place each short job at its cheapest feasible start around `base` (see module doc).

    Per job, the start slots of every (zone, model) that can take it are costed at once
    (numpy); they are then tried cheapest first until one has k GPUs of one node free for
    the run somewhere in the slot, and the earliest start within `DELAY_WORTH` of that cost
    is taken. The "if run now" counterfactual follows `policies.pricing.counterfactual` (the options
    that start earliest, the fastest of them, their grams averaged); a zone without a forecast
    is priced by `policies.pricing.blind`.
    """
    packer = _Packer(snapshot, base, book, policy)
    placed: list[Assignment] = []
    unplaced: dict[int, str] = {}
    for job in sorted(short, key=packer.order):
        a = packer.place(job)
        if isinstance(a, str):
            unplaced[job.id] = a
        else:
            placed.append(a)
    return placed, unplaced


def _busy_spans(snapshot: Snapshot, base: Plan, book: ProfileBook, usable: list[GpuSlot],
                by_id: Mapping[int, GpuSlot]) -> dict[int, list[tuple[float, float]]]:
    """Busy spans (epoch s) by usable GPU: running jobs until their busy_until, pinned plans
    and the long jobs' plan over their runs; a checkpoint job's later segments held on GPUs
    of its node (`_hold_later_segments`)."""
    now, t_now = snapshot.now, snapshot.now.timestamp()
    usable_ids = {g.id for g in usable}
    jobs_by_id = {j.id: j for j in snapshot.jobs}
    per_gpu: dict[int, list[tuple[float, float]]] = defaultdict(list)  # busy spans by GPU
    for g in usable:
        if g.busy_until is not None and g.busy_until > now:
            per_gpu[g.id].append((t_now - 1.0, g.busy_until.timestamp()))
    later: list[tuple[float, float, str, tuple[int, ...]]] = []  # checkpoint jobs' later segments
    for a in (*snapshot.pinned.values(), *base.assignments):
        job = jobs_by_id.get(a.job_id)
        if a.estimate.runtime_s is not None:
            run_s = a.estimate.runtime_s
        elif job is not None and a.gpu_ids and a.gpu_ids[0] in by_id:
            run_s = job_shape(job, by_id[a.gpu_ids[0]].model, book, snapshot.default_runtime_s).runtime_s
        else:
            run_s = snapshot.default_runtime_s
        t0 = a.start_at.timestamp()
        # a job planned in segments holds its GPUs in each segment (a pause job: over its
        # whole span); a checkpoint job's later segments are given GPUs of its node below
        if a.segments and job is not None and job.interruptible == "pause":
            spans = [(t0, a.segments[-1][1].timestamp())]
        elif a.segments:
            spans = [(a.segments[0][0].timestamp(), a.segments[0][1].timestamp())]
            later.extend((s0.timestamp(), s1.timestamp(), a.node, a.gpu_ids) for s0, s1 in a.segments[1:])
        else:
            spans = [(t0, t0 + run_s)]
        for gid in a.gpu_ids:
            if gid in usable_ids:
                per_gpu[gid].extend(spans)
    _hold_later_segments(later, per_gpu, usable)
    return per_gpu


def _free_alone(snapshot: Snapshot, usable: list[GpuSlot]) -> dict[int, float]:
    """When each usable GPU is free as the "if run now" counterfactual sees it
    (policies.pricing.counterfactual): the job alone, only running and pinned jobs hold GPUs, until
    their end (as in the slot planner's `Problem`)."""
    now, t_now = snapshot.now, snapshot.now.timestamp()
    free_alone: dict[int, float] = {g.id: t_now for g in usable}
    for g in usable:
        if g.busy_until is not None and g.busy_until > now:
            free_alone[g.id] = g.busy_until.timestamp()
    for a in snapshot.pinned.values():
        e = a.estimate
        end = a.start_at.timestamp() + (e.runtime_s if e.runtime_s is not None else snapshot.default_runtime_s)
        for gid in a.gpu_ids:
            if gid in free_alone:
                free_alone[gid] = max(free_alone[gid], end)
    return free_alone


def _draws(snapshot: Snapshot, base: Plan, by_id: Mapping[int, GpuSlot],
           capped: set[str]) -> dict[str, list[tuple[float, float, float]]]:
    """Power drawn per capped budget (a zone's or a site's) over time, as (start, end, watts):
    running GPUs at their model's generic power, pinned and planned jobs at their estimate's."""
    now, t_now = snapshot.now, snapshot.now.timestamp()
    draws: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    if capped:
        for g in snapshot.gpus:
            if budget_of(g) in capped and g.busy_until is not None and g.busy_until > now:
                draws[budget_of(g)].append((t_now, g.busy_until.timestamp(), generic_power_w(g.model)))
        for a in (*snapshot.pinned.values(), *base.assignments):
            g0 = by_id.get(a.gpu_ids[0]) if a.gpu_ids else None
            e = a.estimate
            if g0 is not None and budget_of(g0) in capped and e.runtime_s and e.energy_j is not None:
                t0 = a.start_at.timestamp()
                draws[budget_of(g0)].append((t0, t0 + e.runtime_s, e.energy_j / e.runtime_s))
    return draws


def _kinds_of(snapshot: Snapshot, usable: list[GpuSlot]) -> dict[tuple[str, str, float, float | None, str], _Kind]:
    """The usable GPUs by (zone, model, site PUE, power limit, budget), each with its nodes."""
    by_node: dict[tuple[str, str, str], list[GpuSlot]] = defaultdict(list)
    for g in usable:
        by_node[(g.zone, g.model, g.node)].append(g)
    kinds: dict[tuple[str, str, float, float | None, str], _Kind] = {}
    for (zone, model, node), members in sorted(by_node.items()):
        pue = snapshot.gpu_pue(members[0])
        cap = gang_power_limit_w(g.power_limit_w for g in members)
        budget = budget_of(members[0])
        kind = kinds.setdefault((zone, model, pue, cap, budget),
                                _Kind(zone, model, members[0].memory_gib, [], pue, cap, budget))
        kind.nodes.append((node, members))
    return kinds


class _Packer:
    """The GPUs' timelines around the long jobs' plan, and the short jobs placed into them one
    by one (`place`); see `pack`."""

    def __init__(self, snapshot: Snapshot, base: Plan, book: ProfileBook, policy: str) -> None:
        self.snapshot, self.book, self.policy = snapshot, book, policy
        self.now = now = snapshot.now
        self.t_now = now.timestamp()
        self.horizon_end = self.t_now + snapshot.horizon_s
        self.curves = priced_curves(snapshot)  # a zone without a forecast is priced blind (policies.pricing.blind)
        self.blind = {z for z, c in self.curves.items() if c.signal == "blind"}
        self.price = blind_price(snapshot) if self.blind else None
        self.slot_s = snapshot.slot_s
        n_slots = int(math.ceil(snapshot.horizon_s / self.slot_s))
        self.slot_starts = self.t_now + self.slot_s * np.arange(n_slots)
        usable = [g for g in snapshot.gpus if g.healthy and not g.drained]
        by_id: dict[int, GpuSlot] = {g.id: g for g in snapshot.gpus}
        # built when a job first looks at the GPU
        self.lines: dict[int, _Timeline] = _Timelines(_busy_spans(snapshot, base, book, usable, by_id))
        self.alone = _AloneStarts(_free_alone(snapshot, usable))
        self.capped = {c.zone for c in snapshot.power_caps}
        self.draws = _draws(snapshot, base, by_id, self.capped)
        self.kinds = _kinds_of(snapshot, usable)

    def order(self, j: QueuedJob):
        return (j.deadline or datetime.max.replace(tzinfo=self.now.tzinfo), j.submitted_at, j.id)

    def under_cap(self, budget: str, t0: float, t1: float, watts: float) -> bool:
        """Whether `watts` more from t0 to t1 keeps the budget under each of its caps."""
        draws = self.draws
        for cap in self.snapshot.power_caps:
            if cap.zone != budget:
                continue
            lo = max(t0, cap.start.timestamp()) if cap.start else t0
            hi = min(t1, cap.end.timestamp()) if cap.end else t1
            if lo >= hi:
                continue
            points = {lo} | {s for s, _, _ in draws[budget] if lo < s < hi}
            for p in points:
                if sum(w for s, f, w in draws[budget] if s <= p < f) + watts > cap.cap_w + 1e-6:
                    return False
        return True

    def start_in(self, kind: _Kind, k: int, run_s: float, power_w: float, lo: float, hi: float):
        """The earliest start in [lo, hi] with k GPUs of one node of `kind` free for the run
        (and room under its power budget's cap), with the GPUs; None if there is none."""
        lines = self.lines
        if kind.budget not in self.capped:
            return _earliest_on_nodes(kind, lines, k, run_s, lo, hi)
        best = None
        for node, members in kind.nodes:
            if len(members) < k:
                continue
            if best is not None and best[0] <= lo:
                break  # nothing starts earlier than lo
            times = {lo}
            for g in members:
                times.update(lines[g.id].ends_within(lo, hi))
            for t in sorted(times):
                if best is not None and t >= best[0]:
                    break
                free = [g for g in members if lines[g.id].free(t, t + run_s)]
                if len(free) >= k:
                    if kind.budget in self.capped and not self.under_cap(kind.budget, t, t + run_s, power_w):
                        continue
                    best = (t, node, tuple(sorted(g.id for g in free[:k])))
                    break
        return best

    def options(self, job: QueuedJob) -> tuple[list[tuple[_Kind, object]], set[str]]:
        """The kinds that can take the job, each with its shape there, and why the others cannot."""
        book, default_runtime_s = self.book, self.snapshot.default_runtime_s
        options: list[tuple[_Kind, object]] = []
        reasons = set()
        for kind in self.kinds.values():
            why = fits(job, kind.model, kind.memory_gib, book)
            if why is None and not within_time_limit(job, kind.model, book, default_runtime_s, kind.power_limit_w):
                why = "time limit"
            if why is not None:
                reasons.add(why)
                continue
            if all(len(m) < job.gpus for _, m in kind.nodes):
                reasons.add("gpus")
                continue
            shape = job_shape(job, kind.model, book, default_runtime_s, kind.power_limit_w)
            options.append((kind, shape))
        return options, reasons

    def cost_table(self, job: QueuedJob, options: list, starts: np.ndarray) -> np.ndarray:
        """gCO2 of each option (rows) at each start, costed per zone at once."""
        table = np.empty((len(options), len(starts)))  # options x slots, costed per zone at once
        by_zone: dict[tuple[str, float], list[int]] = defaultdict(list)
        for o, (kind, _) in enumerate(options):
            by_zone[(kind.zone, kind.pue)].append(o)
        spread = multipliers(job)  # expected grams over the job's length spread (policies.model.length_spread)
        for (zone, pue), os_ in by_zone.items():
            power_w = np.array([options[o][1].power_w for o in os_])
            table[os_] = expected(lambda run_s: _slot_costs(self.curves[zone], starts, run_s, power_w, pue),
                                  np.array([options[o][1].runtime_s for o in os_]), spread)
        return table

    def place(self, job: QueuedJob) -> Assignment | str:
        """The job at its cheapest feasible start (else as soon as possible, flagged), its
        GPUs then busy for its run; or why it cannot be placed."""
        t_now, slot_s, horizon_end = self.t_now, self.slot_s, self.horizon_end
        release = max(t_now, job.submitted_at.timestamp())
        latest = horizon_end
        if job.max_delay_s is not None:
            latest = min(latest, job.submitted_at.timestamp() + job.max_delay_s)
        first_slot = max(0, int(math.floor((release - t_now) / slot_s)))
        options, reasons = self.options(job)
        if not options:
            return ("no GPU model can take it (" + ", ".join(sorted(reasons)) + ")") if reasons \
                else "no healthy GPUs"
        starts = np.maximum(self.slot_starts[first_slot:], release)
        table = self.cost_table(job, options, starts)
        search = _Search(self, job, options, starts, first_slot + np.arange(table.shape[1]), latest)
        asap = search.asap(release, table.shape[1], first_slot)
        if asap is None:
            return "no GPUs free long enough within the planning horizon" + (
                f" ({', '.join(sorted(reasons))})" if reasons else "")
        if bounded(job):  # a deferral bound or a least saving (policies.pricing.worth)
            search.latest = min(latest, max(asap[0][0], latest_deferred_s(job, asap[0][0])))
        h, o, col, miss = search.cheapest(table, asap)
        if not miss and has_threshold(job) and h[0] > asap[0][0] + 1e-6 and not worth_deferring(
                job, self._gco2(job, options, asap[1], asap[0][0]), self._gco2(job, options, o, h[0])):
            (h, o, col), miss = asap, False
        return self._assignment(job, options, h, o, miss, release, latest)

    def _gco2(self, job: QueuedJob, options: list, o: int, t: float) -> float:
        """The job's grams with option o started at `t` (epoch seconds)."""
        kind, shape = options[o]
        return job_gco2(self.curves[kind.zone], datetime.fromtimestamp(t, self.now.tzinfo), shape.runtime_s,
                        shape.power_w, kind.pue, multipliers(job))

    def _assignment(self, job: QueuedJob, options: list, h: tuple, o: int, miss: bool, release: float,
                    latest: float) -> Assignment:
        """The job started at `h` = (time, node, GPUs) with option o, booked on the GPUs'
        timelines (and its budget's draws), with its estimate and explanation."""
        t_now, now = self.t_now, self.now
        t, node, chosen = h
        kind, shape = options[o]
        for gid in chosen:
            self.lines[gid].add(t, t + shape.runtime_s)
        if kind.budget in self.capped:
            self.draws[kind.budget].append((t, t + shape.runtime_s, shape.power_w))
        start = datetime.fromtimestamp(t, now.tzinfo)
        cost = job_gco2(self.curves[kind.zone], start, shape.runtime_s, shape.power_w, kind.pue, multipliers(job))
        now_cost, now_where = job.gco2_if_now, "if run at submission"
        if now_cost is None:
            cf = _if_now(job, options, self.alone, release, self.horizon_end, self.curves, self.snapshot)
            now_cost, now_where = (cf.gco2, f"now on {cf.where()}" if cf.start - t_now < 1 else
                                   f"at the earliest on {cf.where()}") if cf else (None, "")
        finish = start + timedelta(seconds=shape.runtime_s)
        deadline_miss = job.deadline is not None and finish > job.deadline
        binding = None
        if miss:  # which limit could not be kept
            binding = "max delay" if t > latest + 1e-6 else "deadline" if job.deadline else "capacity"
        when = "now" if t - t_now < 1 else f"at {start:%H:%M:%S}" if t - t_now < 86400 else f"at {start:%Y-%m-%d %H:%M}"
        blind = kind.zone in self.blind
        cost_txt = grams(cost) + (f" {self.price.note()}" if blind else "")
        why = f"{binding} cannot be met: as soon as possible" if miss else "short job packed between longer ones"
        return Assignment(
            job_id=job.id, node=node, gpu_ids=chosen, start_at=start,
            estimate=Estimate(finish_at=finish, energy_j=shape.energy_j, gco2=cost, gco2_if_now=now_cost,
                              runtime_s=shape.runtime_s, prompts=job.prompts, binding=binding,
                              deadline_miss=deadline_miss,
                              blind_g_per_kwh=self.price.g_per_kwh if blind else None,
                              time_limit_s=job.derived_time_limit_s(shape.runtime_s)),
            explanation=(f"{self.policy}: {len(chosen)}x{kind.model} in {kind.zone} {when}: {cost_txt} vs "
                         + (f"{grams(now_cost)} {now_where}" if now_cost is not None else "no free GPU alone")
                         + f" ({why})"))


class _Search:
    """One short job's search over its options (rows) x candidate start slots (columns):
    `starts[col]` is the start the column stands for, `slots[col]` its slot."""

    def __init__(self, packer: _Packer, job: QueuedJob, options: list, starts: np.ndarray, slots: np.ndarray,
                 latest: float) -> None:
        self.packer, self.job, self.options = packer, job, options
        self.starts, self.slots, self.latest = starts, slots, latest
        # earliest[o]: known answers (lo, start) of "the earliest feasible start of option o
        # from lo"; that start also answers every lo' in [lo, start] (nothing fits before it)
        self.earliest: dict[int, list[tuple[float, object]]] = defaultdict(list)
        self._limits: dict[int, float] = {}

    def feasible(self, o: int, col: int, hi_limit: float):
        """The earliest start of option o within column col's slot (and by `hi_limit`)
        with its GPUs free, or None."""
        pk = self.packer
        kind, shape = self.options[o]
        lo = float(self.starts[col])
        hi = min(float(pk.slot_starts[self.slots[col]]) + pk.slot_s - 1e-6, hi_limit)
        if lo > hi:
            return None
        for lo1, h1 in self.earliest[o]:
            if lo1 <= lo and (h1 is None or lo <= h1[0]):
                return h1 if h1 is not None and h1[0] <= hi else None
        h = pk.start_in(kind, self.job.gpus, shape.runtime_s, shape.power_w, lo, pk.horizon_end)
        self.earliest[o].append((lo, h))
        return h if h is not None and h[0] <= hi else None

    def window_limit(self, o: int) -> float:
        """Option o's last start that keeps the job's deadline (with its margin) and maximum
        delay; asked for every candidate start of the option, so remembered."""
        limit = self._limits.get(o)
        if limit is None:
            _, shape = self.options[o]
            job, pk = self.job, self.packer
            limit = self.latest
            if job.deadline is not None:
                limit = min(limit, latest_start_s(job.deadline.timestamp(), shape.runtime_s,
                                                  job_margin(job, shape.model, pk.book,
                                                             getattr(pk.snapshot, "estimate_margin", True)),
                                                  max(pk.t_now, job.submitted_at.timestamp())))
            self._limits[o] = limit
        return limit

    def asap(self, release: float, n_cols: int, first_slot: int):
        """The earliest feasible start anywhere (where a job that cannot meet its window
        runs), as (start, option, column); None if there is none: one scan per option over
        the whole horizon, stopping at its first fit."""
        pk = self.packer
        asap = None
        for o, (kind, shape) in enumerate(self.options):
            hi = pk.horizon_end if asap is None else min(pk.horizon_end, asap[0][0] - 1e-6)
            h = pk.start_in(kind, self.job.gpus, shape.runtime_s, shape.power_w, release, hi)
            if h is not None:
                col = min(n_cols - 1, max(0, int((h[0] - pk.t_now) // pk.slot_s) - first_slot))
                asap = (h, o, col)
        return asap

    def cheapest(self, table: np.ndarray, asap: tuple):
        """The cheapest feasible start within the window, then the earliest start about as
        cheap (`DELAY_WORTH`), as (start, option, column, missed: False); else `asap`, missed."""
        starts = self.starts
        flat = np.argsort(table, axis=None, kind="stable")
        best = None
        for idx in flat:
            o, col = divmod(int(idx), table.shape[1])
            limit = self.window_limit(o)
            if starts[col] > limit + 1e-6:
                continue
            h = self.feasible(o, col, limit)
            if h is not None:
                best = (float(table[o, col]), h, o, col)
                break
        if best is None:
            h, o, col = asap
            return h, o, col, True
        c_star = best[0]
        h, o, col = best[1], best[2], best[3]
        if math.isfinite(c_star):
            near = np.argwhere(table <= c_star * (1 + DELAY_WORTH))
            for o2, col2 in sorted(((int(a), int(b)) for a, b in near), key=lambda x: (starts[x[1]], x[0])):
                if starts[col2] >= h[0]:
                    break
                if starts[col2] > self.window_limit(o2) + 1e-6:
                    continue
                h2 = self.feasible(o2, col2, self.window_limit(o2))
                if h2 is not None and h2[0] < h[0]:
                    h, o, col = h2, o2, col2
                    break
        else:  # carbon-blind everywhere: the earliest feasible start in the window
            h, o, col = asap if asap[0][0] <= self.window_limit(asap[1]) + 1e-6 else (h, o, col)
        return h, o, col, False
