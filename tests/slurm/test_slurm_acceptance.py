"""Acceptance of the Slurm executor (issue 20) against a real slurmctld/slurmd/munged:
the head daemon, and one `carbonsched agent --executor slurm` per Slurm node (sn-de in zone
DE: 2 H100 + 2 MI300X; sn-fr in zone FR: 2 H100), all as processes, on PostgreSQL.

50 jobs with deadlines under synthetic carbon curves (DE dirty, FR clean): 40 submitted
with `carbonsched submit`, 10 with plain `sbatch --hold` into the carbon partition and
adopted; one cancelled from each side; every carbonsched process killed -9 twice mid-flow.
Then: every job ran where and when carbonsched planned it (within a Slurm scheduling cycle),
reached the right end state, is exactly one Slurm job, and has a receipt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from sqlalchemy import select

from daemon_harness import REPO, DaemonProcess, database_for, world_dir
from scheduler.accounting.accountant import Accountant
from scheduler.carbon import CarbonSignals
from scheduler.clock import utcnow
from scheduler.slurm.commands import SlurmCommands
from scheduler.slurm.jobs import list_jobs
from scheduler.store import Store
from scheduler.store.models import gpus, job_events, jobs, nodes

pytestmark = pytest.mark.slow

NODES = ("sn-de", "sn-fr")
# A Slurm scheduling cycle here (sched_interval=1) plus the agent's dispatch tick and a
# loaded 2-core machine's slack.
CYCLE_S = 3.0
# Receipts of runs in the current hour, whose actual intensity is not published yet, are
# priced at the zones' yearly means until it is.
CARBON_STATIC = "[carbon.static]\nDE = 420\nFR = 70\n"


def carbon_curves(path, now) -> None:
    """Hourly forecasts for 2 days: DE around 380 g/kWh, FR around 60, both with a daily swing."""
    rows = ["time,zone,gco2_per_kwh,issued_at"]
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    issued = (now - timedelta(minutes=1)).isoformat()
    for h in range(50):
        t = start + timedelta(hours=h)
        swing = (h % 24) / 24
        rows.append(f"{t.isoformat()},DE,{380 + 80 * swing:.0f},{issued}")
        rows.append(f"{t.isoformat()},FR,{60 + 20 * swing:.0f},{issued}")
    path.write_text("\n".join(rows) + "\n")


class Agents:
    """One `carbonsched agent --executor slurm` process per Slurm node."""

    def __init__(self, root, url, config) -> None:
        self.root, self.url, self.config = root, url, config
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        for node in NODES:
            log = open(self.root / f"agent-{node}.log", "a")
            self.procs[node] = subprocess.Popen(
                [sys.executable, "-m", "scheduler", "--config", str(self.config), "agent", "--db", self.url,
                 "--node", node, "--executor", "slurm", "--state-dir", str(self.root / node),
                 "--sample-hz", "2", "--dispatch-interval", "0.3s"],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            log.close()

    def kill9(self) -> None:
        for p in self.procs.values():
            p.send_signal(signal.SIGKILL)
            p.wait()

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()

    def log(self) -> str:
        return "\n".join((self.root / f"agent-{n}.log").read_text()[-3000:] for n in NODES)


@pytest.fixture
def world(slurm_cluster):
    root = world_dir("cs-slurm-acc-")
    with database_for("postgresql", root) as url:
        store = Store(url)
        store.upgrade()
        now = utcnow()
        carbon_curves(root / "carbon.csv", now)
        CarbonSignals(store, track_status=False).writes.import_file(root / "carbon.csv")
        head = DaemonProcess(root, url, emulate=None, local_agent=False, extra=["--policy", "greedy"])
        config = head.config
        config.write_text(f'grace = "1s"\n[slurm]\npartitions = ["carbon"]\nconf = "{slurm_cluster.conf}"\n'
                          + CARBON_STATIC)
        agents = Agents(root, url, config)
        head.start()
        agents.start()
        try:
            yield head, agents, store, root
        finally:
            agents.stop()
            head.cleanup()
            store.dispose()


def sbatch(cluster, *args: str) -> int:
    out = subprocess.run(["sbatch", "--parsable", *args], env={**os.environ, **cluster.env},
                         capture_output=True, text=True, timeout=30, check=True)
    return int(out.stdout.strip().split(";")[0])


def events(store, job_id):
    with store.read() as conn:
        return [tuple(e) for e in conn.execute(select(job_events.c.at, job_events.c.from_state, job_events.c.to_state,
                                                      job_events.c.reason).where(job_events.c.job_id == job_id))]


def wait_for(what, timeout_s, message):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(message())


def test_fifty_jobs_two_zones_adoption_cancels_and_two_kill9s(world, slurm_cluster):
    head, agents, store, root = world
    t0 = time.time() - 1
    client = head.client()
    expect: dict[int, str] = {}
    deadline_iso = (utcnow() + timedelta(minutes=10)).isoformat()
    for i in range(40):
        fails = i in (7, 23)
        argv = ["sh", "-c", "sleep 1; exit 3"] if fails else ["sleep", str(1 + i % 3)]
        fields = dict(argv=argv, gpus=2 if i % 10 == 9 else 1, est_runtime_s=5, deadline=deadline_iso,
                      cwd=str(root), workload="llm-inference")
        if i % 4 == 0:
            fields["gpu_mem_gib"] = 150  # only the MI300X in DE have that much
        if i in (30, 31):
            fields["argv"] = ["sleep", "40"]  # cancelled while running, one from each side
        expect[client.submit(**fields)["id"]] = "FAILED" if fails else "COMPLETED"
    slurm_ids = [sbatch(slurm_cluster, "--hold", "-p", "carbon", "--gres=gpu:1", "--time=2",
                        f"--output={root}/adopted-%j.out",
                        "--comment=carbonsched deadline=10m workload=llm-inference est-runtime=5s",
                        "--wrap", "sleep 2") for _ in range(10)]
    ours, theirs = sorted(expect)[30:32]
    expect[ours] = expect[theirs] = "CANCELLED"

    def adopted():
        with store.read() as conn:
            return dict(conn.execute(select(jobs.c.slurm_job_id, jobs.c.id)
                                     .where(jobs.c.slurm_job_id.in_(slurm_ids))).all())

    # Kill every carbonsched process mid-flow, twice, a few seconds apart.
    for _ in range(2):
        time.sleep(4)
        head.kill9()
        agents.kill9()
        time.sleep(1)
        head.start()
        agents.start()
    by_slurm = wait_for(lambda: len(adopted()) == 10 and adopted(), 30,
                        lambda: f"adopted {adopted()} of {slurm_ids}\n{agents.log()}")
    for job_id in by_slurm.values():
        expect[job_id] = "COMPLETED"

    def slurm_running(job_id):
        return [j for j in list_jobs(SlurmCommands(slurm_cluster.conf))
                if j.carbonsched_id == job_id and j.submit_time.timestamp() >= t0 and j.state == "RUNNING"]

    # (after two kill -9 rounds, behind the queue of 1-GPU jobs on that node: 120 s on a loaded host)
    running = wait_for(lambda: slurm_running(theirs), 120, lambda: f"job {theirs} never ran\n{agents.log()}")
    time.sleep(2)  # it runs a while: its energy counts
    subprocess.run(["scancel", str(running[0].job_id)], env={**os.environ, **slurm_cluster.env},
                   check=True, timeout=10)
    wait_for(lambda: slurm_running(ours), 120, lambda: f"job {ours} never ran\n{agents.log()}")
    assert head.cli("cancel", str(ours)).returncode == 0

    done = head.wait_states(list(expect), timeout_s=120)
    assert {i: done[i]["state"] for i in expect} == expect, agents.log()
    assert done[theirs]["reason"].startswith("cancelled in Slurm")

    # Exactly one Slurm job per carbonsched job (by comment, or adopted by id); no double submit.
    slurm = [j for j in list_jobs(SlurmCommands(slurm_cluster.conf)) if j.submit_time.timestamp() >= t0]
    per_id: dict[int, list] = {}
    for j in slurm:
        if j.carbonsched_id is not None:
            per_id.setdefault(j.carbonsched_id, []).append(j)
        elif j.job_id in by_slurm:
            per_id.setdefault(by_slurm[j.job_id], []).append(j)
    assert {i: len(v) for i, v in per_id.items()} == {i: 1 for i in expect}

    with store.read() as conn:
        rows = {r.id: r for r in conn.execute(select(jobs).where(jobs.c.id.in_(list(expect))))}
        models = dict(conn.execute(select(gpus.c.id, gpus.c.model)).all())
        zone_of = dict(conn.execute(select(nodes.c.name, nodes.c.zone)).all())
        claimed = dict(conn.execute(select(job_events.c.job_id, job_events.c.at)
                                    .where(job_events.c.to_state == "RUNNING")
                                    .order_by(job_events.c.at)).all())  # the last claim of each
    zones = set()
    for job_id, row in rows.items():
        sj = per_id[job_id][0]
        if sj.start_time is None:
            continue
        zones.add(zone_of[row.node])
        # Where carbonsched planned it: the node, and GPUs of the planned model and count.
        assert sj.nodes == row.planned_node == row.node, (job_id, sj, row.planned_node)
        model = {models[g] for g in row.planned_gpu_ids}
        assert len(model) == 1 and sj.tres_per_node.lower().endswith(f"{model.pop().lower()}:{row.gpus}"), sj
        assert len(sj.gpu_idx or row.gpu_ids) == row.gpus
        # When: never before the planned start, and within a cycle of it (or of the claim,
        # for jobs whose start fell while the agents were down).
        start = sj.start_time.timestamp()
        assert start >= row.planned_start.timestamp() - 1.0, (job_id, sj.start_time, row.planned_start)
        assert start - max(row.planned_start.timestamp(), claimed[job_id].timestamp()) <= CYCLE_S, \
            (job_id, sj.start_time, row.planned_start, claimed[job_id])
    assert zones == {"DE", "FR"}

    # Receipts: the agents measured (emulated) energy; the head prices it (every 60 s in the
    # daemon; here at once, with the same code).
    assert Accountant(store, carbon_config={"carbon": {"static": {"DE": 420, "FR": 70}}}).backfill() > 0
    with store.read() as conn:
        receipts = {r.id: r for r in conn.execute(select(jobs.c.id, jobs.c.energy_j, jobs.c.energy_method,
                                                         jobs.c.gco2).where(jobs.c.id.in_(list(expect))))}
    for job_id, r in receipts.items():
        sj = per_id[job_id][0]
        # Slurm's clock has whole seconds: a job cancelled in the second Slurm started it ran
        # for 0 s by that clock, and 0 J is its right receipt (seen under load on 2 cores).
        ran_in_slurm = sj.start_time is not None and (sj.end_time is None or sj.end_time > sj.start_time)
        if rows[job_id].started_at is not None and ran_in_slurm:
            assert r.energy_j and r.energy_j > 0 and r.energy_method == "modelled" and r.gco2 > 0, \
                (job_id, r, rows[job_id].reason, per_id[job_id][0], events(store, job_id), agents.log())
