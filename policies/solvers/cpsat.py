"""CP-SAT: beat greedy's plan by greedy in other orders charged the LP's GPU-slot prices, then
large-neighbourhood search with OR-Tools CP-SAT, within `max_time_s`.

Where the gap was (bench/planner instances: real 2022 carbon data of 4 zones, 7 GPU models,
8-GPU nodes, half of 48 h of capacity queued, 0-24 h slack): every job prefers the same few
(pool, slot) pairs (at 200 jobs, nearly all of them want the 8 B200s in California; the sum
of each job's own cheapest start is 89 kg, the LP bound 132 kg, EDF greedy 207 kg). EDF hands
those pairs to whoever is due first, also to jobs that could run cleanly almost anywhere in a
long window, and pushes the inflexible ones into dirty slots. Searching around EDF's plan with
CP-SAT (the previous version) gained 0.01-0.3 %; changing who goes first gained 8-22 %.

Priority (`policies.solvers.priority.plan_with_bounds`): where the jobs differ in
`QueuedJob.priority`, the steps below run once per priority, highest first, with the higher
plans held and `max_time_s` shared by jobs; jobs with a deferral bound are placed by greedy's
rule before the search, and jobs the search leaves with less than their least saving are
placed by that rule in a second plan. With one priority and no bounds: the steps below alone,
as before. Measured at 200x64 (work clock, 2 s): 4 priority levels 180 kg (one: 164 kg);
every job with a 1 g / 5 % least saving 191 kg (greedy 217 kg).

Decomposition (each step measured; figures below):

1. **Greedy, EDF** (`greedy.edf_pass`): the first plan, ~1 s of CPU at 5,000 jobs; the
   time it takes (`pass_s`) sizes everything after it. If the budget leaves no room for
   another pass, this is the answer (the 2 s first plan at 5,000 jobs).
2. **GPU-slot prices** (budgets of `price_min_time_s` = 5 s or more): what one GPU of a
   group in a slot is worth to the other jobs, from the LP relaxation's capacity duals: a
   projected subgradient ascent of its Lagrangian bound (`lp_relaxation.lagrangian_prices`,
   pools of a group merged) for `price_share` (30 %) of the time left, or, at sizes where
   the LP is solved for guidance (6. below), that LP's own duals. EDF and the restarts
   below hand contended clean capacity to whoever comes first; charged k x the prices of
   its run, a job that can run cleanly elsewhere goes elsewhere. This closed most of the
   2,000-job gap: one greedy pass priced by an 8.7 s ascent gave 1.32 t where 30 s of
   restarts and LNS without prices had reached 1.41 t (LP bound 1.249 t).
3. **Deterministic restarts** (`restart_keys`): greedy again with the least flexible jobs
   first: fewest in-window (group, start) options per GPU-slot of demand, per GPU, per
   regret (best minus second-best group), and plain option count; each order charged the
   prices at each of `price_scales` (x1 first, then unpriced, then x0.7). The best plan is
   kept (fewer unplaced, then fewer deadline misses, then fewer grams).
4. **Random restarts**: the best key (and its prices) times log-normal noise (`restart_sigma`), for
   `restart_share` of the remaining time or until max(30, 3 sqrt(jobs)) tries in a row
   fail; cheap at small sizes (0.03 s a pass at 200 jobs), a handful at 5,000.
5. **LNS** on the best plan until the deadline: free `neighbourhood` jobs and solve a
   CP-SAT model that re-places them against the capacity the other jobs leave; keep it if
   cheaper. Neighbourhoods rotate: (a) *regret*: jobs far from their own cheapest start plus
   the jobs holding the pools and slots they want; (b) *contention window*: one contended
   (pool, 4-hour window) drawn from a losing job's cheapest candidates, every job holding it
   there and every job whose cheapest candidates fall there, so the model decides who gets
   the clean capacity; (c) every 4th round a random set. A model over all 200 jobs (64
   candidates each, 25 s) found nothing better than its hint; 30-50-job re-solves of 0.5 s
   keep improving.
   (d) with LP guidance, every 4th round: jobs placed where the LP relaxation does not
   put them, with the jobs holding the LP's starts (RINS).
6. **LP guidance** (at most `lp_max_jobs` = 400 jobs, `max_time_s` >= 10 s): after the
   first greedy pass, the LP relaxation of the time-indexed model (`policies.solvers.lp_relaxation`,
   the bench's bound) gets up to 30 % of the time left (1.9 s at 200 jobs); each freed job
   is also offered the open (group, start) pairs the LP uses for it, and (d) above runs.
   Measured on bench/planner 200x64 (seed 1), 30 s, CP-SAT seeds 0-3: 0.1450, 0.1439,
   0.1429, 0.1440 t with it against 0.1452, 0.1453, 0.1447, 0.1448 t without (LP bound
   0.1388 t; mean gap 4.5 % -> 3.7 %). The search is chaotic: the same seed with 24 s gave
   0.1431 t, so single runs differ by +-0.8 %. At 1,000 jobs the LP needs ~48 s: not used.
7. **The sub-model**: one Boolean per candidate (job, pool, start slot), exactly one per
   freed job. Candidates: the current pick; the `candidates` cheapest in-window (group,
   start) pairs that some pool may still hold against the fixed jobs (not the cheapest on an
   empty cluster, which the fixed jobs usually block), plus the cheapest open start of every
   group; each with its two best-fitting free pools. Per (pool, slot) capacity constraints (k
   GPUs a job) and, in capped zones, per (zone, slot) watts. Objective: integer centigrams
   plus a large penalty per deadline miss; the current plan is the hint.

Measured (bench/planner, seed 1, `max_time_s` 30, 1 worker, 2 cores; gCO2 judged by
bench/planner/check.py; the LP bound is the on-time LP, converged; session 5):

  size        fifo      greedy    cpsat-30s  vs greedy  LP bound   gap    without prices (session 4)
  200x64      0.2865 t  0.1810 t  0.1423 t   -21.4 %    0.1388 t   2.5 %  0.1443 t (LP guidance only)
  1000x256    1.4483 t  1.0754 t  0.9519 t   -11.5 %    0.9344 t   1.9 %  0.9741 t
  2000x512    2.5444 t  1.5854 t  1.3035 t   -17.8 %    1.2486 t   4.4 %  1.4112 t
  5000x1024   4.7218 t  3.5792 t  3.3294 t   -7.0 %     3.2458 t   2.6 %  3.4176 t

(single runs: cpsat-30s varies by up to 1 % from run to run.)

cpsat's first plan (`max_time_s` 2, no prices): -17 % at 200 jobs, -9 % at 1,000 and 2,000;
at 5,000 it is greedy's EDF plan (no time for a second pass). With the daemon's budget
(7.5 s at the default 15 s interval) prices help too: 2000x512 1.3647 t with, 1.4260 t
without; 1000x256 0.9614 t against 0.9779 t.

Re-planning: a full re-plan is given the last tick's plan (`Snapshot.previous`) and tries it
first (`_previous_plan`), so the search goes on across ticks instead of starting over each
time; see docs/benchmarks.md ("Re-planning") for what that closes.

Under overload: EDF's cheapest starts can miss more deadlines on a snapshot than starting
every job where it finishes soonest (the carbon-blind edf's rule), and then the final
comparison below kept fifo's or edf's plan whole for the tick, dirty starts and the misses
of its own included. So the search also starts from that rule in the slot model
(`_earliest_finish`, `greedy.finish_first_tables`), and the restarts and LNS lower its grams
without adding a miss. That holds on each snapshot; across a replay at load 1.2 cpsat's
misses still spread widely from run to run (docs/benchmarks.md, "overload", sixth session).

Held starts (`hold`, `policies.problem.held_starts`): a job whose last plan left it less slack
after its finish than `hold` x its runtime (and than `hold_max_h`) is never started more
than a slot later than that plan promised; the promises are kept by the policy across its
plans. With `hold_pace` a promise also moves earlier with the clock (hours per hour) and the
job stays held until it starts. `hold_node_share` gives promises only to jobs whose GPUs
fill that share of their group's largest node. The default (`hold=1`, `hold_pace=1`,
`hold_max_h=12`, `hold_node_share=1`) holds whole-node gangs only: under load such a job
can start only when every GPU of a node is free at once, and a deferred one is the first to
lose its on-time start to later arrivals (the overload replays' extra misses over edf); a
narrower job finds a later gap and keeps following the cleaner hours. Holding every job
cost a third of the saving where the fleet has room (docs/benchmarks.md, "A paced promise",
"Whole-node gangs only"); `hold=0` turns promises off.

The budget (`deterministic`): wall time in the daemon; nominal work in the simulator
(`policies.solvers.work_clock`: greedy passes charged by the problem's size, sub-solves by CP-SAT's
deterministic time, one worker), so a replay repeats exactly on any host. The LP guidance
and the GPU-slot prices stop on wall time and are skipped there.

Accepts FEASIBLE answers (a time-limited sub-solve rarely proves optimality). If the
solver fails, the incumbent stays. Finally the plan is compared with greedy's and with
fifo's (`placement.Score`) and the best is returned, so cpsat is never worse than greedy.
The time after the search is reserved from `pass_s` (fresh explanations for every changed
pick, Assignments, fifo's comparison: about one pass), so `plan_problem` returns within
`max_time_s` on a busy host too. (`plan` then packs the jobs shorter than a slot with
`policies.solvers.short_jobs`, outside that budget: at 5,000 jobs the 30 s run took 61-72 s.) Only
jobs starting in the next tick matter to the daemon; the rest are re-planned next tick.
The short jobs are packed around cpsat's long plan, around greedy's and, when the budget still
has room, around the runner-up of the restarts; the best whole plan wins. A long plan cheaper
by itself may leave a short job late (bench/planner 5000x1024 with 50 % checkpoint jobs: 3.46 t
against greedy's 3.65 t, one short job 1.3 GPU-h late), and the runner-up then keeps most
of the search's gain instead of falling back to greedy's plan.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from policies.pricing.lateness import DEFAULT_LATENESS_G_PER_GPU_H, parse_lateness_price
from policies.solvers.greedy import (CHUNK, GreedyState, edf_order, edf_pass, greedy_picks, in_window, keep_better_than_fifo,
                             notes_for_picks, run_ends, whole_plan_vs_fifo)
from policies.problem.held_starts import Promises, hold_starts
from policies.types import Plan, Snapshot
from policies.solvers.placement import Notes, Pick, deferred_misses, estimate_score, picks_to_plan
from policies.problem.instance import Problem, compile_problem
from policies.problem.segments import interruptible
from policies.solvers.short_jobs import plan_with_short_jobs
from policies.solvers.work_clock import (SUB_MODEL_S_PER_OPTION, SUB_ROUND_MIN_S, Clock, WallClock, WorkClock,
                                 greedy_pass_work_s)

log = logging.getLogger(__name__)

MISS_PENALTY = 10**9  # objective units (centigrams) for a deadline miss
# making a plan of the picks (explanations, GPUs, Assignments): 0.42 s for 5,000 jobs on the
# bench host; the runner-up's plan (made and packed with the short jobs) is given twice that
PLAN_BUILD_S_PER_JOB = 1e-4


@dataclass
class CpsatPolicy:
    name: str = "cpsat"
    max_time_s: float = 10.0  # wall time for the whole plan, greedy included
    workers: int = 1  # CP-SAT search workers per sub-solve
    neighbourhood: int = 40  # jobs freed per LNS round
    candidates: int = 32  # cheapest open (group, start) pairs considered per freed job
    sub_time_s: float = 0.5  # time limit of one sub-solve
    seed: int = 0
    restart_share: float = 0.3  # share of the time after the deterministic restarts spent on random ones
    restart_sigma: float = 0.15  # log-normal noise on the sort key of a random restart
    # CP-SAT's presolve on the sub-models: off by default. Measured on 58 captured sub-models
    # (bench/planner 200 and 1,000 jobs; simulator ticks), 0.5 s each: without it 2.4x faster
    # on the small ones, all optimal (vs 37 of 40), and on the large ones 13 of 18 optimal
    # instead of 7 with a lower total objective.
    presolve: bool = False
    # LP guidance (small queues, enough time): solve the LP relaxation of the time-indexed
    # model (`policies.solvers.lp_relaxation`) with up to `lp_share` of the time left, then offer each
    # freed job the (group, start) pairs the LP uses for it and free, every 4th LNS round, the
    # jobs placed where the LP does not put them with the jobs holding the LP's starts.
    lp_max_jobs: int = 400  # 1,000 jobs took 48 s to converge: too slow for a tick
    lp_min_time_s: float = 10.0  # smaller budgets (a first plan) skip it
    lp_share: float = 0.3
    # GPU-slot prices (larger queues, or when the LP above is skipped): a subgradient ascent
    # of the LP's Lagrangian bound (`lp_relaxation.lagrangian_prices`) for `price_share` of the
    # time left; greedy restarts then charge each job k x the prices of the GPU-slots its
    # run uses, at each of `price_scales`
    price_min_time_s: float = 5.0
    price_share: float = 0.3
    price_scales: tuple[float, ...] = (1.0, 0.7)
    # grams per GPU-hour late (policies.pricing.lateness); "strict"/inf: misses first, then grams
    lateness_g_per_gpu_h: float | str = DEFAULT_LATENESS_G_PER_GPU_H
    # held starts (policies.problem.held_starts): a job whose last plan left it less slack after its
    # finish than `hold` x its runtime is never started more than a slot later than that
    # plan promised; 0: off
    hold: float = 1.0
    hold_max_h: float = 12.0  # ... and less slack than this many hours
    # a promise moves this many hours earlier per hour since it was given, and its job stays
    # held until it starts (a pull towards "now" set by the clock, not by how often plans come)
    hold_pace: float = 1.0
    # hold only jobs whose GPUs fill at least this share of their group's largest node (1:
    # whole-node gangs; 0: every job, which costs grams where the fleet has room)
    hold_node_share: float = 1.0
    # count `max_time_s` (and `sub_time_s`) in nominal seconds of work (policies.solvers.work_clock),
    # not wall time: the same snapshot gives the same plan on any host at any load (for the
    # simulator's comparisons). Skips the LP guidance and the GPU-slot prices, whose
    # solvers stop on wall time.
    deterministic: bool = False

    def __post_init__(self) -> None:
        self.lateness_g_per_gpu_h = parse_lateness_price(self.lateness_g_per_gpu_h)
        self._promises = Promises(self.hold_pace)  # held starts' promises, kept across this policy's plans

    def plan(self, snapshot: Snapshot) -> Plan:
        """cpsat's plan, tier by tier where the jobs differ in priority, with the jobs that
        bound their deferral, and those whose deferral saves less than their least saving,
        placed by greedy's rule first (`policies.solvers.priority.plan_with_bounds`): its search
        moves the jobs it is given, which such a job must not be. Each tier gets its share of
        `max_time_s` by its jobs."""
        from policies.solvers.greedy import GreedyPolicy
        from policies.solvers.priority import plan_with_bounds

        if self.hold > 0:
            self._promises.forget_all_but({j.id for j in snapshot.jobs})
        budget_s = self.max_time_s
        rule = GreedyPolicy(lateness_g_per_gpu_h=self.lateness_g_per_gpu_h)

        def share(part: float) -> None:
            self.max_time_s = budget_s * part

        try:
            return plan_with_bounds(snapshot, self.plan_tier, rule.plan_tier, share)
        finally:
            self.max_time_s = budget_s

    def plan_tier(self, snapshot: Snapshot) -> Plan:
        """cpsat's plan of jobs of one priority (or all, where they do not differ)."""
        clock: Clock = WorkClock() if self.deterministic else WallClock()
        started = clock.now()
        # greedy's plan of the long jobs when cpsat chose another, and the search's runner-up
        # (made only if there are short jobs to pack around it)
        others: list[Plan | Callable[[], Plan | None]] = []
        price = float(self.lateness_g_per_gpu_h)
        # jobs shorter than a slot are packed in continuous time around the slot plan (and
        # around greedy's: the better whole plan wins, so cpsat is never worse than greedy)
        return plan_with_short_jobs(
            snapshot, lambda snap: self.plan_problem(
                compile_problem(snap, price),
                started, others, snap is snapshot, clock),
            self.name, also=lambda: [p for p in (q() if callable(q) else q for q in others) if p is not None],
            final=lambda p: whole_plan_vs_fifo(snapshot, p, self.name, price),
            lateness_g_per_gpu_h=price)

    def plan_problem(self, problem: Problem, started: float | None = None,
                     others: list[Plan | Callable[[], Plan | None]] | None = None, compare_fifo: bool = True,
                     clock: Clock | None = None) -> Plan:
        """cpsat's plan of the problem's jobs; compared with fifo's unless `compare_fifo` is
        False (`plan` compares the whole plan instead when short jobs are packed after).
        `started` is when the budget began on `clock` (the policy's own clock when None)."""
        if clock is None:
            clock = WorkClock() if self.deterministic else WallClock()
        started = clock.now() if started is None else started
        if self.hold > 0:
            log.info("cpsat: %d starts held", hold_starts(problem, self.hold, self.hold_max_h, self._promises,
                                                               self.hold_node_share))
        notes: dict[int, Notes] = {}
        costs: dict[int, float] = {}
        t0 = clock.now()
        picks, unplaced, state, passes = edf_pass(problem, edf_order(problem), notes, costs)
        work_s = greedy_pass_work_s(problem)
        clock.charge(passes * work_s)
        # one pass's time sizes what follows; the first plan may have taken several (the
        # starved-first retry, the uncut pass), and charging them all would over-reserve
        pass_s = work_s if clock.deterministic else (clock.now() - t0) / max(1, passes)
        # leave time to turn picks into a plan and to compare it with greedy's and fifo's:
        # about one greedy pass when a restart replaced every pick (fresh explanations, two
        # plans, fifo's), measured on a busy host too; on the wall clock, also time to make
        # the runner-up's plan for the short-job packing (below)
        runner_up_s = 0.0 if clock.deterministic else 2 * PLAN_BUILD_S_PER_JOB * len(problem.jobs)
        deadline = started + self.max_time_s - (0.1 + pass_s) - runner_up_s
        best = edf_solution = _Solution.of(picks, unplaced, costs, "edf", problem)
        second: list[_Solution] = []  # the search's runner-up (`_restarts`)
        rounds = improved = 0
        try:
            # always, whatever is left of the budget (it costs about one greedy pass): a
            # re-plan must never come out worse than the plan it was given (on a loaded host
            # the budget could be gone before the search began)
            best, state = _previous_plan(problem, best, state)
            best, state = _earliest_finish(problem, best, state)
            clock.charge(2 * pass_s)
            support, price = ({}, None) if clock.deterministic else self._lp_support(problem, started, deadline)
            if price is None and not clock.deterministic:
                price = self._prices(problem, deadline, best.gco2)
            if len(problem.jobs) > self.neighbourhood:  # fewer: LNS solves them all at once, every order included
                best, state = _restarts(problem, best, state, deadline, pass_s, self, price, clock, second)
            current = {p.j: p for p in best.picks}
            if clock.now() + pass_s < deadline:  # its set-up costs about half a pass
                rounds, improved = _lns(problem, state, current, deadline, self, support, clock, pass_s)
        except (RuntimeError, ValueError) as e:  # a solver failure: keep greedy's answer
            log.warning("cpsat: search failed (%s); falling back to greedy", e)
            best, current = edf_solution, {p.j: p for p in picks}
        log.info("cpsat: best start %s, %d LNS rounds (%d improved), %.2f s%s", best.label, rounds, improved,
                 clock.now() - started, " of work" if clock.deterministic else "")
        first = {p.j: p for p in picks}
        new_picks = [current[j] for j in sorted(current)]
        unchanged = {j for j, p in current.items() if first.get(j) == p}
        t_build = time.monotonic()
        fresh = notes_for_picks(problem, [p for p in new_picks if p.j not in unchanged])
        plan = picks_to_plan(problem, new_picks, best.unplaced, self.name,
                             {**{j: notes[j] for j in unchanged}, **fresh})
        t_build = time.monotonic() - t_build
        if len(unchanged) != len(picks) or len(new_picks) != len(picks):
            greedy_plan = picks_to_plan(problem, picks, unplaced, self.name, notes)
            if estimate_score(problem, greedy_plan).better_than(estimate_score(problem, plan)):
                plan = greedy_plan
            elif others is not None:
                others.append(greedy_plan)
                runner_up = second[0] if second else None
                if runner_up is not None and runner_up.better_than(edf_solution):
                    # the short jobs are packed around each plan and the best whole plan
                    # wins: a second search plan, so one that leaves a short job late does
                    # not send the whole plan back to greedy's. Made when the short jobs
                    # are packed, if the budget still has room for it (making and packing
                    # it costs about twice making cpsat's plan)
                    budget_end = started + self.max_time_s

                    def runner_up_plan() -> Plan | None:
                        if not clock.deterministic and clock.now() + 2 * t_build > budget_end:
                            log.info("cpsat: no time left to offer the runner-up (%s)", runner_up.label)
                            return None
                        log.info("cpsat: the runner-up (%s) is offered too", runner_up.label)
                        return picks_to_plan(problem, runner_up.picks, runner_up.unplaced, self.name,
                                             notes_for_picks(problem, runner_up.picks))

                    others.append(runner_up_plan)
        return keep_better_than_fifo(problem, plan, self.name) if compare_fifo else plan

    def _lp_support(self, problem: Problem, started: float,
                    deadline: float) -> tuple[dict[int, list[tuple[int, int]]], np.ndarray | None]:
        """Job -> the (group, start) pairs the LP relaxation uses for it, and the LP's
        GPU-slot prices per (group, slot) (the cheapest pool's: a group slot is congested
        only when all its pools are); ({}, None) when the queue is too large or the budget
        too small for the LP, or the LP fails."""
        if not (2 <= len(problem.jobs) <= self.lp_max_jobs and self.max_time_s >= self.lp_min_time_s):
            return {}, None
        limit_s = self.lp_share * (deadline - time.monotonic())
        if limit_s <= 0.5:
            return {}, None
        try:
            from policies.solvers.lp_relaxation import lp_instance, solve_lp_bound

            result = solve_lp_bound(lp_instance(problem), time_limit_s=limit_s)
        except (RuntimeError, ValueError) as e:
            log.warning("cpsat: LP guidance failed (%s); searching without it", e)
            return {}, None
        support: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for j, pool, slot, x in result.solution:
            if x > 1e-6:
                support[j].append((int(problem.pool_group[pool]), int(slot)))
        price = None
        if result.gpu_slot_price is not None:
            price = np.stack([result.gpu_slot_price[pools].min(axis=0) for pools in problem._group_pools])
        log.info("cpsat: LP guidance from a %s LP (%.4f t, %.1f s)", "converged" if result.converged else "partial",
                 result.bound_g / 1e6, time.monotonic() - started)
        return dict(support), price

    def _prices(self, problem: Problem, deadline: float, plan_g: float) -> np.ndarray | None:
        """GPU-slot prices per (group, slot) from the Lagrangian ascent of the LP relaxation
        (pools of a group merged) for `price_share` of the time left, towards `plan_g` (a
        known plan's gCO2); None when the budget is too small or the ascent fails."""
        if len(problem.jobs) < 2 or self.max_time_s < self.price_min_time_s:
            return None
        t0 = time.monotonic()
        limit_s = self.price_share * (deadline - t0)
        if limit_s <= 0.5:
            return None
        try:
            from policies.solvers.lp_relaxation import lagrangian_prices, lp_instance

            inst = lp_instance(problem, merge=True)
            price, bound_g = lagrangian_prices(inst, time_limit_s=limit_s - (time.monotonic() - t0),
                                               target_g=plan_g)
        except (RuntimeError, ValueError) as e:
            log.warning("cpsat: GPU-slot prices failed (%s); searching without them", e)
            return None
        log.info("cpsat: GPU-slot prices from a Lagrangian bound of %.4f t (%.1f s)", bound_g / 1e6,
                 time.monotonic() - t0)
        return price


