"""Benchmark of the Slurm executor: a queue of jobs planned by carbonsched and
handed to a real Slurm (munged, slurmctld and `slurmd -N` nodes on loopback, started here
with tests/slurm_cluster.py; needs root and Debian's slurm-wlm and munge).

Measures, for --jobs queued jobs (default 1,000; `true`, 1 GPU, --est-runtime 2s):
- the planner's first tick over the whole queue, with Slurm agents and with local agents
  registered for the same GPUs (the planner is the same code; the executors differ only
  after the plan);
- from each job's planned start to Slurm's RUNNING (Slurm's start time, whole seconds),
  p50/p95/max;
- sbatch / scontrol / squeue / sinfo / scancel calls per job, and their mean wall time.

    .venv/bin/python bench/slurm_bench.py [--jobs 1000] [--nodes 2] [--gpus-per-node 16]
        [--est-runtime 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sqlalchemy import select  # noqa: E402

from policies.model.catalog import parse_fleet  # noqa: E402
from scheduler.daemon.planner import Planner  # noqa: E402
from scheduler.daemon.policy_factory import make_policy  # noqa: E402
from scheduler.daemon.access import Caller, ServiceConfig  # noqa: E402
from scheduler.daemon.service import JobService  # noqa: E402
from scheduler.jobs.store import count_by_state  # noqa: E402
from scheduler.clock import utcnow  # noqa: E402
from scheduler.node.agent import Agent  # noqa: E402
from scheduler.node.config import AgentConfig  # noqa: E402
from scheduler.node.main import AgentRunConfig, make_slurm_agent  # noqa: E402
from scheduler.slurm.commands import SlurmCommands  # noqa: E402
from scheduler.slurm.config import SlurmConfig  # noqa: E402
from scheduler.slurm.jobs import list_jobs  # noqa: E402
from scheduler.store import Store  # noqa: E402
from scheduler.store.models import jobs  # noqa: E402
from telemetry.gpu import EmulatedBackend, EmulatedModel  # noqa: E402
from tests.slurm_cluster import SlurmCluster, SlurmNode, missing_reason  # noqa: E402

ROOT = Caller(uid=0, gid=0)
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "LOST"}


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def fill(store: Store, root: Path, n: int, est_runtime_s: float) -> list[int]:
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=root / "logs")
    deadline = (utcnow() + timedelta(hours=2)).isoformat()
    return [service.submit(ROOT, {"argv": ["true"], "gpus": 1, "est_runtime_s": est_runtime_s,
                                  "deadline": deadline,
                                  "cwd": str(root)})["id"] for _ in range(n)]


def timed_tick(planner: Planner) -> float:
    t0 = time.perf_counter()
    planner.tick()
    return time.perf_counter() - t0


def local_planner_tick(root: Path, args) -> float:
    """The first planner tick over the same queue with local agents on the same GPUs."""
    store = Store(f"sqlite:///{root / 'local.db'}")
    store.upgrade()
    for i in range(args.nodes):
        models = [EmulatedModel(m.name, m.vendor, m.memory_gib, m.idle_w, m.tdp_w)
                  for m in parse_fleet(f"{args.gpus_per_node}xH100")]
        agent = Agent(store, EmulatedBackend(models, node=f"bn{i}"),
                      AgentConfig(node=f"bn{i}", zone="DE", state_dir=root / f"local-bn{i}"))
        agent.register()
    fill(store, root, args.jobs, args.est_runtime)
    tick = timed_tick(Planner(store, make_policy(args.policy)))
    store.dispose()
    return tick


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=16)
    ap.add_argument("--policy", default="greedy")
    ap.add_argument("--est-runtime", type=float, default=2.0,
                    help="each job's --est-runtime, s: the planner starts a GPU's next job this much later")
    ap.add_argument("--port", type=int, default=16917)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    problem = missing_reason()
    if problem:
        print(f"SKIP: {problem}")
        return 2
    root = Path(tempfile.mkdtemp(prefix="cs-slurm-bench-", dir="/tmp"))
    root.chmod(0o755)
    cluster = SlurmCluster(root / "slurm", [SlurmNode(f"bn{i}", "DE", [("h100", args.gpus_per_node)])
                                            for i in range(args.nodes)], ctld_port=args.port)
    cluster.start()
    try:
        store = Store(f"sqlite:///{root / 'slurm.db'}")
        store.upgrade()
        config = SlurmConfig(conf=cluster.conf)
        agents = []
        for i in range(args.nodes):
            agent = make_slurm_agent(store, AgentRunConfig(db_url="", state_dir=root / f"bn{i}", node=f"bn{i}",
                                                           zone="DE", sample_hz=1.0), config)
            agent.register()
            agent.startup_reconcile()
            agents.append(agent)
        local_tick_s = local_planner_tick(root, args)  # first: the imports' cost is not Slurm's
        ids = fill(store, root, args.jobs, args.est_runtime)
        planner = Planner(store, make_policy(args.policy))
        first_tick_s = timed_tick(planner)
        t0 = time.monotonic()
        next_plan = t0 + 1.0
        ticks: list[float] = []
        while time.monotonic() - t0 < args.timeout:
            for a in agents:
                a.tick()
            if time.monotonic() >= next_plan:
                ticks.append(timed_tick(planner))
                next_plan = time.monotonic() + 1.0
            with store.read() as conn:
                states = count_by_state(conn)
            if sum(states.get(s, 0) for s in TERMINAL) == len(ids):
                break
            time.sleep(0.2)
        wall_s = time.monotonic() - t0
        with store.read() as conn:
            rows = {r.id: r for r in conn.execute(select(jobs.c.id, jobs.c.state, jobs.c.planned_start))}
        slurm = {j.carbonsched_id: j for j in list_jobs(SlurmCommands(cluster.conf)) if j.carbonsched_id}
        delays = [slurm[i].start_time.timestamp() - rows[i].planned_start.timestamp()
                  for i in ids if i in slurm and slurm[i].start_time and rows[i].planned_start]
        calls: Counter[str] = Counter()
        seconds: Counter[str] = Counter()
        for a in agents:
            calls.update(a.launcher.slurm.calls)
            seconds.update(a.launcher.slurm.seconds)
        result = {
            "jobs": len(ids), "nodes": args.nodes, "gpus": args.nodes * args.gpus_per_node,
            "policy": args.policy, "states": dict(Counter(r.state for r in rows.values())),
            "slurm_jobs": len(slurm), "wall_s": round(wall_s, 1),
            "planner_first_tick_s": {"slurm": round(first_tick_s, 3), "local": round(local_tick_s, 3)},
            "planner_tick_s_during_run": {"p50": round(statistics.median(ticks), 3) if ticks else None,
                                          "max": round(max(ticks), 3) if ticks else None},
            # Slurm's start times are whole seconds: each figure is within 1 s.
            "planned_start_to_running_s": {"p50": round(percentile(delays, 50), 2),
                                           "p95": round(percentile(delays, 95), 2),
                                           "max": round(max(delays), 2), "n": len(delays)} if delays else None,
            "est_runtime_s": args.est_runtime,
            "calls_per_job": {k: round(v / len(ids), 2) for k, v in sorted(calls.items())},
            "mean_call_s": {k: round(seconds[k] / v, 3) for k, v in sorted(calls.items())},
            "load_average_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
        }
        print(json.dumps(result, indent=2))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        for a in agents:
            a.stop()
        store.dispose()
        return 0
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
