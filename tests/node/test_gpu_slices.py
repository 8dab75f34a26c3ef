"""Jobs on slices of a GPU, end to end in-process on SQLite and PostgreSQL: a node's partition
layout in the store (MIG instances read through the fake NVML, AMD compute partitions and
declared time-sliced shares from the emulated fleet), `--gpu-fraction` and `--mig` submits
refused when no GPU of the fleet offers such a slice, and a job on a slice seeing that slice's
device and nothing else."""

from __future__ import annotations

import json
import sys
import time

import pytest
from sqlalchemy import select

from fakes.fake_pynvml import NVML_DEVICE_MIG_ENABLE, FakeMig, FakeNvml, FakeNvmlGpu
from policies import get_policy
from scheduler.daemon.access import Caller, RequestError, ServiceConfig
from scheduler.daemon.plan_store import read_gpus
from scheduler.daemon.planner import Planner
from scheduler.daemon.service import JobService
from scheduler.fleet_spec import parse_emulated_fleet
from scheduler.node.agent import Agent
from scheduler.node.config import AgentConfig
from scheduler.store.models import gpu_instances, gpus, jobs
from telemetry.gpu import EmulatedBackend
from telemetry.gpu.nvml import NvmlBackend

import fleet

ROOT = Caller(uid=0, gid=0)
VISIBLE = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
MIG_SMALL = "MIG-5a5a5a5a-0000-4000-8000-000000000001"
MIG_BIG = "MIG-5a5a5a5a-0000-4000-8000-000000000002"


def agent_on(store, backend, tmp_path, **config) -> Agent:
    agent = Agent(store, backend, AgentConfig(node="n1", zone="DE", state_dir=tmp_path / "state",
                                              grace_s=1.0, heartbeat_s=0.2, **config))
    agent.register()
    agent.startup_reconcile()
    return agent


@pytest.fixture
def service(store, tmp_path):
    return JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "state" / "logs")


def env_probe(tmp_path, name: str) -> list[str]:
    """A job command that writes its visible-devices variables to a file as JSON."""
    out = tmp_path / f"{name}.json"
    code = ("import json, os, sys; json.dump({k: os.environ.get(k) for k in %r}, open(sys.argv[1], 'w'))"
            % (VISIBLE,))
    return [sys.executable, "-c", code, str(out)]


def seen(tmp_path, name: str) -> dict:
    return json.loads((tmp_path / f"{name}.json").read_text())


def run(store, agent, ids, states=("COMPLETED",)):
    planner = Planner(store, get_policy("fifo"))
    return fleet.tick_until(store, ids, set(states), planner, agent, timeout_s=30.0)


def row(store, job_id):
    with store.read() as conn:
        return conn.execute(select(jobs).where(jobs.c.id == job_id)).one()


def instances(store):
    with store.read() as conn:
        return list(conn.execute(select(gpu_instances).order_by(gpu_instances.c.id)))


@pytest.fixture
def mig_node(store, tmp_path, monkeypatch):
    """Node n1 with an H100 in MIG mode (3g.40gb + 1g.10gb) and a whole H100, through the fake NVML."""
    mig_gpu = FakeNvmlGpu(uuid="GPU-11111111-0000-0000-0000-000000000000", pci=(0, 0x1B, 0),
                          mig_mode=(NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE),
                          migs=[FakeMig(uuid=MIG_BIG, gpu_instance_id=2, slices=3, memory_mib=40192),
                                None,
                                FakeMig(uuid=MIG_SMALL, gpu_instance_id=9, slices=1, memory_mib=9984)])
    whole = FakeNvmlGpu(uuid="GPU-22222222-0000-0000-0000-000000000000", pci=(0, 0x2B, 0))
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([mig_gpu, whole]).module)
    agent = agent_on(store, NvmlBackend(env={}), tmp_path)
    yield agent
    agent.stop()


