"""The headline figures, guarded: re-run each figure the project stands on in its
smallest faithful form, compare it with `bench/figures_expected.toml` and exit non-zero on a
regression.

    .venv/bin/python bench/figures.py                  # all figures (`make figures`)
    .venv/bin/python bench/figures.py --only 'gaia.DE.*' --jobs 1 --json out.json
    .venv/bin/python bench/figures.py --list           # the figures and their commands

Each figure is one documented benchmark command (bench/simulate_bench.py or bench.planner,
with `--json` added), run exactly as written in a child process; figures with the same command
share one run. The expected table holds, per figure: the expected value, a tolerance and how it
is applied (`band`: |measured - expected| <= tolerance; `max`: measured <= expected +
tolerance; `min`: measured >= expected - tolerance), optionally the most deadline misses
allowed, the unit, the command (checked against this file's) and where it was measured.

Timings (`alone = true` in the table) run first, one at a time, before the other runs start;
the rest run `--jobs` at a time (default 2: the budget is about 10 minutes on 2 cores).

Exit status: 0 every figure within its tolerance, 1 a regression (or a run that failed),
2 no shared data (../shared/data or CARBONSCHED_SHARED_DATA).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = ROOT / "bench" / "figures_expected.toml"
DATA = Path(os.environ.get("CARBONSCHED_SHARED_DATA", ROOT.parent / "shared" / "data"))
# what the figures read from the shared data (simulate_bench and bench.planner read more of
# the same folders)
NEEDED = ("jobs/pai_1k.csv", "carbon/electricitymaps/DE-LU/DE-LU_2022_hourly.csv",
          "carbon/electricitymaps/US-CAL-CISO/US-CAL-CISO_2022_hourly.csv",
          "carbon/electricitymaps/GB/GB_2022_hourly.csv", "carbon/electricitymaps/SG/SG_2022_hourly.csv",
          "carbon/electricitymaps/JP-TK/JP-TK_2022_hourly.csv")
CHECKS = ("band", "max", "min")
PY = ".venv/bin/python"  # how commands are shown; they run with this interpreter


# ---- what each figure is -------------------------------------------------------------------

@dataclass(frozen=True)
class Figure:
    """One guarded figure: the benchmark command that measures it (argv after the
    interpreter, without `--json`) and how to read its value and deadline misses from that
    command's JSON."""

    name: str
    argv: tuple[str, ...]
    value: Callable[[dict], float]
    misses: Callable[[dict], int] | None = None
    est_s: float = 60.0  # rough run time on the 2-core host, to start the longest runs first

    @property
    def command(self) -> str:
        return f"{PY} {shlex.join(self.argv)}"


def _sim(*args: str) -> tuple[str, ...]:
    return ("bench/simulate_bench.py", *args)


def _planner(*args: str) -> tuple[str, ...]:
    return ("-m", "bench.planner", *args)


def _gaia_reduction(zone: str) -> Callable[[dict], float]:
    return lambda doc: doc["zones"][zone]["reduction_pct"]["greedy"]


def _gaia_misses(zone: str) -> Callable[[dict], int]:
    return lambda doc: doc["zones"][zone]["summaries"]["greedy"]["deadline_misses"]


def _planner_run(doc: dict, label: str) -> dict:
    return next(r for r in doc["sizes"][0]["runs"] if r["label"] == label)


def _overload_greedy(doc: dict) -> dict:
    return doc["cells"][0]["rows"]["greedy"]


