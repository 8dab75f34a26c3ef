"""Planning an interruptible job in segments (issue 30): which slots it runs in.

A job with `QueuedJob.interruptible` set may be cut into up to `max_segments` segments that
together do its remaining work and finish by its deadline (the slot planner's window: the
last one-piece start plus its duration, so the deadline margin of `policies.model.margin` holds).
Each segment lasts at least `min_run_s` (rounded up to whole slots), each after the first
pays `resume_cost_s` of extra running time (the first pays it too when the job resumes:
`done_fraction > 0` or `resume_count > 0`), and the segments start on slot boundaries; the
last one ends where the work is done. Between segments a "checkpoint" job frees its GPUs; a
"pause" job holds them (they must stay free for it) and they draw idle power, which is
priced (`idle_g`).

`cheapest_segments` is an exact dynamic programme over slots: state (segments begun, slots
used, running or not), one numpy step per slot over all (segments, slots used) at once, a
segment entered as a block of `min_run` slots and then extended one slot at a time. It
minimises the grams of the running slots (the last one priced by the share of it the work
uses: whole-slot pricing made a job whose work ends early in its last slot look up to a
slot dearer cut than in one piece, so gains of a few percent were never taken) plus, for a
pause job, of the held idle slots between its segments. Cost per slot `run_g[t]` is the job's
power x PUE x the forecast's integral over slot t (`Problem.slot_integrals`).

Why a DP and not "the N cheapest slots": the cheapest slots are scattered; with at most
`max_segments` pieces of at least `min_run`, each costing a resume, the best choice is a
few contiguous runs, which the DP finds exactly in O(slots x segments x length).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from policies.types import J_PER_KWH

#: a segmented plan is taken only when it is this much cheaper than the job's one-piece plan
#: (relative): an interruption has costs the model does not see (a checkpoint's I/O, risk)
MIN_GAIN = 0.005


class SegmentPlan(NamedTuple):
    """Slot ranges [start, end) of each segment (ascending, disjoint) and their priced grams
    (the running slots, the last by its used share, plus held idle slots for a pause job)."""

    slots: tuple[tuple[int, int], ...]
    gco2: float


def interruptible(job) -> bool:
    """Whether the planner may cut this job into segments."""
    return job.interruptible in ("checkpoint", "pause") and job.max_segments > 1


#: the farthest the windows of interruptible jobs stretch the planning horizon (`horizon_for`)
MAX_WINDOW_HORIZON_S = 7 * 86400.0


def horizon_for(jobs, now, horizon_s: float, slot_s: float) -> float:
    """The planning horizon that lets each interruptible job's segments span its whole
    window: `horizon_s`, or to the farthest deadline of a queued interruptible job (at most
    `MAX_WINDOW_HORIZON_S`), in whole slots. Beyond its horizon the slot model has no slots,
    so a job that runs longer than the horizon's far part of its window could only ever be
    cut inside the first `horizon_s` (pai_1k's 60-hour jobs have 84-hour windows); past the
    forecast the slots are priced by the zone's typical values (`policies.pricing.carbon_tail`)."""
    far = horizon_s
    for job in jobs:
        if interruptible(job) and job.deadline is not None:
            far = max(far, min(MAX_WINDOW_HORIZON_S, (job.deadline - now).total_seconds()))
    return horizon_s if far <= horizon_s else math.ceil(far / slot_s - 1e-9) * slot_s


def window_ends(problem, jobs) -> np.ndarray:
    """Per job of `jobs` (indices) and group: the slot where its segments' window ends, the
    end of its last on-time one-piece run (the slot planner's window, so `policies.model.margin`
    holds), or the horizon for a job without a deadline. Shared by the segment search, its
    nominal cost (`work_clock`) and the LP's segmented option."""
    idx = np.asarray(jobs, dtype=np.int64)
    ends = np.minimum(problem.n_slots, problem.job_on_time_latest[idx] + problem.job_duration[idx])
    due = np.array([problem.jobs[j].deadline is not None for j in idx.tolist()], dtype=bool)
    return np.where(due[:, None], ends, problem.n_slots).astype(np.int64)


def wall_s(work_s: float, segments: int, resume_s: float, resumed: bool) -> float:
    """Running time of `work_s` of work in `segments` pieces: each piece after the first, and
    the first too when the job resumes, pays `resume_s`."""
    return work_s + resume_s * (segments - 1 + (1 if resumed else 0))


def slots_needed(work_s: float, segments: int, resume_s: float, resumed: bool, slot_s: float) -> int:
    """Whole slots the segments occupy in all (the last one may end inside its last slot)."""
    return max(1, int(math.ceil(wall_s(work_s, segments, resume_s, resumed) / slot_s - 1e-9)))


def lower_bound_g(run_g: np.ndarray, lo: int, end: int, n_slots: float) -> float:
    """A lower bound of any segmented plan's grams: the cheapest `n_slots` (fractional: the
    work's own length, so it bounds the exact grams the plan is judged by, not its whole
    slots) of [lo, end), capacity, segment count and minimum run ignored."""
    window = np.asarray(run_g[lo:end], dtype=np.float64)
    whole = int(math.floor(n_slots + 1e-9))
    frac = max(0.0, n_slots - whole)
    need = whole + (1 if frac > 1e-9 else 0)
    if need == 0:
        return 0.0
    if window.size < need:
        return math.inf
    cheapest = np.sort(np.partition(window, need - 1)[:need]) if need < window.size else np.sort(window)
    return float(cheapest[:whole].sum() + (frac * cheapest[whole] if need > whole else 0.0))


class SegmentQuery(NamedTuple):
    """One question for `cheapest_segments_batch`: the cheapest plan of job work `work_s` on
    one group's slot prices `run_g` (and, for a pause job, idle prices `idle_g`) in slots
    [lo, end), the first segment starting no later than `first_latest`, running only where
    `avail` is True, the work done by `finish_by` (in slots from slot 0, fractional: the
    deadline inside its slot; None: the window's end)."""

    run_g: np.ndarray
    avail: np.ndarray
    end: int
    first_latest: int
    work_s: float
    idle_g: np.ndarray | None = None
    finish_by: float | None = None


#: the most DP cells ((slots + 1) x questions x (segments + 1) x (slots used + 1)) one batched
#: call holds per array: ~3 MB of float64, so a batch of short jobs' questions is one numpy
#: step per slot and a 60-hour job over a 7-day window runs alone
MAX_BATCH_CELLS = 400_000


def cheapest_segments(run_g: np.ndarray, avail: np.ndarray, lo: int, end: int, first_latest: int,
                      work_s: float, slot_s: float, resume_s: float, resumed: bool, min_run_slots: int,
                      max_segments: int, pause: bool = False, idle_g: np.ndarray | None = None,
                      finish_by: float | None = None) -> SegmentPlan | None:
    """The cheapest plan of 1 to `max_segments` segments in slots [lo, end), the first
    starting no later than `first_latest`, each at least `min_run_slots` long, running only
    in slots where `avail` is True (a pause job also holds its GPUs, so needs `avail`, in the
    slots between its segments, priced at `idle_g`), its work done by `finish_by` (slots from
    slot 0, fractional; None: by `end`). None: no such plan."""
    query = SegmentQuery(run_g, avail, end, first_latest, work_s, idle_g, finish_by)
    return cheapest_segments_batch([query], lo, slot_s, resume_s, resumed, min_run_slots, max_segments, pause)[0]


def cheapest_segments_batch(queries: list[SegmentQuery], lo: int, slot_s: float, resume_s: float, resumed: bool,
                            min_run_slots: int, max_segments: int, pause: bool = False
                            ) -> list[SegmentPlan | None]:
    """`cheapest_segments` for several questions about one job (its groups: other prices,
    windows and work) at once, each answered exactly as alone. Why: the DP is one numpy step
    per slot on small arrays, so its cost is the steps' overhead; a job asked on 8 groups one
    by one paid it 8 times (greedy with 5,000 checkpoint jobs queued spent 90 % of its 26 s
    there). Questions are cut into batches of at most `MAX_BATCH_CELLS`."""
    M = max(1, int(max_segments))
    mr = max(1, int(min_run_slots))
    out: list[SegmentPlan | None] = [None] * len(queries)
    todo: list[tuple[int, list[int]]] = []
    for i, q in enumerate(queries):
        need = [slots_needed(q.work_s, m, resume_s, resumed, slot_s) for m in range(1, M + 1)]
        if q.end - lo > 0 and need[0] <= q.end - lo:
            todo.append((i, need))
    batch: list[tuple[int, list[int]]] = []
    for item in todo:
        grown = batch + [item]
        T = max(queries[i].end for i, _ in grown) - lo
        L = max(need[-1] for _, need in grown)
        if batch and (T + 1) * len(grown) * (M + 1) * (L + 1) > MAX_BATCH_CELLS:
            _solve_batch(queries, batch, lo, slot_s, resume_s, resumed, mr, M, pause, out)
            grown = [item]
        batch = grown
    if batch:
        _solve_batch(queries, batch, lo, slot_s, resume_s, resumed, mr, M, pause, out)
    return out


def _solve_batch(queries: list[SegmentQuery], batch: list[tuple[int, list[int]]], lo: int, slot_s: float,
                 resume_s: float, resumed: bool, mr: int, M: int, pause: bool,
                 out: list[SegmentPlan | None]) -> None:
    """The DP of the module docstring for a batch of questions, one axis more (question b):
    state (slot t, b, segments begun, slots used), running or not; answers written to `out`."""
    B = len(batch)
    T = max(queries[i].end for i, _ in batch) - lo
    L = max(need[-1] for _, need in batch)
    run = np.full((B, T), math.inf)
    idle = np.zeros((B, T))
    first_latest = np.empty(B, dtype=np.int64)
    target = np.empty((B, M), dtype=np.int64)
    unused = np.empty((B, M))
    last_t = np.empty((B, M))  # the last slot boundary a plan of m segments may finish at
    for b, (i, need) in enumerate(batch):
        q = queries[i]
        n = q.end - lo
        ok = np.asarray(q.avail[lo:q.end], dtype=bool)
        run[b, :n] = np.where(ok, np.asarray(q.run_g[lo:q.end], dtype=np.float64), np.inf)
        if pause:
            idle[b, :n] = np.where(ok, np.asarray(q.idle_g[lo:q.end], dtype=np.float64), np.inf)
            idle[b, n:] = math.inf
        first_latest[b] = q.first_latest - lo
        target[b] = need
        # the share of its last slot a plan of m segments leaves unused (the work ends inside it)
        unused[b] = [1.0 - min(1.0, wall_s(q.work_s, m, resume_s, resumed) / slot_s - (need[m - 1] - 1))
                     for m in range(1, M + 1)]
        # its work ends `1 - unused` into its last slot, so at t - 1 + (1 - unused) slots
        last_t[b] = n if q.finish_by is None else q.finish_by - lo + unused[b] + 1e-9
    finite = np.isfinite(run)
    # block[b, t]: the first `mr` slots of a segment begun at t (inf where a slot is
    # unavailable), plus a hair per segment: of plans that cost the same, the one with fewer
    # segments (two back-to-back segments are one segment and a needless resume)
    cs = np.concatenate([np.zeros((B, 1)), np.cumsum(np.where(finite, run, 0.0), axis=1)], axis=1)
    bad = np.concatenate([np.zeros((B, 1), dtype=np.int64), np.cumsum(~finite, axis=1)], axis=1)
    block = cs[:, mr:] - cs[:, :-mr]
    block = np.where(bad[:, mr:] == bad[:, :-mr], block + 1e-9 * np.maximum(1.0, np.abs(block)), math.inf)
    # a first segment begun after its latest start: inf on the first segment's entry
    late = np.where(np.arange(T + 1)[:, None] > first_latest[None, :], math.inf, 0.0)
    inf = math.inf
    off = np.full((T + 1, B, M + 1, L + 1), inf)
    on = np.full((T + 1, B, M + 1, L + 1), inf)
    off_stop = np.zeros((T + 1, B, M + 1, L + 1), dtype=bool)  # off[t] came from on[t] (a stop)
    on_start = np.zeros((T + 1, B, M + 1, L + 1), dtype=bool)  # on[t] came from a segment begun at t - mr
    off[0, :, 0, 0] = 0.0
    for t in range(T + 1):
        on_t, off_t = on[t], off[t]
        stop = on_t < off_t
        np.copyto(off_t, on_t, where=stop)
        off_stop[t] = stop
        if t == T:
            break
        # wait one slot: free before the first segment; a pause job holds its GPUs after it
        nxt = off[t + 1]
        nxt[:, 0] = off_t[:, 0]
        np.add(off_t[:, 1:], idle[:, t, None, None], out=nxt[:, 1:])
        # run one more slot of the current segment (inf where the slot is unavailable)
        cand = on_t[:, :, :-1] + run[:, t, None, None]
        dest = on[t + 1, :, :, 1:]
        better = cand < dest
        np.copyto(dest, cand, where=better)
        on_start[t + 1, :, :, 1:] &= ~better
        # begin a segment: its first `mr` slots at once
        if t + mr <= T and mr <= L:
            cand = off_t[:, :-1, :L + 1 - mr] + block[:, t, None, None]
            cand[:, 0] += late[t][:, None]
            dest = on[t + mr, :, 1:, mr:]
            better = cand < dest
            np.copyto(dest, cand, where=better)
            on_start[t + mr, :, 1:, mr:] |= better
    # finishing at t: segment r just ends with exactly the slots r segments need; its last slot
    # (t - 1) priced by the share the work uses; the earliest t of the cheapest, fewest segments
    done = on[:, np.arange(B)[:, None], np.arange(1, M + 1)[None, :], target]  # (t, b, r)
    last = np.concatenate([np.zeros((1, B)), np.where(finite, run, 0.0).T], axis=0)
    done = done - last[:, :, None] * unused[None]
    done = np.where(np.arange(T + 1)[:, None, None] <= last_t[None], done, inf)
    d_min, r_min = done.min(axis=2), done.argmin(axis=2)
    best, best_t = np.full(B, inf), np.full(B, -1)
    for t in range(T + 1):  # a later finish only where it is cheaper by more than rounding
        cheaper = d_min[t] < best - 1e-12
        best, best_t = np.where(cheaper, d_min[t], best), np.where(cheaper, t, best_t)
    for b, (i, need) in enumerate(batch):
        if best_t[b] >= 0 and math.isfinite(best[b]):
            t = int(best_t[b])
            out[i] = _walk_back(on_start[:, b], off_stop[:, b], t, int(r_min[t, b]) + 1, need, lo, mr, float(best[b]))


def _walk_back(on_start: np.ndarray, off_stop: np.ndarray, t: int, r: int, need: list[int], lo: int, mr: int,
               gco2: float) -> SegmentPlan | None:
    """The segments of the DP's best plan ending at slot t with r segments, read back from
    where each state came from."""
    l_used = need[r - 1]
    segs: list[tuple[int, int]] = []
    seg_end = t
    running = True
    while True:
        if running:
            if on_start[t, r, l_used]:
                start = t - mr
                segs.append((lo + start, lo + seg_end))
                t, r, l_used = start, r - 1, l_used - mr
                running = False
            else:
                t, l_used = t - 1, l_used - 1
        else:
            if r == 0:
                break
            if off_stop[t, r, l_used]:
                running, seg_end = True, t
            else:
                t -= 1
        if t < 0:
            return None
    segs.reverse()
    return SegmentPlan(tuple(segs), gco2)


def exact_segments_s(slots: tuple[tuple[int, int], ...], work_s: float, resume_s: float, resumed: bool,
                     slot_s: float) -> list[tuple[float, float]]:
    """The segments in seconds from slot 0: whole slots, the last one ending when the work is done."""
    total = wall_s(work_s, len(slots), resume_s, resumed)
    out: list[tuple[float, float]] = []
    used = 0.0
    for i, (a, b) in enumerate(slots):
        start = a * slot_s
        if i == len(slots) - 1:
            out.append((start, start + max(1e-6, total - used)))
        else:
            out.append((start, b * slot_s))
            used += (b - a) * slot_s
    return out


# -- the slot planner's side (greedy, cpsat's re-cut) ---------------------------------------------

def idle_power_w(model: str, k: int) -> float:
    """What k held GPUs of `model` draw while a paused job sleeps on them (the catalog's idle W)."""
    from policies.model.catalog import lookup

    try:
        return float(lookup(model).idle_w) * k
    except KeyError:
        return 0.0


def segment_cost(problem, j: int, g: int, segs_s: list[tuple[float, float]], pause: bool
                 ) -> tuple[float, float, float]:
    """Exact (running seconds, energy J, gCO2) of job j on group g in segments `segs_s`
    (seconds from now): the job's power while running, for a pause job k GPUs' idle power
    in the gaps between its segments."""
    from datetime import timedelta

    group = problem.groups[g]
    power_w = float(problem.job_power_w[j, g])
    run_s = sum(b - a for a, b in segs_s)
    energy_j = power_w * run_s
    gco2 = 0.0
    for a, b in segs_s:
        gco2 += problem.gco2_at(group.zone, problem.now + timedelta(seconds=a), b - a, power_w, group.pue)
    if pause and len(segs_s) > 1:
        idle_w = idle_power_w(group.model, int(problem.job_k[j]))
        for (_, b), (a2, _) in zip(segs_s, segs_s[1:]):
            energy_j += idle_w * (a2 - b)
            gco2 += problem.gco2_at(group.zone, problem.now + timedelta(seconds=b), a2 - b, idle_w, group.pue)
    return run_s, energy_j, gco2


def held_ranges(segments: tuple[tuple[int, int], ...], pause: bool) -> list[tuple[int, int]]:
    """Slot ranges the job's GPUs are held over: each segment, or a pause job's whole span."""
    if pause:
        return [(segments[0][0], segments[-1][1])]
    return list(segments)


def work_s(problem, j: int, g: int) -> float:
    """Job j's remaining work on group g in seconds of running, without resume costs."""
    job = problem.jobs[j]
    rt = float(problem.job_runtime_s[j, g])
    if problem.job_resumed[j]:
        rt = max(1.0, rt - job.resume_cost_s)
    return rt


def segmented_pick(problem, state, j: int, one_piece_g: float, one_piece_pool: int | None):
    """The cheapest segmented plan of interruptible job j given the greedy `state` (nothing
    taken), as (pool, slot ranges, exact gCO2), when it beats `one_piece_g` (the job's
    one-piece pick's grams; inf: none) by `MIN_GAIN`; else None.

    Groups are tried cheapest lower bound first (`lower_bound_g`) and skipped once their
    bound cannot beat the best so far. On a group, the DP runs on the per-slot maximum free
    GPUs over its pools (`GreedyState.gmax`, and watts under the zone's cap); the plan goes to
    the tightest pool that holds it, else to the one-piece pick's pool by the DP on that pool.
    The DPs are asked in batches (`cheapest_segments_batch`: the groups not yet ruled out by
    their bounds, and the one-piece pick's pool), so the answer is the one-by-one answer; each
    plan ends by the deadline (`finish_by`)."""
    job = problem.jobs[j]
    pause = job.interruptible == "pause"
    k = int(problem.job_k[j])
    lo = int(problem.job_earliest[j])
    slot_s = problem.slot_s
    resumed = bool(problem.job_resumed[j])
    resume_s = float(job.resume_cost_s or 0.0)
    mr = max(1, int(math.ceil((job.min_run_s or slot_s) / slot_s - 1e-9)))
    M = int(job.max_segments)
    ends = window_ends(problem, [j])[0]
    cands = []
    for g in np.flatnonzero(problem.job_fit[j]).tolist():
        latest = int(problem.job_latest[j, g])
        if latest < lo:
            continue
        dur = int(problem.job_duration[j, g])
        end = int(ends[g])
        w = work_s(problem, j, g)
        if slots_needed(w, 2, resume_s, resumed, slot_s) > end - lo or dur < 2:
            continue
        run_g = problem.slot_integrals(problem.groups[g].zone) * float(problem.job_scale[j, g])
        # a cut plan has two segments at least, so pays one resume at least
        lb = lower_bound_g(run_g, lo, end, wall_s(w, 2, resume_s, resumed) / slot_s)
        # the work done by the deadline, inside its slot
        finish_by = None if job.deadline is None else \
            float(problem.job_on_time_latest[j, g]) + float(problem.job_runtime_s[j, g]) / slot_s
        cands.append((lb, g, latest, end, finish_by, w, run_g))
    cands.sort(key=lambda c: c[0])

    def avail_idle(g: int) -> tuple[np.ndarray, np.ndarray | None]:
        group = problem.groups[g]
        idle_g = None
        if pause:
            idle_g = problem.slot_integrals(group.zone) * (idle_power_w(group.model, k) * group.pue / J_PER_KWH)
        cap = state.power.get(group.budget)
        avail = state.gmax[g] >= k
        if cap is not None:
            avail = avail & (cap >= float(problem.job_power_w[j, g]) - 1e-9)
        return avail, idle_g

    best = None
    best_g = one_piece_g * (1.0 - MIN_GAIN)
    pick_group = None if one_piece_pool is None else int(problem.pool_group[one_piece_pool])
    answers: dict[tuple[int, int | None], SegmentPlan | None] = {}  # (candidate, pool) -> its DP

    def ask_from(ci: int) -> None:
        """The DPs of candidates ci... not yet ruled out by their bounds, in one batch: on any
        pool of the group, and on the one-piece pick's pool where it is of that group."""
        keys, queries = [], []
        for i in range(ci, len(cands)):
            lb_i, g_i, latest_i, end_i, finish_by, w_i, run_i = cands[i]
            if lb_i >= best_g:
                continue
            avail_i, idle_i = avail_idle(g_i)
            for pool in [None] + ([one_piece_pool] if g_i == pick_group else []):
                ok = avail_i if pool is None else avail_i & (state.rem[pool] >= k)
                keys.append((i, pool))
                queries.append(SegmentQuery(run_i, ok, end_i, latest_i, w_i, idle_i, finish_by))
        answers.update(zip(keys, cheapest_segments_batch(queries, lo, slot_s, resume_s, resumed, mr, M, pause)))

    for ci, (lb, g, _, _, _, w, _) in enumerate(cands):
        if lb >= best_g:
            break
        if (ci, None) not in answers:
            ask_from(ci)
        for pool in [None] + ([one_piece_pool] if g == pick_group else []):
            plan = answers[(ci, pool)]
            if plan is None or len(plan.slots) < 2:
                continue
            chosen = pool if pool is not None else _holding_pool(problem, state, g, k, plan.slots, pause)
            if chosen is None:
                continue
            segs_s = exact_segments_s(plan.slots, w, resume_s, resumed, slot_s)
            _, _, exact = segment_cost(problem, j, g, segs_s, pause)
            if exact < best_g:
                best, best_g = (chosen, plan.slots, exact), exact
            break
    return best


def _holding_pool(problem, state, g: int, k: int, slots: tuple[tuple[int, int], ...], pause: bool) -> int | None:
    """The tightest pool of group g with k GPUs free over every held slot range, or None."""
    members = problem._members(g, k)
    best, best_min = None, None
    for pool in members.tolist():
        m = min(int(state.rem[pool, a:b].min()) for a, b in held_ranges(slots, pause))
        if m >= k and (best_min is None or m < best_min):
            best, best_min = pool, m
    return best
