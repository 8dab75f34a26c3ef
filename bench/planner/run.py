"""The planner benchmark itself: instances, timed runs, judged plans, the LP bound, targets.

For each size the instance is generated (deterministic for the seed), pickled, and every
policy setting runs once in a fresh subprocess (`bench.planner.child`). The plans come back
and are judged here by `check.check_plan` (independent feasibility and gCO2). Then the LP
bound is solved for the same snapshot (`policies.solvers.lp_relaxation`), and the targets are judged.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.planner.check import check_plan
from bench.planner.instance import Instance, InstanceSpec, generate
from policies.solvers.lp_relaxation import LpResult, cannot_meet_deadline, lp_instance, round_solution, solve_lp_bound
from policies.types import J_PER_KWH

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RunSetting:
    """One row of the table: a policy with constructor parameters."""

    label: str
    policy: str
    params: dict = field(default_factory=dict)


DEFAULT_RUNS = (
    RunSetting("fifo", "fifo"),
    RunSetting("greedy", "greedy"),
    RunSetting("cpsat-first", "cpsat", {"max_time_s": 2.0}),
    RunSetting("cpsat-30s", "cpsat", {"max_time_s": 30.0}),
)


@dataclass
class RunResult:
    label: str
    policy: str
    params: dict
    wall_s: float | None = None
    cpu_s: float | None = None
    peak_rss_mb: float | None = None
    peak_over_baseline_mb: float | None = None
    baseline_rss_mb: float | None = None
    gco2: float | None = None
    energy_kwh: float | None = None
    placed: int = 0
    unplaced: int = 0
    deadline_misses: int = 0
    unforced_misses: int = 0
    violations: list[str] = field(default_factory=list)
    estimate_max_diff_pct: float | None = None
    error: str | None = None

    def vs(self, other: RunResult | None) -> float | None:
        """This run's gCO2 relative to another's, in % (negative: cheaper)."""
        if other is None or self.gco2 is None or not other.gco2:
            return None
        return 100.0 * (self.gco2 - other.gco2) / other.gco2


@dataclass
class SizeResult:
    label: str
    jobs: int
    gpus: int
    facts: dict
    compile_s: float
    runs: list[RunResult]
    lp: dict
    forced_misses: int

    def run(self, label: str) -> RunResult | None:
        return next((r for r in self.runs if r.label == label), None)

    def bound_covers(self, r: RunResult) -> bool:
        """The bound holds for plans with at most `late_budget` unforced deadline misses."""
        return r.unforced_misses <= self.lp.get("late_budget", 0)

    def bound_for(self, r: RunResult) -> dict:
        """The LP solved with this plan's own number of unforced misses as its late budget
        (a plan that meets every deadline it can is judged against the LP that makes it meet
        them too), else the main one (the largest budget of the compared plans)."""
        return self.lp.get("by_late_budget", {}).get(r.unforced_misses, self.lp)

    def gap_pct(self, r: RunResult) -> float | None:
        bound = self.bound_for(r).get("bound_g")
        if r.gco2 is None or not bound:
            return None
        return 100.0 * (r.gco2 - bound) / bound


@dataclass
class Target:
    size: str
    what: str
    value: float | None
    limit: float
    unit: str
    passed: bool
    note: str = ""


def run_child(snapshot_path: Path, setting: RunSetting, workdir: Path, timeout_s: float) -> tuple[object, dict]:
    """Run one planning in a fresh interpreter; (plan, figures)."""
    out = workdir / f"plan-{setting.label}.pkl"
    cmd = [sys.executable, "-m", "bench.planner.child", str(snapshot_path), str(out), setting.policy,
           json.dumps(setting.params)]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"{setting.label}: child exited {proc.returncode}: {' | '.join(tail)}")
    with open(out, "rb") as f:
        result = pickle.load(f)
    out.unlink()
    return result["plan"], result["figures"]


MIP_MAX_JOBS = 200  # --mip-time runs only at sizes up to this many jobs (6-24 * 10^4 binaries at 200)


def lp_settings(jobs: int, merge: str, block: int | None) -> tuple[bool, int]:
    """The LP's relaxation for a size: per-pool and per-slot up to 1,000 jobs; pools merged
    per (zone, model) above; capacity rows per hour (4 slots) from 5,000 jobs."""
    m = {"auto": jobs > 1000, "yes": True, "no": False}[merge]
    b = block if block is not None else (4 if jobs >= 5000 else 1)
    return m, b


def bench_size(spec: InstanceSpec, runs: tuple[RunSetting, ...], *, lp_time_s: float, lp_merge: str = "auto",
               lp_block: int | None = None, mip_time_s: float = 0.0, child_timeout_s: float = 600.0,
               progress: Callable[[str], None] = lambda line: None) -> SizeResult:
    """Everything for one size (see the module docstring)."""
    from policies.problem.instance import compile_problem

    t0 = time.perf_counter()
    inst: Instance = generate(spec)
    progress(f"[{spec.label}] instance: {inst.facts['jobs']} jobs, {inst.facts['gpus']} GPUs on "
             f"{inst.facts['nodes']} nodes in {', '.join(inst.facts['zones'])} from {inst.facts['now']}, "
             f"load {inst.facts['load']:.2f} ({time.perf_counter() - t0:.1f} s)")
    snapshot = inst.snapshot
    t0 = time.perf_counter()
    problem = compile_problem(snapshot)
    compile_s = time.perf_counter() - t0
    forced_ids = {job.id for j, job in enumerate(problem.jobs) if cannot_meet_deadline(problem, j)}

    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="bench-planner-") as tmp:
        snap_path = Path(tmp) / "snapshot.pkl"
        with open(snap_path, "wb") as f:
            pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)
        for setting in runs:
            r = RunResult(setting.label, setting.policy, dict(setting.params))
            try:
                plan, fig = run_child(snap_path, setting, Path(tmp), child_timeout_s)
            except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
                r.error = str(e)
                progress(f"[{spec.label}] {setting.label}: FAILED: {e}")
                results.append(r)
                continue
            c = check_plan(snapshot, plan, problem.book)
            r.wall_s, r.cpu_s = fig["wall_s"], fig["cpu_s"]
            r.peak_rss_mb, r.peak_over_baseline_mb = fig["peak_rss_mb"], fig["peak_over_baseline_mb"]
            r.baseline_rss_mb = fig["baseline_rss_mb"]
            r.gco2, r.energy_kwh = c.gco2, c.energy_j / J_PER_KWH
            r.placed, r.unplaced, r.deadline_misses = c.placed, c.unplaced, c.deadline_misses
            r.unforced_misses = len(c.miss_jobs - forced_ids)
            r.violations, r.estimate_max_diff_pct = c.violations, c.estimate_max_diff_pct
            results.append(r)
            progress(f"[{spec.label}] {setting.label}: {r.wall_s:.2f} s wall ({r.cpu_s:.2f} s CPU), "
                     f"peak {r.peak_rss_mb:.0f} MB (+{r.peak_over_baseline_mb:.0f}), "
                     f"{r.gco2 / 1e6:.3f} t CO2, {r.placed} placed, {r.deadline_misses} deadline misses"
                     + (f", {len(r.violations)} VIOLATIONS: {r.violations[0]}" if r.violations else ""))

    # fifo ignores deadlines by design; the bound covers the carbon-aware plans' misses
    late_budget = max((r.unforced_misses for r in results if r.error is None and r.policy != "fifo"), default=0)
    merge, block = lp_settings(spec.jobs, lp_merge, lp_block)
    t0 = time.perf_counter()
    li = lp_instance(problem, merge=merge, late_budget=late_budget)
    build_s = time.perf_counter() - t0
    res: LpResult = solve_lp_bound(li, time_limit_s=lp_time_s, block=block)
    lp = {"bound_g": res.bound_g, "lp_value_g": res.lp_value_g, "converged": res.converged, "status": res.status,
          "rounds": res.rounds, "columns": res.columns, "wall_s": res.wall_s, "build_s": build_s,
          "artificial_share": res.artificial_share, "merged_pools": merge, "block_slots": block,
          "late_budget": late_budget, "notes": res.notes, "solver": "GLOP (MathOpt), column generation"}
    # each plan is judged against the LP with its own late budget: one solve per other budget
    # (usually a carbon-aware plan that misses no deadline besides one that misses one)
    budgets = sorted({r.unforced_misses for r in results if r.error is None and r.policy != "fifo"})
    lp["by_late_budget"] = {late_budget: {k: lp[k] for k in ("bound_g", "converged", "status", "wall_s")}}
    for b in budgets:
        if b == late_budget:
            continue
        res_b = solve_lp_bound(lp_instance(problem, merge=merge, late_budget=b), time_limit_s=lp_time_s, block=block)
        lp["by_late_budget"][b] = {"bound_g": res_b.bound_g, "converged": res_b.converged, "status": res_b.status,
                                   "wall_s": res_b.wall_s}
        progress(f"[{spec.label}] LP bound with {b} late jobs allowed: {res_b.bound_g / 1e6:.4f} t CO2 "
                 f"({'converged' if res_b.converged else 'DID NOT CONVERGE: ' + res_b.status}, {res_b.wall_s:.1f} s)")
    if not merge and block == 1 and not li.power_cap.size:
        rounded_g, placed = round_solution(li, res)
        lp["rounded_plan_g"] = rounded_g
        lp["rounded_plan_placed"] = len(placed)
    segmented = any(opt.scatter for options in li.jobs for opt in options)
    if mip_time_s > 0 and spec.jobs <= MIP_MAX_JOBS and segmented:
        lp["mip"] = {"skipped": "interruptible jobs: their segmented plans are not in the integer model"}
        progress(f"[{spec.label}] MIP bound skipped: interruptible jobs' segmented plans are not in the integer model")
    elif mip_time_s > 0 and spec.jobs <= MIP_MAX_JOBS:
        # the integer model on the LP's own instance (per pool and slot when not merged):
        # its proven bound shows how much of a policy's gap to the LP bound is integrality gap
        from bench.planner.mip_bound import solve_mip_bound

        mip = solve_mip_bound(li if not merge and block == 1 else lp_instance(problem, late_budget=late_budget),
                              time_limit_s=mip_time_s)
        lp["mip"] = {"bound_g": mip.bound_g, "best_g": mip.best_g, "status": mip.status, "wall_s": mip.wall_s,
                     "build_s": mip.build_s, "binaries": mip.binaries, "solver": "SCIP (MathOpt), 1 thread"}
        progress(f"[{spec.label}] MIP bound: {mip.bound_g / 1e6:.4f} t CO2 (best integer "
                 f"{'-' if mip.best_g is None else f'{mip.best_g / 1e6:.4f}'} t, {mip.status}, {mip.wall_s:.0f} s)")
    progress(f"[{spec.label}] LP bound: {res.bound_g / 1e6:.3f} t CO2 "
             f"({'converged' if res.converged else 'DID NOT CONVERGE: ' + res.status}, {res.rounds} rounds, "
             f"{res.columns} columns, {res.wall_s:.1f} s)")
    return SizeResult(label=spec.label, jobs=spec.jobs, gpus=spec.gpus, facts=inst.facts, compile_s=compile_s,
                      runs=results, lp=lp, forced_misses=len(forced_ids))


# Targets of issue 5, per size label
FIRST, FULL = "cpsat-first", "cpsat-30s"
BEAT_GREEDY_PCT = {200: 8.0, 1000: 5.0, 2000: 3.0, 5000: 3.0}
WITHIN_LP_PCT = {200: 4.0, 2000: 8.0}


def judge(sizes: list[SizeResult]) -> list[Target]:
    """Every issue-5 target that applies to the sizes run."""
    out: list[Target] = []
    for s in sizes:
        greedy = s.run("greedy")
        first, full = s.run(FIRST), s.run(FULL)
        for r in s.runs:
            if r.violations or r.error:
                out.append(Target(s.label, f"{r.label} plan feasible", len(r.violations), 0, "violations", False,
                                  r.error or r.violations[0]))
        if s.jobs == 5000 and greedy and greedy.wall_s is not None:
            out.append(Target(s.label, "greedy wall time", greedy.wall_s, 1.5, "s", greedy.wall_s <= 1.5))
        if s.jobs == 5000 and first and first.wall_s is not None:
            out.append(Target(s.label, "cpsat first plan wall time", first.wall_s, 2.0, "s", first.wall_s <= 2.0))
            out.append(Target(s.label, "cpsat first plan peak RSS", first.peak_rss_mb, 1024.0, "MB",
                              first.peak_rss_mb <= 1024.0, "whole process, imports included"))
        for r in (first, full):
            if r and greedy and r.gco2 is not None and greedy.gco2 is not None:
                ok = r.gco2 <= greedy.gco2 * (1 + 1e-9) and r.deadline_misses <= greedy.deadline_misses
                out.append(Target(s.label, f"{r.label} never worse than greedy", r.vs(greedy), 0.0, "% vs greedy", ok))
        if full and greedy and s.jobs in BEAT_GREEDY_PCT and full.gco2 is not None:
            need = BEAT_GREEDY_PCT[s.jobs]
            gain = -full.vs(greedy)
            out.append(Target(s.label, f"{FULL} beats greedy by", gain, need, "% (at least)", gain >= need))
        if full and s.jobs in WITHIN_LP_PCT and full.gco2 is not None and s.lp.get("bound_g"):
            gap = s.gap_pct(full)
            own = s.bound_for(full)
            note = f"LP with {full.unforced_misses} late jobs allowed (as many as the plan misses)"
            if not own["converged"]:
                note += "; it did not converge: gap to a weaker (still proven) bound"
            out.append(Target(s.label, f"{FULL} gap to the LP bound", gap, WITHIN_LP_PCT[s.jobs], "% (at most)",
                              gap <= WITHIN_LP_PCT[s.jobs], note))
    return out


def to_json(sizes: list[SizeResult], targets: list[Target], meta: dict) -> dict:
    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    return clean({
        "meta": meta,
        "sizes": [{**{k: v for k, v in asdict(s).items() if k != "runs"},
                   "runs": [{**asdict(r), "vs_fifo_pct": r.vs(s.run("fifo")), "vs_greedy_pct": r.vs(s.run("greedy")),
                             "gap_to_lp_pct": s.gap_pct(r)} for r in s.runs]} for s in sizes],
        "targets": [asdict(t) for t in targets],
        "all_targets_met": all(t.passed for t in targets),
    })
