"""Benchmarks of `carbonsched simulate`: policy quality against the oracle, the GAIA
comparison, and replay speed. Reads ../shared/data (not shipped); see bench/README.md.

    .venv/bin/python bench/simulate_bench.py gap   [--json OUT]   # cpsat vs oracle, pai_1k, 4 zones
    .venv/bin/python bench/simulate_bench.py gaia  [--json OUT]   # GAIA's setting, DE and US-CAL-CISO
    .venv/bin/python bench/simulate_bench.py gaia --interruptible 1 [--resume-costs 0,60,600]   # in segments
    .venv/bin/python bench/simulate_bench.py speed [--policy greedy] [--days N]  # pai-100k, 256 GPUs
    .venv/bin/python bench/simulate_bench.py overload [--loads 0.6,0.9,1.2] [--variants gaia,long]
    .venv/bin/python bench/simulate_bench.py halfhour [--forecast perfect,baseline]  # 30-min GB vs its hourly mean
    .venv/bin/python bench/simulate_bench.py tenants [--loads 0.9,1.2]  # four accounts, fair share on and off

Each scenario runs the simulator's own API (the same code as the CLI) and prints a table;
`--json` writes the figures. Speed runs each policy in a child process and reports its wall
time, simulated events per second and peak memory (ru_maxrss).
"""

from __future__ import annotations

import argparse
import json
import math
import logging
import os
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.suspend_resume_bound import ideal_suspend_resume_pct  # noqa: E402
from bench.versions import library_versions  # noqa: E402

DATA = Path(os.environ.get("CARBONSCHED_SHARED_DATA", ROOT.parent / "shared" / "data"))
EM = DATA / "carbon" / "electricitymaps"
PAI_1K = DATA / "jobs" / "pai_1k.csv"
PAI_100K = DATA / "jobs" / "pai-100k.csv"
GAIA_START = datetime(2022, 10, 19, 16, tzinfo=timezone.utc)
LONG_SHARE = 0.05  # overload "long": this share of the jobs runs for days
FOLDERS = {"DE": "DE-LU", "GB": "GB", "US-CAL-CISO": "US-CAL-CISO", "SG": "SG"}

# GAIA (ASPLOS'24) on pai_1k, DE-LU / US-CAL-CISO 2022 from 2022-10-19 16:00 UTC, 24 h max
# wait, unlimited homogeneous pool, perfect forecasts: carbon reduction vs run-at-arrival (%).
GAIA_REPORTED = {
    "DE": {"lowest slot": 10.5, "carbon-time": 11.1, "lowest window": 12.6, "wait awhile (suspend-resume)": 16.8},
    "US-CAL-CISO": {"lowest slot": 18.6, "carbon-time": 25.9, "lowest window": 27.2,
                    "wait awhile (suspend-resume)": 33.9},
}


def _carbon(zones: list[str], years: tuple[int, ...] = (2022,)):
    from scheduler.simulate.intensity import load_zone_files

    return {z: load_zone_files(z, [EM / FOLDERS[z] / f"{FOLDERS[z]}_{y}_hourly.csv" for y in years]) for z in zones}


def _estimate_options(args) -> dict:
    """What the planner is told of job lengths (issue 31), for any scenario's SimSettings:
    `SimSettings(..., **_estimate_options(args))`; `--estimate`, `--[no-]correct-estimates`,
    `--[no-]estimate-margin`, `--[no-]price-length-spread`."""
    return {"estimate": args.estimate, "correct_estimates": args.correct_estimates,
            "estimate_margin": args.estimate_margin, "price_length_spread": args.price_length_spread}


def _run(scenario, policies: str, settings, forecast: str = "perfect"):
    from scheduler.simulate.runner import parse_policies, run_policies

    return run_policies(scenario, parse_policies(policies), forecast=forecast, settings=settings,
                        progress=sys.stderr.isatty())


def _print(result) -> None:
    from scheduler.simulate.report import table

    print(table(result.summaries, result.comparison))