def figures() -> list[Figure]:
    out: list[Figure] = []
    # GAIA's setting (pai_1k, one never-full H100 pool, 2022 carbon, 24 h maximum wait): greedy's
    # reduction vs run-at-arrival (fifo), exact and class-mean lengths, the wait only
    # (`--gaia-deadline none`) and with the slack deadline (the default). The estimate margin
    # matters only with an estimate and a deadline: those cells run the README's headline
    # setting (`--no-estimate-margin`), and DE also the default (margin on).
    for zone in ("DE", "US-CAL-CISO"):
        for est in ("exact", "class-mean"):
            for deadline in ("wait", "slack"):
                argv = ["gaia", "--gaia-zones", zone, "--policies", "fifo,greedy"]
                if est != "exact":
                    argv += ["--estimate", est]
                if deadline == "wait":
                    argv += ["--gaia-deadline", "none"]
                variants = [("", ["--no-estimate-margin"])] if est != "exact" and deadline == "slack" else [("", [])]
                if est != "exact" and deadline == "slack" and zone == "DE":
                    variants.append((".margin", []))
                for suffix, extra in variants:
                    out.append(Figure(f"gaia.{zone}.{est}.{deadline}{suffix}", _sim(*argv, *extra),
                                      _gaia_reduction(zone), _gaia_misses(zone),
                                      est_s=160.0 if zone == "US-CAL-CISO" and est != "exact" else 120.0))
    # the gap scenario (pai_1k on the 4-zone, 64-GPU cluster, 24 h slack): greedy vs fifo, both
    # deterministic (cpsat and the oracle search against the clock: load-dependent)
    out.append(Figure("gap.greedy_vs_fifo", _sim("gap", "--policies", "fifo,greedy"),
                      lambda d: d["comparison"]["greedy"]["vs_first_pct"],
                      lambda d: d["summaries"]["greedy"]["deadline_misses"], est_s=30.0))
    # one overload cell: pai's own lengths at 90 % of the 4-zone cluster's GPU-hours, greedy
    out.append(Figure("overload.gaia.0.9.greedy_kg",
                      _sim("overload", "--variants", "gaia", "--loads", "0.9", "--policies", "greedy"),
                      lambda d: _overload_greedy(d)["kgco2"], lambda d: int(_overload_greedy(d)["misses"]),
                      est_s=90.0))
    # the planner bench: greedy's gap to the LP bound at 200x64 (the LP converges in seconds)
    out.append(Figure("planner.200x64.greedy_gap_to_lp", _planner("--sizes", "200x64", "--policies", "greedy"),
                      lambda d: _planner_run(d, "greedy")["gap_to_lp_pct"],
                      lambda d: _planner_run(d, "greedy")["unforced_misses"], est_s=30.0))
    # greedy at 5,000 jobs: its plan (deterministic) and its time (the README's timing command)
    timing = _planner("--sizes", "5000x1024", "--policies", "greedy", "--lp-time", "1")
    out.append(Figure("planner.5000x1024.greedy_t", timing, lambda d: _planner_run(d, "greedy")["gco2"] / 1e6,
                      lambda d: _planner_run(d, "greedy")["deadline_misses"], est_s=30.0))
    out.append(Figure("planner.5000x1024.greedy_wall_s", timing, lambda d: _planner_run(d, "greedy")["wall_s"],
                      est_s=30.0))
    out.append(Figure("planner.5000x1024.greedy_cpu_s", timing, lambda d: _planner_run(d, "greedy")["cpu_s"],
                      est_s=30.0))
    return out


# ---- the expected table and the comparison --------------------------------------------------

@dataclass(frozen=True)
class Expected:
    expected: float
    tolerance: float
    check: str = "band"
    unit: str = ""
    max_deadline_misses: int | None = None
    alone: bool = False
    command: str = ""
    measured: str = ""
    source: str = ""

    def limits(self) -> tuple[float, float]:
        lo = self.expected - self.tolerance if self.check in ("band", "min") else -math.inf
        hi = self.expected + self.tolerance if self.check in ("band", "max") else math.inf
        return lo, hi

    def describe(self) -> str:
        """The tolerance as the table shows it: +-0.05, <= 10, >= 12.6."""
        if self.check == "band":
            return f"+-{self.tolerance:g}"
        if self.check == "max":
            return f"<= {self.expected + self.tolerance:g}"
        return f">= {self.expected - self.tolerance:g}"


