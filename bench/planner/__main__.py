"""`python -m bench.planner`: the planner benchmark (see bench/README.md, "bench/planner").

Exit status: 0 every target met, 2 some target missed, 1 the benchmark itself failed,
130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.planner.instance import DEFAULT_ZONES, SHARED_CARBON_DIR, InstanceSpec, parse_size  # noqa: E402
from bench.planner.run import DEFAULT_RUNS, RunSetting, bench_size, judge, to_json  # noqa: E402
from bench.versions import library_versions  # noqa: E402

DEFAULT_SIZES = "200x64,1000x256,2000x512,5000x1024"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.planner", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"JOBSxGPUS,... (default {DEFAULT_SIZES})")
    p.add_argument("--seed", type=int, default=1, help="instance seed (default 1)")
    p.add_argument("--start", help="now of the instances, ISO date or time in 2022 (default: a seeded midnight)")
    p.add_argument("--zones", default=",".join(DEFAULT_ZONES), help="carbon zone directories (default %(default)s)")
    p.add_argument("--carbon-dir", type=Path, default=SHARED_CARBON_DIR, help="Electricity Maps exports")
    p.add_argument("--policies", default=",".join(r.label for r in DEFAULT_RUNS),
                   help="run labels among %(default)s")
    p.add_argument("--cpsat-workers", type=int, default=None, help="CP-SAT workers (default: the policy's)")
    p.add_argument("--lp-time", type=float, default=300.0, help="LP time limit per size, s (default 300)")
    p.add_argument("--lp-merge", choices=("auto", "yes", "no"), default="auto",
                   help="merge pools per (zone, model) in the LP (auto: above 1,000 jobs)")
    p.add_argument("--lp-block", type=int, default=None,
                   help="sum LP capacity rows over this many slots (default: 1, 4 from 5,000 jobs)")
    p.add_argument("--mip-time", type=float, default=0.0, metavar="S",
                   help="also solve the integer time-indexed model with SCIP for S seconds at sizes of at most "
                        "200 jobs and print its proven bound (default 0: off)")
    p.add_argument("--replan", type=int, default=0, metavar="N", help="also simulate N re-planning ticks")
    p.add_argument("--replan-sizes", default="200x64,1000x256", help="sizes for --replan (default %(default)s)")
    p.add_argument("--replan-time", type=float, default=10.0, help="cpsat max_time_s per re-plan tick")
    p.add_argument("--replan-cold", action="store_true",
                   help="re-plan each tick from scratch (default: from the last tick's plan, as the daemon does)")
    p.add_argument("--climatology", action="store_true",
                   help="curves as the daemon builds them: the horizon + 24 h of forecast, then each zone's "
                        "climatology (typical month x hour values from the year's hours before now)")
    p.add_argument("--interruptible", type=float, default=0.0, metavar="SHARE",
                   help="make this share of the jobs checkpoint jobs, planned in segments (default 0)")
    p.add_argument("--json", type=Path, help="write every figure to this file")
    p.add_argument("--plot", type=Path, help="write a PNG of gCO2 by policy and size")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
        replan_sizes = [parse_size(s) for s in args.replan_sizes.split(",") if s.strip()] if args.replan else []
        start = None
        if args.start:
            start = datetime.fromisoformat(args.start)
            start = (start if start.tzinfo else start.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
        labels = [x.strip() for x in args.policies.split(",") if x.strip()]
        known = {r.label: r for r in DEFAULT_RUNS}
        unknown = [x for x in labels if x not in known]
        if unknown:
            raise ValueError(f"unknown run labels {unknown}; known: {', '.join(known)}")
        runs = []
        for x in labels:
            r = known[x]
            if r.policy == "cpsat" and args.cpsat_workers:
                r = RunSetting(r.label, r.policy, {**r.params, "workers": args.cpsat_workers})
            runs.append(r)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    zones = tuple(z.strip() for z in args.zones.split(",") if z.strip())
    load = os.getloadavg()
    progress(f"host: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
             + ("  (busy host: figures will be noisy)" if load[0] > (os.cpu_count() or 1) * 0.5 else ""))
    from bench.planner import report

    results = []
    replans: dict[str, list[dict]] = {}
    t0 = time.perf_counter()
    try:
        for jobs, gpus in sizes:
            spec = InstanceSpec(jobs=jobs, gpus=gpus, seed=args.seed, zones=zones, start=start,
                                carbon_dir=args.carbon_dir, climatology=args.climatology,
                                interruptible=args.interruptible)
            s = bench_size(spec, tuple(runs), lp_time_s=args.lp_time, lp_merge=args.lp_merge,
                           lp_block=args.lp_block, mip_time_s=args.mip_time, progress=progress)
            results.append(s)
            print(report.size_table(s), flush=True)
            print(flush=True)
        for jobs, gpus in replan_sizes:
            from bench.planner.replan import replan_ticks

            spec = InstanceSpec(jobs=jobs, gpus=gpus, seed=args.seed, zones=zones, start=start,
                                carbon_dir=args.carbon_dir)
            params = {"max_time_s": args.replan_time}
            if args.cpsat_workers:
                params["workers"] = args.cpsat_workers
            rows = replan_ticks(spec, args.replan, policy="cpsat", params=params, warm=not args.replan_cold,
                                progress=progress)
            replans[spec.label] = rows
            same = next((s for s in results if s.label == spec.label), None)
            greedy = same.run("greedy") if same else None
            bounds = {b: v["bound_g"] for b, v in same.lp.get("by_late_budget", {}).items()} if same else {}
            print(report.replan_table(spec.label, rows, bounds, same.forced_misses if same else 0,
                                      greedy.gco2 if greedy else None), flush=True)
            print(flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    targets = judge(results)
    print(report.targets_table(targets), flush=True)
    if args.plot and results:
        report.plot(results, args.plot)
        progress(f"plot written to {args.plot}")
    if args.json:
        meta = {"argv": sys.argv[1:], "host": platform.node(), "cpus": os.cpu_count(), "load_average": load,
                **library_versions(), "seed": args.seed, "wall_s": time.perf_counter() - t0,
                "started": datetime.now(timezone.utc).isoformat()}
        doc = to_json(results, targets, meta)
        doc["replan"] = replans
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, default=str))
        progress(f"figures written to {args.json}")
    return 0 if all(t.passed for t in targets) else 2


if __name__ == "__main__":
    sys.exit(main())