def bench_gap(args) -> dict:
    """cpsat vs oracle savings over fifo: pai_1k, 24 h slack, the 4-zone cluster, 2022 carbon."""
    from scheduler.simulate.cluster import load_cluster
    from scheduler.simulate.scenario import build_scenario
    from scheduler.simulate.settings import SimSettings
    from scheduler.simulate.traces import read_jobs

    cluster = load_cluster(ROOT / "examples" / "cluster-4zone.toml")
    from scheduler.simulate.scenario import parse_mix

    scenario = build_scenario(cluster, read_jobs(PAI_1K), _carbon(cluster.zones), start=GAIA_START,
                              slack_s=24 * 3600.0, mix=parse_mix(args.mix),
                              interruptible=_interruptible(args) if args.interruptible else None)
    settings = SimSettings(plan_interval_s=args.plan_interval, wake_on_submit=args.wake,
                           full_replan_s=args.full_replan, truth=args.truth, learn=args.learn,
                           **_estimate_options(args))
    policies = args.policies or f"fifo,greedy,cpsat:max_time_s={args.cpsat_s},oracle"
    caps = None
    if args.caps:
        # issue 29: the same scenario with the planner choosing GPU power limits, beside it without
        from dataclasses import replace

        from policies.pricing.power_cap import CapBounds

        bounds = CapBounds(allow=True, min_fraction=args.min_cap_fraction)
        print("-- without power caps --")
        free = _run(scenario, policies, settings, args.forecast)
        _print(free)
        print(f"-- with power caps (min {args.min_cap_fraction:.0%} of the default limit) --")
        result = _run(scenario, policies, replace(settings, caps=bounds), args.forecast)
        _print(result)
        caps = {"min_cap_fraction": args.min_cap_fraction, "without": free.summaries, "with": result.summaries,
                "change": {name: {k: (result.summaries[name][k] / free.summaries[name][k] - 1
                                      if free.summaries[name].get(k) else None)
                                  for k in ("energy_kwh", "kgco2")}
                           | {"deadline_misses": (free.summaries[name]["deadline_misses"],
                                                  result.summaries[name]["deadline_misses"])}
                           for name in result.summaries}}
        for name, ch in caps["change"].items():
            print(f"{name:>8}: energy {ch['energy_kwh']:+.1%}, kgCO2 {ch['kgco2']:+.1%}, deadline misses "
                  f"{ch['deadline_misses'][0]} without -> {ch['deadline_misses'][1]} with caps")
    else:
        result = _run(scenario, policies, settings, args.forecast)
        _print(result)
    return {"scenario": "gap", "caps": caps, "cluster": "examples/cluster-4zone.toml", "start": GAIA_START.isoformat(),
            "interruptible": scenario.notes.get("interruptible"),
            "interruptible_jobs": scenario.notes.get("interruptible_jobs"),
            "slack_h": 24, "forecast": args.forecast, "truth": args.truth, "learn": args.learn, "mix": args.mix,
            **_estimate_options(args),
            "plan_interval_s": args.plan_interval,
            "wake_on_submit": args.wake, "summaries": result.summaries, "comparison": result.comparison}


def bench_gaia(args) -> dict:
    """GAIA's setting in both zones: reductions vs run-at-arrival beside GAIA's own figures."""
    from scheduler.simulate.cluster import load_cluster
    from scheduler.simulate.scenario import build_scenario
    from scheduler.simulate.settings import SimSettings
    from scheduler.simulate.traces import read_jobs

    out: dict = {"scenario": "gaia", "start": GAIA_START.isoformat(), "max_wait_h": 24, "zones": {},
                 "forecast": args.forecast, **_estimate_options(args)}
    out["deadline"] = args.gaia_deadline
    if args.interruptible:
        if args.gaia_deadline == "none":
            sys.exit("--gaia-deadline none: an interruptible job's pauses are bounded by its deadline "
                     "(GAIA's suspend-resume: 24 h of waiting in all); use the default, slack")
        return _gaia_interrupting(args, out)
    zones = args.gaia_zones.split(",")
    for zone, cluster_file in (("DE", "cluster-gaia-de.toml"), ("US-CAL-CISO", "cluster-gaia-caiso.toml")):
        if zone not in zones:
            continue
        cluster = load_cluster(ROOT / "examples" / cluster_file)
        scenario = build_scenario(cluster, read_jobs(PAI_1K), _carbon([zone]), start=GAIA_START,
                                  slack_s=_gaia_slack_s(args), max_wait_s=24 * 3600.0)
        # fifo plans at every submit on a pool that is never full: each job runs at its arrival.
        settings = SimSettings(plan_interval_s=args.plan_interval, wake_on_submit=True, **_estimate_options(args))
        # --forecast a,b,...: one run per forecast model (issue 26: what a real forecast keeps)
        forecasts = args.forecast.split(",")
        for forecast in forecasts:
            result = _run(scenario, args.policies or f"fifo,greedy,cpsat:max_time_s={args.cpsat_s},oracle",
                          settings, forecast)
            print(f"\n== {zone} ({cluster_file}), forecast {forecast} ==")
            _print(result)
            ours = {name: c.get("vs_first_pct") for name, c in result.comparison.items()}
            waits = {name: s["max_wait_s"] for name, s in result.summaries.items()}
            entry = {"cluster": f"examples/{cluster_file}", "reduction_pct": ours,
                     "max_wait_s": waits, "gaia_reported_pct": GAIA_REPORTED[zone],
                     "summaries": result.summaries}
            if len(forecasts) == 1:
                out["zones"][zone] = entry
                continue
            out["zones"].setdefault(zone, {})[forecast] = entry
            perfect = out["zones"][zone].get("perfect")
            if perfect and forecast != "perfect":
                kept = {name: (100 * v / perfect["reduction_pct"][name]
                               if v is not None and perfect["reduction_pct"].get(name) else None)
                        for name, v in ours.items()}
                entry["kept_of_perfect_pct"] = kept
                print(f"kept of the perfect-forecast reduction with {forecast}: "
                      + ", ".join(f"{k} {v:.0f}%" for k, v in kept.items() if v is not None))
        print("GAIA reported:", ", ".join(f"{k} {v}%" for k, v in GAIA_REPORTED[zone].items()))
    return out


