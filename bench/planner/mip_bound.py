"""The integer time-indexed model, solved by a MIP solver that proves a dual bound.

`policies.solvers.lp_relaxation` bounds every plan by the LP relaxation of the time-indexed model; this module
solves the same model with integer x (SCIP through MathOpt, single-threaded) for a time
limit and reports the best integer solution found and the best proven bound. The proven
MIP bound is also a lower bound on every plan the LP bound covers (the same relaxations:
gang as k GPUs of a pool, per-pool per-slot capacity, the artificial column, the late
budget), and it is at least the LP bound: the difference is the LP's integrality gap
that the solver has proven. Meant for the small sizes: the seed-1 200x64 instance has
6.3 * 10^4 binaries (2.4 * 10^5 with late options, when a compared plan misses a deadline),
and SCIP needs ~3 min (over 10 min with late options) for its root LP and cuts on 2 cores;
with less time its bound can be below the LP bound (the report says so).
`python -m bench.planner --mip-time S` runs it beside the LP bound.

The model is built as one MathOpt `ModelProto` from numpy arrays (no per-variable Python
calls): rows are the jobs' convexity rows, then the capacity rows (resource, slot), then
the power rows (zone, slot, capped slots only), then the late-budget row.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from policies.solvers.lp_relaxation import LpInstance, _Pricer

log = logging.getLogger(__name__)


@dataclass
class MipResult:
    """The MIP's best integer solution and best proven bound, in gCO2."""

    bound_g: float  # proven lower bound on the integer optimum
    best_g: float | None  # the best integer solution found (None: none)
    status: str
    wall_s: float
    build_s: float
    binaries: int

    @property
    def gap_pct(self) -> float | None:
        """How far the best solution may be above the integer optimum."""
        if self.best_g is None or not self.best_g:
            return None
        return 100.0 * (self.best_g - self.bound_g) / self.best_g


def mip_model(inst: LpInstance, artificial_factor: float = 10.0):
    """(MathOpt ModelProto of the integer time-indexed model, number of binaries)."""
    from ortools.math_opt import model_pb2

    pricer = _Pricer(inst)
    if len(pricer.sc_job):
        raise ValueError("segmented jobs' scatter options are not in the integer model")
    T = inst.n_slots
    R = inst.capacity.shape[0]
    J = len(inst.jobs)
    Z = inst.power_cap.shape[0] if inst.power_cap.size else 0
    ce, cs = np.nonzero(np.isfinite(pricer.cost[pricer.e_row]))  # every (edge, start) column
    n = len(ce)
    cost = pricer.cost[pricer.e_row[ce], cs]
    k, d, r = pricer.e_k[ce], pricer.e_d[ce], pricer.e_res[ce]
    big = np.maximum(pricer.job_max_cost, 1.0) * artificial_factor
    big[np.bincount(pricer.e_job, minlength=J) == 0] = 0.0
    end = np.minimum(cs + d, T)
    length = end - cs
    rep = np.repeat(np.arange(n), length)
    t = cs[rep] + (np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length))
    rows = [pricer.e_job[ce], np.arange(J), J + r[rep] * T + t]
    cols = [np.arange(n), n + np.arange(J), rep]
    vals = [np.ones(n), np.ones(J), k[rep]]
    row_lb = [np.ones(J), np.full(R * T, -np.inf)]
    row_ub = [np.ones(J), np.where(np.isfinite(inst.capacity), inst.capacity, np.inf).reshape(-1)]
    n_rows = J + R * T
    if Z:
        z = pricer.e_zone[ce][rep]
        capped = np.isfinite(inst.power_cap)
        keep = (z >= 0) & capped[np.maximum(z, 0), t]
        rows.append(n_rows + z[keep] * T + t[keep])
        cols.append(rep[keep])
        vals.append(pricer.e_pw[ce][rep][keep])
        row_lb.append(np.full(Z * T, -np.inf))
        row_ub.append(np.where(capped, inst.power_cap, np.inf).reshape(-1))
        n_rows += Z * T
    late = np.flatnonzero(pricer.e_late[ce] > 0)
    if late.size:
        rows.append(np.full(late.size, n_rows))
        cols.append(late)
        vals.append(np.ones(late.size))
        row_lb.append(np.array([-np.inf]))
        row_ub.append(np.array([float(inst.late_budget)]))
        n_rows += 1
    ri, ci, vv = np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)
    order = np.lexsort((ci, ri))
    n_vars = n + J
    obj = np.concatenate([cost, big])
    mp = model_pb2.ModelProto(name="time-indexed-mip")
    mp.variables.ids.extend(range(n_vars))
    mp.variables.lower_bounds.extend([0.0] * n_vars)
    mp.variables.upper_bounds.extend([1.0] * n_vars)
    mp.variables.integers.extend([True] * n_vars)
    nz = np.flatnonzero(obj)
    mp.objective.linear_coefficients.ids.extend(nz.tolist())
    mp.objective.linear_coefficients.values.extend(obj[nz].tolist())
    mp.linear_constraints.ids.extend(range(n_rows))
    mp.linear_constraints.lower_bounds.extend(np.concatenate(row_lb).tolist())
    mp.linear_constraints.upper_bounds.extend(np.concatenate(row_ub).tolist())
    m = mp.linear_constraint_matrix
    m.row_ids.extend(ri[order].tolist())
    m.column_ids.extend(ci[order].tolist())
    m.coefficients.extend(vv[order].tolist())
    return mp, n_vars


def solve_mip_bound(inst: LpInstance, *, time_limit_s: float = 600.0, rel_gap: float = 1e-4,
                    verbose: bool = False) -> MipResult:
    """Solve the integer model with SCIP (one thread) for at most `time_limit_s`."""
    from ortools.math_opt import parameters_pb2, result_pb2
    from ortools.math_opt.core.python import solver as core
    from ortools.math_opt.python import callback, init_arguments, model_parameters
    from ortools.math_opt.python import parameters as mo_params

    t0 = time.perf_counter()
    proto, n_vars = mip_model(inst)
    build_s = time.perf_counter() - t0
    params = parameters_pb2.SolveParametersProto()
    params.time_limit.FromTimedelta(timedelta(seconds=max(1.0, time_limit_s)))
    params.threads = 1
    params.relative_gap_tolerance = rel_gap
    params.enable_output = verbose
    t0 = time.perf_counter()
    res = core.solve(proto, mo_params.SolverType.GSCIP.value,
                     init_arguments.StreamableSolverInitArguments().to_proto(), params,
                     model_parameters.ModelSolveParameters().to_proto(), None,
                     callback.CallbackRegistration().to_proto(), None, None)
    wall_s = time.perf_counter() - t0
    bounds = res.termination.objective_bounds
    best = bounds.primal_bound if math.isfinite(bounds.primal_bound) else None
    status = result_pb2.TerminationReasonProto.Name(res.termination.reason).removeprefix("TERMINATION_REASON_").lower()
    log.debug("MIP: %s, best %s, bound %.1f, %.1f s", status, best, bounds.dual_bound, wall_s)
    return MipResult(bound_g=float(bounds.dual_bound), best_g=best, status=status, wall_s=wall_s,
                     build_s=build_s, binaries=n_vars)