@dataclass
class _Solution:
    """A complete set of picks and how good it is (compared like `placement.Score`)."""

    picks: list[Pick]
    unplaced: dict[int, str]
    gco2: float
    misses: int
    label: str
    priced: bool = False  # a price of lateness: `gco2` is grams + priced lateness, misses do not rank first
    waiting: int = 0  # unplaced jobs that wait for GPUs past the horizon: misses, not unplaced

    @classmethod
    def of(cls, picks: list[Pick], unplaced: dict[int, str], costs: dict[int, float], label: str,
           problem: Problem | None = None) -> "_Solution":
        waiting, late_gpu_h = (0, 0.0) if problem is None else deferred_misses(unplaced, problem.jobs)
        late_g = 0.0 if problem is None else late_gpu_h * problem.effective_lateness_price
        return cls(picks, unplaced, sum(costs.values()) + late_g, sum(p.deadline_miss for p in picks) + waiting,
                   label, problem is not None and not problem.strict, waiting)

    def better_than(self, other: "_Solution") -> bool:
        """Strict: fewer unplaced, then fewer misses, then fewer grams. With a price of
        lateness the misses are in `gco2` already (grams + priced lateness): fewer unplaced,
        then a lower objective."""
        a, b = (len(self.unplaced) - self.waiting, self.misses), (len(other.unplaced) - other.waiting, other.misses)
        if self.priced:
            a, b = a[:1], b[:1]
        if a != b:
            return a < b
        return self.gco2 < other.gco2 - 1e-6 * max(1.0, abs(other.gco2))