def _gaia_slack_s(args) -> float | None:
    """The GAIA scenario's finish deadline: `--gaia-deadline slack` (the default) adds
    deadline = arrival + runtime + 24 h to the 24 h maximum wait; `none` keeps GAIA's own
    constraint only, the maximum wait. With exact lengths the two are the same (a job that
    starts within its wait finishes by that deadline); with an estimate the deadline binds
    first for a job told it is longer than it is (latest start = deadline - estimate)."""
    return None if args.gaia_deadline == "none" else 24 * 3600.0


def _interruptible(args, resume_cost_s: float | None = None):
    """The scenario's `Interruptible` from --interruptible, --interruptible-kind, --min-run and
    --resume-cost (seconds; `resume_cost_s` overrides it)."""
    from scheduler.simulate.scenario import Interruptible

    return Interruptible(share=args.interruptible, kind=args.interruptible_kind, min_run_s=args.min_run,
                         resume_cost_s=args.resume_cost if resume_cost_s is None else resume_cost_s,
                         max_segments=args.max_segments)


def _gaia_interrupting(args, out: dict) -> dict:
    """GAIA's setting with --interruptible SHARE of the jobs interruptible (issue 30), at each
    of --resume-costs: the reduction vs run-at-arrival beside GAIA's suspend-resume figure."""
    from scheduler.simulate.cluster import load_cluster
    from scheduler.simulate.scenario import build_scenario
    from scheduler.simulate.settings import SimSettings
    from scheduler.simulate.traces import read_jobs

    costs = [float(x) for x in args.resume_costs.split(",")]
    out["interruptible"] = {"share": args.interruptible, "kind": args.interruptible_kind, "min_run_s": args.min_run,
                            "max_segments": args.max_segments, "resume_costs_s": costs}
    settings = SimSettings(plan_interval_s=args.plan_interval, wake_on_submit=True, **_estimate_options(args))
    zones = args.gaia_zones.split(",")
    for zone, cluster_file in (("DE", "cluster-gaia-de.toml"), ("US-CAL-CISO", "cluster-gaia-caiso.toml")):
        if zone not in zones:
            continue
        cluster = load_cluster(ROOT / "examples" / cluster_file)
        entry: dict = {"cluster": f"examples/{cluster_file}", "gaia_reported_pct": GAIA_REPORTED[zone], "runs": {}}
        for cost in costs:
            scenario = build_scenario(cluster, read_jobs(PAI_1K), _carbon([zone]), start=GAIA_START,
                                      slack_s=24 * 3600.0, max_wait_s=24 * 3600.0,
                                      interruptible=_interruptible(args, cost))
            result = _run(scenario, args.policies or "fifo,greedy", settings, args.forecast)
            print(f"\n== {zone} ({cluster_file}), every {args.interruptible:.0%} of the jobs "
                  f"{args.interruptible_kind}, resume cost {cost:g} s ==")
            _print(result)
            entry["runs"][f"{cost:g}"] = {
                "reduction_pct": {n: c.get("vs_first_pct") for n, c in result.comparison.items()},
                "kgco2": {n: s["kgco2"] for n, s in result.summaries.items()},
                "deadline_misses": {n: s["deadline_misses"] for n, s in result.summaries.items()},
                "interrupted_jobs": {n: s.get("interrupted_jobs") for n, s in result.summaries.items()},
                "segments": {n: s.get("segments") for n, s in result.summaries.items()},
                "max_wait_s": {n: s["max_wait_s"] for n, s in result.summaries.items()},
                "planner_total_s": {n: s["planner_total_s"] for n, s in result.summaries.items()}}
            if "ideal_pct" not in entry:
                entry["ideal_pct"] = ideal_suspend_resume_pct(scenario, zone)
            # the most any policy can save when each resume costs this much (no other limit)
            bound = entry["runs"][f"{cost:g}"]["bound_pct"] = ideal_suspend_resume_pct(scenario, zone, cost)
            print(f"reduction vs run-at-arrival: " + ", ".join(
                f"{n} {v:.2f}%" for n, v in entry["runs"][f"{cost:g}"]["reduction_pct"].items() if v is not None)
                + f"; GAIA's suspend-resume {GAIA_REPORTED[zone]['wait awhile (suspend-resume)']}%; the ideal "
                f"(free resumes, any segments) {entry['ideal_pct']:.2f}%, the most any policy saves at this "
                f"resume cost {bound:.2f}%", flush=True)
        out["zones"][zone] = entry
        if args.json:  # partial results survive a long run being stopped
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    return out


