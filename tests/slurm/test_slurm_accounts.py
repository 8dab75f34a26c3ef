"""In front of Slurm, a job reaches `sbatch` charged as carbonsched charged it, and in
carbonsched's priority order:

- its account goes as `--account` (not the built-in `default`: Slurm then charges the
  user's own default account), its QOS as `--qos` under its own name or the Slurm QOS that
  `qos_names` maps it to;
- when several jobs wait for the same GPUs, the higher-priority job is handed to Slurm
  first and starts first, whatever the submit order;
- a user's own held `sbatch` job that carbonsched adopts is charged to its Slurm account
  where carbonsched has it (and the user in it), else to the user's default;
- a Slurm that refuses a job's own request (its account, QOS or time limit) ends that job
  FAILED with Slurm's words, once: it is never handed over again.

Against the session's real Slurm (without slurmdbd it records the account and drops the
QOS, so what sbatch was given is read from the agent's own command line too)."""

from __future__ import annotations

import os
import subprocess

import pytest
from sqlalchemy import select

from policies import get_policy
from scheduler.accounts import add_account, add_user
from scheduler.clock import utcnow
from scheduler.daemon.access import Caller
from scheduler.daemon.planner import Planner
from scheduler.node.slurm_executor import refusal
from scheduler.qos import QosTable
from scheduler.slurm.commands import SlurmError
from scheduler.slurm.config import SlurmConfig
from scheduler.standing import Standing
from scheduler.store.models import gpus, job_events, jobs

from test_slurm import ROOT, carbonsched_job_of, drive, slurm_jobs, world  # noqa: F401  (world: the fixture)

NOBODY = Caller(uid=65534, gid=65534)

# -- what sbatch is given, without Slurm ---------------------------------------------------


def test_the_job_s_account_and_qos_become_sbatch_options_unless_the_config_says_otherwise():
    cfg = SlurmConfig()
    assert (cfg.sbatch_account("nlp"), cfg.sbatch_qos("urgent")) == ("nlp", "urgent")
    assert cfg.sbatch_account("default") is None  # Slurm charges the user's own default account
    assert cfg.sbatch_account(None) is None and cfg.sbatch_qos(None) is None
    mapped = SlurmConfig.from_config({"slurm": {"qos_names": {"urgent": "high", "flexible": ""},
                                                "pass_account": False}})
    assert (mapped.sbatch_qos("urgent"), mapped.sbatch_qos("flexible"), mapped.sbatch_qos("normal")) == \
        ("high", None, "normal")
    assert mapped.sbatch_account("nlp") is None


@pytest.mark.parametrize("table,message", [
    ({"pass_account": "yes"}, "pass_account must be true or false"),
    ({"qos_names": {"urgent": 3}}, "qos_names must be a table"),
    ({"qos_name": {}}, "unknown key"),
])
def test_a_bad_account_or_qos_setting_is_one_line_naming_it(table, message):
    with pytest.raises(ValueError, match=message):
        SlurmConfig.from_config({"slurm": table})


@pytest.mark.parametrize("stderr,why", [
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
     "Invalid account or account/partition combination specified"),
    ("sbatch: error: Batch job submission failed: Invalid qos specification", "Invalid qos specification"),
    ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's "
     "size and/or time limits)", "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)"),
    ("sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)",
     "Requested time limit is invalid (missing or exceeds some limit)"),
])
def test_slurm_refusing_the_job_s_own_request_is_told_from_an_outage(stderr, why):
    assert refusal(f"sbatch --parsable failed (exit 1): {stderr}") == why


@pytest.mark.parametrize("stderr", [
    "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
    "sbatch did not answer within 30s (is slurmctld up?)",
])
def test_an_outage_is_not_a_refusal(stderr):
    assert refusal(stderr) is None


# -- against the real Slurm ------------------------------------------------------------------

def _accounts(store, *names):
    now = utcnow()
    with store.write() as conn:
        for name in names:
            add_account(conn, name, now=now)
            add_user(conn, "root", name, now=now)


def _before_sbatch(agents, hook) -> None:
    """Call `hook(argv)` before every sbatch the agents run from now on; the real Slurm
    still runs each, unless the hook raises (as Slurm refusing it)."""
    for agent in agents.values():
        slurm = agent.launcher.slurm

        def run(argv, _real=slurm.run, **kw):
            if argv[0] == "sbatch":
                hook(list(argv))
            return _real(argv, **kw)

        slurm.run = run


def _slurm_job(cluster, job_id: int):
    return next(j for j in slurm_jobs(cluster, "carbonsched:") if j.carbonsched_id == job_id)