def _previous_plan(problem: Problem, best: _Solution, state: GreedyState) -> tuple[_Solution, GreedyState]:
    """The last tick's plan (`Snapshot.previous`) where it still fits, in start order, the
    other jobs placed after it by greedy in EDF order: returned with its GreedyState if
    better than `best`, so a re-plan goes on from where the last tick's search ended."""
    # an interruptible job is placed afresh by greedy (its segments are not in a start slot)
    previous = sorted((x for x in problem.previous_picks() if not interruptible(problem.jobs[x[0]])),
                      key=lambda x: (x[2], x[0]))
    if not previous:
        return best, state
    s = GreedyState(problem)
    picks: list[Pick] = []
    costs: dict[int, float] = {}
    for c0 in range(0, len(previous), CHUNK):
        chunk = previous[c0:c0 + CHUNK]
        tables = problem.cost_tables([j for j, _, _ in chunk])
        for i, (j, pool, slot) in enumerate(chunk):
            pick = Pick(j, pool, slot)
            k, dur, power_w = _footprint(problem, pick)
            if s.fits_at(pool, slot, k, dur, power_w):
                s.take(pool, slot, k, dur, power_w)
                picks.append(pick)
                costs[j] = float(tables[i, problem.pool_group[pool], slot])
    rest = [j for j in edf_order(problem) if j not in costs]
    more, unplaced = greedy_picks(problem, s, rest, costs=costs)
    sol = _Solution.of(picks + more, unplaced, costs, f"previous plan ({len(picks)} of {len(previous)} kept)",
                       problem)
    return (sol, s) if sol.better_than(best) else (best, state)