def test_the_store_holds_each_mig_instance_with_its_profile_share_and_device(mig_node, store):
    rows = instances(store)
    assert [(r.kind, r.profile, round(r.fraction, 3), r.memory_gib, r.slices, r.gpu_instance_id, r.device)
            for r in rows] == [("mig", "3g.40gb", 0.429, 40.0, 3, 2, MIG_BIG),
                               ("mig", "1g.10gb", 0.143, 10.0, 1, 9, MIG_SMALL)]
    with store.read() as conn:
        flags = dict(conn.execute(select(gpus.c.index, gpus.c.mig_enabled)).all())
        planned = [g.index for g in read_gpus(conn)]
    assert flags == {0: True, 1: False}
    assert planned == [1]  # the planner never sees the GPU in MIG mode as a whole GPU


def test_a_job_on_a_mig_instance_sees_that_instance_and_nothing_else(mig_node, store, service, tmp_path):
    job = service.submit(ROOT, {"argv": env_probe(tmp_path, "mig"), "mig_profile": "1g.10gb"})["id"]
    assert run(store, mig_node, [job]) == {job: "COMPLETED"}
    assert seen(tmp_path, "mig") == {"CUDA_VISIBLE_DEVICES": MIG_SMALL, "HIP_VISIBLE_DEVICES": None,
                                     "ROCR_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    r = row(store, job)
    assert r.gpu_instance == MIG_SMALL and r.gpu_indices == [0]
    assert all(i.job_id is None for i in instances(store))  # the instance is free again


def test_a_fraction_takes_the_smallest_instance_that_gives_it(mig_node, store, service, tmp_path):
    small = service.submit(ROOT, {"argv": env_probe(tmp_path, "f10"), "gpu_fraction": 0.1})["id"]
    big = service.submit(ROOT, {"argv": env_probe(tmp_path, "f25"), "gpu_fraction": 0.25})["id"]
    assert run(store, mig_node, [small, big]) == {small: "COMPLETED", big: "COMPLETED"}
    assert seen(tmp_path, "f10")["CUDA_VISIBLE_DEVICES"] == MIG_SMALL
    assert seen(tmp_path, "f25")["CUDA_VISIBLE_DEVICES"] == MIG_BIG


def test_whole_gpu_jobs_run_on_the_whole_gpu_only(mig_node, store, service, tmp_path):
    job = service.submit(ROOT, {"argv": env_probe(tmp_path, "whole"), "gpus": 1})["id"]
    assert run(store, mig_node, [job]) == {job: "COMPLETED"}
    assert seen(tmp_path, "whole")["CUDA_VISIBLE_DEVICES"] == "1"
    assert row(store, job).gpu_instance is None


@pytest.mark.parametrize("body, words", [
    ({"mig_profile": "2g.20gb"}, "no GPU of the fleet offers a 2g.20gb MIG instance"),
    ({"gpu_fraction": 0.5}, "no GPU of the fleet offers 0.5 of a GPU"),
    ({"gpu_fraction": 0.1, "gpu_mem_gib": 50}, "with 50 GiB"),
    ({"mig_profile": "ten-gigs"}, "not a MIG profile name"),
    ({"mig_profile": "1g.10gb", "gpu_fraction": 0.1}, "not both"),
    ({"gpu_fraction": 0.1, "gpus": 2}, "asks for whole GPUs"),
    ({"gpu_fraction": 1.0}, "below 1"),
])
def test_a_slice_no_gpu_can_serve_is_refused_with_one_line(mig_node, store, service, body, words):
    with pytest.raises(RequestError) as e:
        service.submit(ROOT, {"argv": ["true"], **body})
    assert e.value.status == 400 and words in str(e.value) and "\n" not in str(e.value)
    with store.read() as conn:
        assert conn.execute(select(jobs.c.id)).all() == []  # nothing stored


def test_a_slice_job_waits_with_its_reason_while_its_slice_is_busy(mig_node, store, service, tmp_path):
    first = service.submit(ROOT, {"argv": ["sleep", "30"], "mig_profile": "1g.10gb"})["id"]
    second = service.submit(ROOT, {"argv": ["true"], "mig_profile": "1g.10gb"})["id"]
    assert run(store, mig_node, [first], states=("RUNNING",)) == {first: "RUNNING"}
    planner = Planner(store, get_policy("fifo"))
    planner.tick()
    mig_node.tick()
    r = row(store, second)
    assert r.state == "PENDING" and "GpuSlice" in r.reason
    service.cancel(ROOT, [first])
    assert run(store, mig_node, [second]) == {second: "COMPLETED"}


def test_a_changed_mig_layout_replaces_the_stored_instances(mig_node, store):
    fake_gpu = mig_node.backend._devices[0].handle.gpu
    fake_gpu.migs = [FakeMig(uuid="MIG-77777777-0000-4000-8000-000000000007", slices=7, memory_mib=81008)]
    mig_node.backend = NvmlBackend(env={})
    mig_node.register()
    assert [(i.uuid, i.profile, i.fraction) for i in instances(store)] == [
        ("MIG-77777777-0000-4000-8000-000000000007", "7g.80gb", 1.0)]


def test_declared_shares_run_two_jobs_on_one_gpu_with_its_index(store, service, tmp_path):
    backend = EmulatedBackend(parse_emulated_fleet("1xH100"), node="n1", seed=7)
    agent = agent_on(store, backend, tmp_path, gpu_shares=4)
    try:
        assert [(i.kind, i.profile, i.fraction, i.memory_gib, i.device) for i in instances(store)] == \
            [("share", "1/4", 0.25, 20.0, "0")] * 4
        with pytest.raises(RequestError, match="no GPU of the fleet offers 0.3 of a GPU"):
            service.submit(ROOT, {"argv": ["true"], "gpu_fraction": 0.3})
        with pytest.raises(RequestError, match="no GPU of the fleet offers a 1g.10gb MIG instance"):
            service.submit(ROOT, {"argv": ["true"], "mig_profile": "1g.10gb"})
        a = service.submit(ROOT, {"argv": ["sleep", "30"], "gpu_fraction": 0.25})["id"]
        b = service.submit(ROOT, {"argv": env_probe(tmp_path, "share"), "gpu_fraction": 0.2})["id"]
        assert run(store, agent, [a, b], states=("RUNNING", "COMPLETED")) in (
            {a: "RUNNING", b: "COMPLETED"}, {a: "RUNNING", b: "RUNNING"})
        assert seen_eventually(tmp_path, "share", agent, store)["CUDA_VISIBLE_DEVICES"] == "0"
        held = [i.job_id for i in instances(store) if i.job_id is not None]
        assert a in held
        service.cancel(ROOT, [a])
        run(store, agent, [a, b], states=("CANCELLED", "COMPLETED"))
    finally:
        agent.stop()


def seen_eventually(tmp_path, name, agent, store) -> dict:
    """What the job wrote, once it has written it (ticking the agent meanwhile, bounded)."""
    path = tmp_path / f"{name}.json"
    for _ in range(600):
        if path.exists() and path.stat().st_size:
            return seen(tmp_path, name)
        agent.tick()
        time.sleep(0.05)
    raise TimeoutError(f"{path} never written")


def test_an_amd_compute_partition_is_a_slice_seen_by_its_index(store, service, tmp_path):
    backend = EmulatedBackend(parse_emulated_fleet("1xMI300X:partition=QPX:nps=NPS4"), node="n1", seed=7)
    agent = agent_on(store, backend, tmp_path)
    try:
        with store.read() as conn:
            assert conn.execute(select(gpus.c.partition_mode, gpus.c.partitions, gpus.c.memory_partition)
                                .distinct()).all() == [("QPX", 4, "NPS4")]
        with pytest.raises(RequestError, match="no GPU of the fleet offers 0.5 of a GPU"):
            service.submit(ROOT, {"argv": ["true"], "gpu_fraction": 0.5})
        job = service.submit(ROOT, {"argv": env_probe(tmp_path, "amd"), "gpu_fraction": 0.25})["id"]
        assert run(store, agent, [job]) == {job: "COMPLETED"}
        assert seen(tmp_path, "amd") == {"CUDA_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0",
                                         "ROCR_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": None}
        r = row(store, job)
        assert r.gpu_instance is None and r.gpu_indices == [0]
    finally:
        agent.stop()


def test_nodes_shows_each_instance_and_who_runs_on_it(mig_node, store, service, tmp_path):
    from scheduler.cli.output import nodes_table

    job = service.submit(ROOT, {"argv": ["sleep", "30"], "mig_profile": "1g.10gb"})["id"]
    assert run(store, mig_node, [job], states=("RUNNING",)) == {job: "RUNNING"}
    (n,) = service.nodes(ROOT)
    mig_gpu, whole = n["gpus"]
    assert (mig_gpu["mig_enabled"], mig_gpu["busy"], mig_gpu["state"], whole["mig_enabled"], whole["instances"],
            whole["state"]) == (True, True, "BUSY", False, [], "IDLE")
    assert [(i["kind"], i["profile"], i["uuid"], i["busy"], i["job"]) for i in mig_gpu["instances"]] == [
        ("mig", "3g.40gb", MIG_BIG, False, None), ("mig", "1g.10gb", MIG_SMALL, True, job)]
    # another user sees that the instance is busy, not whose job it is
    (other,) = service.nodes(Caller(uid=4242, gid=4242))
    assert [i["job"] for i in other["gpus"][0]["instances"]] == [None, None]
    lines = nodes_table([n]).splitlines()
    assert any("nvidia:0/1" in line and "MIG 1g.10gb" in line and f" {job} " in line + " " for line in lines)
    assert any("H100 (MIG)" in line for line in lines)
    shown = service.get_job(ROOT, job)
    assert (shown["mig_profile"], shown["gpu_fraction"], shown["gpu_instance"]) == ("1g.10gb", None, MIG_SMALL)
    service.cancel(ROOT, [job])
    run(store, mig_node, [job], states=("CANCELLED",))


def test_a_whole_gpu_job_only_a_shared_gpu_could_hold_is_refused_at_submit(store, service, tmp_path):
    backend = EmulatedBackend(parse_emulated_fleet("1xH200:mig=7g.141gb,1xH100"), node="n1", seed=7)
    agent = agent_on(store, backend, tmp_path)
    try:
        with pytest.raises(RequestError) as e:  # 120 GiB: only the H200, which runs MIG instances
            service.submit(ROOT, {"argv": ["true"], "gpu_mem_gib": 120})
        assert 400 <= e.value.status < 500
        job = service.submit(ROOT, {"argv": ["true"], "mig_profile": "7g.141gb", "gpu_mem_gib": 120})["id"]
        assert run(store, agent, [job]) == {job: "COMPLETED"}
    finally:
        agent.stop()


def test_a_shared_gpu_stays_loaded_while_another_slice_job_runs_on_it(store, service, tmp_path):
    backend = EmulatedBackend(parse_emulated_fleet("1xH100"), node="n1", seed=7)
    agent = agent_on(store, backend, tmp_path, gpu_shares=2)
    try:
        short = service.submit(ROOT, {"argv": ["true"], "gpu_fraction": 0.5})["id"]
        long = service.submit(ROOT, {"argv": ["sleep", "30"], "gpu_fraction": 0.5})["id"]
        assert run(store, agent, [short]) == {short: "COMPLETED"}
        assert run(store, agent, [long], states=("RUNNING",)) == {long: "RUNNING"}
        agent.tick()
        uuid = backend.devices()[0].uuid
        assert backend.read(uuid).utilization_pct > 0  # the long job's load, after the short one ended
        service.cancel(ROOT, [long])
        run(store, agent, [long], states=("CANCELLED",))
        assert backend.read(uuid).utilization_pct == 0
    finally:
        agent.stop()