def bench_speed(args) -> dict:
    """pai-100k (hours) on a 256-GPU cluster: each policy in a child process."""
    out: dict = {"scenario": "speed", "trace": str(PAI_100K), "cluster": "examples/cluster-256.toml", "runs": {}}
    for policy in (args.policies or "greedy").split(","):
        cmd = [sys.executable, __file__, "_speed_child", "--policies", policy, "--days", str(args.days),
               "--plan-interval", str(args.plan_interval)] + (["--wake"] if args.wake else []) \
            + (["--full-replan", str(args.full_replan)] if args.full_replan is not None else [])
        t = time.perf_counter()
        # the child's progress bar and errors go straight to our stderr
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            out["runs"][policy] = {"error": f"did not finish within {args.timeout:.0f} s"}
            print(f"{policy}: did not finish within {args.timeout:.0f} s")
            continue
        if proc.returncode != 0:
            out["runs"][policy] = {"error": f"exit {proc.returncode}", "wall_s": time.perf_counter() - t}
            continue
        figures = json.loads(proc.stdout.strip().splitlines()[-1])
        out["runs"][policy] = figures
        print(f"{policy}: {figures['jobs']} jobs, {figures['wall_s']:.1f} s wall (+{figures['load_s']:.1f} s "
              f"loading; {figures['cpu_s']:.1f} s CPU in all), {figures['events_per_s']:.0f} events/s, "
              f"planner {figures['planner_total_s']:.1f} s in "
              f"{figures['planner_calls']} calls ({figures['planner_full_calls']} full re-plans, "
              f"{figures['planner_full_s']:.1f} s), peak RSS {figures['peak_rss_mib']:.0f} MiB, "
              f"{figures['kgco2']:.1f} kgCO2")
    return out


def speed_child(args) -> None:
    from scheduler.simulate.cluster import load_cluster
    from scheduler.simulate.scenario import build_scenario
    from scheduler.simulate.settings import SimSettings
    from scheduler.simulate.traces import read_jobs

    t0 = time.perf_counter()
    cluster = load_cluster(ROOT / "examples" / "cluster-256.toml")
    trace = read_jobs(PAI_100K)  # hours (detected)
    if args.days:
        trace.jobs = [j for j in trace.jobs if j.arrival_s < args.days * 86400]
    carbon = _carbon(cluster.zones)
    scenario = build_scenario(cluster, trace, carbon, start=datetime(2022, 1, 1, tzinfo=timezone.utc),
                              slack_s=24 * 3600.0)
    load_s = time.perf_counter() - t0
    settings = SimSettings(plan_interval_s=args.plan_interval, wake_on_submit=args.wake,
                           full_replan_s=args.full_replan)
    from scheduler.simulate.runner import parse_policies, run_policies

    result = run_policies(scenario, parse_policies(args.policies), settings=settings, progress=True)
    s = next(iter(result.summaries.values()))
    ru = resource.getrusage(resource.RUSAGE_SELF)
    rss_kib = ru.ru_maxrss
    print(json.dumps({"jobs": s["jobs"], "finished": s["finished"], "kgco2": s["kgco2"], "wall_s": s["wall_s"],
                      "load_s": load_s, "cpu_s": ru.ru_utime + ru.ru_stime, "events": s["events"],
                      "events_per_s": s["events_per_s"],
                      "planner_calls": s["planner_calls"], "planner_total_s": s["planner_total_s"],
                      "planner_mean_s": s["planner_mean_s"], "planner_full_calls": s["planner_full_calls"],
                      "planner_full_s": s["planner_full_s"], "full_replan_s": args.full_replan,
                      "simulator_s": s["simulator_s"],
                      "events_per_s_simulator": s["events_per_s_simulator"], "peak_rss_mib": rss_kib / 1024,
                      "plan_interval_s": args.plan_interval, "wake_on_submit": args.wake,
                      "narrowed_jobs": scenario.notes.get("narrowed_jobs")}))


