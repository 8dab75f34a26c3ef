"""The Slurm executor against a real slurmctld/slurmd/munged on loopback (the session's
`slurm_cluster`): carbonsched plans, Slurm runs, and each side sees what the other did.
Plus the pure parts (Slurm's JSON, states, comments, config) without Slurm."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from sqlalchemy import insert, select

from policies import get_policy
from scheduler.clock import utcnow
from scheduler.daemon.access import Caller, ServiceConfig
from scheduler.daemon.planner import Planner
from scheduler.daemon.service import JobService
from scheduler.node.executor import RunState
from scheduler.node.main import AgentRunConfig, make_slurm_agent
from scheduler.node.slurm_executor import _status_of
from scheduler.slurm.commands import SlurmCommands
from scheduler.slurm.config import SlurmConfig
from scheduler.slurm.inventory import parse_gres, read_nodes, zone_of
from scheduler.slurm.jobs import adoption_request, gres_indices, list_jobs, parse_job, requested_gpus
from scheduler.store import Store
from scheduler.store.models import gpus, job_events, jobs, nodes
from suite_hygiene import make_user, remove_user

ROOT = Caller(uid=0, gid=0)
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "LOST"}


# -- the pure parts --------------------------------------------------------------------

def test_gres_strings_give_types_counts_and_indices():
    assert parse_gres("gpu:h100:2,gpu:mi300x:2(S:0)") == [("h100", 2), ("mi300x", 2)]
    assert parse_gres("gpu:4,license:x:1") == [("", 4)]
    assert gres_indices(["gpu:h100:2(IDX:0,2-3)"]) == (0, 2, 3)
    assert gres_indices([]) == ()
    assert requested_gpus("gres:gpu:mi300x:3") == 3
    assert requested_gpus("gres/gpu=2") == 2
    assert requested_gpus("gres:gpu") == 1
    assert requested_gpus("") == 0
    assert zone_of("fast,zone_DE", "zone_") == "DE"
    assert zone_of("fast", "zone_") is None


def test_a_carbonsched_comment_asks_for_adoption_with_its_hints():
    assert adoption_request("carbonsched deadline=6h workload=llm-inference prompts=500") == {
        "deadline": "6h", "workload": "llm-inference", "prompts": "500"}
    assert adoption_request("carbonsched") == {}
    assert adoption_request("carbonsched:12") is None  # carbonsched's own Slurm job
    assert adoption_request("my notes") is None


def _raw(**over):
    raw = dict(job_id=9, job_state="COMPLETED", state_reason="None", comment="carbonsched:4#2",
               user_id=0, group_id=0, user_name="root", partition="carbon", name="x", nodes="sn-de",
               tres_per_node="gres:gpu:h100:1", time_limit=5, submit_time=100, start_time=110,
               end_time=120, exit_code=0, gres_detail=["gpu:h100:1(IDX:1)"])
    raw.update(over)
    return raw


@pytest.mark.parametrize("state,exit_status,cancelled_here,expect", [
    ("COMPLETED", 0, False, {"exit_code": 0}),
    ("FAILED", 3 << 8, False, {"exit_code": 3}),
    ("FAILED", 9, False, {"signal": 9, "exit_code": None}),
    ("CANCELLED", 15, True, {"cancelled": True}),
    ("CANCELLED", 15, False, {"cancelled_outside": "cancelled in Slurm (scancel of job 9)"}),
    ("TIMEOUT", 0, False, {"timed_out": True}),
    ("OUT_OF_MEMORY", 0, False, {"error": "Slurm job 9 ended OUT_OF_MEMORY"}),
])
def test_slurm_end_states_read_as_the_agent_reads_a_finished_run(state, exit_status, cancelled_here, expect):
    job = parse_job(_raw(job_state=state, exit_code=exit_status))
    assert (job.carbonsched_id, job.carbonsched_attempt) == (4, 2)
    status = _status_of(job, None, cancelled_here=cancelled_here, gpu_idx=None)
    assert status.state is RunState.FINISHED
    assert {k: status.result[k] for k in expect} == expect
    assert status.result["gpu_idx"] == [1]


@pytest.mark.parametrize("state", ["NODE_FAIL", "BOOT_FAIL", "PREEMPTED"])
def test_a_slurm_job_lost_with_its_node_is_a_vanished_run(state):
    status = _status_of(parse_job(_raw(job_state=state)), None, cancelled_here=False, gpu_idx=None)
    assert status.state is RunState.VANISHED and state in status.note


def test_the_slurm_table_is_checked_and_maps_gres_types_to_catalog_models():
    cfg = SlurmConfig.from_config({"slurm": {"partitions": ["gpu", "carbon"], "gpu_models": {"h100s": "H100"},
                                             "timeout": "5s"}})
    assert cfg.submit_partition == "gpu" and cfg.timeout_s == 5
    assert cfg.model_of("h100s") == "H100" and cfg.model_of("mi300x") == "MI300X"
    with pytest.raises(ValueError, match="not a catalog GPU model"):
        SlurmConfig.from_config({"slurm": {"gpu_models": {"x": "Z80"}}})
    with pytest.raises(ValueError, match="unknown key"):
        SlurmConfig.from_config({"slurm": {"partition": "x"}})


# -- against the real Slurm ------------------------------------------------------------

_first_id = int(time.time()) % 1000 * 1000


@pytest.fixture
def world(slurm_cluster):
    """A SQLite store, a job service, a fifo planner and one Slurm agent (an Agent with a SlurmLauncher) per Slurm node."""
    root = Path(tempfile.mkdtemp(prefix="cs-world-"))
    root.chmod(0o755)  # slurmd writes a user's output as that user
    store = Store(f"sqlite:///{root / 'carbonsched.db'}")
    store.upgrade()
    # Job ids of their own per test: the Slurm cluster (and its carbonsched:ID comments) is
    # shared by the session, and a fresh store would start at 1 every time.
    global _first_id
    _first_id += 1000
    store.transact(lambda conn: conn.execute(insert(jobs).values(
        id=_first_id, name="id-offset", state="CANCELLED", reason="test: ids start above this one",
        owner_uid=0, owner_gid=0, owner_groups=[], owner_name="root", argv=["true"], cwd="/", env={},
        gpus=1, gpu_mem_gib=0.0, max_retries=0, attempts=0, submitted_at=utcnow(), plan_rev=0)))
    config = SlurmConfig(conf=slurm_cluster.conf, partitions=("carbon",))
    agents = {}
    for node in ("sn-de", "sn-fr"):
        cfg = AgentRunConfig(db_url="", state_dir=root / node, node=node, zone="local", grace_s=1.0,
                             sample_hz=5.0)
        agents[node] = make_slurm_agent(store, cfg, config)
        agents[node].register()
        agents[node].startup_reconcile()
        agents[node].start_sampling()
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=root / "sn-de" / "logs")
    planner = Planner(store, get_policy("fifo"))
    yield store, service, planner, agents, root
    for a in agents.values():
        a.stop()
    store.dispose()
    shutil.rmtree(root, ignore_errors=True)


def drive(store, planner, agents, job_ids, states=TERMINAL, timeout_s=40.0, until=None):
    deadline = time.monotonic() + timeout_s
    rows = {}
    while time.monotonic() < deadline:
        planner.tick()
        for a in agents.values():
            a.tick()
        with store.read() as conn:
            rows = {r.id: r for r in conn.execute(select(jobs).where(jobs.c.id.in_(job_ids)))}
        if all(rows[i].state in states for i in job_ids) and (until is None or until()):
            return rows
        time.sleep(0.1)
    raise TimeoutError({i: rows[i].state for i in job_ids})


def carbonsched_job_of(store, agents, slurm_id: int, timeout_s: float = 30.0) -> int:
    """The carbonsched job the agents made of Slurm job `slurm_id` (adopted or observed),
    ticking them until it exists."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for a in agents.values():
            a.tick()
        with store.read() as conn:
            job = conn.execute(select(jobs.c.id).where(jobs.c.slurm_job_id == slurm_id)).scalar_one_or_none()
        if job is not None:
            return job
        time.sleep(0.2)
    raise AssertionError(f"no carbonsched job for Slurm job {slurm_id} after {timeout_s:g} s")


