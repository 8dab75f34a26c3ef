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
