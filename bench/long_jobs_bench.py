"""Long jobs by their whole run: days-long jobs with and without the zones'
climatology past the forecast. Reads ../shared/data (not shipped); see bench/README.md.

    .venv/bin/python bench/long_jobs_bench.py [--slack 30d] [--policies fifo,greedy,cpsat:max_time_s=0.5] [--json OUT]

The trace is synthetic and seeded (`--seed`): `--jobs` jobs (default 40) of 1, 2 or 4 GPUs
(2:2:1) running U(4, 16) days on an H100, arriving as a Poisson process with a mean gap of
20 h, deadline = arrival + runtime + `--slack`. The cluster is `examples/cluster-4zone.toml`
(64 GPUs in DE, GB, US-CAL-CISO, SG) with Electricity Maps 2021 and 2022 hourly data, from
2022-03-01, so the climatology has a full year of past hours to stand on; perfect forecasts
(the simulator's forecast covers the 48 h horizon plus up to 7 days). Each policy runs twice
on the same code: with the climatology (`SimSettings.climatology`, the default) and with the
forecast's last value repeated past its end (the planner without the climatology).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import sys
import tempfile
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = Path(os.environ.get("CARBONSCHED_SHARED_DATA", ROOT.parent / "shared" / "data"))
EM = DATA / "carbon" / "electricitymaps"
FOLDERS = {"DE": "DE-LU", "GB": "GB", "US-CAL-CISO": "US-CAL-CISO", "SG": "SG"}
START = datetime(2022, 3, 1, tzinfo=timezone.utc)
DAY_S = 86400.0


def write_trace(path: Path, n_jobs: int, seed: int) -> None:
    """The seeded synthetic trace of days-long jobs (see the module docstring)."""
    rng = random.Random(seed)
    t = 0.0
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submit_time", "gpus", "runtime_s", "name"])
        for i in range(n_jobs):
            t += rng.expovariate(1 / (20 * 3600))
            w.writerow([f"{t:.0f}", rng.choice([1, 1, 2, 2, 4]), f"{rng.uniform(4, 16) * DAY_S:.0f}", f"long{i}"])


def main(argv: list[str] | None = None) -> int:
    from scheduler.simulate.cluster import load_cluster
    from scheduler.simulate.intensity import load_zone_files
    from scheduler.simulate.report import table
    from scheduler.simulate.runner import parse_policies, run_policies
    from scheduler.simulate.scenario import build_scenario
    from scheduler.simulate.settings import SimSettings
    from scheduler.simulate.traces import read_jobs
    from scheduler.timeparse import parse_duration

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=40)
    p.add_argument("--seed", type=int, default=24)
    p.add_argument("--slack", default="30d", help="deadline = arrival + runtime + this (default 30d)")
    p.add_argument("--policies", default="fifo,greedy,cpsat:max_time_s=0.5")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    cluster = load_cluster(ROOT / "examples" / "cluster-4zone.toml")
    carbon = {z: load_zone_files(z, [EM / FOLDERS[z] / f"{FOLDERS[z]}_{y}_hourly.csv" for y in (2021, 2022)])
              for z in cluster.zones}
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "long-jobs.csv"
        write_trace(trace, args.jobs, args.seed)
        scenario = build_scenario(cluster, read_jobs(trace), carbon, start=START,
                                  slack_s=parse_duration(args.slack))
    out: dict = {"scenario": "long-jobs", "jobs": args.jobs, "seed": args.seed, "slack": args.slack,
                 "start": START.isoformat(), "runs": {}}
    base = SimSettings(plan_interval_s=3600.0)
    for label, settings in (("climatology", base), ("last value", replace(base, climatology=False))):
        result = run_policies(scenario, parse_policies(args.policies), forecast="perfect", settings=settings,
                              progress=sys.stderr.isatty())
        print(f"\n== past the forecast: {label} ==")
        print(table(result.summaries, result.comparison))
        out["runs"][label] = {name: {k: s[k] for k in ("kgco2", "energy_kwh", "deadline_misses", "mean_wait_s")}
                              for name, s in result.summaries.items()}
    print("\npolicy                  kgCO2 climatology   kgCO2 last value   change")
    for name, row in out["runs"]["climatology"].items():
        old = out["runs"]["last value"][name]["kgco2"]
        print(f"{name:<24}{row['kgco2']:>17.1f}{old:>19.1f}{(row['kgco2'] / old - 1) * 100:>+8.1f} %")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
