"""Run the whole test suite several times under CPU load and list every test that failed at
least once, with its error: the tests that would cost a submission on CI's loaded 2 cores.

    .venv/bin/python scripts/flake_hunt.py [--runs 3] [--busy 2] [--workers 4] [-- PYTEST ARGS]
    make flake-hunt RUNS=3 BUSY=2

`--busy N` keeps N CPU busy loops running beside the suite (as other work on a shared
machine would); they stop when the hunt ends, also on Ctrl-C. Each run's pytest output and
JUnit XML stay in `--out` (default: a new directory under $TMPDIR, printed). Exit status 0
when every run passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class RunResult:
    number: int
    returncode: int
    wall_s: float
    counts: dict[str, int] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # test id -> first lines of its error
    leftovers: list[str] = field(default_factory=list)  # what the suite's end-of-run check found


def busy_loops(n: int) -> list[subprocess.Popen]:
    """N processes that each keep one CPU busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(n)]


def read_junit(path: Path) -> tuple[dict[str, int], dict[str, str]]:
    """(counts by outcome, failing test id -> its error's first lines) from a JUnit XML file."""
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    failures: dict[str, str] = {}
    if not path.exists():
        return counts, failures
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            counts["failed" if bad.tag == "failure" else "error"] += 1
            text = (bad.get("message") or "") + "\n" + (bad.text or "")
            lines = [ln for ln in text.strip().splitlines() if ln.strip()]
            failures[test_id] = "\n".join(lines[:1] + [ln for ln in lines if ln.startswith("E ")][:6])
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts, failures


def leftovers_in(output: str) -> list[str]:
    """The lines under the suite's "left things behind" banner (tests/suite_hygiene.py)."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if "the suite left things behind" in line:
            found = []
            for rest in lines[i + 1:]:
                if rest.startswith("=") or not rest.strip():
                    break
                found.append(rest)
            return found
    return []


def run_suite(number: int, out: Path, workers: str, pytest_args: list[str]) -> RunResult:
    junit = out / f"run-{number}.xml"
    log_path = out / f"run-{number}.log"
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", workers, "--dist", "worksteal", "-p", "no:cacheprovider",
           f"--junitxml={junit}", *pytest_args]
    started = time.monotonic()
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    wall_s = time.monotonic() - started
    counts, failures = read_junit(junit)
    result = RunResult(number, rc, wall_s, counts, failures, leftovers_in(log_path.read_text(errors="replace")))
    if rc != 0 and not failures and not result.leftovers:
        result.failures["(pytest)"] = f"exit status {rc} with no failing test: see {log_path}"
    return result


def report(results: list[RunResult], busy: int) -> bool:
    """Print the per-run lines and every test that failed at least once; True when all passed."""
    print(f"\n{len(results)} run(s) with {busy} busy loop(s) beside the suite:")
    for r in results:
        c = r.counts
        print(f"  run {r.number}: exit {r.returncode}, {r.wall_s:.0f} s, {c.get('passed', 0)} passed, "
              f"{c.get('failed', 0)} failed, {c.get('error', 0)} errors, {c.get('skipped', 0)} skipped"
              + (f", {len(r.leftovers)} thing(s) left behind" if r.leftovers else ""))
    failed: dict[str, list[int]] = defaultdict(list)
    errors: dict[str, str] = {}
    for r in results:
        for test_id, error in r.failures.items():
            failed[test_id].append(r.number)
            errors.setdefault(test_id, error)
    for test_id in sorted(failed, key=lambda t: (-len(failed[t]), t)):
        runs = failed[test_id]
        print(f"\nFAILED in {len(runs)} of {len(results)} run(s) ({', '.join(map(str, runs))}): {test_id}")
        for line in errors[test_id].splitlines():
            print(f"    {line}")
    for r in results:
        for line in r.leftovers:
            print(f"\nLEFT BEHIND by run {r.number}: {line}")
    clean = not failed and not any(r.leftovers for r in results) and all(r.returncode == 0 for r in results)
    print("\nno flaky test found" if clean else "")
    return clean


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="how many times to run the suite (default 3)")
    parser.add_argument("--busy", type=int, default=2, help="CPU busy loops beside it (default 2)")
    parser.add_argument("--workers", default=os.environ.get("TEST_WORKERS", "4"),
                        help="pytest-xdist workers, work-stealing as `make test` (default 4)")
    parser.add_argument("--out", type=Path, help="where each run's log and JUnit XML go")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.busy < 0:
        parser.error("--runs must be at least 1 and --busy at least 0")
    out = args.out or Path(tempfile.mkdtemp(prefix="carbonsched-flake-hunt-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"flake hunt: {args.runs} run(s), {args.busy} busy loop(s), logs in {out}", flush=True)
    loops = busy_loops(args.busy)
    results: list[RunResult] = []
    try:
        for number in range(1, args.runs + 1):
            print(f"run {number}/{args.runs} ...", end=" ", flush=True)
            r = run_suite(number, out, args.workers, args.pytest_args)
            results.append(r)
            print(f"{r.wall_s:.0f} s, exit {r.returncode}, {len(r.failures)} failing", flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted", flush=True)
    finally:
        for p in loops:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return 0 if results and report(results, args.busy) and len(results) == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