def _earliest_finish(problem: Problem, best: _Solution, state: GreedyState) -> tuple[_Solution, GreedyState]:
    """EDF with each job where it finishes soonest (grams only break ties): the carbon-blind
    edf's rule in the slot model, returned with its GreedyState if better than `best`.

    Under overload that order misses fewer deadlines on a snapshot than the cheapest starts.
    Kept as it is (the final comparison with fifo's and edf's plans), such a plan commits
    its dirty starts for a tick; as a start for the search, its misses are kept and its
    grams lowered. Not tried when `best` places every job on time: then it could win on
    grams alone, which its rule leaves to ties, and the pass (about one greedy pass, outside
    the budget like `_previous_plan`) is spared where queues are largest."""
    if not best.misses and not best.unplaced:
        return best, state
    s = GreedyState(problem)
    costs: dict[int, float] = {}
    picks, unplaced = greedy_picks(problem, s, edf_order(problem), costs=costs, finish_first=True)
    sol = _Solution.of(picks, unplaced, costs, "earliest finish", problem)
    return (sol, s) if sol.better_than(best) else (best, state)


def restart_keys(problem: Problem) -> list[tuple[str, np.ndarray]]:
    """Sort keys (ascending: placed first) of the deterministic greedy restarts.

    EDF hands the cleanest (pool, slot) pairs to whoever is due first, even to jobs that
    could run cleanly almost anywhere in a long window. Placing the least flexible jobs
    first (fewest in-window (group, start) options per GPU-slot they need) leaves the
    flexible ones to fill in around them; on the bench/planner instances this alone cut
    greedy's gCO2 by 8-22 %. Regret (the gap between a job's best and second-best group)
    breaks ties between equally flexible jobs that lose a lot by not getting their best.
    """
    n = len(problem.jobs)
    counts = np.zeros(n)
    regret = np.zeros(n)
    slots = problem.slot_index
    for c0 in range(0, n, CHUNK):
        js = np.arange(c0, min(n, c0 + CHUNK))
        tables = problem.cost_tables(js)
        win = (slots[None, None, :] >= problem.job_earliest[js][:, None, None]) & \
            (slots[None, None, :] <= problem.job_latest[js][:, :, None])
        tables[~win] = np.inf
        counts[js] = np.isfinite(tables).sum(axis=(1, 2))
        per_group = np.sort(tables.min(axis=2), axis=1)
        if per_group.shape[1] >= 2:
            with np.errstate(invalid="ignore"):  # inf - inf: a job with at most one group
                gap = per_group[:, 1] - per_group[:, 0]
            regret[js] = np.where(np.isfinite(gap), gap, 0.0)
    demand = problem.job_k * np.where(problem.job_fit, problem.job_duration, np.iinfo(np.int64).max).min(
        axis=1, initial=np.iinfo(np.int64).max)
    demand = np.where(demand < np.iinfo(np.int64).max, demand, 1).astype(np.float64)
    scale = float(np.median(regret[regret > 0])) if (regret > 0).any() else 1.0
    return [("options per GPU-slot", counts / demand),
            ("options per GPU", counts / problem.job_k),
            ("options per regret", counts / (1.0 + regret / scale)),
            ("options", counts.copy())]


