"""Run several policies over one scenario and collect their metrics.

Each policy gets a fresh Simulation over the same jobs, cluster, carbon data and forecast
model (a fresh ForecastModel per policy with the same seed, so `noisy` forecasts are the
same numbers for every policy and every run with that seed).

fifo breaks ties between equally early, equally fast GPUs by a seeded random choice
(`policies.solvers.fifo`), so its figures depend on that seed as on a renaming of the nodes: with
`fifo_seeds` N > 1 a plain `fifo` runs with seeds 0..N-1 and is reported as their mean
(`SEED_MEAN_KEYS`), with each seed's figure and the spread in its summary's `seeds`; the rest
of its summary, and its run (records, meters), are seed 0's.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass

from scheduler.simulate.forecasts import parse_forecast
from scheduler.simulate.metrics import compare, summarize
from scheduler.simulate.model import Simulation
from scheduler.simulate.priorities import SimPriorities
from scheduler.simulate.records import PolicyRun
from scheduler.simulate.scenario import Scenario
from scheduler.simulate.tenancy import tenant_figures
from scheduler.simulate.settings import SimSettings

log = logging.getLogger(__name__)

#: the figures of a many-seed fifo that are the mean over its seeds
SEED_MEAN_KEYS = ("kgco2", "energy_kwh", "facility_energy_kwh", "deadline_misses", "lateness_s", "late_gpu_h",
                  "gco2_per_prompt", "gco2_per_gpu_hour", "mean_wait_s", "cost_usd")


@dataclass
class SimulationResult:
    runs: dict[str, PolicyRun]
    summaries: dict[str, dict]
    comparison: dict[str, dict]


#: Per-call time budgets the simulator gives time-limited policies unless the --policy spec
#: says otherwise (`cpsat:max_time_s=10` for the daemon's own 10 s). A replay makes
#: thousands of planner calls; 1 s each keeps a week of trace to minutes, and cpsat returns
#: at least greedy's plan whatever its budget. The budget is counted in nominal work, not
#: wall time (`policies.solvers.work_clock`): a replay then gives the same figures on any host at
#: any load, which a comparison of policies needs (`cpsat:deterministic=false` for the
#: daemon's wall-clock budget).
SIM_POLICY_DEFAULTS: dict[str, dict[str, object]] = {"cpsat": {"max_time_s": 1.0, "deterministic": True}}


@dataclass(frozen=True)
class PolicySpec:
    """A policy to simulate: its label in the report, registry name and constructor parameters."""

    label: str
    name: str
    params: tuple[tuple[str, object], ...] = ()


def parse_policies(text: str) -> list[PolicySpec]:
    """`fifo,greedy,cpsat:max_time_s=0.5` -> specs, checked against the policy registry.

    `NAME:key=value:key=value` passes constructor parameters to the policy (see each
    policy's dataclass fields); the label in the report is the spec as written.
    """
    from policies.base import get_policy, parse_policy_spec

    specs: list[PolicySpec] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name = part.split(":")[0]
        name, params = parse_policy_spec(part, SIM_POLICY_DEFAULTS.get(name, {}))
        get_policy(name, **params)  # ValueError now for bad parameters, not mid-run
        specs.append(PolicySpec(label=part, name=name, params=tuple(sorted(params.items()))))
    if not specs:
        raise ValueError("--policy needs at least one policy name")
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError("--policy lists a policy twice")
    return specs


def run_policies(scenario: Scenario, policies: list[PolicySpec] | list[str], *, forecast: str = "perfect",
                 settings: SimSettings = SimSettings(), progress: bool = False,
                 on_policy: Callable[[str, dict], None] | None = None, fifo_seeds: int = 1) -> SimulationResult:
    """Simulate each policy in turn; `progress` shows a tqdm bar per policy on stderr; a
    plain `fifo` runs with `fifo_seeds` seeds (module docstring)."""
    runs: dict[str, PolicyRun] = {}
    summaries: dict[str, dict] = {}
    first = min(j.submitted_at for j in scenario.jobs).timestamp()
    last = max(j.submitted_at for j in scenario.jobs).timestamp()
    specs = [p if isinstance(p, PolicySpec) else parse_policies(p)[0] for p in policies]
    fits: dict = {}  # the learned forecaster's fits, the same for every policy
    for spec in specs:
        name = spec.label
        if spec.name == "fifo" and fifo_seeds > 1 and "seed" not in dict(spec.params):
            run, summary = _many_seeds(scenario, spec, fifo_seeds, forecast, settings, fits)
            runs[name], summaries[name] = run, summary
            if on_policy is not None:
                on_policy(name, summary)
            continue
        bar = None
        tick_progress = None
        if progress:
            from tqdm import tqdm

            total_h = max(1, int((last - first) / 3600) + 1)
            bar = tqdm(total=total_h, desc=f"{name:>8}", unit="h", file=sys.stderr, leave=True,
                       dynamic_ncols=True)
            state = {"done": 0}

            def tick_progress(now_s: float, bar=bar, state=state) -> None:
                done = min(total_h, max(0, int((now_s - first) / 3600)))
                if done > state["done"]:
                    bar.update(done - state["done"])
                    state["done"] = done
        try:
            run = _simulate(scenario, spec, dict(spec.params), forecast, settings, fits, tick_progress)
        finally:
            if bar is not None:
                bar.close()
        runs[name] = run
        summaries[name] = _summary(run, scenario)
        log.info("%s: %.3f kgCO2, %d events in %.1f s", name, summaries[name]["kgco2"], run.events, run.wall_s)
        if on_policy is not None:
            on_policy(name, summaries[name])
    return SimulationResult(runs=runs, summaries=summaries, comparison=compare(summaries))


def _summary(run: PolicyRun, scenario: Scenario) -> dict:
    """The run's metrics (`metrics.summarize`) with its figures per account and QOS."""
    return summarize(run, scenario.cluster) | tenant_figures(
        run.records, scenario.tenants, scenario.shares, capacity_gpus=sum(scenario.cluster.gpus_by_model().values()))


def _simulate(scenario: Scenario, spec: PolicySpec, params: dict, forecast: str, settings: SimSettings, fits: dict,
              progress: Callable[[float], None] | None = None) -> PolicyRun:
    """One run of `spec`'s policy with `params`, on a fresh forecast model of the run's seed."""
    model = parse_forecast(forecast, scenario.carbon, seed=settings.seed, fits=fits)
    model.with_climatology = settings.climatology
    priorities = SimPriorities(scenario.tenants, scenario.shares, fair_share=settings.fair_share,
                               fleet_gpus=sum(scenario.cluster.gpus_by_model().values()))
    return Simulation(cluster=scenario.cluster, jobs=scenario.jobs, carbon=scenario.carbon, policy=spec.name,
                      policy_params=params, forecast=model, settings=settings, profiles=scenario.profiles,
                      progress=progress, priorities=priorities if priorities.active else None).run()


def _many_seeds(scenario: Scenario, spec: PolicySpec, seeds: int, forecast: str, settings: SimSettings,
                fits: dict) -> tuple[PolicyRun, dict]:
    """fifo with seeds 0..seeds-1: seed 0's run, and a summary with the mean of
    `SEED_MEAN_KEYS` over the seeds and `seeds` (each seed's kgCO2 and misses, their spread)."""
    import statistics

    runs = [_simulate(scenario, spec, {**dict(spec.params), "seed": seed}, forecast, settings, fits)
            for seed in range(seeds)]
    summaries = [_summary(run, scenario) for run in runs]
    out = dict(summaries[0])
    for key in SEED_MEAN_KEYS:
        values = [s[key] for s in summaries]
        if all(v is not None for v in values):
            out[key] = statistics.fmean(values)
    kg = [s["kgco2"] for s in summaries]
    out["seeds"] = {"count": seeds, "kgco2": kg, "deadline_misses": [s["deadline_misses"] for s in summaries],
                    "kgco2_sd": statistics.stdev(kg) if seeds > 1 else 0.0,
                    "kgco2_range": [min(kg), max(kg)]}
    out["wall_s"] = sum(s["wall_s"] for s in summaries)
    log.info("%s over %d seeds: %.3f +- %.3f kgCO2", spec.label, seeds, out["kgco2"], out["seeds"]["kgco2_sd"])
    return runs[0], out
