"""CP-SAT: improve greedy's plan by large-neighbourhood search with OR-Tools CP-SAT.

Decomposition (chosen by measuring; see the module notes below):

1. **Start from greedy** (EDF, cheapest feasible (pool, start)): a complete plan in about a
   second at 5,000 jobs. That is the first plan; whatever happens next only improves on it.
2. **LNS loop** until `max_time_s`: free a neighbourhood of `neighbourhood` jobs, solve a
   small CP-SAT model that re-places them against the capacity the other jobs leave, and
   keep the result if it is cheaper. One monolithic model over all jobs stalled near the
   hint from 1,000 jobs up in the prototype; small re-solves of 0.3-1 s keep improving.
3. **The sub-model**: one Boolean per candidate (job, pool, start slot), exactly one per
   freed job. Candidates per job: its current pick, and for its `candidates` cheapest
   (group, start) pairs in its window (cost-curve valleys fall out of this ranking) the
   best-fitting pools that are free over the whole run against the fixed jobs. Per (pool,
   slot) linear capacity constraints (k GPUs per job) and, where a zone has a power cap,
   per (zone, slot) watt constraints. Objective: integer centigrams, plus a large penalty
   for a deadline miss. The current plan is given as a complete hint.
4. **Neighbourhoods**: a seed job with a large regret (its gCO2 minus the cheapest start
   in its window on an empty cluster) plus the jobs that currently hold the pools and slots
   it would rather use, repeated until the neighbourhood is full; every few rounds a purely
   random set, so the search does not circle the same blockers.

Measured so far (helper's own generator: 4 zones of 2022 Electricity Maps data, 6 models,
8-GPU nodes, all jobs queued at once, load ~half of 48 h capacity, 0-24 h slack; 2 shared
cores): greedy is 18-21% below fifo; LNS gained only 0.01-0.2% on greedy in 10-30 s at 200
and 1,000 jobs, even with one monolithic solve over all 200 jobs and 40 candidates per job,
so on that instance the capacity of the clean zones, not the search, binds. The issue's
targets (>= 8% / 5% / 3%) are not met there; bench/planner's LP bound says how much is left.

Accepts FEASIBLE answers (a time-limited sub-solve rarely proves optimality). If the
solver fails, the incumbent stays. Finally the plan is compared with greedy's and with
fifo's (`placement.Score`) and the best is returned, so cpsat is never worse than greedy.
Only jobs starting in the next tick matter to the daemon; the rest are re-planned on the
next tick, so repeated ticks keep closing the gap (each tick warm-starts from greedy).
"""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from policies.greedy import GreedyState, edf_order, greedy_picks, keep_better_than_fifo
from policies.model import Plan, Snapshot
from policies.placement import Notes, Pick, picks_to_plan, plan_score
from policies.problem import Problem, compile_problem

log = logging.getLogger(__name__)

MISS_PENALTY = 10**9  # objective units (centigrams) for a deadline miss


@dataclass
class CpsatPolicy:
    name: str = "cpsat"
    max_time_s: float = 10.0  # wall time for the whole plan, greedy included
    workers: int = 1  # CP-SAT search workers per sub-solve
    neighbourhood: int = 150  # jobs freed per LNS round
    candidates: int = 12  # cheapest (group, start) pairs considered per freed job
    sub_time_s: float = 0.5  # time limit of one sub-solve
    seed: int = 0

    def plan(self, snapshot: Snapshot) -> Plan:
        started = time.monotonic()
        problem = compile_problem(snapshot)
        return self.plan_problem(problem, started)

    def plan_problem(self, problem: Problem, started: float | None = None) -> Plan:
        started = time.monotonic() if started is None else started
        deadline = started + self.max_time_s
        state = GreedyState(problem)
        notes: dict[int, Notes] = {}
        picks, unplaced = greedy_picks(problem, state, edf_order(problem), notes)
        greedy_plan = picks_to_plan(problem, picks, unplaced, "greedy", notes)
        current = {p.j: p for p in picks}
        try:
            rounds, improved = _lns(problem, state, current, deadline, self)
        except (RuntimeError, ValueError) as e:  # a solver failure: keep greedy's answer
            log.warning("cpsat: LNS failed (%s); falling back to greedy", e)
            rounds, improved = 0, 0
        log.info("cpsat: %d LNS rounds, %d improved, %.2f s", rounds, improved, time.monotonic() - started)
        new_picks = [current[j] for j in sorted(current)]
        changed = {p.j for p in new_picks} - {p.j for p in picks if current.get(p.j) == p}
        plan = picks_to_plan(problem, new_picks, unplaced, self.name,
                             {j: n for j, n in notes.items() if j not in changed})
        if plan_score(problem, greedy_plan).better_than(plan_score(problem, plan)):
            plan = greedy_plan
        return keep_better_than_fifo(problem, plan, self.name)