def _restarts(problem: Problem, best: _Solution, state: GreedyState, deadline: float, pass_s: float,
              cfg: CpsatPolicy, price: np.ndarray | None = None,
              clock: Clock | None = None, runner_up: list[_Solution] | None = None) -> tuple[_Solution, GreedyState]:
    """Greedy again in other orders (`restart_keys`), charged the GPU-slot `price` at each
    of `cfg.price_scales` and at none, then with random noise on the best key; returns the
    best solution and a GreedyState holding its picks. Each pass is charged `pass_s` on
    `clock`. `runner_up`, when given, ends holding the best solution of the search other
    than the one returned (empty while the best is still the first, EDF plan)."""
    clock = clock or WallClock()
    if len(problem.jobs) < 2 or clock.now() + 2 * pass_s > deadline:
        return best, state
    best_state: GreedyState | None = state
    best_key: np.ndarray | None = None
    best_price: np.ndarray | None = None

    def attempt(label: str, key: np.ndarray, charged: np.ndarray | None) -> bool:
        nonlocal best, best_state, best_key, best_price
        costs: dict[int, float] = {}
        s = GreedyState(problem)
        picks, unplaced = greedy_picks(problem, s, np.argsort(key, kind="stable").tolist(), costs=costs,
                                       price=charged)
        clock.charge(pass_s)
        sol = _Solution.of(picks, unplaced, costs, label, problem)
        if sol.better_than(best):
            if runner_up is not None and best.label != "edf":
                runner_up[:] = [best]
            best, best_state, best_key, best_price = sol, s, key, charged
            return True
        if runner_up is not None and best.label != "edf" and (not runner_up or sol.better_than(runner_up[0])):
            runner_up[:] = [sol]
        return False

    keys = restart_keys(problem)
    scales = list(cfg.price_scales) if price is not None else []
    # priced first: on bench/planner 2000x512 one priced pass beat 30 s of the unpriced search
    tries = [(f"{label}, priced x{a:g}", key, a * price) for a in scales[:1] for label, key in keys] + \
        [(label, key, None) for label, key in keys] + \
        [(f"{label}, priced x{a:g}", key, a * price) for a in scales[1:] for label, key in keys]
    for label, key, charged in tries:
        if clock.now() + pass_s > deadline:
            return best, best_state
        attempt(label, key, charged)
    if best_key is None:  # EDF stayed best: perturb the first flexible order anyway
        best_key = keys[0][1]
    rng = np.random.default_rng(cfg.seed)
    until = clock.now() + cfg.restart_share * max(0.0, deadline - clock.now())
    stale, patience = 0, max(30, 3 * int(math.sqrt(len(problem.jobs))))
    tries = 0
    while clock.now() + pass_s < until and stale < patience:
        tries += 1
        key = best_key * np.exp(cfg.restart_sigma * rng.standard_normal(best_key.size))
        stale = 0 if attempt(f"random restart {tries}" + (" (priced)" if best_price is not None else ""), key,
                             best_price) else stale + 1
    return best, best_state


