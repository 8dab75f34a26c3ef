"""Greedy: earliest deadline first, each job on its cheapest feasible (pool, start).

Jobs are taken in EDF order (no deadline = last; then submission time, id). For each job the
(group, start slot) pairs inside its window are ranked by gCO2 (ties: earlier start, then
group order), and the first one with a pool that has k GPUs free over the whole run (and
watts left under the zone's power cap) wins; among the group's pools the tightest fit wins
(it keeps large gaps for large gangs).

EDF is the documented baseline (DESIGN.md), kept on purpose: cpsat's other orders (least
flexible job first) are 8-22 % cheaper on the bench instances, see policies/solvers/cpsat.py.

How it stays fast (5,000 jobs x 1,024 GPUs, 192 slots, 28 groups, ~130 pools):

* everything per (job, group) that does not depend on the placement order is compiled for
  all jobs at once as arrays by `Problem` (fit, runtime, power, duration, window); the cost
  tables come in chunks of `CHUNK` jobs in greedy order from `Problem.cost_tables` (one
  `numpy.interp` per zone per chunk); the "if started now" alternative of the explanation is
  vectorised per chunk (`ChunkNotes`). Compiling went from 1.1 s to 0.03 s, the cost tables
  from 1.1 s to 0.2 s.
* ranking is per group, not per pool: all pools of a group cost the same. For each job one
  (groups x slots) mask keeps the in-window starts where some pool of the group may hold its
  k GPUs for the whole run: the per-slot maximum over the group's pools (`GreedyState.gmax`)
  never below k, tested for every start at once with prefix sums per k that `take` keeps
  current (`GreedyState.upper_feasible`). Then successive minima: all pairs at the cheapest
  cost (earliest start first), the exact per-pool check, and the next cost if none fits.
  Without the mask the cheapest 32 pairs were all taken for 90 % of the jobs at half load.

Measured, 5,000 x 1,024 bench/planner instance (seed 1), one fresh process per run, median
of 3 on 2 cores shared with 4 other agents (load average ~4): 1.26 s CPU, 2.14 s wall (the
host gave the process ~60 % of a core); it was 2.1-2.8 s wall on a quieter host before.
These are the slot planner's figures (`plan_problem`, what `plan` did before jobs shorter
than a slot were split off to `policies.solvers.short_jobs`; its packing of the instance's 225 such
jobs adds ~15 s of CPU at this size). Of
the CPU: greedy passes 0.8 s, fifo's comparison plan 0.22 s, Assignments 0.1 s, compiling
0.03 s. The plans are identical to the previous implementation's (checked at 200, 1,000 and
2,000 jobs: same picks, same explanations).

A job that fits no start inside its window (deadline / max delay) is placed where it
finishes soonest (a faster model may be worth waiting for: the least lateness), the cheapest
such start, flagged `deadline_miss`. (It used to take the earliest start: in the overload
scenario at load 0.9 that put a 44 h job on a free A100 at once, to finish 11.8 h late; by the
earliest finish it met its deadline.) Where GPUs that come free only past the
horizon would finish it at least a slot sooner, it waits for them instead, unplaced with a
`policies.pricing.deferral.Deferral` that the plan's score counts as its miss. With a
price of lateness (`lateness_g_per_gpu_h`, policies.pricing.lateness) the window is the hard one
(max delay, horizon) and a start past the deadline costs the price per GPU-hour late. A job
that has no option at all (memory, SLO, gang size) or no free GPUs anywhere within the
horizon is reported in `Plan.unplaced` with the reason.

An interruptible job (`QueuedJob.interruptible`, issue 30) is placed in one piece as above
first; then `policies.problem.segments.segmented_pick` looks for the cheapest plan of up to
`max_segments` segments against the same state (an exact DP over slots per group, groups
pruned by a lower bound), and takes it when it is at least `segments.MIN_GAIN` cheaper. A
checkpoint job's segments take capacity in their own slots (the GPUs are free between
them); a pause job's take its whole span (held, idle power priced). Where the plan with cuts
leaves a job late or unplaced, the plan with no job cut is made too and kept unless it does
worse on those counts (`edf_pass`: on a fleet short of GPU-hours the gaps between a
cut job's segments are worth more to the jobs that arrive later than the grams the cut
saves). A job that is not interruptible costs one attribute test: the 5,000-job planner
benchmark is unchanged.

Where the jobs differ in `QueuedJob.priority`, all of the above runs once per priority, highest
first, with the plans of the higher ones held (`policies.solvers.priority`). A job with a
deferral bound or a least saving (`policies.pricing.worth`) takes the cheapest start within
`max_defer_s` of its earliest feasible slot, and that earliest slot where a later one saves too
little (`policies.solvers.bounded_pick`).

Finally the plan is compared with fifo's (on the model's own estimate, `placement.Score`)
and fifo's plan is kept if it is feasible and strictly better, so greedy is never worse than
the carbon-agnostic baseline.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from policies.pricing.counterfactual import RUNTIME_TOL, Counterfactual
from policies.pricing.deferral import Deferral, past_horizon_start
from policies.pricing.feasibility import unfit_text
from policies.pricing.worth import bounded
from policies.solvers.bounded_pick import bounded_pick
from policies.problem.held_starts import is_held, unheld_latest, unheld_window_latest
from policies.pricing.lateness import DEFAULT_LATENESS_G_PER_GPU_H, parse_lateness_price
from policies.types import Plan, Snapshot
from policies.solvers.placement import (Notes, Pick, build_assignment, estimate_score, picks_to_plan, plan_violations,
                                window_binding)
from policies.problem.instance import Problem, compile_problem
from policies.problem.segments import held_ranges, interruptible, segmented_pick
from policies.solvers.short_jobs import plan_with_short_jobs

log = logging.getLogger(__name__)

CHUNK = 256  # jobs whose cost tables are computed together (~11 MB at 28 groups x 192 slots)
_TOL = 1e-9


def edf_order(problem: Problem) -> list[int]:
    """Job indices by deadline (none last), then submission time, then id."""
    def key(j: int):
        job = problem.jobs[j]
        return (job.deadline is None, job.deadline or job.submitted_at, job.submitted_at, job.id)
    return sorted(range(len(problem.jobs)), key=key)


class GreedyState:
    """Remaining GPUs per (pool, slot) and watts per (capped budget, slot) while placing."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.rem = problem.capacity_matrix()
        self.power = {b: problem.power_cap_w(b) for b in problem.capped_budgets}
        self.group_pools = problem._group_pools
        self.pool_group = problem.pool_group
        self.pool_budget = [p.budget for p in problem.pools]
        # most GPUs free on any one pool of a group, per slot: a cheap upper bound that
        # filters (group, start) candidates before the exact per-pool check
        self.gmax = np.zeros((len(problem.groups), problem.n_slots), dtype=np.int32)
        for g, pools in enumerate(self.group_pools):
            self.gmax[g] = self.rem[pools].max(axis=0)
        self._blocked_cs: dict[int, np.ndarray] = {}
        self._stale: dict[int, set[int]] = {}  # per k, groups whose gmax changed since its prefix sums
        self._budget_groups = {b: [g for g, grp in enumerate(problem.groups) if grp.budget == b] for b in self.power}
        # per pool, (end slot, GPUs) of what holds its GPUs past the horizon, picks included
        # (policies.pricing.deferral: when a late job that waits for faster GPUs could start)
        self.past_horizon = [list(holds) for holds in problem.pool_past_horizon]

    def _blocked(self, k: int) -> np.ndarray:
        """(groups x slots+1) prefix sums of "no pool of the group has k GPUs free"."""
        cs = self._blocked_cs.get(k)
        if cs is None:
            cs = np.zeros((self.gmax.shape[0], self.gmax.shape[1] + 1), dtype=np.int32)
            np.cumsum(self.gmax < k, axis=1, out=cs[:, 1:])
            self._blocked_cs[k] = cs
            self._stale[k] = set()
        else:
            stale = self._stale[k]
            if stale:
                # all stale groups in one cumsum: one call per group was 13,852 calls, ~0.1 s
                # of greedy at 5,000 jobs (cProfile); integer sums, so the same counts
                rows = np.fromiter(stale, dtype=np.int64, count=len(stale))
                cs[rows, 1:] = np.cumsum(self.gmax[rows] < k, axis=1)
                stale.clear()
        return cs

    def upper_feasible(self, j: int, ends: np.ndarray, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """(groups x slots): True where job j fits the group and some pool of it may hold
        its k GPUs over the whole run (the per-slot maximum over the group's pools never
        drops below k), with watts left under its power budget's cap. `ends` from `run_ends` (for
        the starts `lo` to `hi` only, when given)."""
        p = self.problem
        S = p.n_slots
        hi = S if hi is None else hi
        k = int(p.job_k[j])
        cs = self._blocked(k)
        ok = cs.ravel()[ends] == cs[:, lo:hi]
        ok &= p.job_fit[j][:, None]
        for budget, cap in self.power.items():
            for g in self._budget_groups[budget]:
                bad = np.zeros(S + 1, dtype=np.int32)
                np.cumsum(cap < p.job_power_w[j, g] - _TOL, out=bad[1:])
                ok[g] &= bad[ends[g] - g * (S + 1)] == bad[lo:hi]
        return ok

    def fits_at(self, pool: int, slot: int, k: int, dur: int, power_w: float) -> bool:
        end = min(slot + dur, self.problem.n_slots)
        if self.rem[pool, slot:end].min() < k:
            return False
        cap = self.power.get(self.pool_budget[pool])
        return cap is None or bool(cap[slot:end].min() >= power_w - _TOL)

    def take(self, pool: int, slot: int, k: int, dur: int, power_w: float) -> None:
        end = min(slot + dur, self.problem.n_slots)
        if slot + dur > end:
            self.past_horizon[pool].append((slot + dur, k))
        self.rem[pool, slot:end] -= k
        g = int(self.pool_group[pool])
        self.gmax[g, slot:end] = self.rem[self.group_pools[g], slot:end].max(axis=0)
        for stale in self._stale.values():
            stale.add(g)
        cap = self.power.get(self.pool_budget[pool])
        if cap is not None:
            cap[slot:end] -= power_w

    def give_back(self, pool: int, slot: int, k: int, dur: int, power_w: float) -> None:
        self.take(pool, slot, -k, dur, -power_w)

    def free_pool(self, j: int, g: int, s: int, upper_checked: bool = False) -> int | None:
        """A pool of group g with job j's k GPUs free over its whole run from slot s, and
        watts left under its power budget's cap (tightest fit), or None.

        `upper_checked`: the caller took (g, s) from `upper_feasible` of the current state,
        which has already tested the group maximum and the power cap over the run; they are
        not tested again (8,754 calls at 5,000 jobs; about a fifth of their time)."""
        p = self.problem
        k = int(p.job_k[j])
        end = min(s + int(p.job_duration[j, g]), p.n_slots)
        if not upper_checked:
            if self.gmax[g, s:end].min() < k:
                return None
            cap = self.power.get(p.groups[g].budget)
            if cap is not None and cap[s:end].min() < p.job_power_w[j, g] - _TOL:
                return None
        if self.group_pools[g].size == 1:  # gmax is that pool's own count
            return int(self.group_pools[g][0])
        members = p._members(g, k)
        mins = self.rem[members, s:end].min(axis=1)
        ok = (mins >= k).nonzero()[0]  # 1-D: np.flatnonzero's ravel and dispatch cost more than the search
        if ok.size == 0:
            return None
        return int(members[ok[np.argmin(mins[ok])]])  # tightest fit keeps big gaps for big jobs


def place_job(problem: Problem, state: GreedyState, j: int, table: np.ndarray | None = None) -> Pick | str:
    """The cheapest feasible pick for job j given `state` (not taken), or why there is none.

    `table` is the job's row of `problem.cost_tables` (all groups; computed when None).
    """
    if not problem.job_fit[j].any():
        jo = problem.job_options(j)
        if jo.excluded:
            return unfit_text(jo.excluded)
        return "no usable GPUs"
    S = problem.n_slots
    lo = int(problem.job_earliest[j])
    if lo >= S:
        return "released after the planning horizon"
    if table is None:
        table = problem.cost_tables([j])[0]
    if bounded(problem.jobs[j]):  # a deferral bound or a least saving (policies.pricing.worth)
        pick = bounded_pick(problem, state, j, table, lo, problem.window_latest(j), _cheapest_in_window,
                            run_ends)
    else:
        pick = _cheapest_in_window(problem, state, j, table, lo, problem.window_latest(j))
    if pick is None and is_held(problem, j):  # the promise cannot be kept: its real window
        pick = _cheapest_in_window(problem, state, j, table, lo, unheld_window_latest(problem, j))
    if pick is not None:
        return pick
    return _as_soon_as_possible(problem, state, j, table, lo, run_ends(problem, j))


def _cheapest_in_window(problem: Problem, state: GreedyState, j: int, table: np.ndarray, lo: int,
                        latest: np.ndarray) -> Pick | None:
    """The cheapest feasible pick for job j starting from slot `lo` to `latest` (per group),
    or None."""
    S = problem.n_slots
    # only the starts from its release to its last in-window start on any group it fits are
    # looked at: the per-job array work shrinks with the window (greedy at 5,000 jobs: ~4 %)
    hi = min(S, int(latest[problem.job_fit[j]].max()) + 1)
    if hi <= lo:
        return None
    W = hi - lo
    ok = state.upper_feasible(j, run_ends(problem, j, lo, hi), lo, hi)
    ok &= problem.slot_index[lo:hi] <= latest[:, None]
    cost = table[:, lo:hi] if not problem.penalised else table[:, lo:hi] + problem.late_penalty(j)[:, lo:hi]
    masked = np.where(ok, cost, np.inf).ravel()
    # successive minima: all (group, start) pairs at the cheapest cost, earliest start first
    # (then group order); at half load the first one is usually free on some pool
    while True:
        best = masked.min()
        if not math.isfinite(best):
            break
        # equal up to float noise (a flat curve's prefix sums differ in the last bits from slot
        # to slot): otherwise "the cheapest" start on a flat curve is a random later one.
        # `masked` is 1-D: .nonzero() directly (np.flatnonzero's wrappers: ~15,000 calls)
        ties = (masked <= best + 1e-9 * max(1.0, abs(best))).nonzero()[0]
        if ties.size > 1:
            ties = ties[np.lexsort((ties, ties % W))]
        for idx in ties.tolist():
            g, s = divmod(idx, W)
            pool = state.free_pool(j, g, lo + s, upper_checked=True)
            if pool is not None:  # priced: a start past the on-time window is a late pick
                return Pick(j, pool, lo + s, deadline_miss=not problem.strict
                            and lo + s > problem.job_on_time_latest[j, g])
        masked[ties] = np.inf
    return None


def in_window(problem: Problem, j: int) -> np.ndarray:
    """(groups x slots): True at the starts inside job j's window on each group."""
    slots = problem.slot_index
    return (slots[None, :] >= problem.job_earliest[j]) & (slots[None, :] <= problem.window_latest(j)[:, None])


def run_ends(problem: Problem, j: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """(groups x slots) flat indices into a (groups x slots+1) prefix-sum array of the end
    of job j's run started at each slot: `g * (S + 1) + min(s + duration, S)`; for the
    starts `lo` to `hi` (exclusive) only, when given."""
    S = problem.n_slots
    ends = np.minimum(problem.slot_index[lo:hi][None, :] + problem.job_duration[j][:, None], S)
    ends += problem.group_row_offsets[:, None]
    return ends


def _as_soon_as_possible(problem: Problem, state: GreedyState, j: int, table: np.ndarray, lo: int,
                         ends: np.ndarray) -> Pick | str:
    """The deadline cannot be met: the earliest finish (a faster model may be worth waiting
    for: the least lateness), then the cheapest start among those that finish then."""
    upper = state.upper_feasible(j, ends)
    upper[:, :lo] = False
    gs, ss = np.nonzero(upper)
    if gs.size == 0:
        return NO_GPUS
    finish = ss * problem.slot_s + problem.job_runtime_s[j, gs]
    for idx in np.lexsort((table[gs, ss], ss, finish)).tolist():
        g, s = int(gs[idx]), int(ss[idx])
        pool = state.free_pool(j, g, s, upper_checked=True)
        if pool is not None:  # a held start (policies.problem.held_starts) may still be on time
            pick = Pick(j, pool, s, deadline_miss=s > unheld_latest(problem, j, g))
            if pick.deadline_miss:
                wait = _wait_past_horizon(problem, state, j, float(finish[idx]), g)
                if wait is not None:
                    return wait
            return pick
    return NO_GPUS


def _wait_past_horizon(problem: Problem, state: GreedyState, j: int, finish_s: float, g_now: int) -> Deferral | None:
    """A `Deferral` when job j, late either way, finishes at least a slot sooner by waiting
    for GPUs that come free only past the horizon than by its soonest finish inside it
    (`finish_s` on group `g_now`, seconds from now); else None (policies.pricing.deferral)."""
    job = problem.jobs[j]
    if job.deadline is None:  # late on its maximum wait alone: waiting longer is no remedy
        return None
    S, k = problem.n_slots, int(problem.job_k[j])
    best: tuple[float, int, int] | None = None  # finish s, group, start slot
    for g in np.flatnonzero(problem.job_fit[j]).tolist():
        run_s = float(problem.job_runtime_s[j, g])
        if S * problem.slot_s + run_s >= finish_s - problem.slot_s:
            continue  # even a start right at the horizon's end finishes no sooner
        for pool in problem._group_pools[g].tolist():
            if int(problem.pool_size[pool]) < k:
                continue
            t = past_horizon_start(int(problem.pool_size[pool]), k, state.past_horizon[pool], S)
            f = t * problem.slot_s + run_s
            if best is None or f < best[0]:
                best = (f, g, t)
    if best is None or best[0] >= finish_s - problem.slot_s:
        return None
    f, g, t = best
    group, now_group = problem.groups[g], problem.groups[g_now]
    text = (f"deadline cannot be met: waits for {k}x{group.model} in {group.zone}, free in ~{_hours(t * problem.slot_s)} "
            f"(past the planning horizon), to finish in ~{_hours(f)} against ~{_hours(finish_s)} "
            f"on {now_group.model} in {now_group.zone} within it")
    return Deferral(text, problem.now + timedelta(seconds=f))


def _hours(seconds: float) -> str:
    h = seconds / 3600.0
    return f"{h:.0f} h" if h >= 10 else f"{h:.1f} h"


class ChunkNotes:
    """Explanation inputs for a chunk of jobs, vectorised: each job's "if run now"
    counterfactual (`policies.pricing.counterfactual`), and its cheapest in-window and in-horizon
    costs (for the binding constraint)."""

    def __init__(self, problem: Problem, js: np.ndarray, tables: np.ndarray) -> None:
        S = problem.n_slots
        self.problem = problem
        lo = problem.job_earliest[js]
        # if now (policies.pricing.counterfactual): per group the first slot with k GPUs free on one of
        # its pools; the earliest of them, then the fastest groups there, then the mean over the
        # tied (zone, model) pairs (groups are sorted by zone and model: pairs are contiguous)
        k = problem.job_k[js]
        width = problem.group_kth_free_slot.shape[1]
        first_free = problem.group_kth_free_slot[:, np.minimum(k, width) - 1].T
        now_slot = np.maximum(lo[:, None], first_free)  # (c, G)
        never = np.iinfo(np.int64).max
        now_slot = np.where(problem.job_fit[js], now_slot, never)
        if not problem.groups:  # no usable GPU at all: nothing is placed
            now_slot = np.full((len(js), 1), never)
        self.now_slot = now_slot.min(axis=1)
        self.now_ok = self.now_slot < S
        self.now_gco2 = np.full(len(js), np.nan)
        self.now_tied = np.zeros((len(js), len(problem.groups)), dtype=bool)
        rows = np.flatnonzero(self.now_ok)
        if rows.size:
            early = now_slot[rows] == self.now_slot[rows, None]
            runtime = np.where(early, problem.job_runtime_s[js[rows]], np.inf)
            fastest = runtime.min(axis=1, keepdims=True)
            tied = early & (runtime <= fastest * (1 + RUNTIME_TOL))
            grams = tables[rows[:, None], np.arange(tables.shape[1])[None, :], self.now_slot[rows, None]]  # (r, G)
            starts = problem.group_kind_starts
            kind_tied = np.logical_or.reduceat(tied, starts, axis=1)
            # each tied kind is the mean of its tied groups (sites of different PUE or power
            # cap), as `counterfactual.choose` has it; then the mean over the tied kinds
            kind_n = np.add.reduceat(tied.astype(np.float64), starts, axis=1)
            kind_sum = np.add.reduceat(np.where(tied, grams, 0.0), starts, axis=1)
            kind_grams = np.divide(kind_sum, kind_n, out=np.zeros_like(kind_sum), where=kind_n > 0)
            self.now_gco2[rows] = np.where(kind_tied, kind_grams, 0.0).sum(axis=1) / kind_tied.sum(axis=1)
            self.now_tied[rows] = tied
        self._kinds: dict[bytes, tuple[tuple[str, str], ...]] = {}
        # the cheapest start in each job's window (and its group), and from its release on
        slots = problem.slot_index
        after = slots[None, :] >= lo[:, None]
        in_window = slots[None, None, :] <= problem.job_latest[js][:, :, None]
        in_window &= after[:, None, :]
        # masked minima (`where=`), not minima of np.where(mask, tables, inf) copies: the same
        # values (a minimum is exact) at half the time, ~2.5 ms of ~8.5 per 256-job chunk
        per_group = np.min(tables, axis=2, where=in_window, initial=np.inf)
        self.best_window = per_group.min(axis=1, initial=np.inf)  # inf: no usable GPU at all
        self.best_after = np.min(np.min(tables, axis=1, initial=np.inf), axis=1, where=after, initial=np.inf)
        self.best_window_group = per_group.argmin(axis=1) if per_group.shape[1] else np.zeros(len(js), np.int64)

    def notes(self, i: int, j: int, pick: Pick, table: np.ndarray) -> Notes:
        """The Notes of pick (job j, row i of the chunk)."""
        p = self.problem
        g = int(p.pool_group[pick.pool])
        gco2 = float(table[g, pick.slot])
        now = None
        if self.now_ok[i]:
            key = self.now_tied[i].tobytes()
            kinds = self._kinds.get(key)
            if kinds is None:  # a few distinct tie sets per chunk
                kinds = self._kinds[key] = tuple(sorted({(p.groups[q].zone, p.groups[q].model)
                                                         for q in np.flatnonzero(self.now_tied[i]).tolist()}))
            now = Counterfactual(float(self.now_slot[i]), float(self.now_gco2[i]), kinds)
        return Notes(gco2, now, self._binding(i, j, pick, gco2))

    def _binding(self, i: int, j: int, pick: Pick, chosen: float) -> str | None:
        """The constraint that kept the job from a cheaper start (None: it got the cheapest)."""
        if pick.deadline_miss:
            return "deadline"
        p = self.problem
        lo = int(p.job_earliest[j])
        if lo >= p.n_slots:
            return None
        why = window_binding(p, j, chosen, float(self.best_window[i]), int(self.best_window_group[i]),
                             float(self.best_after[i]))
        if why is not None:
            return why
        if (p.job_why[j] == 2).any() and "slo" in p.job_options(j).excluded.values():
            return "slo"
        return None


def greedy_picks(problem: Problem, state: GreedyState | None = None, order: list[int] | None = None,
                 notes: dict[int, Notes] | None = None, costs: dict[int, float] | None = None,
                 price: np.ndarray | None = None,
                 finish_first: bool = False, cut: bool = True) -> tuple[list[Pick], dict[int, str]]:
    """Place every job in `order` (EDF by default); returns picks and unplaced reasons (by
    job id). When `notes` is given it is filled with each pick's explanation inputs, when
    `costs` is, with each pick's gCO2 (by job index). With `price` (see `priced_tables`)
    each job takes the feasible start cheapest in gCO2 plus the price of the GPU-slots it
    uses; `costs` and the explanations stay in plain gCO2. With `finish_first` each job
    takes the feasible start that finishes soonest, the cheapest of those, in one piece
    (the carbon-blind edf's rule). With `cut` False no job is cut into segments."""
    state = state or GreedyState(problem)
    order = order if order is not None else edf_order(problem)
    picks: list[Pick] = []
    unplaced: dict[int, str] = {}
    for c0 in range(0, len(order), CHUNK):
        js = np.array(order[c0:c0 + CHUNK], dtype=np.int64)
        tables = problem.cost_tables(js)
        chunk_notes = ChunkNotes(problem, js, tables) if notes is not None else None
        choose = tables if price is None else priced_tables(problem, js, tables, price)
        if finish_first:
            choose = finish_first_tables(problem, js, choose)
        for i, j in enumerate(js.tolist()):
            res = place_job(problem, state, j, choose[i])
            if isinstance(res, str):
                unplaced[problem.jobs[j].id] = res
                continue
            seg = None
            # cut into segments where that is cheaper (issue 30); never when finishing first
            if cut and interruptible(problem.jobs[j]) and not finish_first and not bounded(problem.jobs[j]):
                g = int(problem.pool_group[res.pool])
                one_g = float(tables[i, g, res.slot]) + (
                    problem.late_penalty_at(j, g, res.slot) if problem.penalised or res.deadline_miss else 0.0)
                seg = segmented_pick(problem, state, j, one_g, res.pool)
                if seg is not None:
                    res = Pick(j, seg[0], seg[1][0][0], False, seg[1])
            g = int(problem.pool_group[res.pool])
            if seg is None:
                state.take(res.pool, res.slot, int(problem.job_k[j]), int(problem.job_duration[j, g]),
                           float(problem.job_power_w[j, g]))
            else:
                for a, b in held_ranges(res.segments, problem.jobs[j].interruptible == "pause"):
                    state.take(res.pool, a, int(problem.job_k[j]), b - a, float(problem.job_power_w[j, g]))
            picks.append(res)
            if costs is not None:  # the objective: grams, plus the priced lateness (strict: of a miss)
                costs[j] = seg[2] if seg is not None else float(tables[i, g, res.slot]) + (
                    problem.late_penalty_at(j, g, res.slot) if problem.penalised or res.deadline_miss else 0.0)
            if chunk_notes is not None:
                notes[j] = chunk_notes.notes(i, j, res, tables[i])
                if seg is not None:
                    notes[j] = notes[j]._replace(gco2=seg[2])
    return picks, unplaced


#: at most this many jobs left without GPUs are moved to the front for a second pass
STARVED_RETRY_MAX = 64
NO_GPUS = "no GPUs free within the planning horizon"


def _not_waiting(unplaced: dict[int, str]) -> int:
    """Unplaced jobs that do not wait for GPUs past the horizon (a `Deferral` is a miss)."""
    return sum(not isinstance(why, Deferral) for why in unplaced.values())


def starved_first(problem: Problem, order: list[int], unplaced: dict[int, str],
                  notes: dict[int, Notes] | None = None, costs: dict[int, float] | None = None,
                  cut: bool = True) -> tuple[list[Pick], dict[int, str], GreedyState] | None:
    """A second greedy pass with the jobs the first one left without GPUs placed first, if
    it leaves fewer jobs unplaced (None: not asked, or no better). The order a pass takes
    jobs in can starve one: a job of days placed first takes the only gang of GPUs that a
    job of minutes fits, for longer than the horizon. Asked only for a few such jobs
    (`STARVED_RETRY_MAX`), so an overfull queue does not pay a second pass every tick.
    `notes` and `costs` are filled for the second pass's picks when it is returned."""
    starved = [j for j in order if unplaced.get(problem.jobs[j].id) == NO_GPUS]
    if not starved or len(starved) > STARVED_RETRY_MAX:
        return None
    first = set(starved)
    state = GreedyState(problem)
    new_notes = {} if notes is not None else None
    new_costs = {} if costs is not None else None
    picks, left = greedy_picks(problem, state, starved + [j for j in order if j not in first], new_notes, new_costs,
                               cut=cut)
    if _not_waiting(left) >= _not_waiting(unplaced):
        return None
    if notes is not None:
        notes.clear()
        notes.update(new_notes)
    if costs is not None:
        costs.clear()
        costs.update(new_costs)
    return picks, left, state


def priced_tables(problem: Problem, js: np.ndarray, tables: np.ndarray, price: np.ndarray) -> np.ndarray:
    """`tables` (the jobs' `problem.cost_tables`) plus, per (group, start), k times the sum of
    `price` (groups x slots, gCO2 per GPU-slot: what a GPU of that group in that slot is
    worth to the other jobs) over the job's run there."""
    S = problem.n_slots
    G = price.shape[0]
    cum = np.zeros((G, S + 1))
    np.cumsum(price, axis=1, out=cum[:, 1:])
    ends = np.minimum(problem.slot_index[None, None, :] + problem.job_duration[js][:, :, None], S)
    run = cum[np.arange(G)[None, :, None], ends] - cum[None, :, :S]
    return tables + problem.job_k[js][:, None, None] * run


#: grams a second of earlier finish outweighs in `finish_first_tables` (more than any job emits)
FINISH_FIRST_G_PER_S = 1e7


def finish_first_tables(problem: Problem, js: np.ndarray, tables: np.ndarray) -> np.ndarray:
    """`tables` (the jobs' cost tables) ranked by the finish of each (group, start) first:
    its finish in seconds x `FINISH_FIRST_G_PER_S`, plus its cost, which only breaks ties."""
    finish_s = problem.slot_offsets_s[None, None, :] + problem.job_runtime_s[js][:, :, None]
    return finish_s * FINISH_FIRST_G_PER_S + tables


def notes_for_picks(problem: Problem, picks: list[Pick]) -> dict[int, Notes]:
    """Explanation inputs of many picks at once (by job index), vectorised per chunk."""
    out: dict[int, Notes] = {}
    for c0 in range(0, len(picks), CHUNK):
        chunk = picks[c0:c0 + CHUNK]
        js = np.array([p.j for p in chunk], dtype=np.int64)
        tables = problem.cost_tables(js)
        cn = ChunkNotes(problem, js, tables)
        for i, pick in enumerate(chunk):
            out[pick.j] = cn.notes(i, pick.j, pick, tables[i])
    return out


def keep_better_than_fifo(problem: Problem, plan: Plan, policy: str) -> Plan:
    """Return fifo's plan (re-explained) instead of `plan` if it is feasible and better.
    Skipped between full re-plans (kept plans, a few new jobs): fifo's whole-queue pass would
    cost more than placing the new jobs; the full re-plans compare."""
    if problem.kept:
        return plan
    return _fifo_if_better(problem.snapshot, plan, policy, lambda p: estimate_score(problem, p), lambda: problem,
                           problem.lateness_g_per_gpu_h)


def whole_plan_vs_fifo(snapshot: Snapshot, plan: Plan, policy: str, lateness_g_per_gpu_h: float = math.inf) -> Plan:
    """`keep_better_than_fifo` for a whole plan (short jobs packed too): fifo's own plan of the
    whole queue, if it is feasible and better. Skipped between full re-plans, as there."""
    from policies.solvers.short_jobs import whole_score

    if snapshot.keep:
        return plan
    return _fifo_if_better(snapshot, plan, policy, lambda p: whole_score(p, snapshot, lateness_g_per_gpu_h),
                           lambda: compile_problem(snapshot), lateness_g_per_gpu_h)


def _fifo_if_better(snapshot: Snapshot, plan: Plan, policy: str, score, problem,
                    lateness_g_per_gpu_h: float = math.inf) -> Plan:
    """The carbon-blind baselines' plan of `snapshot` (fifo's, then edf's), relabelled, if
    `score` ranks it better than `plan` and it breaks no hard constraint of `problem()`
    (compiled only then); else `plan`. edf is asked since an overfull queue is where
    deadline order wins: a plan with more misses than edf's is never kept when strict."""
    from policies.solvers.edf import EdfPolicy
    from policies.solvers.fifo import FifoPolicy

    best, best_score = plan, score(plan)
    for base in (FifoPolicy(), EdfPolicy()):
        # explained only if it wins; given up as soon as its unplaced jobs and misses so far (a
        # lower bound of what `score` counts) show it cannot win
        # (priced lateness: misses do not rank first, so only unplaced jobs can rule it out early)
        beat = (best_score.unplaced,
                best_score.deadline_misses if not math.isfinite(lateness_g_per_gpu_h) else math.inf)
        quick = base.plan(snapshot, explain=False, beat=beat)
        if quick is None:
            continue
        quick_score = score(quick)
        if not quick_score.better_than(best_score):
            continue
        full = base.plan(snapshot)
        violations = plan_violations(problem(), full)
        if violations:
            log.debug("%s plan better but infeasible: %s", base.name, violations[:3])
            continue
        log.info("%s: %s's plan is better on the model's estimate (%s vs %s); keeping it",
                 policy, base.name, quick_score, best_score)
        best, best_score = _relabel(full, f"{policy} (kept {base.name}'s plan)", base.name), quick_score
    return best


def _relabel(plan: Plan, label: str, base: str = "fifo") -> Plan:
    from dataclasses import replace

    return replace(plan, assignments=tuple(
        replace(a, explanation=a.explanation.replace(f"{base}:", f"{label}:", 1)) for a in plan.assignments))


@dataclass
class GreedyPolicy:
    name: str = "greedy"
    compare_fifo: bool = True  # keep fifo's plan when it is feasible and cheaper
    # grams per GPU-hour late (policies.pricing.lateness); "strict"/inf: misses first, then grams
    lateness_g_per_gpu_h: float | str = DEFAULT_LATENESS_G_PER_GPU_H

    def __post_init__(self) -> None:
        self.lateness_g_per_gpu_h = parse_lateness_price(self.lateness_g_per_gpu_h)

    def plan(self, snapshot: Snapshot) -> Plan:
        """greedy's plan, tier by tier where the jobs differ in priority (`policies.solvers.priority`)."""
        from policies.solvers.priority import plan_by_priority

        return plan_by_priority(snapshot, self.plan_tier)

    def plan_tier(self, snapshot: Snapshot) -> Plan:
        """greedy's plan of jobs of one priority (or all, where they do not differ)."""
        # Jobs shorter than a slot are packed in continuous time around the slot plan. With
        # short jobs (`plan_long` then gets another snapshot) fifo is compared with the
        # whole plan at the end, not with the long jobs' plan first: one fifo pass, not two.
        price = float(self.lateness_g_per_gpu_h)
        return plan_with_short_jobs(
            snapshot, lambda snap: self.plan_problem(
                compile_problem(snap, price),
                compare_fifo=snap is snapshot),
            self.name, final=(lambda p: whole_plan_vs_fifo(snapshot, p, self.name, price))
            if self.compare_fifo else None, lateness_g_per_gpu_h=price)

    def plan_problem(self, problem: Problem, compare_fifo: bool = True) -> Plan:
        notes: dict[int, Notes] = {}
        picks, unplaced, _, _ = edf_pass(problem, edf_order(problem), notes)
        plan = picks_to_plan(problem, picks, unplaced, self.name, notes)
        if self.compare_fifo and compare_fifo:
            plan = keep_better_than_fifo(problem, plan, self.name)
        return plan


def _pass(problem: Problem, order: list[int], notes: dict[int, Notes] | None, costs: dict[int, float] | None,
          cut: bool) -> tuple[list[Pick], dict[int, str], GreedyState, int]:
    state = GreedyState(problem)
    picks, unplaced = greedy_picks(problem, state, order, notes, costs, cut=cut)
    retry = starved_first(problem, order, unplaced, notes, costs, cut=cut)
    if retry is None:
        return picks, unplaced, state, 1
    return (*retry, 2)


def _short_of(picks: list[Pick], unplaced: dict[int, str]) -> tuple[int, int]:
    """(jobs left unplaced, jobs placed late) of a pass."""
    return len(unplaced), sum(1 for p in picks if p.deadline_miss)


def edf_pass(problem: Problem, order: list[int], notes: dict[int, Notes] | None = None,
             costs: dict[int, float] | None = None) -> tuple[list[Pick], dict[int, str], GreedyState, int]:
    """greedy's pass over the jobs in `order` (with the starved-first retry): its picks, the
    unplaced jobs, the state after them and the passes it took (greedy's plan, and cpsat's
    start). Where it cut a job into segments and left a job unplaced or late, the pass with no
    job cut is made too and taken unless it leaves more jobs unplaced or late (issue 30; its
    passes are added). `notes` and `costs` are filled for the picks returned.

    Why: a plan sees only the jobs queued now: between a cut job's segments its GPUs
    go to them, but on a fleet already short of GPU-hours the jobs that arrive later need
    them, and the rest of a cut job ends near its deadline. In the overload scenario at load
    1.2 with 50 % checkpoint jobs this took misses from 8 to 6 (3 with no job interruptible)
    and kgCO2 from 855 to 817; where every job is on time (a fleet with room, GAIA's setting,
    the gap scenario) the cuts and their figures are unchanged. (Dropping cuts wherever a job
    is kept from its cheapest start by capacity matched the uncut run at load 1.2, but lost
    all of the gap scenario's saving; choosing by grams too gave 826 kg and 8 misses.)"""
    picks, unplaced, state, passes = _pass(problem, order, notes, costs, cut=True)
    # no job cut (every job of most queues: not interruptible) or none late: this pass is it
    if not any(len(p.segments) > 1 for p in picks) or not any(short := _short_of(picks, unplaced)):
        return picks, unplaced, state, passes
    whole_notes = {} if notes is not None else None
    whole_costs = {} if costs is not None else None
    w_picks, w_unplaced, w_state, w_passes = _pass(problem, order, whole_notes, whole_costs, cut=False)
    if _short_of(w_picks, w_unplaced) > short:
        return picks, unplaced, state, passes + w_passes
    for mine, theirs in ((notes, whole_notes), (costs, whole_costs)):
        if mine is not None:
            mine.clear()
            mine.update(theirs)
    return w_picks, w_unplaced, w_state, passes + w_passes


__all__ = ["GreedyPolicy", "GreedyState", "build_assignment", "edf_order", "edf_pass", "greedy_picks", "notes_for_picks",
           "place_job"]