def slurm_jobs(cluster, comment_prefix=None):
    return [j for j in list_jobs(SlurmCommands(cluster.conf))
            if comment_prefix is None or j.comment.startswith(comment_prefix)]


def test_inventory_comes_from_slurm_zones_from_features_and_models_from_gres_types(world, slurm_cluster):
    store, *_ = world
    infos = {n.name: n for n in read_nodes(SlurmCommands(slurm_cluster.conf), SlurmConfig())}
    assert infos["sn-de"].fleet_spec() == "2xH100,2xMI300X"
    with store.read() as conn:
        zones = dict(conn.execute(select(nodes.c.name, nodes.c.zone)).all())
        models = sorted(conn.execute(select(gpus.c.node_name, gpus.c.model)).all())
    assert zones == {"sn-de": "DE", "sn-fr": "FR"}
    assert models == [("sn-de", "H100")] * 2 + [("sn-de", "MI300X")] * 2 + [("sn-fr", "H100")] * 2


def test_a_submitted_job_becomes_one_slurm_job_on_the_planned_node_and_gpus_with_a_receipt(world, slurm_cluster):
    store, service, planner, agents, root = world
    # Long enough for the agent to see it RUNNING in squeue: the emulated GPUs draw busy power
    # only from that poll on, so a 2 s job once ran whole between two polls at idle power.
    job = service.submit(ROOT, {"argv": ["sh", "-c", 'echo "rocr=$ROCR_VISIBLE_DEVICES gpus=$SLURM_JOB_GPUS"; sleep 6'],
                                "gpus": 2, "gpu_mem_gib": 150, "est_runtime_s": 10, "cwd": str(root)})["id"]
    rows = drive(store, planner, agents, [job])
    row = rows[job]
    assert row.state == "COMPLETED", row.reason
    assert row.node == "sn-de"  # only sn-de has MI300X (192 GiB)
    mine = [j for j in slurm_jobs(slurm_cluster, "carbonsched:") if j.submit_time.timestamp() >= row.submitted_at.timestamp() - 1
            and j.carbonsched_id == job]
    assert len(mine) == 1
    sj = mine[0]
    assert (sj.state, sj.nodes, sj.partition, sj.tres_per_node) == ("COMPLETED", "sn-de", "carbon", "gres:gpu:mi300x:2")
    out = (root / "sn-de" / "logs" / f"{job}.out").read_text()
    assert "rocr=2,3 gpus=2,3" in out
    assert row.started_at.timestamp() == pytest.approx(sj.start_time.timestamp(), abs=1)
    assert row.energy_j and row.energy_method == "modelled"
    run_s = (row.ended_at - row.started_at).total_seconds()
    assert 2 * 300 * run_s < row.energy_j < 2 * 760 * run_s  # two busy MI300X