def load_expected(path: Path = EXPECTED) -> dict[str, Expected]:
    """The committed table: `[figure."NAME"]` tables with expected, tolerance, check, unit,
    max_deadline_misses, alone, command, measured and source. ValueError on a bad entry."""
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    out: dict[str, Expected] = {}
    for name, row in doc.get("figure", {}).items():
        unknown = set(row) - set(Expected.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{path.name}: {name}: unknown keys {sorted(unknown)}")
        try:
            e = Expected(**row)
        except TypeError as err:
            raise ValueError(f"{path.name}: {name}: {err}") from err
        if e.check not in CHECKS:
            raise ValueError(f"{path.name}: {name}: check {e.check!r} is not one of {CHECKS}")
        if not (isinstance(e.expected, (int, float)) and isinstance(e.tolerance, (int, float))) or e.tolerance < 0:
            raise ValueError(f"{path.name}: {name}: expected and tolerance (>= 0) must be numbers")
        out[name] = e
    return out


def judge(measured: float | None, misses: int | None, exp: Expected) -> tuple[bool, str]:
    """(passed, why not) for one measured value against its expectation."""
    if measured is None or not math.isfinite(measured):
        return False, "no value"
    lo, hi = exp.limits()
    if not lo <= measured <= hi:
        side = "below" if measured < lo else "above"
        return False, f"{side} {lo if measured < lo else hi:g}"
    if exp.max_deadline_misses is not None and misses is not None and misses > exp.max_deadline_misses:
        return False, f"{misses} deadline misses (at most {exp.max_deadline_misses})"
    return True, ""


# ---- running ---------------------------------------------------------------------------------

@dataclass
class RunOutcome:
    argv: tuple[str, ...]
    doc: dict | None = None
    wall_s: float = 0.0
    error: str | None = None
    figures: list[str] = field(default_factory=list)


def run_command(argv: tuple[str, ...], timeout_s: float) -> RunOutcome:
    """Run one benchmark command with `--json` into a temporary file; its figures back."""
    out = RunOutcome(argv)
    with tempfile.TemporaryDirectory(prefix="carbonsched-figures-") as tmp:
        path = Path(tmp) / "figures.json"
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, *argv, "--json", str(path)], cwd=ROOT, capture_output=True,
                                  text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            out.wall_s = time.perf_counter() - t0
            out.error = f"timed out after {timeout_s:g} s"
            return out
        out.wall_s = time.perf_counter() - t0
        # bench.planner exits 2 when an issue-5 target is missed; its figures are still written
        if proc.returncode not in (0, 2) or not path.exists():
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            out.error = f"exit {proc.returncode}: {tail}"
            return out
        out.doc = json.loads(path.read_text())
    return out


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4f}" if abs(x) < 10 else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", metavar="NAME",
                   help="run only this figure (a glob, e.g. 'gaia.DE.*'; may be repeated)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="runs at a time, besides the timings, which run alone first (default 2)")
    p.add_argument("--timeout", type=float, default=1200.0, help="per run, seconds (default 1200)")
    p.add_argument("--expected", type=Path, default=EXPECTED, help="the expected table (default %(default)s)")
    p.add_argument("--json", type=Path, help="write every figure and run to this file")
    p.add_argument("--list", action="store_true", help="list the figures and their commands, run nothing")
    args = p.parse_args(argv)

    expected = load_expected(args.expected)
    defs = {f.name: f for f in figures()}
    if set(defs) != set(expected):
        print(f"error: {args.expected.name} and bench/figures.py disagree on the figures: "
              f"only in the table {sorted(set(expected) - set(defs))}, "
              f"only in the code {sorted(set(defs) - set(expected))}", file=sys.stderr)
        return 1
    for name, f in defs.items():
        if expected[name].command != f.command:
            print(f"error: {name}: the table's command {expected[name].command!r} is not the one run, "
                  f"{f.command!r}", file=sys.stderr)
            return 1
    chosen = [n for n in defs if not args.only or any(fnmatch.fnmatchcase(n, pat) for pat in args.only)]
    if not chosen:
        print(f"error: no figure matches {args.only}; --list shows them", file=sys.stderr)
        return 1
    if args.list:
        for n in chosen:
            print(f"{n:<36} {defs[n].command}")
        return 0
    missing = [x for x in NEEDED if not (DATA / x).exists()]
    if missing:
        print(f"figures: no shared data at {DATA} ({missing[0]} missing; set CARBONSCHED_SHARED_DATA)",
              file=sys.stderr)
        return 2

    runs: dict[tuple[str, ...], RunOutcome] = {}
    for n in chosen:
        runs.setdefault(defs[n].argv, RunOutcome(defs[n].argv)).figures.append(n)
    alone = [a for a, r in runs.items() if any(expected[n].alone for n in r.figures)]
    rest = sorted((a for a in runs if a not in alone), key=lambda a: -max(defs[n].est_s for n in runs[a].figures))
    load0 = os.getloadavg()
    print(f"figures: {len(chosen)} figures from {len(runs)} runs, {max(1, min(args.jobs, len(rest)))} at a time; "
          f"{os.cpu_count()} CPUs, load average {load0[0]:.1f}", file=sys.stderr, flush=True)

    results: dict[str, dict] = {}
    done = 0

    def finish(a: tuple[str, ...], outcome: RunOutcome) -> None:
        nonlocal done
        outcome.figures = runs[a].figures
        runs[a] = outcome
        for n in outcome.figures:
            done += 1
            value = misses = None
            error = outcome.error
            if outcome.doc is not None:
                try:
                    value = float(defs[n].value(outcome.doc))
                    misses = defs[n].misses(outcome.doc) if defs[n].misses else None
                except (KeyError, StopIteration, TypeError, ValueError, IndexError) as e:
                    error = f"figure not in the run's JSON: {e!r}"
            ok, why = (False, error) if error else judge(value, misses, expected[n])
            results[n] = {"measured": value, "deadline_misses": misses, "passed": ok, "why": why,
                          "run_wall_s": outcome.wall_s}
            print(f"figures: [{done}/{len(chosen)}] {n}: {_fmt(value)} {expected[n].unit}"
                  + (f", {misses} misses" if misses is not None else "")
                  + f" ({'PASS' if ok else 'FAIL: ' + why}; run {outcome.wall_s:.0f} s)", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    for a in alone:
        finish(a, run_command(a, args.timeout))
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run_command, a, args.timeout): a for a in rest}
        for fut in as_completed(futures):
            finish(futures[fut], fut.result())
    wall_s = time.perf_counter() - t0

    print(f"{'figure':<36} {'expected':>10} {'tolerance':>10} {'measured':>10}  {'unit':<22} result")
    for n in chosen:
        e, r = expected[n], results[n]
        miss = f" ({r['deadline_misses']} misses)" if r["deadline_misses"] else ""
        print(f"{n:<36} {_fmt(e.expected):>10} {e.describe():>10} {_fmt(r['measured']):>10}  {e.unit:<22} "
              + ("PASS" if r["passed"] else f"FAIL ({r['why']})") + miss)
    failed = [n for n in chosen if not results[n]["passed"]]
    load1 = os.getloadavg()
    print(f"{len(chosen) - len(failed)} of {len(chosen)} figures within tolerance; {wall_s:.0f} s wall, "
          f"load average {load0[0]:.1f} -> {load1[0]:.1f}")
    if args.json:
        sys.path.insert(0, str(ROOT))
        from bench.versions import library_versions

        doc = {"wall_s": wall_s, "jobs": args.jobs, "cpus": os.cpu_count(), "load_average": [load0, load1],
               **library_versions(),
               "figures": {n: {**results[n], "expected": expected[n].expected, "tolerance": expected[n].tolerance,
                               "check": expected[n].check, "unit": expected[n].unit, "command": defs[n].command}
                           for n in chosen},
               "runs": [{"command": f"{PY} {shlex.join(a)}", "figures": r.figures, "wall_s": r.wall_s,
                         "error": r.error} for a, r in runs.items()]}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
