"""Setting and restoring GPU power limits (issue 29), one contract over the three backends:
emulated, NVML over the strict fake pynvml, amdsmi over the strict fake amdsmi. The fakes
record every set call in the vendor's own unit (mW, uW) and refuse what the driver refuses:
a value out of range, a caller without root."""

from __future__ import annotations

import sys

import pytest

from fakes.fake_amdsmi import STATUS, FakeAmdGpu, FakeAmdSmi
from fakes.fake_pynvml import NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NO_PERMISSION, NVML_SUCCESS, FakeNvml, FakeNvmlGpu
from telemetry.gpu import (
    EmulatedBackend,
    EmulatedModel,
    GpuDriverError,
    GpuNotSupported,
    GpuPermissionDenied,
    PowerLimitOutOfRange,
)
from telemetry.gpu.amd import AmdSmiBackend
from telemetry.gpu.nvml import NvmlBackend

H100 = "GPU-aaaa1111-0000-0000-0000-000000000000"
MI300X = "11111111-0000-1000-8000-000000000000"


class Case:
    def __init__(self, backend, uuid, fake=None, deny=None, set_calls=None):
        self.backend, self.uuid, self.fake = backend, uuid, fake
        self.deny = deny            # make setting need a privilege we lack
        self.set_calls = set_calls  # the vendor-level record: [(uuid, value in vendor units, ok)]


@pytest.fixture(params=["emulated", "fake-nvml", "fake-amdsmi"])
def case(request, monkeypatch, tmp_path):
    if request.param == "emulated":
        b = EmulatedBackend([EmulatedModel("H100", "nvidia", 80, 70, 700)], node="n1", seed=1,
                            limits_path=tmp_path / "limits.json")
        c = Case(b, b.devices()[0].uuid, deny=lambda: setattr(b, "deny_power_limits", True),
                 set_calls=lambda: [(u, w, None) for u, w in b.set_calls])
    elif request.param == "fake-nvml":
        fake = FakeNvml([FakeNvmlGpu(uuid=H100, power_w=650.0)])
        monkeypatch.setitem(sys.modules, "pynvml", fake.module)
        c = Case(NvmlBackend(env={}), H100, fake, deny=lambda: setattr(fake.gpus[0], "privileged", False),
                 set_calls=lambda: [(u, mw / 1000, code == NVML_SUCCESS) for u, mw, code in fake.set_calls])
    else:
        fake = FakeAmdSmi([FakeAmdGpu(uuid=MI300X, power_w=700.0, cap_w=750.0)])
        monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
        c = Case(AmdSmiBackend(env={}), MI300X, fake, deny=lambda: setattr(fake.gpus[0], "privileged", False),
                 set_calls=lambda: [(u, uw / 1e6, st == 0) for u, _, uw, st in fake.set_calls])
    yield c
    c.backend.close()


def test_a_limit_set_reaches_the_gpu_is_read_back_and_restored_to_the_default(case):
    b, u = case.backend, case.uuid
    before = b.power_limit(u)
    assert before.default_w and before.current_w == pytest.approx(before.default_w)
    target = round(0.8 * before.default_w)
    after = b.set_power_limit(u, target)
    assert after.current_w == pytest.approx(target, abs=0.01)
    assert b.power_limit(u).current_w == pytest.approx(target, abs=0.01)
    restored = b.restore_power_limit(u)
    assert restored.current_w == pytest.approx(before.default_w)
    calls = case.set_calls()
    assert [round(w, 3) for _, w, _ in calls] == [target, before.default_w]
    assert all(ok in (True, None) for *_, ok in calls)


def test_an_emulated_board_draws_at_most_its_limit():
    """The fakes report what a test scripts (garbage included); the emulated fleet models
    the board, which throttles to its limit."""
    b = EmulatedBackend([EmulatedModel("H100", "nvidia", 80, 70, 700)], node="n1", seed=1)
    u = b.devices()[0].uuid
    b.set_busy_power_w(u, 690.0)
    b.set_busy(u, True)
    b.read(u)
    uncapped = b.read(u).power_w
    default = b.power_limit(u).default_w
    cap = round(0.6 * default)
    assert uncapped > cap
    b.set_power_limit(u, cap)
    assert b.read(u).power_w <= cap + 1e-6


