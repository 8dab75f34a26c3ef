"""The multi-tenant scenario of `bench/simulate_bench.py tenants`: the overload family's
4-zone cluster at load 0.9 and 1.2 (pai-100k's jobs compressed into a few days, 24 h of
slack), shared by four accounts of equal shares where one submits 70 % of the jobs, and
30 % of all jobs `urgent`; each policy run with fair share on and off, on the same jobs.

Figures per run: kgCO2, deadline misses, each account's delivered GPU-hours against its
fair-share target over the busy period (the first arrival to the last; the target is split
by shares, none above what an account asked for), the `urgent` jobs' p95 wait against one
planning tick, Jain's index over accounts, and the price of fairness (kgCO2 with fair share
on against off, same policy and jobs).
"""

from __future__ import annotations

import random
from dataclasses import replace

HEAVY = "heavy"
LIGHT = ("light-a", "light-b", "light-c")
HEAVY_SHARE = 0.7  # of the jobs
URGENT_SHARE = 0.3  # of the jobs, whichever account
TARGET_BAND = 0.10  # delivered within +-10 % of the fair-share target


def give_tenants(trace, seed: int = 11):
    """The trace's jobs with an account (70 % `heavy`, the rest split evenly over three light
    accounts) and a QOS (30 % `urgent`, else `normal`), drawn from their own seeded streams."""
    accounts, qos = random.Random(f"account:{seed}"), random.Random(f"qos:{seed}")
    jobs = []
    for j in trace.jobs:
        account = HEAVY if accounts.random() < HEAVY_SHARE else LIGHT[accounts.randrange(len(LIGHT))]
        level = "urgent" if qos.random() < URGENT_SHARE else "normal"
        jobs.append(replace(j, account=account, user=account, qos=level))
    return replace(trace, jobs=jobs)


def judge(summary: dict, plan_interval_s: float) -> dict:
    """What the run is judged by: the worst account's delivered / target ratio, whether every
    account is within the band, the urgent jobs' p95 wait in ticks, Jain's index."""
    ratios = {a: v["share_delivered"] / v["share_target"] for a, v in summary["accounts"].items()
              if v["share_target"]}
    urgent = summary["qos"].get("urgent", {})
    p95 = urgent.get("wait_p95_s")
    return {"ratios": ratios, "within_band": all(abs(r - 1.0) <= TARGET_BAND for r in ratios.values()),
            "urgent_p95_wait_s": p95, "urgent_p95_ticks": None if p95 is None else p95 / plan_interval_s,
            "jain": summary["fairness"]["jain"]}


def bench_tenants(args, overload_trace, carbon_of, run, root) -> dict:
    """Run every policy with fair share on and off at each load; print and return the figures."""
    from scheduler.simulate.cluster import load_cluster
    from scheduler.simulate.scenario import build_scenario
    from scheduler.simulate.settings import SimSettings

    cluster = load_cluster(root / "examples" / "cluster-4zone.toml")
    capacity = sum(cluster.gpus_by_model().values())
    carbon = carbon_of(cluster.zones)
    loads = [float(x) for x in args.loads.split(",")]
    policies = args.policies or f"fifo,edf,greedy,cpsat:max_time_s={args.cpsat_s}"
    out: dict = {"scenario": "tenants", "cluster": "examples/cluster-4zone.toml", "days": args.days,
                 "plan_interval_s": args.plan_interval, "heavy_share": HEAVY_SHARE, "urgent_share": URGENT_SHARE,
                 "cells": []}
    for load in loads:
        trace, gpu_h = overload_trace(load, args.days, 0.0, 7, capacity, cluster.max_gpus_per_node())
        trace = give_tenants(trace)
        scenario = build_scenario(cluster, trace, carbon, start=args.start, slack_s=24 * 3600.0)
        print(f"\n== load {load:g}: {len(trace.jobs)} jobs, {gpu_h:,.0f} GPU-h offered over {args.days:g} days "
              f"on {capacity} GPUs; accounts {scenario.shares} ==", flush=True)
        cell = {"load": load, "jobs": len(trace.jobs), "gpu_h_offered": gpu_h, "rows": {}}
        for fair in (True, False):
            settings = SimSettings(plan_interval_s=args.plan_interval, wake_on_submit=args.wake, fair_share=fair)
            result = run(scenario, policies, settings)
            for name, s in result.summaries.items():
                row = {"kgco2": s["kgco2"], "misses": s["deadline_misses"], "unfinished": s["unfinished"],
                       "accounts": s["accounts"], "qos": s["qos"], **judge(s, args.plan_interval)}
                cell["rows"][f"{name} fair-share {'on' if fair else 'off'}"] = row
        _print_cell(cell, policies.split(","))
        out["cells"].append(cell)
    return out


def _print_cell(cell: dict, policies: list[str]) -> None:
    rows = cell["rows"]
    print(f"{'policy':<34} {'kgCO2':>9} {'misses':>6} {'worst acct':>10} {'band':>5} {'urgent p95':>10} "
          f"{'jain':>6}")
    for name, r in rows.items():
        worst = max(r["ratios"].values(), key=lambda x: abs(x - 1.0)) if r["ratios"] else None
        p95, jain = r["urgent_p95_wait_s"], r["jain"]
        worst_text = "-" if worst is None else f"{worst:.3f}"
        p95_text = "-" if p95 is None else f"{p95 / 60:.1f} min"
        jain_text = "-" if jain is None else f"{jain:.3f}"
        band = "yes" if r["within_band"] else "NO"
        print(f"{name:<34} {r['kgco2']:>9.1f} {r['misses']:>6.0f} {worst_text:>10} {band:>5} {p95_text:>10} "
              f"{jain_text:>6}")
    for p in policies:
        on, off = rows.get(f"{p} fair-share on"), rows.get(f"{p} fair-share off")
        if on and off and off["kgco2"]:
            print(f"price of fairness, {p}: {on['kgco2'] - off['kgco2']:+.1f} kgCO2 "
                  f"({(on['kgco2'] / off['kgco2'] - 1) * 100:+.2f} %)")
