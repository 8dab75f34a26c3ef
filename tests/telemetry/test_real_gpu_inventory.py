"""What a node agent registers from real drivers (issue 17), through the strict vendor fakes:
model names as drivers print them, nominal memory for `--gpu-mem`, power limits stored and
shown, unknown parts planned generically, and MI300X compute partitions."""

from __future__ import annotations

import logging
import sys

import pytest
from sqlalchemy import select

from fakes.fake_amdsmi import FakeAmdGpu, FakeAmdSmi
from fakes.fake_pynvml import REPORTED, FakeNvml, FakeNvmlGpu
from policies import get_policy
from scheduler.cli.output import nodes_table
from scheduler.daemon.access import Caller, ServiceConfig
from scheduler.daemon.planner import Planner
from scheduler.daemon.service import JobService
from scheduler.metrics import GpuCollector
from scheduler.node.agent import Agent
from scheduler.node.config import AgentConfig
from scheduler.store.models import gpus
from telemetry.gpu.amd import AmdSmiBackend
from telemetry.gpu.nvml import NvmlBackend

ROOT = Caller(uid=0, gid=0)


def nvidia(name_key: str, uuid: str, bus: int, **kw) -> FakeNvmlGpu:
    name, total_b, limit_mw = REPORTED[name_key]
    kw.setdefault("limit_mw", limit_mw)
    kw.setdefault("max_limit_mw", max(limit_mw, kw["limit_mw"]))
    return FakeNvmlGpu(name=name, uuid=uuid, pci=(0, bus, 0), memory_total_b=total_b, **kw)


@pytest.fixture
def node(store, tmp_path, monkeypatch):
    """An agent on a node with whatever fake NVIDIA GPUs a test passes in."""
    made = []

    def make(fake_gpus: list[FakeNvmlGpu], *, backend=None):
        if backend is None:
            monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(fake_gpus).module)
            backend = NvmlBackend(env={})
        agent = Agent(store, backend, AgentConfig(node="n1", zone="DE", state_dir=tmp_path / "state",
                                                  heartbeat_s=0.0))
        agent.register()
        made.append(agent)
        return agent

    yield make
    for a in made:
        a.stop()
        a.backend.close()


def rows(store):
    with store.read() as conn:
        return {r.uuid: r for r in conn.execute(select(gpus))}


def test_gpu_mem_80_fits_a_real_h100_80gb_that_reports_81559_mib(store, node, tmp_path):
    """nvidia-smi shows 81559MiB (79.6 GiB) on an H100 80GB: --gpu-mem 80 must be placed."""
    node([nvidia("H100", "GPU-h", 0x1B)])
    row = rows(store)["GPU-h"]
    assert row.model == "H100"
    assert row.memory_gib == 80 and row.memory_reported_gib == pytest.approx(79.65, abs=0.01)
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs")
    job = service.submit(ROOT, {"argv": ["true"], "gpus": 1, "gpu_mem_gib": 80, "est_runtime_s": 60})["id"]
    Planner(store, get_policy("greedy")).tick()
    (mine,) = [n for n in service.nodes(ROOT) if n["name"] == "n1"]
    assert mine["gpus"][0]["memory_gib"] == 80
    from scheduler.store.models import jobs
    with store.read() as conn:
        assert conn.execute(select(jobs.c.state).where(jobs.c.id == job)).scalar_one() == "PLANNED"


@pytest.mark.parametrize("key, model, nominal", [
    ("H100", "H100", 80), ("A100", "A100", 80), ("A100-40GB", "A100-40GB", 40),
    ("H100-NVL", "H100-NVL", 94), ("B200", "B200", 180), ("H200", "H200", 141),
])
def test_each_part_registers_as_its_own_catalog_row_with_its_data_sheet_memory(store, node, key, model, nominal):
    node([nvidia(key, "GPU-x", 0x1B)])
    row = rows(store)["GPU-x"]
    assert (row.model, row.memory_gib) == (model, nominal)
    assert row.memory_reported_gib <= nominal


def test_an_h100_pcie_is_not_planned_as_the_sxm_part(store, node):
    node([FakeNvmlGpu(name="NVIDIA H100 PCIe", uuid="GPU-p", memory_total_b=81559 * 2**20,
                      limit_mw=350_000, max_limit_mw=350_000, default_limit_mw=350_000)])
    assert rows(store)["GPU-p"].model == "H100-PCIe"