def _footprint(problem: Problem, p: Pick) -> tuple[int, int, float]:
    """(GPUs, duration in slots, IT watts) of a pick."""
    g = int(problem.pool_group[p.pool])
    return int(problem.job_k[p.j]), int(problem.job_duration[p.j, g]), float(problem.job_power_w[p.j, g])


def _pick_cost(problem: Problem, p: Pick, table: np.ndarray | None = None) -> int:
    """A pick's objective in centigrams: its grams plus, strict, MISS_PENALTY for a deadline
    miss, or, with a price of lateness, the priced lateness. `table` is the job's row of
    `problem.cost_tables` (computed when None)."""
    if table is None:
        table = problem.cost_tables([p.j])[0]
    g = int(problem.pool_group[p.pool])
    c = int(round(float(table[g, p.slot]) * 100))
    if problem.penalised or p.deadline_miss:
        c += int(round(problem.late_penalty_at(p.j, g, p.slot) * 100))
    return c + (MISS_PENALTY if problem.strict and p.deadline_miss else 0)


def _objective_table(problem: Problem, j: int, table: np.ndarray) -> np.ndarray:
    """Job j's cost table (groups x slots) in the objective's grams: plus the priced lateness."""
    return table if not problem.penalised else table + problem.late_penalty(j)


