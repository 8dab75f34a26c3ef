"""Partition layouts at the vendor seam: NVIDIA MIG instances through NVML and AMD memory
partition modes through AMD SMI, read by the real backends from the strict fakes of the vendor
modules (tests/fakes), whose added calls are checked against the installed packages."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

from fakes.fake_amdsmi import MI300X_VRAM_B, FakeAmdGpu, FakeAmdSmi
from fakes.fake_pynvml import NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE, FakeMig, FakeNvml, FakeNvmlGpu
from telemetry.gpu.amd import AmdSmiBackend
from telemetry.gpu.nvml import NvmlBackend

ON = (NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE)


def h100_with(migs, mode=ON, uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000") -> FakeNvmlGpu:
    return FakeNvmlGpu(uuid=uuid, mig_mode=mode, migs=migs)


def backend(monkeypatch, gpus) -> NvmlBackend:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus).module)
    return NvmlBackend(env={})


def test_a_gpu_in_mig_mode_lists_each_mig_device_with_its_uuid_instance_slices_and_memory(monkeypatch):
    migs = [FakeMig(uuid="MIG-11111111-1111-1111-1111-111111111111", gpu_instance_id=2, slices=3,
                    memory_mib=40192),
            None,  # an empty slot: NVML_ERROR_NOT_FOUND
            FakeMig(uuid="MIG-22222222-2222-2222-2222-222222222222", gpu_instance_id=9, slices=1,
                    memory_mib=9984)]
    (d,) = backend(monkeypatch, [h100_with(migs)]).devices()
    assert d.mig_enabled
    assert [(m.uuid, m.gpu_instance_id, m.compute_instance_id, m.slices, m.memory_mib)
            for m in d.mig_instances] == [
        ("MIG-11111111-1111-1111-1111-111111111111", 2, 0, 3, 40192.0),
        ("MIG-22222222-2222-2222-2222-222222222222", 9, 0, 1, 9984.0)]
    # the GPU itself is still the whole card for power and memory
    assert d.uuid.startswith("GPU-") and d.memory_gib == pytest.approx(79.65, abs=0.01)


@pytest.mark.parametrize("mode", [None, (NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_DISABLE),
                                  (NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE)])
def test_a_gpu_without_mig_or_with_it_off_or_only_pending_is_whole(monkeypatch, mode):
    (d,) = backend(monkeypatch, [h100_with([FakeMig()], mode=mode)]).devices()
    assert not d.mig_enabled and d.mig_instances == ()


def test_mig_mode_on_without_instances_is_said_in_the_notes(monkeypatch):
    (d,) = backend(monkeypatch, [h100_with([])]).devices()
    assert d.mig_enabled and d.mig_instances == ()
    assert any("no MIG device is configured" in n for n in d.capabilities.notes)


def test_a_mig_device_without_attributes_still_counts_with_its_memory(monkeypatch):
    g = h100_with([FakeMig(slices=2, memory_mib=20096)])
    g.unsupported.add("nvmlDeviceGetAttributes")
    (d,) = backend(monkeypatch, [g]).devices()
    (m,) = d.mig_instances
    assert m.slices is None and m.memory_mib == 20096.0
    assert any("attributes" in n for n in d.capabilities.notes)


def test_the_fake_attributes_have_the_fields_of_the_real_structure():
    real = pytest.importorskip("pynvml")
    fake = FakeNvml([h100_with([FakeMig()])]).module
    fake.nvmlInit()
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(fake.nvmlDeviceGetHandleByIndex(0), 0)
    fields = [name for name, _ in real.c_nvmlDeviceAttributes._fields_]
    assert sorted(vars(fake.nvmlDeviceGetAttributes(mig))) == sorted(fields)
    for name in ("nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
                 "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId", "nvmlDeviceGetAttributes"):
        assert list(inspect.signature(getattr(fake, name)).parameters) == \
            list(inspect.signature(getattr(real, name)).parameters), name


def test_the_amd_memory_partition_call_is_the_real_packages():
    spec = importlib.util.find_spec("amdsmi")
    assert spec is not None and spec.origin
    source = (Path(spec.origin).parent / "amdsmi_interface.py").read_text()
    assert "def amdsmi_get_gpu_memory_partition(processor_handle: processor_handle):" in source
    assert "def amdsmi_get_gpu_compute_partition(processor_handle: processor_handle):" in source


def test_each_amd_partition_reports_its_cards_memory_partition_mode(monkeypatch):
    card = [FakeAmdGpu(uuid=f"0xBEEF-{i}", hip_id=i, partition="QPX", partition_id=i, asic_serial="0xBEEF",
                       bdf=f"0000:0c:00.{i}", vram_b=MI300X_VRAM_B // 4, memory_partition="NPS4")
            for i in range(4)]
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi(card).module)
    devices = AmdSmiBackend(env={}).devices()
    assert [(d.partition_mode, d.partitions, d.memory_partition) for d in devices] == [("QPX", 4, "NPS4")] * 4


def test_an_amd_gpu_that_does_not_report_a_memory_partition_has_none(monkeypatch):
    g = FakeAmdGpu()
    g.unsupported.add("amdsmi_get_gpu_memory_partition")
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi([g]).module)
    (d,) = AmdSmiBackend(env={}).devices()
    assert d.memory_partition is None and d.partitions == 1