def test_exit_codes_and_cancels_from_either_side_follow_slurm(world, slurm_cluster):
    store, service, planner, agents, root = world
    fail = service.submit(ROOT, {"argv": ["sh", "-c", "exit 3"], "gpus": 1, "est_runtime_s": 5})["id"]
    ours = service.submit(ROOT, {"argv": ["sleep", "60"], "gpus": 1, "est_runtime_s": 60})["id"]
    theirs = service.submit(ROOT, {"argv": ["sleep", "60"], "gpus": 1, "est_runtime_s": 60})["id"]
    drive(store, planner, agents, [ours, theirs], states={"RUNNING"},
          until=lambda: all(agents[n].launcher.slurm_executor.jobs(0) for n in agents))

    def reason_of(job_id):
        with store.read() as conn:
            return conn.execute(select(jobs.c.reason).where(jobs.c.id == job_id)).scalar()

    deadline = time.monotonic() + 10  # what `carbonsched show` says once Slurm runs it
    while not reason_of(ours).startswith("running as Slurm job") and time.monotonic() < deadline:
        for a in agents.values():
            a.tick()
        time.sleep(0.2)
    assert reason_of(ours).startswith("running as Slurm job"), reason_of(ours)
    by_id = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not {ours, theirs} <= set(by_id):
        by_id = {j.carbonsched_id: j for j in slurm_jobs(slurm_cluster, "carbonsched:") if j.state == "RUNNING"}
        time.sleep(0.2)
    time.sleep(2)  # both run a while first
    service.cancel(ROOT, [ours])
    subprocess.run(["scancel", str(by_id[theirs].job_id)], env={**os.environ, **slurm_cluster.env}, check=True,
                   timeout=10)
    rows = drive(store, planner, agents, [fail, ours, theirs])
    assert (rows[fail].state, rows[fail].exit_code) == ("FAILED", 3)
    assert rows[ours].state == "CANCELLED" and rows[ours].reason == "cancelled by user while running"
    assert rows[theirs].state == "CANCELLED" and "scancel" in rows[theirs].reason
    # Both ran a while on their GPUs before the cancel: their energy counts.
    assert rows[ours].energy_j > 0 and rows[theirs].energy_j > 0