def _lns(problem: Problem, state: GreedyState, current: dict[int, Pick], deadline: float,
         cfg: CpsatPolicy, support: dict[int, list[tuple[int, int]]] | None = None,
         clock: Clock | None = None, pass_s: float = 0.0) -> tuple[int, int]:
    """Large-neighbourhood search from `current` (changed in place) until `deadline` on
    `clock` (its set-up charged `pass_s / 2`, each round its sub-model and solve); returns
    (rounds, rounds that improved)."""
    clock = clock or WallClock()
    if len(current) < 2:
        return 0, 0
    rng = random.Random(cfg.seed)
    S = problem.n_slots
    # per job: cheapest (row, slot) candidates in its window, and its regret
    cand: dict[int, list[tuple[int, int, int]]] = {}  # j -> [(cost, group, slot)]
    regret: dict[int, int] = {}
    cost_now: dict[int, int] = {}
    # jobs planned in segments (policies.problem.segments) keep greedy's segments: the sub-model
    # places one-piece runs only
    jobs = sorted(j for j, p in current.items() if not p.segments)
    if len(jobs) < 2:
        return 0, 0
    clock.charge(pass_s / 2)
    for c0 in range(0, len(jobs), CHUNK):
        if clock.now() > deadline:
            return 0, 0
        js = np.array(jobs[c0:c0 + CHUNK], dtype=np.int64)
        tables = problem.cost_tables(js)
        for i, j in enumerate(js.tolist()):
            masked = np.where(in_window(problem, j), _objective_table(problem, j, tables[i]), np.inf).ravel()
            finite = np.flatnonzero(np.isfinite(masked))
            take = finite if finite.size <= cfg.candidates else \
                finite[np.argpartition(masked[finite], cfg.candidates)[:cfg.candidates]]
            cand[j] = sorted((int(round(float(masked[x]) * 100)), int(x // S), int(x % S)) for x in take.tolist())
            p = current[j]
            cost_now[j] = _pick_cost(problem, p, tables[i])
            regret[j] = cost_now[j] - (cand[j][0][0] if cand[j] else cost_now[j])
    if all(r <= 0 for r in regret.values()):
        return 0, 0  # every job holds its own cheapest in-window start: the costs add up, so optimal
    # who holds which (pool, slot)
    holders: dict[int, list[int]] = defaultdict(list)  # pool -> jobs
    for j in jobs:
        holders[current[j].pool].append(j)
    rounds = improved = 0
    overhead = 0.0  # the slowest round's time outside the solver (model building, bookkeeping)
    while clock.now() + 0.05 + overhead < deadline:
        round_start = clock.now()
        rounds += 1
        if len(jobs) <= cfg.neighbourhood:
            free = set(jobs)
        elif rounds % 4 == 0:
            free = set(rng.sample(jobs, min(cfg.neighbourhood, len(jobs))))
        elif rounds % 2 == 0:
            free = _window_neighbourhood(problem, current, cand, regret, holders, rng, cfg.neighbourhood)
        elif support and rounds % 4 == 3:
            free = _lp_neighbourhood(problem, current, support, holders, rng, cfg.neighbourhood) or \
                _regret_neighbourhood(problem, current, cand, regret, holders, rng, cfg.neighbourhood)
        else:
            free = _regret_neighbourhood(problem, current, cand, regret, holders, rng, cfg.neighbourhood)
        if not free:
            break
        limit = min(cfg.sub_time_s, deadline - clock.now() - overhead)
        if limit <= 0.05:
            break
        result, optimal, solve_s = _solve_sub(problem, state, current, sorted(free), limit, cfg, support, clock)
        overhead = max(overhead, clock.now() - round_start - solve_s)
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
            for other in _holding(problem, current, holders, problem._members(g, k)[:3].tolist(), s):
                free.add(other)
                if len(free) >= size:
                    return free
    return free


def _holding(problem, current, holders, pools, s):
    """The jobs whose runs on `pools` overlap [s, s + 8 slots): who holds a start there."""
    for pool in pools:
        for other in holders.get(pool, ()):
            q = current[other]
            _, dur, _ = _footprint(problem, q)
            if q.slot < s + 8 and s < q.slot + dur:
                yield other


def _lp_neighbourhood(problem, current, support, holders, rng, size) -> set[int]:
    """Jobs placed where the LP relaxation does not put them (in random order), each with the
    jobs holding the pools and slots the LP uses for it (RINS: search where the incumbent
    and the relaxation disagree)."""
    disagree = [j for j, p in current.items() if not p.segments and support.get(j) and
                (int(problem.pool_group[p.pool]), p.slot) not in support[j]]
    rng.shuffle(disagree)
    free: set[int] = set()
    for j in disagree:
        free.add(j)
        for g, s in support[j]:
            free.update(_holding(problem, current, holders, problem._group_pools[g].tolist(), s))
        if len(free) >= size:
            break
    return free


def _window_neighbourhood(problem, current, cand, regret, holders, rng, size) -> set[int]:
    """The jobs around one contended (pool, time window): a pool and start drawn from the
    cheapest candidates of the jobs that lose most (regret), then every job holding that
    pool in a window around it and every job whose own cheapest candidates fall there, so
    the sub-model decides who gets the contended capacity."""
    losers = sorted((r, j) for j, r in regret.items() if r > 0)
    if not losers:
        return set()
    seed = rng.choice([j for _, j in losers[-max(size, 10):]])
    if not cand[seed]:
        return {seed}
    _, g, s = rng.choice(cand[seed][:4])
    pools = problem._members(g, int(problem.job_k[seed])).tolist()
    pool = rng.choice(pools)
    width = 8  # two hours of 15-minute slots either side
    lo, hi = s - width, s + int(problem.job_duration[seed, g]) + width
    free = {seed}
    for other in sorted(holders.get(pool, ()), key=lambda o: abs(current[o].slot - s)):
        q = current[other]
        if q.slot < hi and lo < q.slot + int(problem.job_duration[other, g]):
            free.add(other)
            if len(free) >= size // 2:
                break
    wanting = [j for _, j in reversed(losers) if j not in free and
               any(gg == g and lo <= ss < hi for _, gg, ss in cand[j][:8])]
    for j in wanting[:size - len(free)]:
        free.add(j)
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


def _open_candidates(problem: Problem, state: GreedyState, j: int, table: np.ndarray, n: int,
                     lp_pairs: list[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """(group, start) pairs for job j in its window that some pool may still hold against
    `state` (the fixed jobs): the `n` cheapest, plus the cheapest start of every group, so
    the sub-model can trade a clean slot in one zone for one in another, plus those of
    `lp_pairs` (where the LP relaxation puts the job) that are open."""
    ok = state.upper_feasible(j, run_ends(problem, j)) & in_window(problem, j)
    masked = np.where(ok, _objective_table(problem, j, table), np.inf)
    flat = masked.ravel()
    finite = np.flatnonzero(np.isfinite(flat))
    if finite.size > n:
        finite = finite[np.argpartition(flat[finite], n)[:n]]
    S = problem.n_slots
    out = {(int(i // S), int(i % S)) for i in finite.tolist()}
    per_group = masked.argmin(axis=1)
    for g in np.flatnonzero(np.isfinite(masked.min(axis=1))).tolist():
        out.add((g, int(per_group[g])))
    out.update((g, s) for g, s in lp_pairs if ok[g, s])
    return sorted(out)


def _solve_sub(problem: Problem, state: GreedyState, current: dict[int, Pick], free: list[int],
               limit_s: float, cfg: CpsatPolicy,
               support: dict[int, list[tuple[int, int]]] | None = None,
               clock: Clock | None = None) -> tuple[dict[int, Pick] | None, bool, float]:
    """Re-place the `free` jobs optimally among their candidates (gives their GPUs back to
    `state` first; the caller takes the returned or the old picks again). Returns the new
    picks (None: no answer in time), whether they are optimal, and the solver's time on
    `clock` (a deterministic clock: the solver's deterministic time, which also bounds it;
    the sub-model's building is charged too)."""
    clock = clock or WallClock()
    for j in free:
        k, dur, power_w = _footprint(problem, current[j])
        state.give_back(current[j].pool, current[j].slot, k, dur, power_w)
    S = problem.n_slots
    model = cp_model.CpModel()
    # GPUs and watts each candidate would use, per (pool, slot) and (zone, slot); keyed by
    # pool * S + slot so the per-slot loops stay cheap
    use: dict[int, list[tuple[cp_model.IntVar, int]]] = defaultdict(list)
    watts: dict[tuple[str, int], list[tuple[cp_model.IntVar, int]]] = defaultdict(list)
    options: dict[int, list[tuple[cp_model.IntVar, Pick]]] = {}
    obj_vars: list[cp_model.IntVar] = []
    obj_coefs: list[int] = []
    tables = problem.cost_tables(free)
    for i, j in enumerate(free):
        k = int(problem.job_k[j])
        here: list[tuple[cp_model.IntVar, Pick]] = []
        seen: set[tuple[int, int]] = set()
        cur = current[j]
        entries = [(cur.pool, cur.slot, cur.deadline_miss)]
        for g, s in _open_candidates(problem, state, j, tables[i], cfg.candidates, (support or {}).get(j, ())):
            members = problem._members(g, k)
            end = min(s + int(problem.job_duration[j, g]), S)
            mins = state.rem[members, s:end].min(axis=1)
            ok = np.flatnonzero(mins >= k)
            late = not problem.strict and s > problem.job_on_time_latest[j, g]
            for m in ok[np.argsort(mins[ok], kind="stable")][:2].tolist():
                entries.append((int(members[m]), s, bool(late)))
        for pool, s, miss in entries:
            if (pool, s) in seen:
                continue
            seen.add((pool, s))
            pick = Pick(j, pool, s, miss)
            kk, dur, power_w = _footprint(problem, pick)
            x = model.NewBoolVar("")
            here.append((x, pick))
            end = min(s + dur, S)
            term = (x, kk)
            base = pool * S
            for key in range(base + s, base + end):
                use[key].append(term)
            budget = problem.pools[pool].budget
            if budget in state.power:
                wterm = (x, int(np.ceil(power_w)))
                for t in range(s, end):
                    watts[(budget, t)].append(wterm)
            obj_vars.append(x)
            obj_coefs.append(_pick_cost(problem, pick, tables[i]))
            if pick == cur:
                model.AddHint(x, True)  # the rest follow from exactly-one
        model.AddExactlyOne(x for x, _ in here)
        options[j] = here
    rem = state.rem.ravel()
    for key, terms in use.items():
        cap = int(rem[key])
        if len(terms) > 1 or terms[0][1] > cap:
            if sum(k for _, k in terms) > cap:
                model.Add(cp_model.LinearExpr.WeightedSum([x for x, _ in terms], [k for _, k in terms]) <= cap)
    for (budget, t), terms in watts.items():
        cap = state.power[budget][t]
        if sum(w for _, w in terms) > cap:
            model.Add(cp_model.LinearExpr.WeightedSum([x for x, _ in terms], [w for _, w in terms])
                      <= int(np.floor(cap)))
    model.Minimize(cp_model.LinearExpr.WeightedSum(obj_vars, obj_coefs))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = max(1, cfg.workers)
    solver.parameters.cp_model_presolve = cfg.presolve
    solver.parameters.random_seed = cfg.seed
    if clock.deterministic:
        # one worker: CP-SAT's parallel portfolio is not reproducible under a time limit
        solver.parameters.num_workers = 1
        solver.parameters.max_deterministic_time = max(0.05, limit_s)
        clock.charge(max(SUB_ROUND_MIN_S, SUB_MODEL_S_PER_OPTION * len(obj_vars)))
    else:
        solver.parameters.max_time_in_seconds = max(0.05, limit_s)
    t0 = clock.now()
    status = solver.Solve(model)
    clock.charge(solver.deterministic_time)
    solve_s = solver.deterministic_time if clock.deterministic else clock.now() - t0
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, False, solve_s
    out: dict[int, Pick] = {}
    for j, here in options.items():
        for x, pick in here:
            if solver.BooleanValue(x):
                out[j] = pick
                break
        else:
            return None, False, solve_s
    return out, status == cp_model.OPTIMAL, solve_s