def _overload_trace(load: float, days: float, long_share: float, seed: int, capacity_gpus: int,
                    widest: int):
    """pai-100k's first jobs, as many as offer `load` x the cluster's GPU-hours over `days`,
    their arrivals compressed into `days` (the order and relative spacing kept). With
    `long_share`, that share of the jobs (seeded) runs 1-7 days instead (log-uniform): the
    days-to-weeks jobs of a production GPU cluster that pai's GAIA lengths lack."""
    import random
    from dataclasses import replace as dc_replace

    from scheduler.simulate.traces import read_jobs

    trace = read_jobs(PAI_100K)
    rng = random.Random(seed)
    target_gpu_s = load * capacity_gpus * days * 86400.0
    picked, gpu_s = [], 0.0
    for job in trace.jobs:
        if gpu_s >= target_gpu_s:
            break
        if long_share and rng.random() < long_share:
            job = dc_replace(job, est_runtime_s=86400.0 * math.exp(rng.uniform(0.0, math.log(7.0))))
        picked.append(job)
        gpu_s += job.gpus * (job.est_runtime_s or 3600.0)  # narrowed jobs keep their GPU-hours
    t0, t1 = picked[0].arrival_s, picked[-1].arrival_s
    factor = days * 86400.0 / max(1.0, t1 - t0)
    jobs = [dc_replace(j, arrival_s=t0 + (j.arrival_s - t0) * factor) for j in picked]
    return dc_replace(trace, jobs=jobs), gpu_s / 3600.0


