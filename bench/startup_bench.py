#!/usr/bin/env python3
"""Startup benchmark: how long `carbonsched profiles` takes, and how long the daemon takes
from its start until it is ready (systemd's READY=1, and the API socket answering).

    .venv/bin/python bench/startup_bench.py [--runs 5] [--baseline REV] [--emulate 2xH100]

Each run is a fresh process, as an operator meets it: `profiles` with no daemon to ask (its
learned figures are then "unavailable", which costs one failed connect), and `daemon
--emulate 2xH100` on a SQLite store in a temp dir (made by a warm-up start, then restarted
once per run, as a restart finds it), stopped with SIGTERM once it answers. The policy
tables' cache (`scheduler.policy_tables`) is warm, as on any host after the first start.
"First start" is the daemon on a new host: an empty state dir (no store) and an empty
policy tables cache, as a new operator's first `carbonsched daemon` meets it.

With `--baseline REV` the same runs are made against a git worktree of REV (a temp dir,
removed afterwards) in the same invocation, alternating with this tree's runs, so that on a
shared, noisy host both see the same load; the load average is printed beside the medians.
Targets (issue: interactive verbs on a quiet 2-core machine): `profiles` <= 1 s, daemon
ready <= 3 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
PROFILES_TARGET_S = 1.0
READY_TARGET_S = 3.0


def _env(tree: Path, work: Path) -> dict[str, str]:
    """The environment of a run of `tree`'s code: its own checkout first on the path (the venv
    has this tree installed editable), no config file, no daemon socket."""
    env = {**os.environ, "PYTHONPATH": str(tree), "CARBONSCHED_CONFIG": str(work / "none.toml"),
           "CARBONSCHED_SOCKET": str(work / "absent.sock"), "PYTHONUNBUFFERED": "1"}
    env.pop("NOTIFY_SOCKET", None)
    return env


def time_profiles(tree: Path, work: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `carbonsched profiles` (the summary of every
    preset), start to exit. CPU time is what a quiet machine's wall time comes near: it
    hardly moves with the host's load."""
    started = time.monotonic()
    proc = subprocess.Popen([str(PYTHON), "-m", "scheduler", "profiles"], cwd=tree, env=_env(tree, work),
                            stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"profiles exited with {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a running process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _health(sock: Path) -> bool:
    """Whether the daemon answers GET /v1/health on its socket (stdlib only: the bench's own
    imports must not weigh on the daemon being measured)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2.0)
            s.connect(str(sock))
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            head = s.recv(64)
    except OSError:
        return False
    return head.startswith(b"HTTP/1.1 200") or head.startswith(b"HTTP/1.0 200")


def time_daemon(tree: Path, work: Path, emulate: str, timeout_s: float = 120.0,
                cache: Path | None = None) -> tuple[float, float, float]:
    """(seconds to READY=1 on $NOTIFY_SOCKET, seconds to the first answered GET /v1/health,
    CPU seconds of the daemon's own process at READY=1: not its planner process's) of one
    daemon start on the store under `work` (with the policy tables' cache in `cache`: None,
    the user's); the daemon is stopped before returning."""
    state, sock = work / "state", work / "carbonsched.sock"
    notify_path = work / "notify.sock"
    notify_path.unlink(missing_ok=True)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.setblocking(False)
    env = {**_env(tree, work), "NOTIFY_SOCKET": str(notify_path),
           **({"CARBONSCHED_CACHE_DIR": str(cache)} if cache is not None else {})}
    cmd = [str(PYTHON), "-m", "scheduler", "daemon", "--state-dir", str(state), "--socket", str(sock),
           "--db", f"sqlite:///{state}/carbonsched.db", "--emulate", emulate]
    log = open(work / "daemon.log", "a")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    ready_s = answer_s = cpu_s = None
    try:
        while (ready_s is None or answer_s is None) and time.monotonic() - started < timeout_s:
            if proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {proc.returncode}; see {work / 'daemon.log'}")
            try:
                if b"READY=1" in notify.recv(4096) and ready_s is None:
                    ready_s = time.monotonic() - started
                    cpu_s = _cpu_s(proc.pid)
            except BlockingIOError:
                pass
            if answer_s is None and _health(sock):
                answer_s = time.monotonic() - started
            time.sleep(0.01)
        if ready_s is None or answer_s is None:
            raise TimeoutError(f"daemon not ready after {timeout_s}s; see {work / 'daemon.log'}")
        return ready_s, answer_s, cpu_s
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        notify.close()


def _worktree(rev: str, root: Path) -> Path:
    path = root / f"rev-{rev.replace('/', '_')}"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="timed runs of each measurement per tree (default 5)")
    ap.add_argument("--baseline", metavar="REV", help="also time REV (a git worktree), alternating with this tree")
    ap.add_argument("--emulate", default="2xH100", help="the daemon's emulated GPUs (default 2xH100)")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="cs-startup-bench-"))
    trees = {"this tree": REPO}
    try:
        if args.baseline:
            trees = {f"baseline {args.baseline}": _worktree(args.baseline, root), "this tree": REPO}
        works = {}
        for name, tree in trees.items():
            work = root / name.replace(" ", "-").replace("/", "_")
            work.mkdir()
            (work / "none.toml").write_text("")
            works[name] = work
            time_profiles(tree, work)  # warm-up: the policy tables' cache, the bytecode
            time_daemon(tree, work, args.emulate)  # warm-up: creates the store
        keys = ("profiles", "profiles_cpu", "ready", "answers", "ready_cpu", "first", "first_cpu")
        times: dict[str, dict[str, list[float]]] = {n: {k: [] for k in keys} for n in trees}
        loads = [os.getloadavg()[0]]
        for i in range(args.runs):
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            for name in order:
                wall, cpu = time_profiles(trees[name], works[name])
                times[name]["profiles"].append(wall)
                times[name]["profiles_cpu"].append(cpu)
            for name in order:
                ready, answers, cpu = time_daemon(trees[name], works[name], args.emulate)
                times[name]["ready"].append(ready)
                times[name]["answers"].append(answers)
                times[name]["ready_cpu"].append(cpu)
            for name in order:
                fresh = works[name] / f"first-{i}"
                fresh.mkdir()
                (fresh / "none.toml").write_text("")
                ready, _, cpu = time_daemon(trees[name], fresh, args.emulate, cache=fresh / "cache")
                times[name]["first"].append(ready)
                times[name]["first_cpu"].append(cpu)
                shutil.rmtree(fresh, ignore_errors=True)
            loads.append(os.getloadavg()[0])
        print(f"{args.runs} runs each, alternating; emulate {args.emulate}; 1-min load average "
              f"{min(loads):.2f}-{max(loads):.2f} during the runs ({os.cpu_count()} CPUs)")
        print(f"{'(medians, s)':<22} " + " ".join(f"{k:>12}" for k in keys))
        for name in trees:
            print(f"{name:<22} " + " ".join(f"{statistics.median(times[name][k]):>12.2f}" for k in keys))
        print("  profiles: wall of `carbonsched profiles`; ready/answers: a restart to READY=1 and to the "
              "socket answering; first: a first start to READY=1; *_cpu: CPU s of that process (the daemon's "
              "own, at READY=1)")
        for name in trees:
            print(f"  {name}, every run: " + "; ".join(f"{k} " + ", ".join(f"{x:.2f}" for x in v)
                                                  for k, v in times[name].items()))
        mine = times["this tree"]
        ok = (statistics.median(mine["profiles"]) <= PROFILES_TARGET_S
              and statistics.median(mine["ready"]) <= READY_TARGET_S)
        print(f"{'PASS' if ok else 'FAIL'}: targets profiles <= {PROFILES_TARGET_S:g} s, daemon ready <= "
              f"{READY_TARGET_S:g} s (this tree's medians; the targets are for a quiet 2-core machine)")
        return 0
    finally:
        for name, tree in trees.items():
            if tree != REPO:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
