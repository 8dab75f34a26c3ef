"""Run several policies over one scenario and collect their metrics.

Each policy gets a fresh Simulation over the same jobs, cluster, carbon data and forecast
model (a fresh ForecastModel per policy with the same seed, so `noisy` forecasts are the
same numbers for every policy and every run with that seed).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass

from scheduler.simulate.forecasts import parse_forecast
from scheduler.simulate.metrics import compare, summarize
from scheduler.simulate.model import PolicyRun, SimSettings, Simulation
from scheduler.simulate.scenario import Scenario

log = logging.getLogger(__name__)


@dataclass
class SimulationResult:
    runs: dict[str, PolicyRun]
    summaries: dict[str, dict]
    comparison: dict[str, dict]


#: Per-call time budgets the simulator gives time-limited policies unless the --policy spec
#: says otherwise (`cpsat:max_time_s=10` for the daemon's own 10 s). A replay makes
#: thousands of planner calls; 1 s each keeps a week of trace to minutes, and cpsat returns
#: at least greedy's plan whatever its budget.
SIM_POLICY_DEFAULTS: dict[str, dict[str, object]] = {"cpsat": {"max_time_s": 1.0}}


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
                 on_policy: Callable[[str, dict], None] | None = None) -> SimulationResult:
    """Simulate each policy in turn; `progress` shows a tqdm bar per policy on stderr."""
    runs: dict[str, PolicyRun] = {}
    summaries: dict[str, dict] = {}
    first = min(j.submitted_at for j in scenario.jobs).timestamp()
    last = max(j.submitted_at for j in scenario.jobs).timestamp()
    specs = [p if isinstance(p, PolicySpec) else parse_policies(p)[0] for p in policies]
    fits: dict = {}  # the learned forecaster's fits, the same for every policy
    for spec in specs:
        name = spec.label
        model = parse_forecast(forecast, scenario.carbon, seed=settings.seed, fits=fits)
        model.climatology = settings.climatology
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
            sim = Simulation(cluster=scenario.cluster, jobs=scenario.jobs, carbon=scenario.carbon, policy=spec.name,
                             policy_params=dict(spec.params), forecast=model, settings=settings,
                             profiles=scenario.profiles,
                             progress=tick_progress)
            run = sim.run()
        finally:
            if bar is not None:
                bar.close()
        runs[name] = run
        summaries[name] = summarize(run, scenario.cluster)
        log.info("%s: %.3f kgCO2, %d events in %.1f s", name, summaries[name]["kgco2"], run.events, run.wall_s)
        if on_policy is not None:
            on_policy(name, summaries[name])
    return SimulationResult(runs=runs, summaries=summaries, comparison=compare(summaries))