def bench_overload(args) -> dict:
    """The 4-zone cluster under load 0.6 / 0.9 / 1.2: kgCO2, MWh, misses, lateness and planner
    failures per policy; fifo as the mean and spread of seeds; cpsat over trade-off settings."""
    import statistics

    from scheduler.simulate.cluster import load_cluster
    from scheduler.simulate.scenario import build_scenario
    from scheduler.simulate.settings import SimSettings

    cluster = load_cluster(ROOT / "examples" / "cluster-4zone.toml")
    capacity = sum(cluster.gpus_by_model().values())
    carbon = _carbon(cluster.zones)
    loads = [float(x) for x in args.loads.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    prices = [p for p in args.prices.split(",") if p]
    out: dict = {"scenario": "overload", "cluster": "examples/cluster-4zone.toml", "days": args.days,
                 "interruptible": {"share": args.interruptible, "kind": args.interruptible_kind,
                                   "min_run_s": args.min_run, "resume_cost_s": args.resume_cost}
                 if args.interruptible else None,
                 "start": GAIA_START.isoformat(), "slack_h": 24, "cpsat_s": args.cpsat_s,
                 "plan_interval_s": args.plan_interval, "wake_on_submit": args.wake, "cells": []}
    for variant in variants:
        for load in loads:
            trace, gpu_h = _overload_trace(load, args.days, LONG_SHARE if variant == "long" else 0.0, 7,
                                           capacity, cluster.max_gpus_per_node())
            scenario = build_scenario(cluster, trace, carbon, start=GAIA_START, slack_s=24 * 3600.0,
                                      interruptible=_interruptible(args) if args.interruptible else None)
            settings = SimSettings(plan_interval_s=args.plan_interval, wake_on_submit=args.wake,
                                   full_replan_s=args.full_replan, **_estimate_options(args))
            specs = [f"fifo:seed={s}" for s in range(args.fifo_seeds)] + ["edf"]
            specs += [f"greedy:lateness_g_per_gpu_h={p}" for p in prices]
            specs += [f"cpsat:max_time_s={args.cpsat_s}:lateness_g_per_gpu_h={p}" for p in prices]
            if args.policies:
                specs = args.policies.split(",")
            print(f"\n== {variant} lengths, load {load:g}: {len(trace.jobs)} jobs, {gpu_h:,.0f} GPU-h offered "
                  f"over {args.days:g} days on {capacity} GPUs ==", flush=True)
            result = _run(scenario, ",".join(specs), settings, args.forecast)
            rows = {}
            for name, s in result.summaries.items():
                rows[name] = {"kgco2": s["kgco2"], "mwh": s["energy_kwh"] / 1000.0,
                              "misses": s["deadline_misses"], "late_gpu_h": s["late_gpu_h"],
                              "lateness_h": s["lateness_s"] / 3600.0, "unfinished": s["unfinished"],
                              "planner_failures": s.get("planner_failures", 0),
                              "mean_wait_h": (s["mean_wait_s"] or 0) / 3600.0,
                              "interrupted_jobs": s.get("interrupted_jobs", 0)}
            fifo = [rows[n] for n in rows if n.startswith("fifo")]
            if fifo:
                rows["fifo (mean of seeds)"] = {
                    k: statistics.mean(r[k] for r in fifo) for k in fifo[0]} | {
                    "kgco2_sd": statistics.pstdev(r["kgco2"] for r in fifo),
                    "misses_sd": statistics.pstdev(r["misses"] for r in fifo)}
            print(f"{'policy':<46} {'kgCO2':>9} {'MWh':>7} {'misses':>7} {'GPU-h late':>11} {'unfin.':>6} "
                  f"{'fail':>4}")
            for name, r in rows.items():
                sd = f" +-{r['kgco2_sd']:.1f}" if "kgco2_sd" in r else ""
                print(f"{name:<46} {r['kgco2']:>9.1f} {r['mwh']:>7.2f} {r['misses']:>7.1f} {r['late_gpu_h']:>11.0f} "
                      f"{r['unfinished']:>6.0f} {r['planner_failures']:>4.0f}{sd}", flush=True)
            out["cells"].append({"variant": variant, "load": load, "jobs": len(trace.jobs), "gpu_h_offered": gpu_h,
                                 "rows": rows})
            if args.json:  # partial results survive a long run being stopped
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    return out


GB30 = ROOT / "tests" / "data" / "carbon" / "GB_2020-04-27_to_2020-06-21_30min_lwa.csv"
HALFHOUR_START = datetime(2020, 6, 8, tzinfo=timezone.utc)


def bench_halfhour(args) -> dict:
    """What hourly averaging costs: pai_1k on a never-full GB pool (16 x 8 H100) from
    2020-06-08 with 8 h of slack, on Let's Wait Awhile's 30-minute GB trace. Each forecast
    runs twice, once on the half-hours and once on their hourly means (`+hourly`); emissions
    are counted on the 30-minute truth in both."""
    from scheduler.simulate.cluster import load_cluster
    from scheduler.simulate.intensity import load_zone_files
    from scheduler.simulate.scenario import build_scenario
    from scheduler.simulate.settings import SimSettings
    from scheduler.simulate.traces import read_jobs

    import dataclasses

    cluster = load_cluster(ROOT / "examples" / "cluster-gb.toml")
    carbon = {"GB": load_zone_files("GB", [GB30])}
    trace = read_jobs(PAI_1K)
    if args.lengths != "pai":  # pai_1k's arrivals, every job of this length (short jobs)
        from scheduler.timeparse import parse_duration

        length = parse_duration(args.lengths)
        trace.jobs = [dataclasses.replace(j, est_runtime_s=length) for j in trace.jobs]
    scenario = build_scenario(cluster, trace, carbon, start=HALFHOUR_START, slack_s=args.slack_h * 3600.0)
    settings = SimSettings(plan_interval_s=args.plan_interval, wake_on_submit=args.wake, **_estimate_options(args))
    policies = args.policies or "fifo,greedy"
    out: dict = {"scenario": "halfhour", "cluster": "examples/cluster-gb.toml", "carbon": str(GB30.relative_to(ROOT)),
                 "jobs": str(PAI_1K.name), "lengths": args.lengths, "start": HALFHOUR_START.isoformat(), "slack_h": args.slack_h,
                 "plan_interval_s": args.plan_interval, "rows": []}
    print(f"{'forecast':<12} {'view':<8} {'policy':<8} {'kgCO2':>9} {'saving vs fifo':>15} {'misses':>7}")
    for fc in [f for f in args.forecast.split(",") if f]:
        by_view = {}
        for view, spec in (("30 min", fc), ("hourly", f"{fc}+hourly")):
            result = _run(scenario, policies, settings, spec)
            fifo = result.summaries.get("fifo", {}).get("kgco2")
            for name, summ in result.summaries.items():
                saving = 100.0 * (1 - summ["kgco2"] / fifo) if fifo else None
                row = {"forecast": fc, "view": view, "policy": name, "kgco2": summ["kgco2"],
                       "saving_pct": saving, "deadline_misses": summ["deadline_misses"]}
                out["rows"].append(row)
                by_view[(view, name)] = row
                print(f"{fc:<12} {view:<8} {name:<8} {summ['kgco2']:>9.2f} "
                      f"{'' if saving is None else f'{saving:.2f} %':>15} {summ['deadline_misses']:>7}", flush=True)
        for name in policies.split(","):
            a, b = by_view.get(("30 min", name)), by_view.get(("hourly", name))
            if a and b and name != "fifo" and a["saving_pct"] is not None:
                print(f"  {fc} {name}: hourly averaging cost {a['saving_pct'] - b['saving_pct']:.2f} points of "
                      f"saving ({b['kgco2'] - a['kgco2']:+.2f} kgCO2)")
    out["mae_30min"] = _halfhour_mae(carbon["GB"], [f for f in args.forecast.split(",") if f])
    return out


def _halfhour_mae(zone, forecasts: list[str]) -> dict:
    """Mean absolute error (g/kWh) against the half-hours of each forecast over the next 24 h
    (30 min to 24 h ahead), issued every 3 h from HALFHOUR_START to 2020-06-21, on the
    half-hours and on hourly means (`+hourly`)."""
    from scheduler.simulate.forecasts import parse_forecast

    t0 = HALFHOUR_START.timestamp()
    t1 = datetime(2020, 6, 21, tzinfo=timezone.utc).timestamp()
    out: dict = {}
    print("\nforecast error against the half-hours, 30 min to 24 h ahead (MAE, g/kWh):")
    for fc in forecasts:
        for spec in (fc, f"{fc}+hourly"):
            model = parse_forecast(spec, {"GB": zone})
            errors = []
            now = t0
            while now < t1:
                curve = model.curve("GB", now, 24 * 3600.0)
                start = curve.start.timestamp()
                for k in range(1, 48):
                    t = now + k * 1800.0
                    errors.append(abs(curve.values_g_per_kwh[int((t - start) // curve.step_s)] - zone.value_at(t)))
                now += 3 * 3600.0
            out[spec] = sum(errors) / len(errors)
            print(f"  {spec:<16} {out[spec]:7.2f}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=["gap", "gaia", "speed", "overload", "halfhour", "tenants", "_speed_child"])
    p.add_argument("--policies", help="policy specs (default per scenario)")
    p.add_argument("--cpsat-s", type=float, default=1.0, help="cpsat time budget per planner call (default 1)")
    p.add_argument("--forecast", default="perfect",
                   help="forecast model; gaia takes a list (perfect,model,...) and reports what each keeps "
                        "of the perfect-forecast reduction")
    p.add_argument("--truth", default="perfect", help="gap: how jobs really run (perfect, noisy:SIGMA, "
                                                        "profiles:FILE)")
    p.add_argument("--learn", action=argparse.BooleanOptionalAction, default=True,
                   help="gap: the planner learns from finished jobs (default on)")
    p.add_argument("--mix", help="gap: give the trace's jobs workload classes, e.g. llm-chat-8b=1.0")
    p.add_argument("--caps", action="store_true", help="gap: run the scenario without and with GPU power "
                   "limits chosen by the planner and compare energy, kgCO2 and deadline misses")
    p.add_argument("--min-cap-fraction", type=float, default=0.7, help="gap --caps: the lowest limit, a "
                   "fraction of the default (default 0.7)")
    p.add_argument("--estimate", default="exact", help="what the planner is told of job lengths: exact, "
                                                        "class-mean, lognormal:SIGMA, user:K (gap, gaia)")
    p.add_argument("--correct-estimates", action=argparse.BooleanOptionalAction, default=None,
                   help="learn and correct estimates per class (default: on unless --estimate exact)")
    p.add_argument("--estimate-margin", action=argparse.BooleanOptionalAction, default=True,
                   help="widen deadline margins by the learned estimate spread (default on)")
    p.add_argument("--price-length-spread", action=argparse.BooleanOptionalAction, default=True,
                   help="with the correction, price jobs at their expected grams over the learned spread of "
                        "their class's lengths (default on)")
    p.add_argument("--plan-interval", type=float, default=3600.0, help="planner tick in seconds (default 3600)")
    p.add_argument("--wake", action=argparse.BooleanOptionalAction, default=None,
                   help="also plan at every submit, as the daemon does (default: on for overload, off for the "
                        "other scenarios, whose recorded figures were measured with ticks alone)")
    p.add_argument("--full-replan", type=float, default=None, metavar="S",
                   help="incremental planning: keep earlier plans between full re-plans S seconds apart "
                        "(default: every tick re-plans every queued job)")
    p.add_argument("--days", type=float, default=0, help="speed: only the first N days of pai-100k (0 = all); "
                   "overload: the span the arrivals are compressed into (default 3)")
    p.add_argument("--timeout", type=float, default=3600, help="speed: per-policy limit, seconds")
    p.add_argument("--loads", default="0.6,0.9,1.2", help="overload, tenants: offered loads, share of the GPU-hours (tenants: default 0.9,1.2)")
    p.add_argument("--variants", default="gaia,long", help="overload: job lengths, gaia (pai's own) and/or long "
                   f"({LONG_SHARE * 100:.0f}%% of the jobs run 1-7 days)")
    p.add_argument("--prices", default="strict,2000,500,100,20",
                   help="overload: lateness prices (g per GPU-hour late) for greedy and cpsat")
    p.add_argument("--fifo-seeds", type=int, default=3, help="overload: fifo runs (its tie-breaking seeds)")
    p.add_argument("--slack-h", type=float, default=8.0, help="halfhour: hours of slack per job (default 8)")
    p.add_argument("--lengths", default="pai", help="halfhour: pai (pai_1k's own lengths) or a duration that "
                                                    "every job runs (e.g. 30m)")
    p.add_argument("--interruptible", type=float, default=0.0, metavar="SHARE",
                   help="gap, gaia, overload: this share of the jobs may be cut into segments; "
                        "gaia then runs fifo,greedy at each of --resume-costs")
    p.add_argument("--interruptible-kind", choices=("checkpoint", "pause"), default="checkpoint")
    p.add_argument("--min-run", type=float, default=None, metavar="S", help="shortest segment, s (default one slot)")
    p.add_argument("--resume-cost", type=float, default=60.0, metavar="S",
                   help="gap, overload: running time lost per resume, s (default 60)")
    p.add_argument("--resume-costs", default="0,60,600", help="gaia --interruptible: resume costs, s (default 0,60,600)")
    p.add_argument("--gaia-deadline", choices=("slack", "none"), default="slack",
                   help="gaia: slack (deadline = arrival + runtime + 24 h besides the 24 h maximum wait, the "
                        "default) or none (the maximum wait only, GAIA's own constraint)")
    p.add_argument("--gaia-zones", default="DE,US-CAL-CISO", help="gaia: the zones (default both)")
    p.add_argument("--max-segments", type=int, default=4, help="at most this many segments a job (default 4)")
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args()
    if args.wake is None:
        # Under load a job that waits up to a tick before it is first planned has lost that
        # much of its slack to the simulator, not to the policy; the daemon plans at submit.
        args.wake = args.scenario in ("overload", "tenants")
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "WARNING"))
    if not DATA.exists():
        sys.exit(f"no shared data at {DATA} (set CARBONSCHED_SHARED_DATA)")
    if args.scenario == "_speed_child":
        speed_child(args)
        return
    if args.scenario in ("overload", "tenants") and not args.days:
        args.days = 3.0
    if args.scenario == "tenants":
        from bench.tenants_bench import bench_tenants

        if args.loads == "0.6,0.9,1.2":
            args.loads = "0.9,1.2"
        args.start = GAIA_START
        figures = bench_tenants(args, _overload_trace, _carbon, lambda sc, pol, st: _run(sc, pol, st, args.forecast),
                                ROOT)
    else:
        figures = {"gap": bench_gap, "gaia": bench_gaia, "speed": bench_speed,
                   "overload": bench_overload, "halfhour": bench_halfhour}[args.scenario](args)
    figures["machine"] = {"cpus": os.cpu_count(), **library_versions()}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
