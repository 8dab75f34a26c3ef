"""The agent's launchers without a real Slurm: what a Slurm node's launcher changes in the one
agent (GRES indices, the Slurm job in the launch spec, energy over the run as Slurm timed it,
a launch found again after a restart, an outage that only heartbeats) and what the local one
leaves as it is. The real-Slurm behaviour is tests/slurm/test_slurm.py's."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from policies.model.catalog import parse_fleet
from scheduler.node.agent import Agent
from scheduler.node.config import AgentConfig
from scheduler.node.executor import LaunchSpec, RunStatus, RunState
from scheduler.node.launcher import LocalLauncher
from scheduler.node.slurm_launcher import SlurmLauncher
from scheduler.slurm.commands import SlurmError
from scheduler.slurm.config import SlurmConfig
from scheduler.slurm.inventory import SlurmGpu, SlurmNodeInfo
from scheduler.store.models import nodes
from telemetry.gpu import EmulatedBackend, EmulatedModel


def emulated(spec: str) -> EmulatedBackend:
    return EmulatedBackend([EmulatedModel(m.name, m.vendor, m.memory_gib, m.idle_w, m.tdp_w)
                            for m in parse_fleet(spec)], node="sn", seed=7)


class DownSlurm:
    """A Slurm whose every command fails (slurmctld unreachable)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def run(self, argv, **kw):
        self.calls.append(list(argv))
        raise SlurmError(f"{argv[0]}: slurm_load_jobs error: Unable to contact slurm controller")

    def json(self, argv, **kw):
        return self.run(argv, **kw)


@pytest.fixture
def slurm_agent(store, tmp_path):
    backend = emulated("2xH100")
    config = AgentConfig(node="sn", zone="DE", state_dir=tmp_path / "state", heartbeat_s=0.0)
    info = SlurmNodeInfo(name="sn", zone="DE", state="IDLE", reason="",
                         gpus=(SlurmGpu(0, "h100", "H100"), SlurmGpu(1, "h100", "H100")))
    slurm = DownSlurm()
    launcher = SlurmLauncher(store, backend, config, slurm=slurm, slurm_config=SlurmConfig(), node_info=info)
    agent = Agent(store, backend, config, launcher=launcher)
    agent.register()
    yield agent, launcher, slurm
    agent.stop()


def test_the_local_launcher_runs_local_processes_and_changes_nothing(tmp_path, monkeypatch):
    backend = emulated("1xH100")
    loaded = []
    monkeypatch.setattr(backend, "set_busy", lambda uuid, busy: loaded.append((uuid, busy)))
    launcher = LocalLauncher(backend, AgentConfig(node="n", zone="DE", state_dir=tmp_path))
    job = SimpleNamespace(id=1, gpu_ids=[1], started_at=datetime.now(timezone.utc))
    spec = LaunchSpec(job_id=1, argv=["true"], cwd="/", env={}, uid=0, gid=0, groups=[], time_limit_s=None,
                      grace_s=1.0, stdout="o", stderr="e")
    assert launcher.refresh() and not launcher.follow()
    assert launcher.launch_spec(job, spec) is spec
    assert launcher.measured_run(job, RunStatus(RunState.FINISHED)) is job
    assert not launcher.launched_anyway(job)
    launcher.set_busy("GPU-x", True)
    assert loaded == [("GPU-x", True)]  # a claim loads its GPUs (the emulator's power follows)


def test_a_slurm_node_maps_its_gpus_to_gres_indices_and_submits_one_gres_type(slurm_agent):
    agent, launcher, _ = slurm_agent
    ids = sorted(agent._uuid_of)
    assert launcher._slurm_gpu_of_id == {ids[0]: 0, ids[1]: 1}
    job = SimpleNamespace(id=3, planned_gpu_ids=ids, attempts=1, resume_count=2, name="j", slurm_job_id=None,
                          account="nlp", qos="normal",
                          planned_start=datetime(2024, 1, 1, 12, tzinfo=timezone.utc),
                          submitted_at=datetime(2024, 1, 1, 11, tzinfo=timezone.utc))
    spec = LaunchSpec(job_id=3, argv=["true"], cwd="/", env={}, uid=0, gid=0, groups=[], time_limit_s=None,
                      grace_s=1.0, stdout="o", stderr="e", extra={"start_readings": {}})
    slurm = launcher.launch_spec(job, spec).extra["slurm"]
    assert (slurm["gres_type"], slurm["count"], slurm["node"]) == ("h100", 2, "sn")
    assert slurm["comment"] == "carbonsched:3#4"  # attempt 2 plus 2 resumes: a Slurm job of its own
    assert (slurm["account"], slurm["qos"]) == ("nlp", "normal")  # as carbonsched charged it
    with pytest.raises(OSError):
        launcher.launch_spec(SimpleNamespace(**{**vars(job), "planned_gpu_ids": [999]}), spec)


def test_a_slurm_runs_energy_is_over_the_gpus_and_times_slurm_gave_it(slurm_agent, monkeypatch):
    agent, launcher, _ = slurm_agent
    loaded = []
    monkeypatch.setattr(agent.backend, "set_busy", lambda uuid, busy: loaded.append((uuid, busy)))
    agent._set_busy(sorted(agent._uuid_of)[0], True)
    assert loaded == []  # GPU load follows Slurm's allocation, not carbonsched's claims
    ids = sorted(agent._uuid_of)
    job = SimpleNamespace(id=5, gpu_ids=[ids[0]], started_at=datetime.now(timezone.utc))
    started = datetime.now(timezone.utc) - timedelta(seconds=30)
    run = launcher.measured_run(job, RunStatus(RunState.FINISHED, result={"started_at": started.isoformat(),
                                                                          "gpu_idx": [1]}))
    assert (run.id, run.gpu_ids, run.started_at) == (5, [ids[1]], started)
    assert launcher.measured_run(job, RunStatus(RunState.FINISHED, result={})) is None  # never started


def test_a_slurm_outage_claims_nothing_but_the_node_still_heartbeats(slurm_agent, store):
    agent, launcher, slurm = slurm_agent
    with store.read() as conn:
        before = conn.execute(select(nodes.c.last_heartbeat).where(nodes.c.name == "sn")).scalar_one()
    agent.tick()
    assert slurm.calls and slurm.calls[0][0] == "squeue"  # tried to read Slurm's jobs, and only that
    assert len(slurm.calls) == 1
    with store.read() as conn:
        after = conn.execute(select(nodes.c.last_heartbeat).where(nodes.c.name == "sn")).scalar_one()
    assert after > before


def test_a_slurm_job_of_its_own_is_found_again_not_requeued(slurm_agent, monkeypatch):
    agent, launcher, _ = slurm_agent
    held = SimpleNamespace(held=True)
    released = SimpleNamespace(held=False)
    monkeypatch.setattr(launcher.slurm_executor, "jobs", lambda *a, **k: {70: held, 71: released})
    assert not launcher.launched_anyway(SimpleNamespace(id=8, slurm_job_id=None))
    assert not launcher.launched_anyway(SimpleNamespace(id=8, slurm_job_id=70))
    assert launcher.launched_anyway(SimpleNamespace(id=9, slurm_job_id=71))
    assert json.loads((launcher.slurm_executor.run_dir(9) / "slurm.json").read_text()) == {"job_id": 71}