@pytest.mark.parametrize("fraction", [0.05, 1.2])
def test_a_limit_out_of_range_is_refused_before_the_vendor_is_called(case, fraction):
    b, u = case.backend, case.uuid
    limit = b.power_limit(u)
    with pytest.raises(PowerLimitOutOfRange):
        b.set_power_limit(u, fraction * limit.default_w)
    assert b.power_limit(u).current_w == pytest.approx(limit.current_w)
    if case.fake is not None:
        assert case.set_calls() == []


def test_no_privilege_is_our_permission_error_and_changes_nothing(case):
    b, u = case.backend, case.uuid
    case.deny()
    default = b.power_limit(u).default_w
    with pytest.raises(GpuPermissionDenied) as err:
        b.set_power_limit(u, 0.8 * default)
    assert isinstance(err.value, GpuDriverError)  # what a refused call always was
    assert b.power_limit(u).current_w == pytest.approx(default)
    assert len(case.set_calls()) == 1


def test_the_strict_fakes_refuse_what_the_driver_refuses(monkeypatch):
    fake = FakeNvml([FakeNvmlGpu(uuid=H100)])
    nv = fake.module
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nv.NVMLError) as e:
        nv.nvmlDeviceSetPowerManagementLimit(h, 100_000)  # below the 200 W minimum
    assert e.value.value == NVML_ERROR_INVALID_ARGUMENT
    with pytest.raises(TypeError):
        nv.nvmlDeviceSetPowerManagementLimit(h, 500.0)  # watts as a float: a unit mix-up
    fake.gpus[0].privileged = False
    with pytest.raises(nv.NVMLError) as e:
        nv.nvmlDeviceSetPowerManagementLimit(h, 500_000)
    assert e.value.value == NVML_ERROR_NO_PERMISSION
    assert [c[2] for c in fake.set_calls] == [NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NO_PERMISSION]
    assert fake.gpus[0].limit_mw == 700_000

    amd = FakeAmdSmi([FakeAmdGpu(uuid=MI300X)])
    am = amd.module
    am.amdsmi_init()
    h = am.amdsmi_get_processor_handles()[0]
    with pytest.raises(am.AmdSmiParameterException):
        am.amdsmi_set_power_cap(h, 0, 500.0)
    with pytest.raises(am.AmdSmiLibraryException) as e:
        am.amdsmi_set_power_cap(h, 0, 900_000_000)  # above the 750 W maximum
    assert e.value.err_code == STATUS["AMDSMI_STATUS_INVAL"]
    assert am.amdsmi_get_power_cap_info(h)["power_cap"] == 750_000_000


def test_a_partition_of_an_amd_card_never_sets_the_shared_cap(monkeypatch):
    gpus = [FakeAmdGpu(uuid=f"3333333{i}-0000-1000-8000-000000000000", hip_id=i, partition="DPX",
                       partition_id=i, vram_b=96 * 2**30) for i in range(2)]
    fake = FakeAmdSmi(gpus)
    monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
    b = AmdSmiBackend(env={})
    try:
        with pytest.raises(GpuNotSupported):
            b.set_power_limit(gpus[0].uuid, 300.0)
        assert fake.set_calls == []
    finally:
        b.close()


def test_an_emulated_limit_outlives_the_backend_like_a_real_boards(tmp_path):
    models = [EmulatedModel("H100", "nvidia", 80, 70, 700)]
    first = EmulatedBackend(models, node="n1", limits_path=tmp_path / "limits.json")
    uuid = first.devices()[0].uuid
    first.set_power_limit(uuid, 420.0)
    again = EmulatedBackend(models, node="n1", limits_path=tmp_path / "limits.json")  # after kill -9
    assert again.power_limit(uuid).current_w == 420.0
    assert again.devices()[0].power_limit.current_w == 420.0
    again.restore_power_limit(uuid)
    assert EmulatedBackend(models, node="n1", limits_path=tmp_path / "limits.json").power_limit(uuid).current_w == 700


# -- the agent applies the plan's limit (in-process agent, SQLite and PostgreSQL) ------------

import logging  # noqa: E402