def test_an_agent_that_died_after_sbatch_finds_the_job_by_its_comment_and_never_submits_twice(world, slurm_cluster):
    store, service, planner, agents, root = world
    job = service.submit(ROOT, {"argv": ["sleep", "3"], "gpus": 1, "est_runtime_s": 5})["id"]
    drive(store, planner, agents, [job], states={"RUNNING"})
    node = next(n for n, a in agents.items() if a.executor.known_runs())
    executor = agents[node].launcher.slurm_executor
    (executor.run_dir(job) / "slurm.json").unlink()  # as if killed between sbatch and writing it down
    config = SlurmConfig(conf=slurm_cluster.conf)
    cfg = AgentRunConfig(db_url="", state_dir=executor.run_root.parent, node=node, zone="x", grace_s=1.0)
    agents[node].stop()
    agents[node] = make_slurm_agent(store, cfg, config)
    agents[node].register()
    agents[node].startup_reconcile()
    rows = drive(store, planner, agents, [job])
    assert rows[job].state == "COMPLETED"
    submitted = rows[job].submitted_at.timestamp() - 1
    assert len([j for j in slurm_jobs(slurm_cluster, f"carbonsched:{job}")
                if j.submit_time.timestamp() >= submitted]) == 1


def test_a_held_sbatch_job_in_the_carbon_partition_is_adopted_planned_placed_and_released(world, slurm_cluster):
    store, service, planner, agents, root = world
    out = root / "adopted.out"
    sbatch = subprocess.run(
        ["sbatch", "--parsable", "--hold", "-p", "carbon", "--gres=gpu:1", "--time=2", "-o", str(out),
         "--comment=carbonsched deadline=2h workload=llm-inference est-runtime=10s",
         "--wrap", 'echo "gpus=$SLURM_JOB_GPUS"; sleep 1'],
        env={**os.environ, **slurm_cluster.env}, capture_output=True, text=True, timeout=20, check=True)
    slurm_id = int(sbatch.stdout.strip())
    job = carbonsched_job_of(store, agents, slurm_id)
    rows = drive(store, planner, agents, [job])
    row = rows[job]
    assert row.state == "COMPLETED", row.reason
    assert row.workload == "llm-inference" and row.time_limit_s == 120
    sj = next(j for j in slurm_jobs(slurm_cluster) if j.job_id == slurm_id)
    assert sj.state == "COMPLETED" and sj.nodes == row.node
    assert row.energy_j and "gpus=" in out.read_text()
    # Adopted once: a second sweep finds it known.
    with store.read() as conn:
        assert conn.execute(select(jobs.c.id).where(jobs.c.slurm_job_id == slurm_id)).all() == [(job,)]


