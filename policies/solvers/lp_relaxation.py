"""A proven lower bound on any plan's gCO2: the LP relaxation of the time-indexed model.

Two users: bench/planner judges every plan against it, and cpsat prices contended GPU-slots
by its capacity duals (`lagrangian_prices`, the Lagrangian ascent below on its own, at any
size) and, at small sizes, steers its search by where the LP puts each job
(`policies.solvers.cpsat`, "GPU-slot prices" and "LP guidance").

The model (what every policy solves, relaxed): x[j, o, s] in [0, 1] is the fraction of job
j started at slot s with option o (a pool and a shape); each job is placed once
(sum over o, s of x = 1); per pool and slot the GPUs in use are at most the pool's free
GPUs; per zone and slot the jobs' power is at most the zone's power cap, if any; minimise
the sum of cost * x. "Every start allowed": every slot where the option's cost is finite
(release, deadline, max delay) is a candidate, not just the ones a policy looks at.

The LP is solved by column generation with GLOP, which keeps the 5,000-job instance
(~10^7 candidate starts) tractable: the master LP holds only the columns generated so far;
each round prices every (job, pool, start) against the master's duals with numpy and adds
the most negative ones. Every round also yields a **Lagrangian bound** that is a valid
lower bound whatever the duals are (capacity duals are clipped to <= 0 first):

    LB(pi) = sum_j min_{o,s} [cost(j,o,s) - gpus * sum_{t in run} pi[pool,t] - power * sum rho[zone,t]]
             + sum_{pool,t} pi[pool,t] * cap[pool,t] + sum rho * power_cap

It equals the LP optimum once no column prices out, so the bound is exact at convergence
and still proven (just weaker) when the time limit stops the loop: `converged` says which.
Pricing is smoothed (Wentges: between the best-bound duals and the master's), and when
column generation runs out of its share of the time a projected subgradient ascent of
LB(pi) from the best duals raises the bound further (every point it visits is valid).

Two things make it converge at 1,000-2,000 jobs within minutes on one core (measured on
the seed-1 instances; before them neither size converged in 300 s):

- a warm-up: the first 10 % of the time is a subgradient ascent of LB(pi) from pi = 0,
  which gets within 2-3 % of the LP optimum in 30 s of cheap pricing passes at 2,000 jobs;
  every job's best columns of its last steps seed the first master, and its best duals
  centre the smoothing from the first round, so the expensive master rounds start near
  the optimum instead of from a master made of artificial columns;
- each master re-solve starts from the previous optimal basis (`_Master`), which MathOpt's
  incremental GLOP does not do by itself when columns are added.
Capacity rows may be summed over blocks of slots (`block`): a relaxation, pi constant per
block.

Relaxations that keep it a bound, stated in `LpResult.notes`:

- a job's gang (its GPUs on one node) is not modelled beyond the pool's GPU count;
- `lp_instance(merge=True)` pools every node of one (zone, model) into one capacity (a
  job's options on those nodes cost the same), for the large instances;
- `block` > 1 sums the capacity rows over that many slots;
- an interruptible job's segmented plans (issue 30) are one "scatter" option per group: k
  GPUs in any `floor(running time / slot)` slots of its window, each slot on any pool of
  the group, at whole-slot prices (`_segmented_option`). Its columns are slot sets, priced by
  taking the slots of least reduced cost; segment count, minimum run and the pauses' idle
  power are left out;
- each job also gets an "artificial" column of cost `artificial_factor` times its dearest
  real option and no capacity use: adding an option can only lower the optimum, so the
  bound stays a bound, and the artificial share left in the optimum shows whether the
  deadline-respecting LP was infeasible.

Deadlines: a job that no plan can start in time (`cannot_meet_deadline`: every option's
window is empty, or ends before k GPUs of one pool are free of running jobs; the policies
place it as soon as possible, flagged) may start anywhere up to the end of the horizon, at
its real cost. Other jobs may also start after their deadline ("late"
options, at their real cost), but at most `late_budget` of them: the benchmark sets it to
the most deadline misses any compared plan has beyond the forced ones (usually 0), so the
bound holds for every plan it is compared with and is not weakened when none misses.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from policies.problem.segments import interruptible, wall_s, window_ends, work_s

log = logging.getLogger(__name__)


@dataclass
class LpOption:
    """One way to run a job: on any of `resources` (pools), `gpus` GPUs for `duration` slots.

    `cost[s]` is the gCO2 of starting at slot s (inf: not allowed); one array may be shared
    by many options. `zone` indexes `LpInstance.power_cap` (-1: no cap applies).
    """

    resources: tuple[int, ...]
    gpus: int
    duration: int
    cost: np.ndarray
    power_w: float = 0.0
    zone: int = -1
    late: bool = False  # a start after the deadline: counts against `LpInstance.late_budget`
    # > 0: a segmented plan's relaxation (issue 30): run `scatter` slots anywhere `cost` is
    # finite, each slot on any one of `resources`, `cost[t]` per slot chosen (`duration` unused)
    scatter: int = 0


@dataclass
class LpInstance:
    """The time-indexed model as arrays: capacity (R, T), power caps (Z, T), jobs' options."""

    n_slots: int
    capacity: np.ndarray
    jobs: list[list[LpOption]]
    power_cap: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    late_budget: float = 0.0  # at most this many jobs placed by `late` options
    notes: list[str] = field(default_factory=list)


@dataclass
class LpResult:
    """The bound and how it was obtained."""

    bound_g: float  # proven lower bound (best Lagrangian bound seen)
    lp_value_g: float | None  # the final restricted master's value (>= the LP optimum)
    converged: bool
    status: str
    rounds: int
    columns: int
    wall_s: float
    artificial_share: float  # sum of artificial x in the last master (0: all placed for real)
    notes: list[str] = field(default_factory=list)
    solution: list[tuple[int, int, int, float]] = field(default_factory=list)  # (job, resource, start, x > 0)
    # the capacity duals of the best bound, as prices >= 0 in gCO2 per GPU-slot, (resources, slots):
    # what one more free GPU on that resource in that slot would save (None: no bound yet)
    gpu_slot_price: np.ndarray | None = None

    @property
    def gap_pct(self) -> float | None:
        """How far the bound may be below the LP optimum (0 when converged)."""
        if self.lp_value_g is None or self.lp_value_g <= 0:
            return None
        return 100.0 * (self.lp_value_g - self.bound_g) / self.lp_value_g