def test_an_unknown_part_warns_once_and_is_planned_from_what_its_driver_reports(store, node, caplog, tmp_path):
    h800 = FakeNvmlGpu(name="NVIDIA H800", uuid="GPU-u", memory_total_b=81559 * 2**20,
                       limit_mw=350_000, max_limit_mw=350_000, default_limit_mw=350_000)
    with caplog.at_level(logging.WARNING):
        agent = node([h800])
        agent.register()  # again: no second warning
    warnings = [r for r in caplog.records if "not in the catalog" in r.getMessage()]
    assert len(warnings) == 1 and "NVIDIA H800" in warnings[0].getMessage()
    row = rows(store)["GPU-u"]
    assert row.model == "NVIDIA H800"  # never "H100"
    assert row.memory_gib == 80 and row.power_limit_w == 350
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs")
    service.submit(ROOT, {"argv": ["true"], "gpus": 1, "gpu_mem_gib": 80, "est_runtime_s": 3600})
    snap, plan = Planner(store, get_policy("greedy")).preview()
    (a,) = plan.assignments
    assert a.estimate.energy_j / a.estimate.runtime_s <= 350.0


def test_power_limits_are_stored_shown_and_exported(store, node, tmp_path):
    agent = node([nvidia("H100", "GPU-c", 0x1B, limit_mw=500_000, min_limit_mw=200_000,
                         max_limit_mw=700_000)])
    row = rows(store)["GPU-c"]
    assert (row.power_limit_w, row.power_limit_min_w, row.power_limit_max_w) == (500, 200, 700)
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs")
    (n,) = service.nodes(ROOT)
    g = n["gpus"][0]
    assert (g["power_limit_w"], g["power_limit_min_w"], g["power_limit_max_w"]) == (500, 200, 700)
    assert {"id", "model", "memory_gib", "power_w", "healthy", "job"} <= set(g)  # the old keys stay
    table = nodes_table([n]).splitlines()
    assert "LIMIT_W" in table[0] and " 500 " in table[-1]
    metrics = {(m.name, s.labels.get("uuid")): s.value for m in GpuCollector(agent).collect() for s in m.samples}
    assert metrics[("carbonsched_gpu_power_limit_watts", "GPU-c")] == 500
    assert metrics[("carbonsched_gpu_power_limit_max_watts", "GPU-c")] == 700


def test_a_changed_power_limit_reaches_the_store_and_the_plan(store, node, monkeypatch, tmp_path):
    fake_gpu = nvidia("H100", "GPU-c", 0x1B)
    agent = node([fake_gpu])
    assert rows(store)["GPU-c"].power_limit_w == 700
    fake_gpu.limit_mw = 450_000  # an operator ran nvidia-smi -pl 450
    monkeypatch.setattr("scheduler.node.power_limits.POWER_LIMIT_REFRESH_S", 0.0)
    agent.tick()
    assert rows(store)["GPU-c"].power_limit_w == 450
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs")
    service.submit(ROOT, {"argv": ["true"], "gpus": 1, "est_runtime_s": 3600})
    _, plan = Planner(store, get_policy("greedy")).preview()
    (a,) = plan.assignments
    assert a.estimate.energy_j / a.estimate.runtime_s <= 450.0


def test_mi300x_cpx_partitions_register_as_eight_gpus_with_a_share_each(store, node, monkeypatch):
    card = [FakeAmdGpu(uuid=f"p{i}", hip_id=i, partition="CPX", partition_id=i,
                       vram_b=25767706624, power_w=560.0) for i in range(8)]
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi(card).module)
    node([], backend=AmdSmiBackend(env={}))
    got = rows(store)
    assert len(got) == 8
    for r in got.values():
        assert (r.model, r.memory_gib) == ("MI300X", 24)
        assert r.power_limit_w == pytest.approx(750 / 8)


def test_the_power_limit_revision_upgrades_a_database_to_match_the_models(db_url):
    """`alembic upgrade head` then `alembic check`: the gpus table carries the power limits."""
    from alembic import command
    from sqlalchemy import inspect

    from scheduler.store import Store
    from scheduler.store.engine import alembic_config

    s = Store(db_url)
    try:
        s.upgrade()
        with s.engine.connect() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns("gpus")}
        assert {"power_limit_w", "power_limit_min_w", "power_limit_max_w", "memory_reported_gib"} <= columns
        assert s.check() == []
        with s.engine.begin() as conn:
            command.check(alembic_config(conn))  # raises AutogenerateDiffsDetected on any drift
    finally:
        s.dispose()