def test_a_job_submitted_by_a_user_is_a_slurm_job_of_that_user(world, slurm_cluster):
    store, service, planner, agents, root = world
    nobody = Caller(uid=65534, gid=65534)
    job = service.submit(nobody, {"argv": ["id", "-u"], "gpus": 1, "est_runtime_s": 5, "cwd": "/tmp"})["id"]
    rows = drive(store, planner, agents, [job])
    assert rows[job].state == "COMPLETED", rows[job].reason
    sj = next(j for j in slurm_jobs(slurm_cluster, f"carbonsched:{job}")
              if j.submit_time.timestamp() >= rows[job].submitted_at.timestamp() - 1)
    assert sj.user_id == 65534
    assert (root / rows[job].node / "logs" / f"{job}.out").read_text().strip() == "65534"


def test_a_slurm_gpu_job_from_outside_carbonsched_is_observed_and_gets_a_receipt(world, slurm_cluster):
    store, service, planner, agents, root = world
    slurm_id = int(subprocess.run(
        ["sbatch", "--parsable", "-p", "debug", "--nodelist=sn-fr", "--gres=gpu:h100:1", "-o", "/dev/null",
         "--wrap", "sleep 4"], env={**os.environ, **slurm_cluster.env}, capture_output=True, text=True,
        timeout=20, check=True).stdout.strip())
    job = carbonsched_job_of(store, agents, slurm_id)
    with store.read() as conn:  # its GPU is busy for the planner while it runs
        held = conn.execute(select(gpus.c.node_name).where(gpus.c.job_id == job)).scalars().all()
    assert held == ["sn-fr"]
    row = drive(store, planner, agents, [job])[job]
    assert (row.state, row.node, row.gpus) == ("COMPLETED", "sn-fr", 1)
    with store.read() as conn:
        reasons = conn.execute(select(job_events.c.reason).where(job_events.c.job_id == job)).scalars().all()
    assert f"observed running in Slurm (job {slurm_id})" in reasons
    assert row.energy_j > 0 and row.energy_method == "modelled"


def adopt(agents, store, slurm_cluster, *, wrap="sleep 1"):
    """sbatch a held, carbonsched-commented job; tick the agents (no planner) until adopted."""
    slurm_id = int(subprocess.run(
        ["sbatch", "--parsable", "--hold", "-p", "carbon", "--gres=gpu:1", "-o", "/dev/null",
         "--comment=carbonsched deadline=1h", "--wrap", wrap], env={**os.environ, **slurm_cluster.env},
        capture_output=True, text=True, timeout=20, check=True).stdout.strip())
    return slurm_id, carbonsched_job_of(store, agents, slurm_id, timeout_s=20)


def test_an_adopted_job_cancelled_on_either_side_before_it_is_placed_is_cancelled_on_both(world, slurm_cluster):
    store, service, planner, agents, root = world
    env = {**os.environ, **slurm_cluster.env}
    here_slurm, here = adopt(agents, store, slurm_cluster)
    there_slurm, there = adopt(agents, store, slurm_cluster)
    service.cancel(ROOT, [here])
    subprocess.run(["scancel", str(there_slurm)], env=env, check=True, timeout=10)

    def slurm_state(slurm_id):
        return next(j.state for j in slurm_jobs(slurm_cluster) if j.job_id == slurm_id)

    def both_cancelled():
        for a in agents.values():
            a.launcher._adopted_at = -1e18  # sweep now
            a.tick()
        with store.read() as conn:
            state = conn.execute(select(jobs.c.state).where(jobs.c.id == there)).scalar_one()
        return state == "CANCELLED" and slurm_state(here_slurm) == "CANCELLED"

    deadline = time.monotonic() + 20
    while not both_cancelled() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm_state(here_slurm) == "CANCELLED"  # cancelled here: its held Slurm job is scancelled
    with store.read() as conn:
        row = conn.execute(select(jobs).where(jobs.c.id == there)).one()
    assert row.state == "CANCELLED" and row.reason.startswith(f"Slurm job {there_slurm} ended CANCELLED")


