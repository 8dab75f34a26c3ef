"""Greedy: earliest deadline first, each job on its cheapest feasible (pool, start).

Jobs are taken in EDF order (no deadline = last; then submission time, id). For each job the
(group, start slot) pairs inside its window are ranked by gCO2 (ties: earlier start), and
the first one with a pool that has k GPUs free over the whole run (and watts left under the
zone's power cap) wins. Ranking per group instead of per pool is what makes it fast: all
pools of a group cost the same, so one sorted list of ~25 groups x 192 slots serves ~130
pools, and at half load the first few candidates are usually feasible.

A job that fits no start inside its window (deadline / max delay) is placed as soon as
possible on the cheapest pool that can start then, flagged `deadline_miss`. A job that has
no option at all (memory, SLO, gang size) or no free GPUs anywhere within the horizon is
reported in `Plan.unplaced` with the reason.

Finally the plan is compared with fifo's (on the model's own estimate, `placement.Score`)
and fifo's plan is kept if it is feasible and strictly better, so greedy is never worse than
the carbon-agnostic baseline.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from policies.model import Plan, Snapshot
from policies.placement import Notes, Pick, build_assignment, notes_for, picks_to_plan, plan_score, plan_violations
from policies.problem import Problem, compile_problem

log = logging.getLogger(__name__)



def edf_order(problem: Problem) -> list[int]:
    """Job indices by deadline (none last), then submission time, then id."""
    def key(j: int):
        job = problem.jobs[j]
        return (job.deadline is None, job.deadline or job.submitted_at, job.submitted_at, job.id)
    return sorted(range(len(problem.jobs)), key=key)


class GreedyState:
    """Remaining GPUs per (pool, slot) and watts per (capped zone, slot) while placing."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.rem = problem.capacity_matrix()
        self.power = {z: problem.power_cap_w(z) for z in problem.capped_zones}
        # most GPUs free on any one pool of a group, per slot: a cheap upper bound that
        # filters (group, start) candidates before the exact per-pool check
        self.gmax = np.zeros((len(problem.groups), problem.n_slots), dtype=np.int32)
        for g, grp in enumerate(problem.groups):
            self.gmax[g] = self.rem[list(grp.pools)].max(axis=0)

    def fits_at(self, pool: int, slot: int, k: int, dur: int, power_w: float) -> bool:
        end = min(slot + dur, self.problem.n_slots)
        if self.rem[pool, slot:end].min() < k:
            return False
        zone = self.problem.pools[pool].zone
        cap = self.power.get(zone)
        return cap is None or bool(cap[slot:end].min() >= power_w - 1e-9)

    def take(self, pool: int, slot: int, k: int, dur: int, power_w: float) -> None:
        end = min(slot + dur, self.problem.n_slots)
        self.rem[pool, slot:end] -= k
        g = self.problem.pools[pool].group
        self.gmax[g, slot:end] = self.rem[list(self.problem.groups[g].pools), slot:end].max(axis=0)
        cap = self.power.get(self.problem.pools[pool].zone)
        if cap is not None:
            cap[slot:end] -= power_w

    def give_back(self, pool: int, slot: int, k: int, dur: int, power_w: float) -> None:
        self.take(pool, slot, -k, dur, -power_w)


def place_job(problem: Problem, state: GreedyState, j: int, table: np.ndarray | None = None,
              max_candidates: int = 64) -> Pick | str:
    """The cheapest feasible pick for job j given `state` (not taken), or why there is none.

    `table` is the job's `problem.cost_table(j)` (computed when None).
    """
    jo = problem.job_options(j)
    if jo.pool.size == 0:
        if jo.excluded:
            return "fits no GPU model: " + ", ".join(f"{m} ({r})" for m, r in sorted(jo.excluded.items()))
        return "no usable GPUs"
    S = problem.n_slots
    lo = jo.earliest
    if lo >= S:
        return "released after the planning horizon"
    if table is None:
        table = problem.cost_table(j)
    k = max(1, problem.jobs[j].gpus)
    gis, first = jo.groups, jo.first
    slots = np.arange(S)
    window = (slots[None, :] >= lo) & (slots[None, :] <= jo.latest[first][:, None])
    pick = _first_feasible(problem, state, j, jo, gis, first, table, window, k, max_candidates)
    if pick is not None:
        return pick
    # deadline cannot be met: as soon as possible, cheapest pool at that start
    upper = _upper_feasible(problem, state, jo, gis, first, k)
    for s in np.flatnonzero(upper[:, lo:].any(axis=0)).tolist():
        s += lo
        best = None
        for row in np.argsort(table[:, s], kind="stable").tolist():
            if not upper[row, s]:
                continue
            pool = _free_pool(problem, state, jo, int(gis[row]), int(first[row]), s, k)
            if pool is not None:
                best = pool
                break
        if best is not None:
            return Pick(j, best, s, deadline_miss=True)
    return "no GPUs free within the planning horizon"