class _Pricer:
    """Vectorised pricing of every (job option, resource, start) against given duals."""

    def __init__(self, inst: LpInstance, chunk: int = 4096) -> None:
        self.inst = inst
        self.T = inst.n_slots
        rows_cost: list[np.ndarray] = []
        ids: dict[int, int] = {}
        e_job, e_row, e_res, e_k, e_d, e_pw, e_zone, e_late = [], [], [], [], [], [], [], []
        self.job_max_cost = np.zeros(len(inst.jobs))
        sc_job, sc_cost, sc_k, sc_n, sc_pw, sc_zone, sc_group = [], [], [], [], [], [], []
        res_sets: dict[tuple[int, ...], int] = {}
        for j, options in enumerate(inst.jobs):
            worst = 0.0
            for opt in options:
                if opt.scatter > 0:
                    finite = np.sort(opt.cost[np.isfinite(opt.cost)])
                    n = min(int(opt.scatter), finite.size)
                    if n == 0 or not opt.resources:
                        continue
                    worst = max(worst, float(finite[-n:].sum()))
                    sc_job.append(j)
                    sc_cost.append(np.asarray(opt.cost, dtype=np.float64))
                    sc_k.append(opt.gpus)
                    sc_n.append(n)
                    sc_pw.append(opt.power_w)
                    sc_zone.append(opt.zone)
                    sc_group.append(res_sets.setdefault(tuple(opt.resources), len(res_sets)))
                    continue
                key = id(opt.cost)
                if key not in ids:
                    ids[key] = len(rows_cost)
                    rows_cost.append(np.asarray(opt.cost, dtype=np.float64))
                finite = opt.cost[np.isfinite(opt.cost)]
                if finite.size:
                    worst = max(worst, float(finite.max()))
                for r in opt.resources:
                    e_job.append(j)
                    e_row.append(ids[key])
                    e_res.append(r)
                    e_k.append(opt.gpus)
                    e_d.append(opt.duration)
                    e_pw.append(opt.power_w)
                    e_zone.append(opt.zone)
                    e_late.append(1.0 if opt.late else 0.0)
            self.job_max_cost[j] = worst
        self.cost = np.stack(rows_cost) if rows_cost else np.zeros((0, self.T))
        self.e_job = np.asarray(e_job, dtype=np.int64)
        self.e_row = np.asarray(e_row, dtype=np.int64)
        self.e_res = np.asarray(e_res, dtype=np.int64)
        self.e_k = np.asarray(e_k, dtype=np.float64)
        self.e_d = np.asarray(e_d, dtype=np.int64)
        self.e_pw = np.asarray(e_pw, dtype=np.float64)
        self.e_zone = np.asarray(e_zone, dtype=np.int64)
        self.e_late = np.asarray(e_late, dtype=np.float64)
        self.chunk = chunk
        # scatter options (segmented plans' relaxation), priced apart from the edges; their
        # columns are (self.edges + option, key of the slots and resources in `sc_columns`)
        self.sc_job = np.asarray(sc_job, dtype=np.int64)
        self.sc_cost = sc_cost  # per scatter option, its cost per slot (the option's own array)
        self.sc_k = np.asarray(sc_k, dtype=np.float64)
        self.sc_n = np.asarray(sc_n, dtype=np.int64)
        self.sc_pw = np.asarray(sc_pw, dtype=np.float64)
        self.sc_zone = np.asarray(sc_zone, dtype=np.int64)
        self.sc_group = np.asarray(sc_group, dtype=np.int64)
        self.sc_res_sets = [np.asarray(r, dtype=np.int64) for r in res_sets]
        self.sc_columns: list[tuple[int, np.ndarray, np.ndarray]] = []  # (option, slots, resources)
        self._sc_keys: dict[tuple[int, bytes, bytes], int] = {}
        self.has_power = inst.power_cap.size > 0 and (bool((self.e_zone >= 0).any()) or bool((self.sc_zone >= 0).any()))

    def value_at(self, edges: np.ndarray, starts: np.ndarray, pi: np.ndarray, rho: np.ndarray,
                 sigma: float) -> np.ndarray:
        """`price`'s value of the given (edge, start) columns at the given duals."""
        sc = edges >= self.edges
        if sc.any():
            val = np.empty(len(edges))
            val[sc] = [self.scatter_value(int(k), pi, rho) for k in starts[sc]]
            if (~sc).any():
                val[~sc] = self.value_at(edges[~sc], starts[~sc], pi, rho, sigma)
            return val
        T = self.T
        cp = np.concatenate([np.zeros((pi.shape[0], 1)), np.cumsum(pi, axis=1)], axis=1)
        ends = np.minimum(starts + self.e_d[edges], T)
        res = self.e_res[edges]
        val = self.cost[self.e_row[edges], starts] - self.e_k[edges] * (cp[res, ends] - cp[res, starts])
        if self.has_power:
            cr = np.concatenate([np.zeros((rho.shape[0], 1)), np.cumsum(rho, axis=1)], axis=1)
            z = self.e_zone[edges]
            zz = np.where(z >= 0, z, 0)
            val -= np.where(z >= 0, self.e_pw[edges], 0.0) * (cr[zz, ends] - cr[zz, starts])
        return val - sigma * self.e_late[edges]

    @property
    def edges(self) -> int:
        return len(self.e_job)

    def scatter_value(self, key: int, pi: np.ndarray, rho: np.ndarray) -> float:
        """The priced value of scatter column `key` (of `sc_columns`) at the given duals."""
        i, slots, res = self.sc_columns[key]
        val = float(self.sc_cost[i][slots].sum()) - self.sc_k[i] * float(pi[res, slots].sum())
        if self.has_power and self.sc_zone[i] >= 0:
            val -= self.sc_pw[i] * float(rho[self.sc_zone[i], slots].sum())
        return val

    def scatter_column(self, key: int) -> tuple[int, int, np.ndarray, np.ndarray]:
        """(job, option, slots, resources) of scatter column `key`."""
        i, slots, res = self.sc_columns[key]
        return int(self.sc_job[i]), i, slots, res

    def _register(self, i: int, slots: np.ndarray, res: np.ndarray) -> int:
        order = np.argsort(slots)
        slots, res = slots[order], res[order]
        key = (i, slots.tobytes(), res.tobytes())
        known = self._sc_keys.get(key)
        if known is None:
            known = self._sc_keys[key] = len(self.sc_columns)
            self.sc_columns.append((i, slots, res))
        return known

    def _price_scatter(self, pi: np.ndarray, rho: np.ndarray, best: np.ndarray,
                       cands: list[tuple[int, int, int, float]]) -> None:
        """Price the scatter options: each takes its n slots of least value (cost - k x pi of
        the resource whose pi is nearest 0 in that slot - power x rho); each job's best one
        joins `cands`, and becomes the job's best column where it beats the edges."""
        S = len(self.sc_job)
        if S == 0:
            return
        G, T = len(self.sc_res_sets), self.T
        top_pi = np.empty((G, T))
        top_res = np.empty((G, T), dtype=np.int64)
        cols = np.arange(T)
        for g, rs in enumerate(self.sc_res_sets):
            a = pi[rs].argmax(axis=0)  # pi <= 0: the resource whose slot costs the least
            top_pi[g], top_res[g] = pi[rs][a, cols], rs[a]

        def least(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """(value, slots in order of value) of these options, a row each."""
            v = np.stack([self.sc_cost[i] for i in rows.tolist()]) - self.sc_k[rows, None] * top_pi[self.sc_group[rows]]
            if self.has_power:
                m = self.sc_zone[rows] >= 0
                if m.any():
                    v[m] -= self.sc_pw[rows][m, None] * rho[self.sc_zone[rows][m]]
            order = np.argsort(v, axis=1, kind="stable")
            csum = np.cumsum(np.take_along_axis(v, order, axis=1), axis=1)
            return csum[np.arange(len(rows)), self.sc_n[rows] - 1], order

        # in chunks (a row per option and slot at once is large), then again for the best only
        value = np.concatenate([least(np.arange(lo, min(lo + self.chunk, S)))[0] for lo in range(0, S, self.chunk)])
        best_sc: dict[int, int] = {}
        for i in np.argsort(value, kind="stable").tolist():
            best_sc.setdefault(int(self.sc_job[i]), i)
        picked = np.array([i for i in best_sc.values() if math.isfinite(value[i])], dtype=np.int64)
        for lo in range(0, len(picked), self.chunk):
            rows = picked[lo:lo + self.chunk]
            _, order = least(rows)
            for r, i in enumerate(rows.tolist()):
                j = int(self.sc_job[i])
                slots = order[r, :self.sc_n[i]].copy()
                key = self._register(i, slots, top_res[self.sc_group[i], slots])
                cands.append((self.edges + i, key, j, float(value[i])))
                if value[i] < best[j]:
                    best[j] = value[i]
                    self.last_best_edge[j], self.last_best_start[j] = self.edges + i, key

    def price(self, pi: np.ndarray, rho: np.ndarray, sigma: float, per_job: int) -> tuple[np.ndarray, list[tuple[int, int, int, float]]]:
        """(best value per job, candidate columns (edge, start, job, value)).

        value = cost - gpus * sum(pi over the run) - power * sum(rho over the run)
        - sigma * late (the late-budget dual), the
        column's reduced cost plus the job's convexity dual. `per_job` candidates per job:
        the best start of each of its `per_job` best edges.
        """
        T = self.T
        n_jobs = len(self.inst.jobs)
        best = np.full(n_jobs, np.inf)
        cp = np.concatenate([np.zeros((pi.shape[0], 1)), np.cumsum(pi, axis=1)], axis=1)
        if self.has_power:
            cr = np.concatenate([np.zeros((rho.shape[0], 1)), np.cumsum(rho, axis=1)], axis=1)
        starts = np.arange(T)
        edge_best = np.empty(self.edges)
        edge_arg = np.empty(self.edges, dtype=np.int64)
        for lo in range(0, self.edges, self.chunk):
            hi = min(lo + self.chunk, self.edges)
            ends = np.minimum(starts[None, :] + self.e_d[lo:hi, None], T)
            res = self.e_res[lo:hi, None]
            run_pi = cp[res, ends] - cp[res, starts[None, :]]
            val = self.cost[self.e_row[lo:hi]] - self.e_k[lo:hi, None] * run_pi
            if self.has_power:
                z = self.e_zone[lo:hi]
                mask = z >= 0
                if mask.any():
                    zz = np.where(mask, z, 0)[:, None]
                    run_rho = cr[zz, ends] - cr[zz, starts[None, :]]
                    val -= (self.e_pw[lo:hi] * mask)[:, None] * run_rho
            if sigma:
                val -= sigma * self.e_late[lo:hi, None]
            arg = np.argmin(val, axis=1)
            edge_arg[lo:hi] = arg
            edge_best[lo:hi] = val[np.arange(hi - lo), arg]
        np.minimum.at(best, self.e_job, edge_best)
        self.last_value = best  # per job, its best value at these duals
        # per job, its `per_job` best edges
        order = np.lexsort((edge_best, self.e_job))
        cands: list[tuple[int, int, int, float]] = []
        jobs_sorted = self.e_job[order]
        first = np.searchsorted(jobs_sorted, np.arange(n_jobs))
        for j in range(n_jobs):
            for e in order[first[j]: first[j] + per_job]:
                if self.e_job[e] != j or not math.isfinite(edge_best[e]):
                    break
                cands.append((int(e), int(edge_arg[e]), j, float(edge_best[e])))
        head = order[np.minimum(first, len(order) - 1)] if len(order) else np.zeros(n_jobs, dtype=np.int64)
        has = (first < len(order)) & (self.e_job[head] == np.arange(n_jobs)) if len(order) else first < 0
        self.last_best_edge = np.where(has, head, -1)
        self.last_best_start = np.where(self.last_best_edge >= 0, edge_arg[np.maximum(self.last_best_edge, 0)], -1) \
            if self.edges else np.full(n_jobs, -1, dtype=np.int64)  # no job has an option
        self._price_scatter(pi, rho if self.has_power else np.zeros((0, T)), best, cands)
        self.last_value = best
        return best, cands

    def usage(self, jobs: np.ndarray, n_res: int, n_zones: int) -> tuple[np.ndarray, np.ndarray, float]:
        """GPUs (R, T) and watts (Z, T) used per slot, and late starts, by the given jobs'
        best columns of the last `price` call (a subgradient of the Lagrangian bound)."""
        T = self.T
        e = self.last_best_edge[jobs]
        s = self.last_best_start[jobs]
        sc_keys = s[e >= self.edges]
        keep = (e >= 0) & (e < self.edges)
        e, s = e[keep], s[keep]
        ends = np.minimum(s + self.e_d[e], T)
        diff = np.zeros((n_res, T + 1))
        np.add.at(diff, (self.e_res[e], s), self.e_k[e])
        np.add.at(diff, (self.e_res[e], ends), -self.e_k[e])
        gpus = np.cumsum(diff, axis=1)[:, :T]
        watts = np.zeros((n_zones, T))
        if n_zones:
            z = self.e_zone[e]
            m = z >= 0
            dz = np.zeros((n_zones, T + 1))
            np.add.at(dz, (z[m], s[m]), self.e_pw[e][m])
            np.add.at(dz, (z[m], ends[m]), -self.e_pw[e][m])
            watts = np.cumsum(dz, axis=1)[:, :T]
        for key in sc_keys.tolist():
            i, slots, res = self.sc_columns[key]
            np.add.at(gpus, (res, slots), self.sc_k[i])
            if n_zones and self.sc_zone[i] >= 0:
                watts[self.sc_zone[i], slots] += self.sc_pw[i]
        return gpus, watts, float(self.e_late[e].sum())


class _Master:
    """The restricted master LP, re-solved each round with GLOP through MathOpt.

    Each round only adds columns (and the capacity rows they are the first to touch), so the
    previous optimal basis stays primal feasible: it is passed back as the initial basis
    (new columns non-basic at 0, new rows' slacks basic). MathOpt's incremental GLOP does
    not keep the basis by itself when columns are added (measured: a re-solve took as many
    simplex iterations as a cold solve); the explicit warm start halves a round at 1,000 jobs.
    """

    def __init__(self, algorithm: str = "primal_simplex", warm_start: bool = True) -> None:
        from ortools.math_opt.python import mathopt

        self.algorithm = algorithm
        self.warm_start = warm_start
        self._mathopt = mathopt
        self.model = mathopt.Model(name="lp-bound")
        self.model.objective.is_maximize = False
        self._solver = None
        self.result = None
        self._vars: list = []
        self._rows: list = []
        self._basis = None  # (variable statuses, row statuses) of the last optimal solve

    def row(self, lb: float, ub: float):
        c = self.model.add_linear_constraint(lb=lb, ub=ub)
        self._rows.append(c)
        return c

    def column(self, cost: float, entries: list[tuple[object, float]]):
        v = self.model.add_variable(lb=0.0)
        self.model.objective.set_linear_coefficient(v, cost)
        for row, coef in entries:
            row.set_coefficient(v, coef)
        self._vars.append(v)
        return v

    def _initial_basis(self):
        """The last optimal basis extended to the current model, or None."""
        if not self.warm_start or self._basis is None:
            return None
        mo = self._mathopt
        var_status, row_status = self._basis
        at_lower, basic = mo.BasisStatus.AT_LOWER_BOUND, mo.BasisStatus.BASIC
        vs = {v: var_status.get(v, at_lower) for v in self._vars}
        rs = {c: row_status.get(c, basic) for c in self._rows}
        return mo.ModelSolveParameters(initial_basis=mo.Basis(variable_status=vs, constraint_status=rs))

    def solve(self, time_limit_s: float) -> tuple[bool, str]:
        mo = self._mathopt
        if self._solver is None:
            self._solver = mo.IncrementalSolver(self.model, mo.SolverType.GLOP)
        params = mo.SolveParameters(time_limit=_timedelta(max(1.0, time_limit_s)), presolve=mo.Emphasis.OFF,
                                    lp_algorithm=getattr(mo.LPAlgorithm, self.algorithm.upper()))
        self.result = self._solver.solve(params=params, model_params=self._initial_basis())
        log.debug("GLOP: %s iterations, %.2f s", self.result.solve_stats.simplex_iterations,
                  self.result.solve_time().total_seconds())
        reason = self.result.termination.reason
        optimal = reason == mo.TerminationReason.OPTIMAL
        if optimal and self.result.has_basis():
            b = self.result.solutions[0].basis
            self._basis = (dict(b.variable_status), dict(b.constraint_status))
        return optimal, reason.name.lower()

    def value(self) -> float:
        return float(self.result.objective_value())

    def duals(self, rows: list) -> list[float]:
        return [float(x) for x in self.result.dual_values(rows)] if rows else []

    def primal(self, cols: list) -> list[float]:
        return [float(x) for x in self.result.variable_values(cols)] if cols else []


def _timedelta(seconds: float):
    from datetime import timedelta

    return timedelta(seconds=seconds)


class _Lagrangian:
    """The Lagrangian bound LB(duals) of an instance (capacity and power rows summed per
    `block` of slots) and a projected subgradient ascent of it; keeps the best bound seen
    and its duals. Duals are (pi (R, blocks) <= 0, rho (Z, blocks) <= 0, sigma <= 0)."""

    def __init__(self, inst: LpInstance, pricer: _Pricer, block: int, big: np.ndarray, per_job: int,
                 rel_tol: float) -> None:
        self.inst, self.pricer, self.block, self.big = inst, pricer, block, big
        self.per_job, self.rel_tol = per_job, rel_tol
        self.R, self.T = inst.capacity.shape[0], inst.n_slots
        self.Z = inst.power_cap.shape[0] if inst.power_cap.size else 0
        self.n_blocks = -(-self.T // block)
        self.cap_b = self.blocked(inst.capacity)
        self.pcap_b = self.blocked(inst.power_cap) if self.Z else np.zeros((0, self.n_blocks))
        self.pcap_finite_b = self.blocked(np.isfinite(inst.power_cap).astype(float)) if self.Z else None
        self.best_bound = -math.inf
        self.best_duals: tuple[np.ndarray, np.ndarray, float] | None = None
        self.last_real = np.zeros(len(inst.jobs), dtype=bool)

    def blocked(self, a: np.ndarray) -> np.ndarray:
        """Per-slot limits summed per block, (rows, n_blocks)."""
        fin = np.where(np.isfinite(a), a, 0.0)
        pad = np.zeros((a.shape[0], self.n_blocks * self.block))
        pad[:, :self.T] = fin
        return pad.reshape(a.shape[0], self.n_blocks, self.block).sum(axis=2)

    def zero(self) -> tuple[np.ndarray, np.ndarray, float]:
        return np.zeros((self.R, self.n_blocks)), np.zeros((self.Z, self.n_blocks)), 0.0

    def per_slot(self, a_b: np.ndarray) -> np.ndarray:
        """Block duals spread over their slots, (rows, T)."""
        return np.repeat(a_b, self.block, axis=1)[:, :self.T]

    def evaluate(self, duals: tuple[np.ndarray, np.ndarray, float]) -> list[tuple[int, int, int, float]]:
        """Price at `duals`; keep the best Lagrangian bound (and its duals); the candidates."""
        d_pi_b, d_rho_b, d_sigma = duals
        # LB(pi) with pi constant per block
        best, cands = self.pricer.price(self.per_slot(d_pi_b), self.per_slot(d_rho_b), d_sigma, self.per_job)
        self.last_real[:] = best < self.big  # jobs whose best option beats their artificial one
        bound = float(np.minimum(best, self.big).sum() + (d_pi_b * self.cap_b).sum()) \
            + d_sigma * float(self.inst.late_budget)
        if self.Z:
            bound += float((d_rho_b * self.pcap_b).sum())
        if bound > self.best_bound:
            self.best_bound, self.best_duals = bound, duals
        return cands

    def ascend(self, start: tuple[np.ndarray, np.ndarray, float], target: float, deadline: float,
               collect: list[np.ndarray] | None = None) -> int:
        """Projected subgradient ascent of LB from `start` (Polyak steps towards `target`,
        halved after 8 steps without a new best) until `deadline`; the number of steps.
        With `collect`, each step's best column of every job is appended to it as an
        (edge, start) array."""
        pricer, Z, n_blocks = self.pricer, self.Z, self.n_blocks
        lam_pi, lam_rho, lam_sigma = (-start[0], -start[1], -start[2])
        theta, stall, steps = 1.0, 0, 0
        while time.perf_counter() < deadline and target - self.best_bound > self.rel_tol * abs(target):
            prev = self.best_bound
            self.evaluate((-lam_pi, -lam_rho, -lam_sigma))
            steps += 1
            real = np.flatnonzero(self.last_real)
            if collect is not None:
                collect.append(np.stack([pricer.last_best_edge[real], pricer.last_best_start[real]], axis=1))
            gpus, watts, late = pricer.usage(real, self.R, Z)
            g_pi = self.blocked(gpus) - self.cap_b
            g_rho = (self.blocked(watts) - self.pcap_b) * (self.pcap_finite_b >= self.block) if Z \
                else np.zeros((0, n_blocks))
            g_sigma = late - float(self.inst.late_budget)
            norm = float((g_pi ** 2).sum() + (g_rho ** 2).sum() + g_sigma ** 2)
            if norm <= 0:
                break
            stall = 0 if self.best_bound > prev else stall + 1
            if stall >= 8:
                theta, stall = theta / 2, 0
                best = self.best_duals
                lam_pi, lam_rho, lam_sigma = (-best[0], -best[1], -best[2])
                if theta < 1e-4:
                    break
            step = theta * (target - self.best_bound) / norm
            lam_pi = np.maximum(0.0, lam_pi + step * g_pi)
            lam_rho = np.maximum(0.0, lam_rho + step * g_rho) if Z else lam_rho
            lam_sigma = max(0.0, lam_sigma + step * g_sigma)
        return steps

    def gpu_slot_price(self) -> np.ndarray | None:
        """The best bound's capacity duals as prices >= 0 per GPU-slot, (R, T)."""
        return None if self.best_duals is None else -self.per_slot(self.best_duals[0])


def _artificial_costs(inst: LpInstance, pricer: _Pricer, artificial_factor: float) -> np.ndarray:
    """Per job, the cost of its artificial column (0 for a job with no option: no policy places it)."""
    big = np.maximum(pricer.job_max_cost, 1.0) * artificial_factor
    n_opts = np.bincount(pricer.e_job, minlength=len(inst.jobs)) + np.bincount(pricer.sc_job, minlength=len(inst.jobs))
    big[n_opts == 0] = 0.0
    return big


def lagrangian_prices(inst: LpInstance, *, time_limit_s: float, target_g: float, block: int = 1,
                      artificial_factor: float = 10.0, rel_tol: float = 1e-5) -> tuple[np.ndarray | None, float]:
    """(GPU-slot prices (R, T), the proven bound they give) from a subgradient ascent of the
    Lagrangian bound alone, for `time_limit_s`, with Polyak steps towards `target_g` (the
    cost of a known plan).

    The prices are what a GPU of each resource in each slot is worth to the other jobs: a
    planner that adds k x the price of its run to a job's cost stops handing clean
    contended capacity to jobs that could run cleanly elsewhere (`policies.solvers.cpsat`). The
    ascent alone gets most of the way cheaply: at 2,000 jobs (merged pools) 5 s gave a
    bound of 1.160 t against the LP optimum 1.249 t, and a greedy pass priced by it 1.322 t
    against 1.313 t priced by the LP's own optimal duals.
    """
    t0 = time.perf_counter()
    if not inst.jobs:
        return None, 0.0
    pricer = _Pricer(inst)
    lag = _Lagrangian(inst, pricer, max(1, int(block)), _artificial_costs(inst, pricer, artificial_factor), 1,
                      rel_tol)
    zero = lag.zero()
    lag.evaluate(zero)
    lag.ascend(zero, max(target_g, lag.best_bound * 1.01), t0 + time_limit_s)
    return lag.gpu_slot_price(), lag.best_bound


def solve_lp_bound(inst: LpInstance, *, time_limit_s: float = 120.0, block: int = 1,
                   artificial_factor: float = 10.0, per_job: int = 2, rel_tol: float = 1e-5,
                   smoothing: float = 0.5, ascent_share: float = 0.1, warmup_share: float = 0.1,
                   seed_steps: int = 5) -> LpResult:
    """Lower-bound the instance's optimum; see the module docstring.

    `block` > 1 sums the capacity (and power) rows over blocks of that many slots, a valid
    relaxation that makes the master LP `block` times smaller (stated in the notes). The
    loop stops when the bound is within `rel_tol` of the master's value (converged) or at
    `time_limit_s` (not converged; the bound is still proven). Pricing uses Wentges
    smoothing (`smoothing`: the weight of the best-bound duals). When column generation has
    not converged after `1 - ascent_share` of the time, the rest goes to a projected
    subgradient ascent of the Lagrangian bound from the best duals. The first `warmup_share`
    of the time goes to the same ascent from zero duals, which seeds the first master with
    every job's best columns along the way (see the warm-up comment below).
    """
    t0 = time.perf_counter()
    notes = list(inst.notes)
    pricer = _Pricer(inst)
    n_jobs = len(inst.jobs)
    if n_jobs == 0:
        return LpResult(0.0, 0.0, True, "no jobs", 0, 0, 0.0, 0.0, notes)
    block = max(1, int(block))
    if block > 1:
        notes.append(f"capacity rows summed over blocks of {block} slots (a relaxation)")
    big = _artificial_costs(inst, pricer, artificial_factor)
    lag = _Lagrangian(inst, pricer, block, big, per_job, rel_tol)
    cols = _Columns(inst, pricer, lag, big, block)
    for e, s in _greedy_columns(inst, pricer):
        cols.add(e, s)
    if warmup_share > 0:
        notes.append(_warm_up(cols, lag, pricer, big, t0, t0 + warmup_share * time_limit_s, seed_steps))
    cg = _column_generation(cols, lag, pricer, t0, time_limit_s, time_limit_s * (1.0 - ascent_share),
                            smoothing, rel_tol)
    lp_value, converged, status = cg.lp_value, cg.converged, cg.status
    ascent_steps = 0
    if not converged and lag.best_duals is not None and lp_value is not None:
        # Lagrangian ascent from the best duals towards the master's value: every point is
        # a valid bound, so this only ever raises it
        before = lag.best_bound
        ascent_steps = lag.ascend(lag.best_duals, lp_value, t0 + time_limit_s)
        if ascent_steps:
            notes.append(f"Lagrangian ascent after column generation: {ascent_steps} steps raised the bound "
                         f"by {100 * (lag.best_bound - before) / before:.2f} %")
    wall_s = time.perf_counter() - t0
    if not converged:
        gap = f"{100 * (lp_value - lag.best_bound) / lp_value:.2f} %" if lp_value else "an unknown amount"
        notes.append(f"did not converge ({status}); the bound is the best Lagrangian bound: "
                     f"proven, but below the LP optimum by up to {gap}")
    return LpResult(bound_g=lag.best_bound, lp_value_g=lp_value, converged=converged, status=status,
                    rounds=cg.rounds, columns=cols.count, wall_s=wall_s, artificial_share=cg.art_share, notes=notes,
                    solution=cols.solution(cg.last_x), gpu_slot_price=lag.gpu_slot_price())


class _Columns:
    """The restricted master LP and its columns: one convexity row per job (kept feasible by
    an artificial column at `big`), capacity and power rows per (pool or zone, block of
    slots) made when a column first touches them, the late-budget row likewise, and one
    column per (edge or scatter column of the pricer, start) added (each once)."""

    def __init__(self, inst: LpInstance, pricer: _Pricer, lag: _Lagrangian, big: np.ndarray, block: int) -> None:
        self.inst, self.pricer, self.block = inst, pricer, block
        self.cap_b, self.pcap_b, self.pcap_finite_b = lag.cap_b, lag.pcap_b, lag.pcap_finite_b
        self.Z = inst.power_cap.shape[0] if inst.power_cap.size else 0
        self.master = _Master()
        n_jobs = len(inst.jobs)
        self.conv = [self.master.row(1.0, 1.0) for _ in range(n_jobs)]
        self.budget_row = None
        self.cap_rows: dict[tuple[int, int], object] = {}
        self.pow_rows: dict[tuple[int, int], object] = {}
        self.artificial = [self.master.column(float(big[j]), [(self.conv[j], 1.0)]) for j in range(n_jobs)]
        self.seen: set[tuple[int, int]] = set()
        self.count = 0
        self.vars: list = []
        self.keys: list[tuple[int, int]] = []

    def add(self, e: int, s: int) -> None:
        """Column (e, s) into the master, unless it is there already."""
        if (e, s) in self.seen:
            return
        self.seen.add((e, s))
        if e >= self.pricer.edges:  # a scatter column: k GPUs in each of its slots
            self._add_scatter(e, s)
            return
        pricer, block, master, inf = self.pricer, self.block, self.master, math.inf
        cap_rows, pow_rows = self.cap_rows, self.pow_rows
        j, r = int(pricer.e_job[e]), int(pricer.e_res[e])
        d, k = int(pricer.e_d[e]), float(pricer.e_k[e])
        end = min(s + d, self.inst.n_slots)
        entries: list[tuple[object, float]] = [(self.conv[j], 1.0)]
        z = int(pricer.e_zone[e])
        pw = float(pricer.e_pw[e]) if self.Z and z >= 0 else 0.0
        for b in range(s // block, (end - 1) // block + 1):
            overlap = min(end, (b + 1) * block) - max(s, b * block)
            row = cap_rows.get((r, b))
            if row is None:
                row = cap_rows[(r, b)] = master.row(-inf, float(self.cap_b[r, b]))
            entries.append((row, k * overlap))
            if pw > 0 and self.pcap_finite_b[z, b] >= block:  # a cap on every slot of the block
                row = pow_rows.get((z, b))
                if row is None:
                    row = pow_rows[(z, b)] = master.row(-inf, float(self.pcap_b[z, b]))
                entries.append((row, pw * overlap))
        if pricer.e_late[e]:
            if self.budget_row is None:
                self.budget_row = master.row(-inf, float(self.inst.late_budget))
            entries.append((self.budget_row, 1.0))
        self.vars.append(master.column(float(pricer.cost[pricer.e_row[e], s]), entries))
        self.keys.append((e, s))
        self.count += 1

    def _add_scatter(self, e: int, s: int) -> None:
        pricer, block = self.pricer, self.block
        j, i, slots, res = pricer.scatter_column(s)
        per_row: dict[tuple[str, int, int], float] = {}
        z = int(pricer.sc_zone[i])
        pw = float(pricer.sc_pw[i]) if self.Z and z >= 0 else 0.0
        for t, r in zip(slots.tolist(), res.tolist()):
            b = t // block
            per_row[("cap", r, b)] = per_row.get(("cap", r, b), 0.0) + float(pricer.sc_k[i])
            if pw > 0 and self.pcap_finite_b[z, b] >= block:
                per_row[("pow", z, b)] = per_row.get(("pow", z, b), 0.0) + pw
        entries = [(self.conv[j], 1.0)]
        for (kind, r, b), coef in per_row.items():
            rows, limit = (self.cap_rows, self.cap_b) if kind == "cap" else (self.pow_rows, self.pcap_b)
            row = rows.get((r, b))
            if row is None:
                row = rows[(r, b)] = self.master.row(-math.inf, float(limit[r, b]))
            entries.append((row, coef))
        self.vars.append(self.master.column(float(pricer.sc_cost[i][slots].sum()), entries))
        self.keys.append((e, s))
        self.count += 1

    def duals(self, n_res: int, n_blocks: int, rho_b: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
        """The last optimal master's duals: (capacity per (pool, block), power per (zone,
        block); `rho_b` kept without power rows, late budget, convexity per job), each
        clipped to its sign."""
        master = self.master
        mu = np.asarray(master.duals(self.conv))
        sigma = min(0.0, master.duals([self.budget_row])[0]) if self.budget_row is not None else 0.0
        pi_b = np.zeros((n_res, n_blocks))
        keys = list(self.cap_rows)
        if keys:
            idx = np.asarray(keys)
            pi_b[idx[:, 0], idx[:, 1]] = np.minimum(0.0, master.duals([self.cap_rows[k] for k in keys]))
        if self.Z:
            rho_b = np.zeros((self.Z, n_blocks))
            keys = list(self.pow_rows)
            if keys:
                idx = np.asarray(keys)
                rho_b[idx[:, 0], idx[:, 1]] = np.minimum(0.0, master.duals([self.pow_rows[k] for k in keys]))
        return pi_b, rho_b, sigma, mu

    def solution(self, last_x: tuple[int, list[float]]) -> list[tuple[int, int, int, float]]:
        """(job, pool, start, x) of the edge columns with a positive value in the last
        optimal master (`last_x`: how many columns it had, and their values)."""
        out: list[tuple[int, int, int, float]] = []
        if last_x[1]:
            for (e, s), x in zip(self.keys[:last_x[0]], last_x[1]):
                if x > 1e-9 and e < self.pricer.edges:  # scatter columns have no start to report
                    out.append((int(self.pricer.e_job[e]), int(self.pricer.e_res[e]), s, x))
        return out


def _warm_up(cols: _Columns, lag: _Lagrangian, pricer: _Pricer, big: np.ndarray, t0: float, until: float,
             seed_steps: int) -> str:
    """Seed the first master: a Lagrangian ascent from zero duals, towards the greedy
    columns' cost, finds near-optimal duals cheaply (each step is one pricing pass); every
    job's best columns along the way seed the first master, and its best duals centre the
    smoothing from the first round on. Without it the first masters are mostly artificial
    columns and their duals are poor, which costs many expensive rounds. Returns the note."""
    n_jobs = len(cols.conv)
    greedy_cost = sum(float(pricer.cost[pricer.e_row[e], s]) for e, s in cols.keys)  # edges only so far
    placed = np.zeros(n_jobs, dtype=bool)
    placed[[int(pricer.e_job[e]) for e, _ in cols.keys]] = True
    zero = lag.zero()
    lag.evaluate(zero)
    cheapest = np.minimum(pricer.last_value, big)
    target = greedy_cost + float(cheapest[~placed].sum())
    steps_cols: list[np.ndarray] = []
    warm_steps = lag.ascend(zero, max(target, lag.best_bound * 1.01), until, steps_cols)
    # the columns of the last `seed_steps` steps only: the early ones were priced at
    # poor duals, and every column makes the master slower
    seeds = np.unique(np.concatenate(steps_cols[-seed_steps:]), axis=0) if steps_cols else np.zeros((0, 2), int)
    before_cols = cols.count
    for e, s in seeds.tolist():
        cols.add(e, s)
    log.debug("warm-up: %d ascent steps, bound %.1f, %d seed columns, %.1f s", warm_steps, lag.best_bound,
              cols.count - before_cols, time.perf_counter() - t0)
    return (f"column generation warm-started by {warm_steps} Lagrangian ascent steps "
            f"({cols.count - before_cols} seed columns)")


@dataclass
class _CgRun:
    """Where column generation stopped: the last master's value (None: never solved), why,
    the rounds, the artificial columns' share, and the last optimal master's column values."""

    lp_value: float | None = None
    status: str = "not solved"
    converged: bool = False
    rounds: int = 0
    art_share: float = float("nan")
    last_x: tuple[int, list[float]] = (0, [])


def _column_generation(cols: _Columns, lag: _Lagrangian, pricer: _Pricer, t0: float, time_limit_s: float,
                       cg_limit_s: float, smoothing: float, rel_tol: float) -> _CgRun:
    """Rounds of pricing and master solves until the bound is within `rel_tol` of the
    master's value (converged), no column improves, or `cg_limit_s` from `t0` is spent."""
    R, T = cols.inst.capacity.shape[0], cols.inst.n_slots
    block, n_blocks = cols.block, lag.n_blocks
    pi_b = np.zeros((R, n_blocks))
    rho_b = np.zeros((cols.Z, n_blocks))
    mu = np.zeros(len(cols.conv))
    sigma = 0.0
    run = _CgRun()

    def improving(cands: list[tuple[int, int, int, float]]) -> list[tuple[int, int]]:
        """The candidates whose reduced cost at the master's duals is negative."""
        if not cands:
            return []
        e = np.array([c[0] for c in cands])
        st = np.array([c[1] for c in cands])
        jj = np.array([c[2] for c in cands])
        rc = pricer.value_at(e, st, np.repeat(pi_b, block, axis=1)[:, :T],
                             np.repeat(rho_b, block, axis=1)[:, :T], sigma) - mu[jj]
        keep = rc < -1e-9 * np.maximum(1.0, np.abs(mu[jj]))
        return [(int(a), int(b)) for a, b in zip(e[keep], st[keep])]

    evaluate = lag.evaluate
    while True:
        master_duals = (pi_b, rho_b, sigma)
        if run.rounds > 0 and lag.best_duals is not None and smoothing > 0:
            # Wentges smoothing: price between the best-bound duals and the master's, which
            # damps the oscillation of plain column generation; fall back to the master's
            # duals when that finds nothing (a "mispricing")
            a = smoothing
            smooth = tuple(a * x + (1 - a) * y for x, y in zip(lag.best_duals, master_duals))
            new = improving(evaluate(smooth))  # type: ignore[arg-type]
            if not new:
                new = improving(evaluate(master_duals))
        else:
            new = improving(evaluate(master_duals)) if run.rounds > 0 else \
                [(e, s) for e, s, _, _ in evaluate(master_duals)]
        lp_value = run.lp_value
        if run.rounds > 0 and (not new or lp_value - lag.best_bound <= rel_tol * max(1.0, abs(lp_value))):
            run.converged = True
            run.status = "optimal" if not new else f"within {rel_tol:g} of the LP optimum"
            break
        if time.perf_counter() - t0 > cg_limit_s:
            run.status = f"time limit {time_limit_s:g} s after {run.rounds} rounds"
            break
        for e, s in new:
            cols.add(e, s)
        ok, why = cols.master.solve(cg_limit_s - (time.perf_counter() - t0))
        run.rounds += 1
        if not ok:
            run.status = f"GLOP stopped ({why}) in round {run.rounds}"
            break
        run.lp_value = cols.master.value()
        run.art_share = float(sum(cols.master.primal(cols.artificial)))
        run.last_x = (len(cols.vars), cols.master.primal(cols.vars))
        pi_b, rho_b, sigma, mu = cols.duals(R, n_blocks, rho_b)
        log.debug("round %d: master %.1f, bound %.1f, %d columns, %.1f s", run.rounds, run.lp_value, lag.best_bound,
                  cols.count, time.perf_counter() - t0)
    return run


def _greedy_columns(inst: LpInstance, pricer: _Pricer) -> list[tuple[int, int]]:
    """Columns of a feasible integer plan (tightest jobs first, each at its cheapest start
    that still fits every slot of its run), so the first master needs few artificials."""
    T = inst.n_slots
    remaining = np.where(np.isfinite(inst.capacity), inst.capacity, np.inf).astype(np.float64)
    power_left = np.where(np.isfinite(inst.power_cap), inst.power_cap, np.inf) if inst.power_cap.size else None
    order_e = np.argsort(pricer.e_job, kind="stable")
    first = np.searchsorted(pricer.e_job[order_e], np.arange(len(inst.jobs) + 1))
    finite_starts = np.isfinite(pricer.cost).sum(axis=1)
    tightness = [min((finite_starts[pricer.e_row[e]] for e in order_e[first[j]:first[j + 1]]), default=0)
                 for j in range(len(inst.jobs))]
    starts = np.arange(T)
    chosen: list[tuple[int, int]] = []
    for j in sorted(range(len(inst.jobs)), key=lambda j: (tightness[j], j)):
        edges = order_e[first[j]:first[j + 1]]
        if edges.size == 0:
            continue
        ends = np.minimum(starts[None, :] + pricer.e_d[edges, None], T)
        bad = (remaining[pricer.e_res[edges]] < pricer.e_k[edges, None]).astype(np.int64)
        cb = np.concatenate([np.zeros((len(edges), 1), dtype=np.int64), np.cumsum(bad, axis=1)], axis=1)
        rows = np.arange(len(edges))[:, None]
        ok = (cb[rows, ends] - cb[rows, starts[None, :]]) == 0
        if power_left is not None:
            z = pricer.e_zone[edges]
            zz = np.where(z >= 0, z, 0)
            pbad = ((power_left[zz] < pricer.e_pw[edges, None]) & (z >= 0)[:, None]).astype(np.int64)
            pc = np.concatenate([np.zeros((len(edges), 1), dtype=np.int64), np.cumsum(pbad, axis=1)], axis=1)
            ok &= (pc[rows, ends] - pc[rows, starts[None, :]]) == 0
        ok &= (pricer.e_late[edges] == 0)[:, None]  # the budget of late starts is the LP's to spend
        val = np.where(ok, pricer.cost[pricer.e_row[edges]], np.inf)
        flat = int(np.argmin(val))
        i, s = divmod(flat, T)
        if not math.isfinite(val[i, s]):
            continue
        e = int(edges[i])
        end = min(s + int(pricer.e_d[e]), T)
        remaining[pricer.e_res[e], s:end] -= pricer.e_k[e]
        if power_left is not None and pricer.e_zone[e] >= 0:
            power_left[pricer.e_zone[e], s:end] -= pricer.e_pw[e]
        chosen.append((e, s))
    return chosen


def cannot_meet_deadline(problem, j: int) -> bool:
    """No plan can start job j in time: on every group it fits, its window is empty or ends
    before any one pool of the group has k GPUs free of running (and pinned) jobs. Queued
    jobs only take capacity away, so such a miss is forced, whatever the policy."""
    jo = problem.job_options(j)
    if jo.groups.size == 0:
        return False
    lo = int(jo.earliest)
    k = max(1, problem.jobs[j].gpus)
    for row, gi in enumerate(jo.groups.tolist()):
        hi = int(jo.latest[jo.first[row]])
        if hi >= lo and int(problem.kth_free_slot[jo.pool[jo.group == gi], k - 1].min()) <= hi:
            return False
    return True


def lp_instance(problem, *, merge: bool = False, late_budget: int = 0) -> LpInstance:
    """The LP of a compiled `policies.problem.instance.Problem`.

    Resources are the problem's pools, or with `merge` its groups (pools of one zone, model,
    memory and PUE, whose capacity is summed: a relaxation). Each job gets, per group it
    fits, its in-window starts at `cost_table` prices; a job that no option lets meet its
    deadline gets every start from its release to the end of the horizon; with
    `late_budget` > 0 the other jobs also get their after-deadline starts as `late` options.
    """
    T = problem.n_slots
    notes: list[str] = ["gang (k GPUs on one node) relaxed to k GPUs of the pool's capacity"]
    if merge:
        cap = np.zeros((len(problem.groups), T))
        for gi, g in enumerate(problem.groups):
            for p in g.pools:
                cap[gi] += problem.capacity(p)
        notes.append(f"pools of one (zone, model) merged: {len(problem.pools)} pools -> "
                     f"{len(problem.groups)} capacities (a relaxation)")
    else:
        cap = problem.capacity_matrix().astype(np.float64)
    zones = list(problem.capped_budgets)  # the power budgets' keys: a zone's or `site:NAME`
    zone_index = {z: i for i, z in enumerate(zones)}
    power = np.stack([problem.power_cap_w(z) for z in zones]) if zones else np.zeros((0, 0))
    if zones:
        notes.append(f"power caps in {', '.join(zones)}")
    jobs: list[list[LpOption]] = []
    forced = no_option = 0
    for j in range(len(problem.jobs)):
        jo = problem.job_options(j)
        opts: list[LpOption] = []
        if jo.groups.size == 0:
            no_option += 1
            jobs.append(opts)
            continue
        table = problem.cost_table(j)
        lo = int(jo.earliest)
        is_forced = cannot_meet_deadline(problem, j)
        forced += is_forced
        k = max(1, problem.jobs[j].gpus)
        for row, gi in enumerate(jo.groups.tolist()):
            o = int(jo.first[row])
            group = problem.groups[gi]
            shape = jo.shapes[group.model]
            if merge:
                resources: tuple[int, ...] = (gi,)
            else:
                resources = tuple(int(p) for p in jo.pool[jo.group == gi])
            common = dict(resources=resources, gpus=k, duration=int(jo.duration[o]), power_w=float(shape.power_w),
                          zone=zone_index.get(group.budget, -1))
            hi = int(jo.latest[o])
            if is_forced:
                cost = np.full(T, np.inf)
                cost[lo:] = table[row, lo:]
                opts.append(LpOption(cost=cost, **common))
                continue
            if lo <= hi:
                cost = np.full(T, np.inf)
                cost[lo:hi + 1] = table[row, lo:hi + 1]
                opts.append(LpOption(cost=cost, **common))
                if interruptible(problem.jobs[j]):
                    opts.append(_segmented_option(problem, j, gi, lo, common))
            if late_budget > 0 and max(lo, hi + 1) < T:
                cost = np.full(T, np.inf)
                cost[max(lo, hi + 1):] = table[row, max(lo, hi + 1):]
                opts.append(LpOption(cost=cost, late=True, **common))
        jobs.append(opts)
    if forced:
        notes.append(f"{forced} jobs cannot meet their deadline on any option: any start up to the horizon")
    if no_option:
        notes.append(f"{no_option} jobs fit no pool: left out (every policy leaves them unplaced)")
    if late_budget > 0:
        notes.append(f"up to {late_budget} other jobs may start after their deadline (the compared plans' misses)")
    return LpInstance(n_slots=T, capacity=cap, jobs=jobs, power_cap=power, late_budget=float(late_budget),
                      notes=notes)


def _segmented_option(problem, j: int, gi: int, lo: int, common: dict) -> LpOption:
    """The relaxation of an interruptible job's segmented plans on group gi (issue 30): a
    scatter option that runs `floor(running time / slot)` slots anywhere in its on-time window
    (from its release to `segments.window_ends`), k GPUs of any of the group's resources in
    each, at each slot's whole-slot price (under one slot of running: one slot at that share of
    its price). Every segmented plan on gi runs at least that long,
    so it holds k GPUs in at least that many slots of the window and, where the forecast is
    constant within a slot (hourly data, slots of an hour or less), costs at least those
    slots' prices; segment count, minimum run, the first segment's latest start, one pool per
    segment and a pause job's idle power are ignored. A bound, and it now charges capacity
    (before: an option that used none). One-piece starts keep their own options."""
    job = problem.jobs[j]
    resumed = bool(problem.job_resumed[j])
    w = work_s(problem, j, gi)
    run_s = wall_s(w, 1, job.resume_cost_s or 0.0, resumed)
    end = int(window_ends(problem, [j])[0, gi])
    per_slot = problem.slot_integrals(problem.groups[gi].zone) * float(problem.job_scale[j, gi])
    slots = run_s / problem.slot_s
    n = int(math.floor(slots + 1e-9))
    cost = np.full(problem.n_slots, np.inf)
    # under one slot of running: one slot held, at the share of its price the run can use
    cost[lo:end] = per_slot[lo:end] * (1.0 if n >= 1 else slots)
    return LpOption(cost=cost, scatter=max(1, n), **common)


def round_solution(inst: LpInstance, result: LpResult) -> tuple[float, dict[int, tuple[int, int]]]:
    """An integer plan near the LP optimum: (its cost, job -> (resource, start)).

    Jobs in order of their largest LP fraction (of the last optimal master), each at its
    highest-fraction column that
    still fits the remaining per-slot capacity, else at its cheapest start that fits; in one
    piece (a segmented job's scatter option is a relaxation, not a plan).
    With per-pool resources (no merge) this is a feasible plan of the policies' problem
    (gang GPUs follow from per-slot counts), ignoring power caps, without late starts; its
    cost shows how much of a policy's gap to the bound is the policy's and how much the LP's.
    """
    T = inst.n_slots
    remaining = np.where(np.isfinite(inst.capacity), inst.capacity, np.inf).astype(np.float64)
    by_job: dict[int, list[tuple[float, int, int]]] = {}
    for j, r, s, x in result.solution:
        by_job.setdefault(j, []).append((x, r, s))
    order = sorted(range(len(inst.jobs)), key=lambda j: -max((x for x, _, _ in by_job.get(j, [])), default=0.0))
    total = 0.0
    placed: dict[int, tuple[int, int]] = {}
    for j in order:
        options = inst.jobs[j]
        if not options:
            continue
        choice = None
        for x, r, s in sorted(by_job.get(j, []), reverse=True):
            for opt in options:
                if not opt.late and not opt.scatter and r in opt.resources and math.isfinite(opt.cost[s]) and \
                        remaining[r, s:min(s + opt.duration, T)].min() >= opt.gpus:
                    choice = (float(opt.cost[s]), r, s, opt)
                    break
            if choice:
                break
        if choice is None:
            for opt in (o for o in options if not o.late and not o.scatter):
                for r in opt.resources:
                    for s in np.argsort(opt.cost, kind="stable").tolist():
                        if not math.isfinite(opt.cost[s]):
                            break
                        if choice is not None and opt.cost[s] >= choice[0]:
                            break
                        if remaining[r, s:min(s + opt.duration, T)].min() >= opt.gpus:
                            choice = (float(opt.cost[s]), r, s, opt)
                            break
        if choice is None:
            continue
        cost, r, s, opt = choice
        remaining[r, s:min(s + opt.duration, T)] -= opt.gpus
        total += cost
        placed[j] = (r, s)
    return total, placed