def test_a_node_drained_in_slurm_takes_no_plans_until_resumed(world, slurm_cluster):
    store, service, planner, agents, root = world
    env = {**os.environ, **slurm_cluster.env}

    def fr_gpus():
        agents["sn-fr"].launcher._node_checked = -1e18  # read the node now, not in 10 s
        agents["sn-fr"].tick()
        with store.read() as conn:
            return conn.execute(select(gpus.c.healthy, gpus.c.unhealthy_reason)
                                .where(gpus.c.node_name == "sn-fr")).all()

    subprocess.run(["scontrol", "update", "NodeName=sn-fr", "State=DRAIN", "Reason=fan_test"], env=env,
                   check=True, timeout=10)
    try:
        drained = fr_gpus()
        assert [h for h, _ in drained] == [False, False]
        assert all(r.startswith("slurm: ") and "DRAIN" in r and "fan_test" in r for _, r in drained), drained
        job = service.submit(ROOT, {"argv": ["true"], "gpus": 1, "est_runtime_s": 5})["id"]
        assert drive(store, planner, agents, [job])[job].node == "sn-de"
    finally:
        subprocess.run(["scontrol", "update", "NodeName=sn-fr", "State=RESUME"], env=env, check=True, timeout=10)
    deadline = time.monotonic() + 10
    while fr_gpus() != [(True, None), (True, None)] and time.monotonic() < deadline:
        time.sleep(0.3)
    assert fr_gpus() == [(True, None), (True, None)]


def test_a_single_host_daemon_runs_its_jobs_through_slurm_with_its_in_process_agent(slurm_cluster):
    from daemon_harness import DaemonProcess, world_dir

    root = world_dir("cs-slurm-daemon-")
    head = DaemonProcess(root, f"sqlite:///{root / 'state' / 'carbonsched.db'}", emulate=None,
                         extra=["--executor", "slurm", "--node", "sn-de", "--policy", "fifo"])
    head.config.write_text(f'grace = "1s"\n[slurm]\nconf = "{slurm_cluster.conf}"\n[carbon.static]\nDE = 400\n')
    try:
        head.start()
        nodes = head.client().nodes()
        assert [(n["name"], n["zone"], len(n["gpus"])) for n in nodes] == [("sn-de", "DE", 4)]
        job = head.client().submit(argv=["sh", "-c", "echo $SLURM_JOB_ID; sleep 2"], gpus=1, est_runtime_s=5,
                                   cwd=str(root))["id"]
        done = head.wait_states([job], timeout_s=60)[job]
        assert done["state"] == "COMPLETED" and done["node"] == "sn-de", head.log()
        slurm_id = int((root / "state" / "logs" / f"{job}.out").read_text().split()[0])
        sj = next(j for j in slurm_jobs(slurm_cluster) if j.job_id == slurm_id)
        assert sj.comment == f"carbonsched:{job}" and sj.state == "COMPLETED"
        # Priced by the daemon's accounting after the job ended (at DE's static 400 g/kWh: no
        # other data here): the agent prices it after noting the end and learning from it, and
        # the head's 60 s accounting backfill retries, so allow one backfill period.
        deadline = time.monotonic() + 75
        while done["gco2"] is None and time.monotonic() < deadline:
            time.sleep(0.2)
            done = head.wait_states([job], timeout_s=5)[job]
        assert done["energy_j"] > 0 and done["gco2"] == pytest.approx(done["energy_j"] / 3.6e6 * 400, rel=0.01)
    finally:
        head.cleanup()