from sqlalchemy import select, update  # noqa: E402

from scheduler.daemon.access import Caller, ServiceConfig  # noqa: E402
from scheduler.daemon.service import JobService  # noqa: E402
from scheduler.clock import utcnow  # noqa: E402
from scheduler.node.agent import Agent  # noqa: E402
from scheduler.node.config import AgentConfig  # noqa: E402
from scheduler.node.power_limits import ENV_POWER_LIMIT  # noqa: E402
from scheduler.store.models import gpus, job_events, jobs  # noqa: E402

import fleet  # noqa: E402

ROOT = Caller(uid=0, gid=0)


def make_agent(store, backend, tmp_path) -> Agent:
    agent = Agent(store, backend, AgentConfig(node="n1", zone="DE", state_dir=tmp_path / "state",
                                              grace_s=1.0, sample_hz=2.0, heartbeat_s=0.2))
    agent.register()
    agent.startup_reconcile()
    return agent


def plan_on(store, job_id: int, gpu_ids: list[int], limit_w: float | None) -> None:
    """What the planner writes for a job: PLANNED on these GPUs now, with this power limit."""
    with store.engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(
            state="PLANNED", planned_node="n1", planned_gpu_ids=gpu_ids, planned_start=utcnow(),
            planned_power_limit_w=limit_w))


def gpu_ids_of(store) -> list[int]:
    with store.read() as conn:
        return sorted(conn.execute(select(gpus.c.id).where(gpus.c.node_name == "n1")).scalars())


def tick_until(agent, store, job_id, states, timeout_s=30.0, during=None):
    def while_running(seen):
        if during is not None and seen[job_id] == "RUNNING":
            during()
    return fleet.tick_until(store, [job_id], states, agent, timeout_s=timeout_s, during=while_running)[job_id]


def row(store, job_id):
    with store.read() as conn:
        return conn.execute(select(jobs).where(jobs.c.id == job_id)).one()


def events(store, job_id) -> list[str]:
    with store.read() as conn:
        return [r.reason for r in conn.execute(select(job_events.c.reason).where(
            job_events.c.job_id == job_id).order_by(job_events.c.id))]


@pytest.fixture(params=["emulated", "fake-nvml", "fake-amdsmi"])
def node(request, monkeypatch, tmp_path, store):
    """An agent over one backend with two GPUs; `current(uuid)` reads the board's limit in W
    straight from the (fake) hardware, not through the backend under test."""
    if request.param == "emulated":
        b = EmulatedBackend([EmulatedModel("H100", "nvidia", 80, 70, 700)] * 2, node="n1", seed=3,
                            limits_path=tmp_path / "limits.json")
        current = lambda u: b.power_limit(u).current_w  # noqa: E731
        deny = lambda: setattr(b, "deny_power_limits", True)  # noqa: E731
    elif request.param == "fake-nvml":
        fake = FakeNvml([FakeNvmlGpu(uuid=f"GPU-{i}aaa1111-0000-0000-0000-000000000000", pci=(0, 0x1B + i, 0))
                         for i in range(2)])
        monkeypatch.setitem(sys.modules, "pynvml", fake.module)
        b = NvmlBackend(env={})
        current = lambda u: next(g.limit_mw for g in fake.gpus if g.uuid == u) / 1000  # noqa: E731
        deny = lambda: [setattr(g, "privileged", False) for g in fake.gpus]  # noqa: E731
    else:
        fake = FakeAmdSmi([FakeAmdGpu(uuid=f"{i}1111111-0000-1000-8000-000000000000", hip_id=i,
                                      asic_serial=f"0x5F3A1C0DE000000{i}") for i in range(2)])
        monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
        b = AmdSmiBackend(env={})
        current = lambda u: next(g.cap_w for g in fake.gpus if g.uuid == u)  # noqa: E731
        deny = lambda: [setattr(g, "privileged", False) for g in fake.gpus]  # noqa: E731
    agent = make_agent(store, b, tmp_path)
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "state" / "logs")
    yield agent, service, current, deny
    agent.stop()
    b.close()


def submit(service, tmp_path, argv, **kw):
    return service.submit(ROOT, {"argv": argv, "gpus": 2, "cwd": str(tmp_path), **kw})["id"]