def test_a_job_reaches_slurm_with_its_account_and_qos(world, slurm_cluster):
    store, service, planner, agents, root = world
    _accounts(store, "nlp")
    sbatches: list[list[str]] = []
    _before_sbatch(agents, sbatches.append)
    charged = service.submit(ROOT, {"argv": ["true"], "gpus": 1, "est_runtime_s": 5, "account": "nlp",
                                    "qos": "urgent", "cwd": str(root)})["id"]
    # a user in no account: the built-in `default`
    plain = service.submit(NOBODY, {"argv": ["true"], "gpus": 1, "est_runtime_s": 5, "cwd": "/tmp"})["id"]
    rows = drive(store, planner, agents, [charged, plain])
    assert rows[charged].state == rows[plain].state == "COMPLETED"
    assert _slurm_job(slurm_cluster, charged).account == "nlp"
    argvs = {next(int(a.split(":")[1]) for a in argv if a.startswith("--comment=carbonsched:")): argv
             for argv in sbatches}
    assert {"--account=nlp", "--qos=urgent"} <= set(argvs[charged])
    # the built-in default account is not Slurm's: Slurm charges the user's own default account
    assert not any(a.startswith("--account") for a in argvs[plain]) and "--qos=normal" in argvs[plain]


def test_the_higher_priority_job_is_handed_to_slurm_and_starts_first(world, slurm_cluster):
    """One place fits these jobs (2 GPUs with 150 GiB: sn-de's two MI300X). While it is busy,
    a `flexible` job and then an `urgent` one arrive; the urgent one goes to Slurm first."""
    store, service, _fifo, agents, root = world
    planner = Planner(store, get_policy("fifo"), standing=Standing(QosTable()))
    release = root / "release"
    big = {"gpus": 2, "gpu_mem_gib": 150, "est_runtime_s": 5, "cwd": str(root)}
    blocker = service.submit(ROOT, {**big, "argv": ["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.1; done"]})["id"]
    drive(store, planner, agents, [blocker], states={"RUNNING"})
    low = service.submit(ROOT, {**big, "argv": ["true"], "qos": "flexible"})["id"]
    high = service.submit(ROOT, {**big, "argv": ["true"], "qos": "urgent"})["id"]
    drive(store, planner, agents, [low, high], states={"PLANNED"})
    release.touch()
    rows = drive(store, planner, agents, [blocker, low, high])
    assert {r.state for r in rows.values()} == {"COMPLETED"}
    first, second = _slurm_job(slurm_cluster, high), _slurm_job(slurm_cluster, low)
    assert first.job_id < second.job_id  # handed over first
    assert first.start_time <= second.start_time
    assert rows[high].started_at <= rows[low].started_at


def test_a_job_slurm_refuses_for_its_own_request_fails_once_with_slurm_s_words(world, slurm_cluster):
    """A QOS Slurm does not know (on a cluster with accounting): FAILED with Slurm's words,
    its GPUs free for the next job, never handed over again."""
    store, service, planner, agents, root = world
    tries = []

    def refuse_flexible(argv: list[str]) -> None:
        if "--qos=flexible" in argv:
            tries.append(argv)
            raise SlurmError("sbatch --parsable failed (exit 1): sbatch: error: Batch job submission "
                             "failed: Invalid qos specification")

    _before_sbatch(agents, refuse_flexible)
    refused = service.submit(ROOT, {"argv": ["true"], "gpus": 1, "est_runtime_s": 5, "qos": "flexible",
                                    "cwd": str(root)})["id"]
    rows = drive(store, planner, agents, [refused])
    assert rows[refused].state == "FAILED"
    assert rows[refused].reason == "Slurm refused the job: Invalid qos specification"
    assert len(tries) == 1
    after = service.submit(ROOT, {"argv": ["true"], "gpus": 1, "est_runtime_s": 5, "cwd": str(root)})["id"]
    assert drive(store, planner, agents, [after])[after].state == "COMPLETED"
    assert len(tries) == 1
    with store.read() as conn:
        states = [e.to_state for e in conn.execute(select(job_events).where(job_events.c.job_id == refused)
                                                   .order_by(job_events.c.id))]
        holding = conn.execute(select(gpus.c.id).where(gpus.c.job_id == refused)).all()
        started = conn.execute(select(jobs.c.started_at).where(jobs.c.id == refused)).scalar_one()
    assert states == ["PENDING", "PLANNED", "RUNNING", "FAILED"]
    assert holding == [] and started is None  # its GPUs free, and it never ran


def test_a_user_s_own_held_sbatch_is_charged_to_its_slurm_account_where_carbonsched_has_it(world, slurm_cluster):
    """An adopted job counts for fair share where Slurm counts it: its `--account` when the
    user is in that account here, else the user's default."""
    store, service, planner, agents, root = world
    _accounts(store, "vision", "nlp")  # root's default: the first added, vision
    adopted = {}
    for account in ("nlp", "elsewhere"):
        out = subprocess.run(
            ["sbatch", "--parsable", "--hold", "-p", "carbon", "--gres=gpu:1", "--time=2", f"--account={account}",
             "--comment=carbonsched est-runtime=5s", "-o", "/dev/null", "--wrap", "true"],
            env={**os.environ, **slurm_cluster.env}, capture_output=True, text=True, timeout=20, check=True)
        adopted[account] = carbonsched_job_of(store, agents, int(out.stdout.strip()))
    rows = drive(store, planner, agents, list(adopted.values()))
    assert rows[adopted["nlp"]].account == "nlp"
    assert rows[adopted["elsewhere"]].account == "vision"