# -- no user acts as another through Slurm (issue 25) -----------------------------------

@pytest.fixture
def alice_and_bob():
    import pwd

    made = [make_user(), make_user()]
    yield [pwd.getpwnam(u) for u in made]
    for u in made:  # their Slurm jobs may still run: remove_user kills them first
        remove_user(u)


def test_a_slurm_job_of_another_user_with_a_jobs_comment_is_never_taken_for_it(world, slurm_cluster, alice_and_bob):
    store, service, planner, agents, root = world
    alice, bob = alice_and_bob
    job = service.submit(Caller(uid=alice.pw_uid, gid=alice.pw_gid),
                         {"argv": ["sh", "-c", "echo alice ran; id -u"], "gpus": 1, "est_runtime_s": 5,
                          "cwd": "/tmp"})["id"]
    # bob forges the comment before the agent submits alice's job (after she submitted it,
    # so Slurm's submit time alone cannot tell the two apart).
    forged = int(subprocess.run(
        [shutil.which("runuser") or "runuser", "-u", bob.pw_name, "--", "sbatch", "--parsable", "-p", "carbon",
         "--gres=gpu:1", "-o", "/dev/null", f"--comment=carbonsched:{job}", "--wrap", "sleep 3; exit 7"],
        env={**os.environ, **slurm_cluster.env}, capture_output=True, text=True, timeout=20, check=True,
        cwd="/tmp").stdout.strip())
    rows = drive(store, planner, agents, [job])
    row = rows[job]
    assert (row.state, row.exit_code) == ("COMPLETED", 0), row.reason
    assert (root / row.node / "logs" / f"{job}.out").read_text().split("\n")[:2] == ["alice ran", str(alice.pw_uid)]
    theirs = [j for j in slurm_jobs(slurm_cluster, f"carbonsched:{job}")
              if j.submit_time.timestamp() >= row.submitted_at.timestamp() - 1]
    assert sorted((j.user_id, j.job_id == forged) for j in theirs) == sorted([(alice.pw_uid, False), (bob.pw_uid, True)])
    with store.read() as conn:
        history = " ".join(r or "" for r in conn.execute(
            select(job_events.c.reason).where(job_events.c.job_id == job)).scalars())
    assert f"Slurm job {forged} " not in history + " " and str(rows[job].slurm_job_id) != str(forged)


def test_a_jobs_environment_reaches_the_job_only_never_sbatch(world, slurm_cluster, alice_and_bob):
    store, service, planner, agents, root = world
    alice, _ = alice_and_bob
    # A TZ far from UTC would make Slurm read the agent's --begin hours late; SBATCH_* would be
    # sbatch options (an unknown feature: sbatch refuses the job). The job itself sees both.
    env = {"PATH": "/usr/bin:/bin", "TZ": "America/Los_Angeles", "SBATCH_CONSTRAINT": "no-such-feature",
           "NOTE": "a value, with commas\nand a newline"}
    job = service.submit(Caller(uid=alice.pw_uid, gid=alice.pw_gid),
                         {"argv": ["sh", "-c", 'echo "$TZ|$SBATCH_CONSTRAINT|$(umask)|$NOTE"; echo "LANG=${LANG-unset}"'],
                          "gpus": 1, "est_runtime_s": 5, "cwd": "/tmp", "env": env})["id"]
    started = time.monotonic()
    rows = drive(store, planner, agents, [job], timeout_s=30)
    assert rows[job].state == "COMPLETED", rows[job].reason
    assert time.monotonic() - started < 25  # started when planned (now), not 8 hours late
    out = (root / rows[job].node / "logs" / f"{job}.out").read_text()
    assert out.splitlines() == ["America/Los_Angeles|no-such-feature|0022|a value, with commas", "and a newline",
                                "LANG=unset"]  # the job's environment: not sbatch's LANG=C.UTF-8