def _option_of(problem: Problem, j: int, pool: int) -> int:
    jo = problem.job_options(j)
    return int(jo.first[np.searchsorted(jo.groups, problem.pools[pool].group)])


def _footprint(problem: Problem, p: Pick) -> tuple[int, int, float]:
    jo = problem.job_options(p.j)
    o = _option_of(problem, p.j, p.pool)
    return max(1, problem.jobs[p.j].gpus), int(jo.duration[o]), jo.shapes[problem.pools[p.pool].model].power_w


def _pick_cost(problem: Problem, p: Pick, table: np.ndarray | None = None) -> int:
    jo = problem.job_options(p.j)
    if table is None:
        table = problem.cost_table(p.j)
    row = int(np.searchsorted(jo.groups, problem.pools[p.pool].group))
    c = int(round(float(table[row, p.slot]) * 100))
    return c + (MISS_PENALTY if p.deadline_miss else 0)


def _lns(problem: Problem, state: GreedyState, current: dict[int, Pick], deadline: float,
         cfg: CpsatPolicy) -> tuple[int, int]:
    if len(current) < 2:
        return 0, 0
    rng = random.Random(cfg.seed)
    S = problem.n_slots
    # per job: cheapest (row, slot) candidates in its window, and its regret
    cand: dict[int, list[tuple[int, int, int]]] = {}  # j -> [(cost, group, slot)]
    regret: dict[int, int] = {}
    cost_now: dict[int, int] = {}
    slots = np.arange(S)
    for j, p in current.items():
        if time.monotonic() > deadline:
            return 0, 0
        jo = problem.job_options(j)
        table = problem.cost_table(j)
        window = (slots[None, :] >= jo.earliest) & (slots[None, :] <= jo.latest[jo.first][:, None])
        masked = np.where(window, table, np.inf).ravel()
        finite = np.flatnonzero(np.isfinite(masked))
        take = finite if finite.size <= cfg.candidates else \
            finite[np.argpartition(masked[finite], cfg.candidates)[:cfg.candidates]]
        cand[j] = sorted((int(round(float(masked[i]) * 100)), int(jo.groups[i // S]), int(i % S)) for i in take)
        cost_now[j] = _pick_cost(problem, p, table)
        regret[j] = cost_now[j] - (cand[j][0][0] if cand[j] else cost_now[j])
    # who holds which (pool, slot)
    holders: dict[int, list[int]] = defaultdict(list)  # pool -> jobs
    for j, p in current.items():
        holders[p.pool].append(j)
    rounds = improved = 0
    jobs = list(current)
    while time.monotonic() + 0.05 < deadline:
        rounds += 1
        if len(jobs) <= cfg.neighbourhood:
            free = set(jobs)
        elif rounds % 4 == 0:
            free = set(rng.sample(jobs, min(cfg.neighbourhood, len(jobs))))
        else:
            free = _regret_neighbourhood(problem, current, cand, regret, holders, rng, cfg.neighbourhood)
        if not free:
            break
        limit = min(cfg.sub_time_s, deadline - time.monotonic())
        if limit <= 0.05:
            break
        result, optimal = _solve_sub(problem, state, current, sorted(free), cand, limit, cfg)
        whole = optimal and len(free) == len(jobs)  # the whole plan solved to optimality
        if result is None:  # no answer in time: the freed jobs go back where they were
            _apply(problem, state, current, holders, {j: current[j] for j in free}, free)
            continue
        old_total = sum(cost_now[j] for j in free)
        new_total = sum(_pick_cost(problem, result[j]) for j in free)
        if new_total >= old_total:
            _apply(problem, state, current, holders, {j: current[j] for j in free}, free)
            if whole:
                break
            continue
        improved += 1
        _apply(problem, state, current, holders, result, free)
        for j in free:
            cost_now[j] = _pick_cost(problem, current[j])
            regret[j] = cost_now[j] - (cand[j][0][0] if cand[j] else cost_now[j])
        if whole:
            break
    return rounds, improved


def _regret_neighbourhood(problem, current, cand, regret, holders, rng, size) -> set[int]:
    pool_jobs = sorted((r, j) for j, r in regret.items() if r > 0)
    if not pool_jobs:
        return set()
    top = [j for _, j in pool_jobs[-max(size * 2, 10):]]
    free: set[int] = set()
    tries = 0
    while len(free) < size and tries < size * 4:
        tries += 1
        seed = rng.choice(top)
        free.add(seed)
        k = max(1, problem.jobs[seed].gpus)
        for _, g, s in cand[seed][:4]:
            for pool in problem._members(g, k)[:3].tolist():
                for other in holders.get(pool, ()):
                    q = current[other]
                    _, dur, _ = _footprint(problem, q)
                    if q.slot < s + 8 and s < q.slot + dur:
                        free.add(other)
                        if len(free) >= size:
                            return free
    return free


def _apply(problem, state, current, holders, result, free) -> None:
    """Replace the picks of `free` (already given back to `state`) by `result` and take them."""
    for j in free:
        old = current[j]
        if j in holders.get(old.pool, []):
            holders[old.pool].remove(j)
        new = result[j]
        current[j] = new
        k, dur, power_w = _footprint(problem, new)
        state.take(new.pool, new.slot, k, dur, power_w)
        holders[new.pool].append(j)


def _solve_sub(problem: Problem, state: GreedyState, current: dict[int, Pick], free: list[int],
               cand: dict[int, list[tuple[int, int, int]]], limit_s: float,
               cfg: CpsatPolicy) -> tuple[dict[int, Pick] | None, bool]:
    """Re-place the `free` jobs optimally among their candidates (gives their GPUs back to
    `state` first; the caller takes the returned or the old picks again)."""
    for j in free:
        k, dur, power_w = _footprint(problem, current[j])
        state.give_back(current[j].pool, current[j].slot, k, dur, power_w)
    S = problem.n_slots
    model = cp_model.CpModel()
    use: dict[tuple[int, int], list[tuple[cp_model.IntVar, int]]] = defaultdict(list)
    watts: dict[tuple[str, int], list[tuple[cp_model.IntVar, int]]] = defaultdict(list)
    options: dict[int, list[tuple[cp_model.IntVar, Pick]]] = {}
    objective = []
    for j in free:
        jo = problem.job_options(j)
        k = max(1, problem.jobs[j].gpus)
        here: list[tuple[cp_model.IntVar, Pick]] = []
        seen: set[tuple[int, int]] = set()
        cur = current[j]
        entries = [(cur.pool, cur.slot, cur.deadline_miss)]
        for _, g, s in cand[j]:
            members = problem._members(g, k)
            o = int(jo.first[np.searchsorted(jo.groups, g)])
            end = min(s + int(jo.duration[o]), S)
            mins = state.rem[members, s:end].min(axis=1)
            ok = np.flatnonzero(mins >= k)
            for i in ok[np.argsort(mins[ok], kind="stable")][:2].tolist():
                entries.append((int(members[i]), s, False))
        for pool, s, miss in entries:
            if (pool, s) in seen:
                continue
            seen.add((pool, s))
            pick = Pick(j, pool, s, miss)
            kk, dur, power_w = _footprint(problem, pick)
            x = model.NewBoolVar("")
            here.append((x, pick))
            end = min(s + dur, S)
            for t in range(s, end):
                use[(pool, t)].append((x, kk))
            zone = problem.pools[pool].zone
            if zone in state.power:
                for t in range(s, end):
                    watts[(zone, t)].append((x, int(np.ceil(power_w))))
            objective.append(_pick_cost(problem, pick) * x)
            model.AddHint(x, pick == cur)
        model.AddExactlyOne(x for x, _ in here)
        options[j] = here
    for (pool, t), terms in use.items():
        cap = int(state.rem[pool, t])
        if sum(k for _, k in terms) > cap:
            model.Add(sum(k * x for x, k in terms) <= cap)
    for (zone, t), terms in watts.items():
        cap = state.power[zone][t]
        if sum(w for _, w in terms) > cap:
            model.Add(sum(w * x for x, w in terms) <= int(np.floor(cap)))
    model.Minimize(sum(objective))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, limit_s)
    solver.parameters.num_workers = max(1, cfg.workers)
    solver.parameters.random_seed = cfg.seed
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, False
    out: dict[int, Pick] = {}
    for j, here in options.items():
        for x, pick in here:
            if solver.BooleanValue(x):
                out[j] = pick
                break
        else:
            return None, False
    return out, status == cp_model.OPTIMAL
