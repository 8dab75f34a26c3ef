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


def _value(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_policies(text: str) -> list[PolicySpec]:
    """`fifo,greedy,cpsat:max_time_s=0.5` -> specs, checked against the policy registry.

    `NAME:key=value:key=value` passes constructor parameters to the policy (see each
    policy's dataclass fields); the label in the report is the spec as written.
    """
    from policies.base import get_policy, policy_names

    specs: list[PolicySpec] = []
    known = policy_names()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, *opts = part.split(":")
        if name not in known:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(known)}")
        params: dict[str, object] = dict(SIM_POLICY_DEFAULTS.get(name, {}))
        for opt in opts:
            key, sep, value = opt.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"bad policy option {opt!r} in {part!r}; expected key=value, "
                                 "e.g. cpsat:max_time_s=0.5")
            params[key.strip()] = _value(value.strip())
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