@pytest.mark.parametrize("ending", ["completed", "failed", "cancelled"])
def test_the_planned_limit_reaches_the_gpus_before_the_start_and_is_restored_at_the_end(node, store, tmp_path, ending):
    agent, service, current, _ = node
    uuids = [d.uuid for d in agent.devices]
    default = agent.backend.power_limit(uuids[0]).default_w
    cap = round(0.7 * default)
    out = tmp_path / "env.txt"
    script = {"completed": f'echo "${ENV_POWER_LIMIT}" > {out}; sleep 0.5',
              "failed": f'echo "${ENV_POWER_LIMIT}" > {out}; sleep 0.5; exit 3',
              "cancelled": f'echo "${ENV_POWER_LIMIT}" > {out}; sleep 30'}[ending]
    job = submit(service, tmp_path, ["sh", "-c", script])
    plan_on(store, job, gpu_ids_of(store), cap)
    seen: list[float] = []

    def during():
        seen.extend(current(u) for u in uuids)
        if ending == "cancelled" and out.exists() and out.read_text().strip():
            service.cancel(ROOT, [job])

    end = {"completed": "COMPLETED", "failed": "FAILED", "cancelled": "CANCELLED"}[ending]
    assert tick_until(agent, store, job, {end}, during=during) == end
    assert seen and all(w == pytest.approx(cap) for w in seen)  # capped while it ran
    assert out.read_text().strip() == f"{cap:g}"
    assert [current(u) for u in uuids] == [pytest.approx(default)] * 2  # restored after
    r = row(store, job)
    assert r.power_limit_w == cap and r.power_limit_note is None
    assert any(f"power limit set to {cap:g} W" in (e or "") for e in events(store, job))


def test_a_job_without_a_planned_limit_leaves_the_gpus_alone(node, store, tmp_path):
    agent, service, current, _ = node
    job = submit(service, tmp_path, ["sh", "-c", f'echo "x${ENV_POWER_LIMIT}" > {tmp_path}/env.txt'])
    plan_on(store, job, gpu_ids_of(store), None)
    assert tick_until(agent, store, job, {"COMPLETED"}) == "COMPLETED"
    assert (tmp_path / "env.txt").read_text().strip() == "x"
    assert row(store, job).power_limit_w is None


def test_no_privilege_runs_the_job_uncapped_with_a_clear_event_logged_once(node, store, tmp_path, caplog):
    agent, service, current, deny = node
    deny()
    uuids = [d.uuid for d in agent.devices]
    default = agent.backend.power_limit(uuids[0]).default_w
    caplog.set_level(logging.WARNING, logger="scheduler.node.power_limits")
    for _ in range(2):
        job = submit(service, tmp_path, ["sh", "-c", f'echo "x${ENV_POWER_LIMIT}" > {tmp_path}/env.txt'])
        plan_on(store, job, gpu_ids_of(store), round(0.7 * default))
        assert tick_until(agent, store, job, {"COMPLETED"}) == "COMPLETED"
        r = row(store, job)
        assert r.power_limit_w is None
        assert "runs uncapped" in r.power_limit_note and "no privilege" in r.power_limit_note
        assert "CAP_SYS_ADMIN" in r.power_limit_note and "systemd/power-limits.conf" in r.power_limit_note
        assert any("runs uncapped" in (e or "") and "no privilege" in e for e in events(store, job))
        assert (tmp_path / "env.txt").read_text().strip() == "x"  # not told a limit it does not have
        assert [current(u) for u in uuids] == [pytest.approx(default)] * 2
    warned = [r for r in caplog.records if "runs uncapped" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]


