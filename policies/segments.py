"""Planning an interruptible job in segments (issue 30): which slots it runs in.

A job with `QueuedJob.interruptible` set may be cut into up to `max_segments` segments that
together do its remaining work and finish by its deadline (the slot planner's window: the
last one-piece start plus its duration, so the deadline margin of `policies.margin` holds).
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
    forecast the slots are priced by the zone's typical values (`policies.carbon_tail`)."""
    far = horizon_s
    for job in jobs:
        if interruptible(job) and job.deadline is not None:
            far = max(far, min(MAX_WINDOW_HORIZON_S, (job.deadline - now).total_seconds()))
    return horizon_s if far <= horizon_s else math.ceil(far / slot_s - 1e-9) * slot_s


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


def cheapest_segments(run_g: np.ndarray, avail: np.ndarray, lo: int, end: int, first_latest: int,
                      work_s: float, slot_s: float, resume_s: float, resumed: bool, min_run_slots: int,
                      max_segments: int, pause: bool = False, idle_g: np.ndarray | None = None
                      ) -> SegmentPlan | None:
    """The cheapest plan of 1 to `max_segments` segments in slots [lo, end), the first
    starting no later than `first_latest`, each at least `min_run_slots` long, running only
    in slots where `avail` is True (a pause job also holds its GPUs, so needs `avail`, in the
    slots between its segments, priced at `idle_g`). None: no such plan."""
    T = end - lo
    M = max(1, int(max_segments))
    mr = max(1, int(min_run_slots))
    need = [slots_needed(work_s, m, resume_s, resumed, slot_s) for m in range(1, M + 1)]
    L = need[-1]
    if T <= 0 or need[0] > T:
        return None
    run = np.asarray(run_g[lo:end], dtype=np.float64)
    ok = np.asarray(avail[lo:end], dtype=bool)
    run = np.where(ok, run, np.inf)
    idle = np.zeros(T) if not pause else np.where(ok, np.asarray(idle_g[lo:end], dtype=np.float64), np.inf)
    # block[t]: the first `mr` slots of a segment begun at t
    cs = np.concatenate([[0.0], np.cumsum(np.where(np.isfinite(run), run, 0.0))])
    bad = np.concatenate([[0], np.cumsum(~np.isfinite(run))])
    inf = math.inf
    off = np.full((T + 1, M + 1, L + 1), inf)
    on = np.full((T + 1, M + 1, L + 1), inf)
    off_stop = np.zeros((T + 1, M + 1, L + 1), dtype=bool)  # off[t] came from on[t] (a stop)
    on_start = np.zeros((T + 1, M + 1, L + 1), dtype=bool)  # on[t] came from a segment begun at t - mr
    off[0, 0, 0] = 0.0
    first_latest_local = first_latest - lo
    best, best_at = inf, None
    target = np.array(need, dtype=np.int64)
    # the share of its last slot a plan of r segments uses (the work ends inside it)
    unused = np.array([1.0 - min(1.0, wall_s(work_s, m, resume_s, resumed) / slot_s - (need[m - 1] - 1))
                       for m in range(1, M + 1)])
    rs = np.arange(1, M + 1)
    for t in range(T + 1):
        # finishing here: segment r just ends with exactly the slots r segments need; its last
        # slot (t - 1) priced by the share the work uses
        done = on[t, rs, target]
        if t > 0 and math.isfinite(run[t - 1]):
            done = done - run[t - 1] * unused
        r_best = int(np.argmin(done))
        if done[r_best] < best - 1e-12:
            best, best_at = float(done[r_best]), (t, r_best + 1)
        stop = on[t] < off[t]
        off[t] = np.where(stop, on[t], off[t])
        off_stop[t] = stop
        if t == T:
            break
        # wait one slot: free before the first segment; a pause job holds its GPUs after it
        nxt = off[t + 1]
        nxt[0] = off[t, 0]
        nxt[1:] = off[t, 1:] + idle[t]
        # run one more slot of the current segment
        if math.isfinite(run[t]):
            cand = on[t, :, :-1] + run[t]
            better = cand < on[t + 1, :, 1:]
            on[t + 1, :, 1:] = np.where(better, cand, on[t + 1, :, 1:])
            on_start[t + 1, :, 1:] &= ~better
        # begin a segment: its first `mr` slots at once
        if t + mr <= T and bad[t + mr] == bad[t] and mr <= L:
            # plus a hair per segment: of plans that cost the same, the one with fewer segments
            # (two back-to-back segments are one segment and a needless resume)
            block = cs[t + mr] - cs[t]
            block += 1e-9 * max(1.0, abs(block))
            cand = off[t, :-1, :L + 1 - mr] + block
            if t > first_latest_local:
                cand[0] = inf  # the first segment starts within the job's window
            better = cand < on[t + mr, 1:, mr:]
            on[t + mr, 1:, mr:] = np.where(better, cand, on[t + mr, 1:, mr:])
            on_start[t + mr, 1:, mr:] |= better
    if best_at is None or not math.isfinite(best):
        return None
    # walk back
    t, r = best_at
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
    return SegmentPlan(tuple(segs), best)


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
    from policies.catalog import lookup

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
    the tightest pool that holds it, else the DP runs again on the one-piece pick's pool."""
    job = problem.jobs[j]
    pause = job.interruptible == "pause"
    k = int(problem.job_k[j])
    S = problem.n_slots
    lo = int(problem.job_earliest[j])
    slot_s = problem.slot_s
    resumed = bool(problem.job_resumed[j])
    resume_s = float(job.resume_cost_s or 0.0)
    mr = max(1, int(math.ceil((job.min_run_s or slot_s) / slot_s - 1e-9)))
    M = int(job.max_segments)
    cands = []
    for g in np.flatnonzero(problem.job_fit[j]).tolist():
        latest = int(problem.job_latest[j, g])
        if latest < lo:
            continue
        dur = int(problem.job_duration[j, g])
        on_time = int(problem.job_on_time_latest[j, g])
        end = min(S, on_time + dur) if job.deadline is not None else S
        w = work_s(problem, j, g)
        if slots_needed(w, 2, resume_s, resumed, slot_s) > end - lo or dur < 2:
            continue
        run_g = problem.slot_integrals(problem.groups[g].zone) * float(problem.job_scale[j, g])
        lb = lower_bound_g(run_g, lo, end, wall_s(w, 1, resume_s, resumed) / slot_s)
        cands.append((lb, g, latest, end, on_time, w, run_g))
    cands.sort(key=lambda c: c[0])
    best = None
    best_g = one_piece_g * (1.0 - MIN_GAIN)
    for lb, g, latest, end, on_time, w, run_g in cands:
        if lb >= best_g:
            break
        group = problem.groups[g]
        idle_g = None
        if pause:
            idle_g = problem.slot_integrals(group.zone) * (idle_power_w(group.model, k) * group.pue / 3.6e6)
        cap = state.power.get(group.budget)
        avail = state.gmax[g] >= k
        if cap is not None:
            avail = avail & (cap >= float(problem.job_power_w[j, g]) - 1e-9)
        pools = [None]
        if one_piece_pool is not None and int(problem.pool_group[one_piece_pool]) == g:
            pools.append(one_piece_pool)
        for pool in pools:
            ok = avail if pool is None else avail & (state.rem[pool] >= k)
            plan = None
            e = end
            for _ in range(2):  # the last segment may end inside its slot past the deadline: one slot less
                plan = cheapest_segments(run_g, ok, lo, e, latest, w, slot_s, resume_s, resumed, mr, M,
                                         pause, idle_g)
                if plan is None or len(plan.slots) < 2:
                    plan = None
                    break
                segs_s = exact_segments_s(plan.slots, w, resume_s, resumed, slot_s)
                if job.deadline is None or segs_s[-1][1] <= on_time * slot_s + float(problem.job_runtime_s[j, g]) + 1e-6:
                    break
                plan, e = None, e - 1
            if plan is None:
                continue
            chosen = pool if pool is not None else _holding_pool(problem, state, g, k, plan.slots, pause)
            if chosen is None:
                continue
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