def _upper_feasible(problem: Problem, state: GreedyState, jo, gis, first, k: int) -> np.ndarray:
    """(groups x slots): True where some pool of the group may hold k GPUs for the whole run
    (the per-slot maximum over the group's pools never drops below k; power cap respected)."""
    S = problem.n_slots
    bad = state.gmax[gis] < k
    for row, (g, o) in enumerate(zip(gis.tolist(), first.tolist())):
        cap = state.power.get(problem.groups[g].zone)
        if cap is not None:
            bad[row] |= cap < jo.shapes[problem.groups[g].model].power_w - 1e-9
    cs = np.zeros((bad.shape[0], S + 1), dtype=np.int32)
    np.cumsum(bad, axis=1, out=cs[:, 1:])
    ends = np.minimum(np.arange(S)[None, :] + jo.duration[first][:, None], S)
    return (np.take_along_axis(cs, ends, axis=1) - cs[:, :S]) == 0


def _first_feasible(problem, state, j, jo, gis, first, cost, window, k, max_candidates) -> Pick | None:
    S = problem.n_slots
    masked = np.where(window & _upper_feasible(problem, state, jo, gis, first, k), cost, np.inf)
    flat = masked.ravel()
    finite = np.flatnonzero(np.isfinite(flat))
    if finite.size == 0:
        return None
    # cheapest first, ties to the earlier slot; sort a prefix first when there are many
    if finite.size > max_candidates:
        part = finite[np.argpartition(flat[finite], max_candidates)[:max_candidates]]
        order = part[np.lexsort((part % S, flat[part]))]
        pick = _scan(problem, state, j, jo, gis, first, order, S, k)
        if pick is not None:
            return pick
    order = finite[np.lexsort((finite % S, flat[finite]))]
    return _scan(problem, state, j, jo, gis, first, order, S, k)


def _scan(problem, state, j, jo, gis, first, order, S, k) -> Pick | None:
    for idx in order.tolist():
        gi, s = divmod(idx, S)
        pool = _free_pool(problem, state, jo, int(gis[gi]), int(first[gi]), s, k)
        if pool is not None:
            return Pick(j, pool, s)
    return None


def _free_pool(problem, state, jo, g, o, s, k) -> int | None:
    """A pool of group g with k GPUs free over the whole run from slot s (best fit)."""
    members = problem._members(g, k)
    dur = int(jo.duration[o])
    end = min(s + dur, problem.n_slots)
    power_w = jo.shapes[problem.groups[g].model].power_w
    cap = state.power.get(problem.groups[g].zone)
    if cap is not None and cap[s:end].min() < power_w - 1e-9:
        return None
    mins = state.rem[members, s:end].min(axis=1)
    ok = np.flatnonzero(mins >= k)
    if ok.size == 0:
        return None
    return int(members[ok[np.argmin(mins[ok])]])  # tightest fit keeps big gaps for big jobs


def greedy_picks(problem: Problem, state: GreedyState | None = None, order: list[int] | None = None,
                 notes: dict[int, Notes] | None = None) -> tuple[list[Pick], dict[int, str]]:
    """Place every job in `order` (EDF by default); returns picks and unplaced reasons (by
    job id). When `notes` is given it is filled with each pick's explanation inputs."""
    state = state or GreedyState(problem)
    picks: list[Pick] = []
    unplaced: dict[int, str] = {}
    for j in (order if order is not None else edf_order(problem)):
        table = problem.cost_table(j) if problem.job_options(j).pool.size else None
        res = place_job(problem, state, j, table)
        if isinstance(res, str):
            unplaced[problem.jobs[j].id] = res
            continue
        jo = problem.job_options(j)
        o = int(jo.first[np.searchsorted(jo.groups, problem.pools[res.pool].group)])
        state.take(res.pool, res.slot, max(1, problem.jobs[j].gpus), int(jo.duration[o]),
                   jo.shapes[problem.pools[res.pool].model].power_w)
        picks.append(res)
        if notes is not None:
            notes[j] = notes_for(problem, res, table)
    return picks, unplaced


def keep_better_than_fifo(problem: Problem, plan: Plan, policy: str) -> Plan:
    """Return fifo's plan (re-explained) instead of `plan` if it is feasible and better."""
    from policies.fifo import FifoPolicy

    fifo = FifoPolicy().plan(problem.snapshot)
    fifo_score, own = plan_score(problem, fifo), plan_score(problem, plan)
    if not fifo_score.better_than(own):
        return plan
    violations = plan_violations(problem, fifo)
    if violations:
        log.debug("fifo plan better but infeasible: %s", violations[:3])
        return plan
    log.info("%s: fifo's plan is better on the model's estimate (%s vs %s); keeping it",
             policy, fifo_score, own)
    return _relabel(fifo, f"{policy} (kept fifo's plan)")


def _relabel(plan: Plan, label: str) -> Plan:
    from dataclasses import replace

    return replace(plan, assignments=tuple(
        replace(a, explanation=a.explanation.replace("fifo:", f"{label}:", 1)) for a in plan.assignments))


@dataclass
class GreedyPolicy:
    name: str = "greedy"
    compare_fifo: bool = True  # keep fifo's plan when it is feasible and cheaper

    def plan(self, snapshot: Snapshot) -> Plan:
        problem = compile_problem(snapshot)
        return self.plan_problem(problem)

    def plan_problem(self, problem: Problem) -> Plan:
        notes: dict[int, Notes] = {}
        picks, unplaced = greedy_picks(problem, notes=notes)
        plan = picks_to_plan(problem, picks, unplaced, self.name, notes)
        if self.compare_fifo:
            plan = keep_better_than_fifo(problem, plan, self.name)
        return plan


__all__ = ["GreedyPolicy", "GreedyState", "build_assignment", "edf_order", "greedy_picks", "place_job"]