def test_at_start_up_the_agent_restores_every_gpu_that_runs_no_job_of_ours(node, store, tmp_path):
    """Crash recovery: a new agent finds one GPU capped by a job it adopts (it stays capped)
    and one capped with no job on it (left by a killed agent): that one is restored."""
    agent, service, current, _ = node
    uuids = [d.uuid for d in agent.devices]
    ids = gpu_ids_of(store)
    default = agent.backend.power_limit(uuids[0]).default_w
    cap = round(0.7 * default)
    job = service.submit(ROOT, {"argv": ["sleep", "30"], "gpus": 1, "cwd": str(tmp_path)})["id"]
    plan_on(store, job, [ids[0]], cap)
    tick_until(agent, store, job, {"RUNNING"})
    agent.backend.set_power_limit(uuids[1], cap)  # as a killed agent may leave it
    agent.sampler.stop()
    again = make_agent(store, agent.backend, tmp_path)  # the restarted agent, same boards
    try:
        assert current(uuids[0]) == pytest.approx(cap)      # its adopted job's limit stays
        assert current(uuids[1]) == pytest.approx(default)  # nobody's: restored
        service.cancel(ROOT, [job])
        tick_until(again, store, job, {"CANCELLED"})
        assert current(uuids[0]) == pytest.approx(default)
    finally:
        again.stop()


def test_show_and_the_receipt_say_what_limit_was_planned_and_whether_it_was_applied():
    from scheduler.accounting.receipts import power_limit
    from scheduler.cli.output import power_limit_text

    assert power_limit({"planned_power_limit_w": None, "power_limit_w": None}) is None
    assert power_limit_text(None, None, None).startswith("- (the GPUs' default)")
    uncapped = {"planned_power_limit_w": 490.0, "power_limit_w": None,
                "power_limit_note": "runs uncapped: ... (no privilege: NVML_ERROR_NO_PERMISSION)",
                "est_gco2": 80.0, "est_uncapped_gco2": 95.0}
    r = power_limit(uncapped)
    assert r["planned_w"] == 490.0 and r["applied_w"] is None and "no privilege" in r["note"]
    assert r["estimate_uncapped"]["gco2"] == 95.0 and r["estimate_capped"]["gco2"] == 80.0
    text = power_limit_text(490.0, None, uncapped["power_limit_note"], 95.0, 80.0)
    assert "runs uncapped" in text and "no privilege" in text and "80.0 g vs 95.0 g" in text
    assert "applied 490 W" in power_limit_text(490.0, 490.0, None)


def test_gpu_check_sets_80_percent_checks_it_under_load_and_restores_the_default(case, tmp_path):
    import io

    from test_gpu_backends import load_gpu_check

    gpu_check = load_gpu_check()
    out = io.StringIO()
    default = case.backend.power_limit(case.uuid).default_w
    if case.fake is None:  # the emulated board draws a load's power, capped at the limit
        case.backend.set_busy_power_w(case.uuid, 0.95 * default)
        case.backend.set_busy(case.uuid, True)
    else:  # a fake reports its scripted power: script one under the 80 % limit
        for g in case.fake.gpus:
            g.power_w = 0.7 * default
    rc = gpu_check.power_limit_check(case.backend, fraction=0.8, seconds=0.3, hz=20, use_load=False, out=out)
    text = out.getvalue()
    assert rc == 0, text
    assert f"set {0.8 * default:.0f} W" in text and "ok" in text and "restored" in text
    assert case.backend.power_limit(case.uuid).current_w == pytest.approx(default)
    assert [round(w) for _, w, _ in case.set_calls()] == [round(0.8 * default), round(default)]


def test_gpu_check_reports_a_limit_not_held_or_not_settable_and_leaves_the_default(case):
    import io

    from test_gpu_backends import load_gpu_check

    gpu_check = load_gpu_check()
    default = case.backend.power_limit(case.uuid).default_w
    if case.fake is not None:
        for g in case.fake.gpus:
            g.power_w = 0.95 * default  # a board that ignores its limit
        out = io.StringIO()
        rc = gpu_check.power_limit_check(case.backend, fraction=0.8, seconds=0.3, hz=20, use_load=False, out=out)
        assert rc == gpu_check.EXIT_LIMIT_NOT_HELD and "ABOVE THE LIMIT" in out.getvalue()
    else:
        case.deny()
        out = io.StringIO()
        rc = gpu_check.power_limit_check(case.backend, fraction=0.8, seconds=0.3, hz=20, use_load=False, out=out)
        assert rc == gpu_check.EXIT_LIMIT_NOT_SET and "could not set" in out.getvalue()
    assert case.backend.power_limit(case.uuid).current_w == pytest.approx(default)
