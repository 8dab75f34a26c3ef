"""GPU backends: one contract for emulated, NVML and amdsmi, then what each vendor adds.

The vendor backends run for real on fakes of the vendor modules (tests/fakes), installed in
sys.modules: nothing here needs a GPU.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import inspect
import io
import logging
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from fakes import fake_amdsmi, fake_pynvml
from fakes.fake_amdsmi import MI300X_VRAM_B, UINT16_MAX, UINT32_MAX, UINT64_MAX, FakeAmdGpu, FakeAmdSmi
from fakes.fake_pynvml import REPORTED, FakeNvml, FakeNvmlGpu
from telemetry.gpu import (
    EmulatedBackend,
    EmulatedModel,
    GpuBackend,
    GpuDriverError,
    GpuError,
    GpuLibraryMissing,
    GpuLost,
    GpuNotFound,
    detect_backend,
    probe_backends,
)
from telemetry.gpu.amd import AmdSmiBackend, cap_watts, power_watts
from telemetry.gpu.common import translate_vendor_errors
from telemetry.gpu.nvml import NvmlBackend

REPO = Path(__file__).resolve().parents[2]


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    """A backend plus the hooks the contract needs to drive it like real hardware."""

    backend: GpuBackend
    clock: Clock
    fake: object | None = None

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        if self.fake is not None:
            self.fake.advance(seconds)

    def load(self, uuid: str, busy: bool) -> None:
        """A job starts or stops: the emulator hears it, fake hardware draws more power."""
        self.backend.set_busy(uuid, busy)
        if self.fake is not None:
            self._gpu(uuid).power_w = 600.0 if busy else 70.0

    def lose(self, uuid: str) -> None:
        if self.fake is None:
            self.backend.lose(uuid)
        else:
            self._gpu(uuid).lost = True

    def counter_backwards(self, uuid: str) -> None:
        if self.fake is None:
            self.backend.counter_fault(uuid, "backwards")
        elif isinstance(self.fake, FakeNvml):
            self._gpu(uuid).energy_mj = 0.0
        else:
            self._gpu(uuid).energy_uj = 0.0

    def _gpu(self, uuid: str):
        return next(g for g in self.fake.gpus if g.uuid == uuid)


def nvml_gpus() -> list[FakeNvmlGpu]:
    return [FakeNvmlGpu(uuid="GPU-aaaa1111-0000-0000-0000-000000000000", pci=(0, 0x1B, 0)),
            FakeNvmlGpu(uuid="GPU-bbbb2222-0000-0000-0000-000000000000", pci=(0, 0x3B, 0),
                        name=REPORTED["H200"][0], memory_total_b=REPORTED["H200"][1])]


def amd_gpus() -> list[FakeAmdGpu]:
    return [FakeAmdGpu(uuid="11111111-0000-1000-8000-000000000000", hip_id=0),
            FakeAmdGpu(uuid="22222222-0000-1000-8000-000000000000", hip_id=1, asic_serial="0x5F3A1C0DE0000002",
                       market_name="AMD Instinct MI325X", vram_b=256 * 2**30, cap_w=1000.0)]


@pytest.fixture
def nvml(monkeypatch) -> FakeNvml:
    fake = FakeNvml(nvml_gpus())
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    return fake


@pytest.fixture
def amd(monkeypatch) -> FakeAmdSmi:
    fake = FakeAmdSmi(amd_gpus())
    monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
    return fake


@pytest.fixture(params=["emulated", "fake-nvml", "fake-amdsmi"])
def harness(request, monkeypatch) -> Harness:
    clock = Clock()
    if request.param == "emulated":
        models = [EmulatedModel("MI300X", "amd", 192, 140, 750),
                  EmulatedModel("H100", "nvidia", 80, 70, 700)]
        h = Harness(EmulatedBackend(models, node="n1", seed=7, clock=clock), clock)
    elif request.param == "fake-nvml":
        fake = FakeNvml(nvml_gpus())
        monkeypatch.setitem(sys.modules, "pynvml", fake.module)
        h = Harness(NvmlBackend(env={}, clock=clock), clock, fake)
    else:
        fake = FakeAmdSmi(amd_gpus())
        monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
        h = Harness(AmdSmiBackend(env={}, clock=clock), clock, fake)
    yield h
    h.backend.close()


def trapezoid_j(readings) -> float:
    return sum((b.timestamp_s - a.timestamp_s) * (a.power_w + b.power_w) / 2
               for a, b in zip(readings, readings[1:]))


# -- the contract every backend keeps ---------------------------------------------------


def test_devices_enumerate_with_index_uuid_model_and_memory(harness):
    devices = harness.backend.devices()
    assert len(devices) == 2
    assert len({d.uuid for d in devices}) == 2 and all(d.uuid for d in devices)
    for vendor in {d.vendor for d in devices}:
        assert vendor in ("nvidia", "amd")
        indices = sorted(d.index for d in devices if d.vendor == vendor)
        assert indices == list(range(len(indices)))
    for d in devices:
        assert d.model and d.name
        assert d.memory_gib > 10
        assert d.capabilities is not None and d.capabilities.power
        assert harness.backend.capabilities(d.uuid) == d.capabilities


def test_a_reading_has_sane_power_energy_and_time(harness):
    for d in harness.backend.devices():
        first = harness.backend.read(d.uuid)
        harness.advance(1.0)
        r = harness.backend.read(d.uuid)
        assert r.uuid == d.uuid
        assert 10 < r.power_w < 2 * harness.backend.power_limit(d.uuid).current_w
        assert r.energy_j is not None and r.energy_j >= 0
        assert r.timestamp_s == pytest.approx(first.timestamp_s + 1.0)
        assert not r.energy_reset


def test_energy_counter_is_monotonic_while_healthy(harness):
    uuid = harness.backend.devices()[0].uuid
    last = harness.backend.read(uuid).energy_j
    for step in range(50):
        if step in (10, 30):
            harness.load(uuid, busy=step == 10)
        harness.advance(0.1)
        r = harness.backend.read(uuid)
        assert r.energy_j >= last and not r.energy_reset
        last = r.energy_j


def test_energy_counter_matches_integrated_power_within_2_percent(harness):
    """60 s at 10 Hz with a job in the middle: counter delta vs trapezoid of power_w."""
    uuid = harness.backend.devices()[-1].uuid
    readings = [harness.backend.read(uuid)]
    for step in range(600):
        if step in (100, 500):
            harness.load(uuid, busy=step == 100)
        harness.advance(0.1)
        readings.append(harness.backend.read(uuid))
    counter_j = readings[-1].energy_j - readings[0].energy_j
    assert counter_j > 10_000  # the job really drew power
    assert trapezoid_j(readings) == pytest.approx(counter_j, rel=0.02)


def test_unknown_uuid_raises_our_not_found(harness):
    with pytest.raises(GpuNotFound):
        harness.backend.read("GPU-does-not-exist")
    with pytest.raises(GpuNotFound):
        harness.backend.capabilities("GPU-does-not-exist")


def test_a_lost_gpu_raises_gpu_lost_and_leaves_the_inventory(harness):
    lost, healthy = [d.uuid for d in harness.backend.devices()]
    harness.backend.read(lost)
    harness.lose(lost)
    with pytest.raises(GpuLost):
        harness.backend.read(lost)
    with pytest.raises(GpuLost):
        harness.backend.check(lost)
    assert [d.uuid for d in harness.backend.devices()] == [healthy]
    harness.advance(1.0)
    assert harness.backend.read(healthy).power_w > 0


def test_a_counter_that_goes_backwards_is_flagged_not_hidden(harness, caplog):
    uuid = harness.backend.devices()[0].uuid
    harness.advance(10.0)
    before = harness.backend.read(uuid)
    harness.counter_backwards(uuid)
    harness.advance(1.0)
    with caplog.at_level(logging.WARNING):
        after = harness.backend.read(uuid)
    assert after.energy_j < before.energy_j and after.energy_reset
    assert "went backwards" in caplog.text
    harness.advance(1.0)
    assert not harness.backend.read(uuid).energy_reset


def test_close_is_idempotent_and_reads_after_close_are_our_error(harness):
    uuid = harness.backend.devices()[0].uuid
    harness.backend.close()
    harness.backend.close()
    with pytest.raises(GpuError):
        harness.backend.read(uuid)


def test_vendor_errors_are_translated_by_the_decorator_with_the_cause_kept():
    class VendorError(Exception):
        pass

    class Backend:
        _vendor_errors = (VendorError,)

        def _translate(self, e, call):
            return GpuLost(f"{call}: {e}")

        @translate_vendor_errors
        def read(self, exc):
            raise exc

    with pytest.raises(GpuLost, match="read: fell off") as e:
        Backend().read(VendorError("fell off"))
    assert isinstance(e.value.__cause__, VendorError)
    with pytest.raises(GpuNotFound):  # our own errors pass through untouched
        Backend().read(GpuNotFound("x"))
    with pytest.raises(KeyError):  # and so do programming errors
        Backend().read(KeyError("bug"))


def test_importing_the_package_touches_no_vendor_library():
    code = "import sys, telemetry.gpu; print(sorted({'pynvml', 'amdsmi'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"


# -- NVML -------------------------------------------------------------------------------


def test_nvml_missing_python_package_is_library_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(GpuLibraryMissing):
        NvmlBackend(env={})


def test_nvml_missing_shared_library_is_library_missing(monkeypatch):
    fake = FakeNvml([], init_error=fake_pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    with pytest.raises(GpuLibraryMissing):
        NvmlBackend(env={})


def test_nvml_driver_not_loaded_is_a_driver_error(monkeypatch):
    fake = FakeNvml(nvml_gpus(), init_error=fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    with pytest.raises(GpuDriverError) as e:
        NvmlBackend(env={})
    assert isinstance(e.value.__cause__, fake_pynvml.NVMLError)


def test_nvml_converts_milliwatts_and_millijoules(nvml):
    nvml.gpus[0].power_w, nvml.gpus[0].instant_w, nvml.gpus[0].energy_mj = 312.5, 401.0, 7_654_321
    b = NvmlBackend(env={})
    r = b.read(nvml.gpus[0].uuid)
    assert (r.power_w, r.instant_power_w, r.energy_j) == (312.5, 401.0, 7654.321)
    limit = b.power_limit(nvml.gpus[0].uuid)
    assert (limit.current_w, limit.min_w, limit.max_w, limit.default_w) == (700, 200, 700, 700)


def test_nvml_numbers_gpus_in_pci_bus_order_whatever_nvml_order(monkeypatch):
    gpus = [FakeNvmlGpu(uuid="GPU-c", pci=(0, 0xC1, 0)), FakeNvmlGpu(uuid="GPU-a", pci=(0, 0x1B, 0)),
            FakeNvmlGpu(uuid="GPU-b", pci=(0, 0x3B, 0))]
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus).module)
    devices = NvmlBackend(env={}).devices()
    assert [(d.index, d.uuid) for d in devices] == [(0, "GPU-a"), (1, "GPU-b"), (2, "GPU-c")]
    assert devices[0].pci_bus_id == "00000000:1B:00.0"


@pytest.mark.parametrize("visible, expected", [
    ("2,0", [(2, "GPU-c"), (0, "GPU-a")]),           # indices count in PCI order, kept physical
    ("GPU-b", [(1, "GPU-b")]),                        # a UUID (a unique prefix is enough)
    ("1,7,0", [(1, "GPU-b")]),                        # like CUDA: stop at the first bad entry
    ("", []),                                         # empty hides every GPU
])
def test_nvml_respects_cuda_visible_devices_in_the_agents_environment(monkeypatch, visible, expected):
    gpus = [FakeNvmlGpu(uuid="GPU-a", pci=(0, 1, 0)), FakeNvmlGpu(uuid="GPU-b", pci=(0, 2, 0)),
            FakeNvmlGpu(uuid="GPU-c", pci=(0, 3, 0))]
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus).module)
    env = {"CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert [(d.index, d.uuid) for d in NvmlBackend(env=env).devices()] == expected


def test_nvml_power_kind_follows_the_architecture(monkeypatch):
    gpus = [FakeNvmlGpu(uuid="GPU-h", name="NVIDIA H100 80GB HBM3", arch=9, pci=(0, 1, 0)),
            FakeNvmlGpu(uuid="GPU-a", name="NVIDIA A100-SXM4-80GB", arch=7, pci=(0, 2, 0)),
            FakeNvmlGpu(uuid="GPU-v", name="Tesla V100-SXM2-32GB", arch=5, pci=(0, 3, 0))]
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus).module)
    kinds = {d.uuid: d.capabilities.power_kind for d in NvmlBackend(env={}).devices()}
    # nvmlDeviceGetPowerUsage: 1 s average on Ampere and later except GA100 (A100), else instant.
    assert kinds == {"GPU-h": "average_1s", "GPU-a": "instant", "GPU-v": "instant"}


def test_nvml_unsupported_queries_are_probed_once_and_recorded(monkeypatch):
    old = FakeNvmlGpu(uuid="GPU-old", unsupported={"instant", "nvmlDeviceGetTotalEnergyConsumption",
                                                   "nvmlDeviceGetUtilizationRates"})
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([old]).module)
    b = NvmlBackend(env={})
    caps = b.capabilities("GPU-old")
    assert caps.power and not caps.instant_power and not caps.energy_counter and not caps.utilization
    assert any("energy counter" in n for n in caps.notes)
    probes = old.calls
    r = b.read("GPU-old")
    assert r.power_w == 70.0 and r.energy_j is None and r.instant_power_w is None
    assert r.utilization_pct is None
    assert old.calls - probes == 1  # only the power query is made per read


def test_nvml_without_power_usage_falls_back_to_instant_power(monkeypatch):
    g = FakeNvmlGpu(uuid="GPU-x", instant_w=250.0, unsupported={"nvmlDeviceGetPowerUsage"})
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([g]).module)
    assert NvmlBackend(env={}).read("GPU-x").power_w == 250.0


def test_nvml_gpu_lost_mid_run_stops_further_vendor_calls(nvml):
    b = NvmlBackend(env={})
    uuid = nvml.gpus[0].uuid
    b.read(uuid)
    nvml.gpus[0].lost = True
    with pytest.raises(GpuLost) as e:
        b.read(uuid)
    assert isinstance(e.value.__cause__, fake_pynvml.NVMLError)
    calls = nvml.gpus[0].calls
    with pytest.raises(GpuLost):
        b.read(uuid)
    assert nvml.gpus[0].calls == calls


def test_nvml_old_bindings_returning_bytes_are_decoded(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(nvml_gpus(), bytes_strings=True).module)
    d = NvmlBackend(env={}).devices()[0]
    assert d.uuid.startswith("GPU-") and d.name == "NVIDIA H100 80GB HBM3"


def test_nvml_power_limit_is_read_fresh(nvml):
    b = NvmlBackend(env={})
    nvml.gpus[0].limit_mw = 450_000
    assert b.power_limit(nvml.gpus[0].uuid).current_w == 450.0


def test_nvml_close_shuts_nvml_down_once(nvml):
    b = NvmlBackend(env={})
    b.close()
    b.close()
    assert nvml.shutdowns == 1 and nvml.initialized == 0


def test_fake_pynvml_matches_the_real_bindings():
    """The fake only uses names that nvidia-ml-py has, with its constants and arities."""
    real = pytest.importorskip("pynvml")
    for name, value in fake_pynvml.CONSTANTS.items():
        assert getattr(real, name) == value, name
    for name in fake_pynvml.FUNCTIONS:
        fake_params = inspect.signature(getattr(FakeNvml([]).module, name)).parameters
        real_params = inspect.signature(getattr(real, name)).parameters
        assert list(fake_params) == list(real_params), name


# -- amdsmi ---------------------------------------------------------------------------


class RealAmdSmi:
    """The installed amdsmi package, read from its source (amdsmi_interface.py,
    amdsmi_exception.py, amdsmi_wrapper.py) without importing it: its import needs
    libamd_smi.so, which a machine without ROCm does not have."""

    def __init__(self) -> None:
        spec = importlib.util.find_spec("amdsmi")
        assert spec is not None and spec.origin, "the amdsmi package (dev extra) is not installed"
        pkg = Path(spec.origin).parent
        self.interface = ast.parse((pkg / "amdsmi_interface.py").read_text())
        self.exceptions = ast.parse((pkg / "amdsmi_exception.py").read_text())
        wrapper = (pkg / "amdsmi_wrapper.py").read_text()
        self.status = {m[1]: int(m[2]) for m in re.finditer(r"^(AMDSMI_STATUS_\w+) = (\d+)$", wrapper, re.M)}
        self.functions = {n.name: n for n in self.interface.body if isinstance(n, ast.FunctionDef)}
        self.classes = {n.name: n for tree in (self.interface, self.exceptions)
                        for n in tree.body if isinstance(n, ast.ClassDef)}

    def params(self, name: str) -> list[str]:
        args = self.functions[name].args
        return [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]

    def result_keys(self, name: str) -> set[str]:
        """Every string used as a dict key (literal or subscript) in the function's body."""
        keys = set()
        for node in ast.walk(self.functions[name]):
            if isinstance(node, ast.Dict):
                keys |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                    and isinstance(node.slice.value, str):
                keys.add(node.slice.value)
        return keys

    def members(self, cls: str) -> set[str]:
        return {t.id for n in self.classes[cls].body if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Name)}

    def init_params(self, cls: str) -> list[str] | None:
        for n in self.classes[cls].body:
            if isinstance(n, ast.FunctionDef) and n.name == "__init__":
                return [a.arg for a in n.args.args[1:]]
        return None

    def bases(self, cls: str) -> list[str]:
        return [b.id for b in self.classes[cls].bases if isinstance(b, ast.Name)]


def amdsmi_names_used_by_the_backend() -> set[str]:
    text = (REPO / "telemetry" / "gpu" / "amd.py").read_text()
    return set(re.findall(r"\b(amdsmi_(?:get|init|shut)\w*)", text)) - {"amdsmi_wrapper"}


def test_every_amdsmi_function_the_backend_calls_exists_in_the_real_package_and_the_fake():
    real, fake = RealAmdSmi(), FakeAmdSmi([]).module
    used = amdsmi_names_used_by_the_backend()
    assert {"amdsmi_get_power_info", "amdsmi_get_energy_count", "amdsmi_get_power_cap_info"} <= used
    for name in used:
        assert name in real.functions, f"{name} is not in the installed amdsmi"
        assert hasattr(fake, name), f"{name} is not in the fake"


def test_fake_amdsmi_signatures_match_the_real_package():
    real, fake = RealAmdSmi(), FakeAmdSmi([]).module
    for name in (n for n in vars(fake) if n.startswith("amdsmi_") and n != "amdsmi_wrapper"):
        assert name in real.functions, name
        assert list(inspect.signature(getattr(fake, name)).parameters) == real.params(name), name


def test_fake_amdsmi_result_keys_are_the_real_packages():
    """Each dict the fake returns has exactly the keys the real function builds (a key the
    real package dropped, renamed or added is a failure here, not on the first real node)."""
    real = RealAmdSmi()
    fake = FakeAmdSmi([FakeAmdGpu()])
    m = fake.module
    m.amdsmi_init(m.AmdSmiInitFlags.INIT_AMD_GPUS)
    handle = m.amdsmi_get_processor_handles()[0]
    checked = 0
    for name in (n for n in vars(m) if n.startswith("amdsmi_get_")):
        params = inspect.signature(getattr(m, name)).parameters
        args = [handle] if "processor_handle" in params else []
        if "mem_type" in params:
            args.append(m.AmdSmiMemoryType.VRAM)
        result = getattr(m, name)(*args)
        if isinstance(result, dict):
            assert set(result) == real.result_keys(name), (name, set(result) ^ real.result_keys(name))
            checked += 1
    assert checked >= 9


def test_fake_amdsmi_exceptions_enums_and_status_codes_match_the_real_package():
    real = RealAmdSmi()
    for cls in ("AmdSmiException", "AmdSmiLibraryException", "AmdSmiRetryException",
                "AmdSmiTimeoutException", "AmdSmiParameterException"):
        ours = getattr(fake_amdsmi, cls)
        assert cls in real.classes, cls
        assert [b.__name__ for b in ours.__bases__] == real.bases(cls), cls
        real_init = real.init_params(cls)
        if real_init is not None:
            assert list(inspect.signature(ours.__init__).parameters)[1:] == real_init, cls
    for name, code in fake_amdsmi.STATUS.items():
        assert real.status[name] == code, name
    assert {"INIT_AMD_GPUS"} <= real.members("AmdSmiInitFlags")
    assert {m.name for m in fake_amdsmi.AmdSmiMemoryType} <= real.members("AmdSmiMemoryType")
    # The backend's own fallback status table agrees with the package too.
    from telemetry.gpu.amd import _STATUS_DEFAULTS
    for name, code in _STATUS_DEFAULTS.items():
        assert real.status[f"AMDSMI_STATUS_{name}"] == code, name



def test_amdsmi_missing_python_package_is_library_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    with pytest.raises(GpuLibraryMissing):
        AmdSmiBackend(env={})


def test_amdsmi_without_its_shared_library_is_library_missing_and_quiet(monkeypatch, tmp_path, capsys):
    """The PyPI package raises KeyError and prints to stdout when libamd_smi.so is missing."""
    pkg = tmp_path / "amdsmi"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "print('Unable to find amdsmi library try installing amd-smi-lib')\n"
        "import os\nos.environ['CARBONSCHED_TEST_NO_SUCH_ROCM_PATH']\n")
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(GpuLibraryMissing) as e:
        AmdSmiBackend(env={})
    assert isinstance(e.value.__cause__, KeyError)
    assert capsys.readouterr().out == ""


def test_amdsmi_driver_not_loaded_is_a_driver_error(monkeypatch):
    fake = FakeAmdSmi(amd_gpus(), init_error="AMDSMI_STATUS_DRIVER_NOT_LOADED")
    monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
    with pytest.raises(GpuDriverError):
        AmdSmiBackend(env={})


def test_amdsmi_initialises_for_gpus_only(amd):
    AmdSmiBackend(env={})
    assert amd.init_flags == [amd.module.AmdSmiInitFlags.INIT_AMD_GPUS]


@pytest.mark.parametrize("generation, kind, instant", [
    ("mi300", "instant", True),    # current_socket_power; average_socket_power is N/A
    ("mi200", "average", False),   # average_socket_power; current_socket_power is N/A
    ("rocm7", "instant", True),    # socket_power only
])
def test_amdsmi_reads_whichever_power_field_the_chip_has(monkeypatch, generation, kind, instant):
    g = FakeAmdGpu(generation=generation, power_w=512.0)
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi([g]).module)
    b = AmdSmiBackend(env={})
    caps = b.capabilities(g.uuid)
    assert (caps.power_kind, caps.instant_power) == (kind, instant)
    r = b.read(g.uuid)
    assert r.power_w == 512.0 and (r.instant_power_w == 512.0) == instant


def test_amdsmi_microwatt_power_is_detected_by_magnitude(monkeypatch):
    g = FakeAmdGpu(power_unit="uW", power_w=655.0, cap_w=750.0)
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi([g]).module)
    b = AmdSmiBackend(env={})
    assert b.read(g.uuid).power_w == pytest.approx(655.0)
    assert b.power_limit(g.uuid).current_w == pytest.approx(750.0)


def test_power_unit_rule_separates_watts_from_microwatts():
    assert power_watts(1400, cap_w=1400.0) == 1400  # an MI355X at its cap, in watts
    assert power_watts(90_000_000, cap_w=750.0) == pytest.approx(90.0)  # idle, in microwatts
    assert power_watts(2_500, cap_w=None) == 2_500
    assert power_watts(250_000_000, cap_w=None) == pytest.approx(250.0)
    assert power_watts("N/A", cap_w=750.0) is None
    assert cap_watts(750_000_000) == pytest.approx(750.0) and cap_watts(750) == 750.0
    assert cap_watts("N/A") is None and cap_watts(0) is None


@pytest.mark.parametrize("key", ["energy_accumulator", "power"])
def test_amdsmi_energy_is_ticks_times_resolution_under_either_key(monkeypatch, key):
    g = FakeAmdGpu(energy_key=key, counter_resolution_uj=15.259, energy_uj=15.259 * 1_000_000)
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi([g]).module)
    assert AmdSmiBackend(env={}).read(g.uuid).energy_j == pytest.approx(15.259)


def test_amdsmi_index_is_the_rocm_enumeration_order(monkeypatch):
    gpus = [FakeAmdGpu(uuid="u-b", hip_id=1), FakeAmdGpu(uuid="u-a", hip_id=0)]
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi(gpus).module)
    assert [(d.index, d.uuid) for d in AmdSmiBackend(env={}).devices()] == [(0, "u-a"), (1, "u-b")]


def test_amdsmi_without_enumeration_info_orders_by_kfd_node(monkeypatch):
    gpus = [FakeAmdGpu(uuid="u-b", hip_id=None, kfd_node_id=9),
            FakeAmdGpu(uuid="u-a", hip_id=None, kfd_node_id=2)]
    fake = FakeAmdSmi(gpus, enumeration_info=False)
    monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
    assert [(d.index, d.uuid) for d in AmdSmiBackend(env={}).devices()] == [(0, "u-a"), (1, "u-b")]


def test_amdsmi_respects_rocr_then_hip_visible_devices(monkeypatch):
    gpus = [FakeAmdGpu(uuid=f"u-{i}", hip_id=i) for i in range(4)]
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi(gpus).module)
    env = {"ROCR_VISIBLE_DEVICES": "1,2,3", "HIP_VISIBLE_DEVICES": "2,0"}
    assert [(d.index, d.uuid) for d in AmdSmiBackend(env=env).devices()] == [(3, "u-3"), (1, "u-1")]


def test_amdsmi_one_failed_read_is_retried_before_declaring_the_gpu_lost(amd):
    b = AmdSmiBackend(env={})
    g = amd.gpus[0]
    g.lost, g.lost_failures = True, 1  # one sysfs hiccup
    assert b.read(g.uuid).power_w == 140.0
    assert g.uuid in {d.uuid for d in b.devices()}
    g.lost, g.lost_failures = True, None  # the card is gone
    with pytest.raises(GpuLost):
        b.read(g.uuid)
    assert g.uuid not in {d.uuid for d in b.devices()}


def test_amdsmi_unsupported_energy_counter_is_recorded(monkeypatch):
    g = FakeAmdGpu(unsupported={"amdsmi_get_energy_count"})
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi([g]).module)
    b = AmdSmiBackend(env={})
    assert not b.capabilities(g.uuid).energy_counter
    assert b.read(g.uuid).energy_j is None


def test_amdsmi_unexpected_status_is_our_generic_error(amd):
    b = AmdSmiBackend(env={})
    amd.gpus[0].lost, amd.gpus[0].lost_status = True, "AMDSMI_STATUS_TIMEOUT"
    with pytest.raises(GpuError) as e:
        b.read(amd.gpus[0].uuid)
    assert type(e.value) is GpuError
    assert isinstance(e.value.__cause__, amd.module.AmdSmiLibraryException)


# -- the validity gate (issue 17) ---------------------------------------------------------


def test_amdsmi_sentinel_in_average_power_is_not_read_as_4295_watts(monkeypatch):
    """amdsmi 7.0.2 passes 0xFFFFFFFF on (only 0xFFFF becomes "N/A"): on an MI300X the
    unsupported average_socket_power must not become 4294.97 W."""
    g = FakeAmdGpu(power_w=512.0)
    g.overrides[("amdsmi_get_power_info", "average_socket_power")] = UINT32_MAX
    g.overrides[("amdsmi_get_power_info", "socket_power")] = UINT32_MAX
    fake = FakeAmdSmi([g])
    monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
    b = AmdSmiBackend(env={})
    assert b.capabilities(g.uuid).power_kind == "instant"
    assert b.read(g.uuid).power_w == 512.0


@pytest.mark.parametrize("raw", [UINT16_MAX, UINT32_MAX, UINT64_MAX, "N/A", -5])
def test_amdsmi_invalid_power_is_a_gap_never_a_number(monkeypatch, raw):
    g = FakeAmdGpu(power_w=300.0)
    fake = FakeAmdSmi([g])
    monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
    b = AmdSmiBackend(env={})
    g.overrides[("amdsmi_get_power_info", "current_socket_power")] = raw
    r = b.read(g.uuid)
    assert r.power_w is None and r.instant_power_w is None
    assert r.energy_j is not None  # the counter is still read


def test_amdsmi_power_impossible_for_the_catalog_tdp_is_a_gap(monkeypatch):
    """No cap reported, so only the catalog TDP the agent passes in bounds the reading."""
    g = FakeAmdGpu(power_w=300.0, unsupported={"amdsmi_get_power_cap_info"})
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi([g]).module)
    b = AmdSmiBackend(env={})
    b.set_rated_power_w(g.uuid, 750.0)
    assert b.read(g.uuid).power_w == 300.0
    g.power_w = 2000.0  # in watts: more than 1.5 x 750 W
    assert b.read(g.uuid).power_w is None


@pytest.mark.parametrize("fn, key, raw", [
    ("amdsmi_get_energy_count", "energy_accumulator", UINT64_MAX),
    ("amdsmi_get_gpu_activity", "gfx_activity", UINT16_MAX),
    ("amdsmi_get_gpu_activity", "gfx_activity", 250),
])
def test_amdsmi_invalid_counter_and_activity_are_gaps(monkeypatch, fn, key, raw):
    g = FakeAmdGpu(gfx_activity=40)
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi([g]).module)
    b = AmdSmiBackend(env={})
    g.overrides[(fn, key)] = raw
    r = b.read(g.uuid)
    assert (r.energy_j if fn == "amdsmi_get_energy_count" else r.utilization_pct) is None
    assert r.power_w == 140.0


def test_amdsmi_sentinel_power_caps_are_no_cap(monkeypatch):
    g = FakeAmdGpu()
    g.overrides[("amdsmi_get_power_cap_info", "max_power_cap")] = UINT64_MAX
    g.overrides[("amdsmi_get_power_cap_info", "min_power_cap")] = UINT32_MAX
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi([g]).module)
    limit = AmdSmiBackend(env={}).power_limit(g.uuid)
    assert (limit.current_w, limit.min_w, limit.max_w) == (pytest.approx(750.0), None, None)


def test_a_sentinel_power_never_outvotes_a_healthy_amd_counter(monkeypatch):
    """End to end: the backend's readings through the energy code keep the counter."""
    from telemetry.energy import Sample, window_energy

    g = FakeAmdGpu(power_w=600.0)
    fake = FakeAmdSmi([g])
    monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
    clock = Clock()
    b = AmdSmiBackend(env={}, clock=clock)
    samples = []
    for step in range(600):
        g.overrides.pop(("amdsmi_get_power_info", "current_socket_power"), None)
        if step % 5 == 1:  # firmware hiccup: the field reads all-ones
            g.overrides[("amdsmi_get_power_info", "current_socket_power")] = UINT32_MAX
        r = b.read(g.uuid)
        samples.append(Sample(r.timestamp_s, r.power_w, r.energy_j))
        clock.now += 0.1
        fake.advance(0.1)
    est = window_energy(samples)
    assert est.method == "counter"
    assert est.energy_j == pytest.approx(600.0 * 59.9, rel=0.01)


@pytest.mark.parametrize("fn, raw, field", [
    ("nvmlDeviceGetPowerUsage", 0xFFFFFFFF, "power_w"),
    ("nvmlDeviceGetPowerUsage", 4_000_000, "power_w"),  # 4 kW on a 700 W board
    ("nvmlDeviceGetTotalEnergyConsumption", 0xFFFFFFFFFFFFFFFF, "energy_j"),
    ("nvmlDeviceGetUtilizationRates", 0xFFFFFFFF, "utilization_pct"),
])
def test_nvml_invalid_readings_are_gaps(monkeypatch, fn, raw, field):
    g = FakeNvmlGpu(uuid="GPU-x", util_pct=30, unsupported={"instant"})
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([g]).module)
    b = NvmlBackend(env={})
    g.raw[fn] = raw
    r = b.read("GPU-x")
    assert getattr(r, field) is None
    assert r.timestamp_s is not None


def test_nvml_sentinel_power_limit_is_no_limit(monkeypatch):
    g = FakeNvmlGpu(uuid="GPU-x")
    g.raw["nvmlDeviceGetEnforcedPowerLimit"] = 0xFFFFFFFF
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([g]).module)
    limit = NvmlBackend(env={}).power_limit("GPU-x")
    assert limit.current_w is None and limit.max_w == 700.0


def test_the_amd_module_is_not_named_like_the_vendor_package():
    assert not (REPO / "telemetry" / "gpu" / "amdsmi.py").exists()


# -- emulated ------------------------------------------------------------------------


def emulated(clock: Clock, seed: int = 1) -> EmulatedBackend:
    return EmulatedBackend([EmulatedModel("MI300X", "amd", 192, 140, 750)], seed=seed, clock=clock)


def test_emulated_counter_equals_the_trapezoid_of_the_power_it_reports():
    clock = Clock()
    b = emulated(clock)
    uuid = b.devices()[0].uuid
    readings = [b.read(uuid)]
    for i in range(200):
        if i % 50 == 10:
            b.set_busy(uuid, i % 100 == 10)
        clock.now += 0.05 + (i % 7) * 0.03
        readings.append(b.read(uuid))
    counter = readings[-1].energy_j - readings[0].energy_j
    assert counter == pytest.approx(trapezoid_j(readings), rel=1e-9)


def test_emulated_busy_power_is_70_to_95_percent_of_tdp():
    clock = Clock()
    b = emulated(clock, seed=3)
    uuid = b.devices()[0].uuid
    assert 140 * 0.9 <= b.read(uuid).power_w <= 140 * 1.02
    b.set_busy(uuid, True)
    clock.now += 1
    r = b.read(uuid)
    assert 0.98 * (140 + 0.70 * 610) <= r.power_w <= 1.02 * (140 + 0.95 * 610)
    assert 70 <= r.utilization_pct <= 95


def test_emulated_stuck_counter_stops_while_power_flows_and_heals():
    clock = Clock()
    b = emulated(clock)
    uuid = b.devices()[0].uuid
    clock.now += 1
    stuck_at = b.read(uuid).energy_j
    b.counter_fault(uuid, "stuck")
    for _ in range(3):
        clock.now += 1
        r = b.read(uuid)
        assert r.energy_j == stuck_at and r.power_w > 100
    assert b.true_energy_j(uuid) > stuck_at + 300
    b.counter_fault(uuid, None)
    clock.now += 1
    assert b.read(uuid).energy_j > stuck_at


def test_emulated_rejects_unknown_faults():
    b = emulated(Clock())
    with pytest.raises(ValueError):
        b.counter_fault(b.devices()[0].uuid, "sideways")


def test_emulated_numbers_each_vendor_from_zero():
    models = [EmulatedModel("MI300X", "amd", 192, 140, 750), EmulatedModel("H100", "nvidia", 80, 70, 700),
              EmulatedModel("MI300X", "amd", 192, 140, 750)]
    devices = EmulatedBackend(models, seed=1).devices()
    assert [(d.vendor, d.index) for d in devices] == [("amd", 0), ("nvidia", 0), ("amd", 1)]


# -- detection ----------------------------------------------------------------------


def test_detect_tries_nvml_then_amd(monkeypatch, amd, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with caplog.at_level(logging.INFO):
        backend = detect_backend()
    assert isinstance(backend, AmdSmiBackend)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_detect_prefers_nvml_when_it_sees_gpus(nvml, amd):
    assert isinstance(detect_backend(), NvmlBackend)
    assert not amd.init_flags  # amdsmi was never touched


def test_detect_returns_none_quietly_when_no_library_is_installed(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    with caplog.at_level(logging.INFO):
        assert detect_backend() is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_detect_skips_a_library_that_sees_no_gpu(monkeypatch, amd):
    empty = FakeNvml([])
    monkeypatch.setitem(sys.modules, "pynvml", empty.module)
    assert isinstance(detect_backend(), AmdSmiBackend)
    assert empty.shutdowns == 1


def test_detect_reports_a_broken_driver_loudly(monkeypatch, caplog):
    broken = FakeNvml(nvml_gpus(), init_error=fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    monkeypatch.setitem(sys.modules, "pynvml", broken.module)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    with caplog.at_level(logging.INFO):
        backend, problems = probe_backends()
    assert backend is None
    assert [(name, type(e)) for name, e in problems] == [("nvml", GpuDriverError)]
    assert any(r.levelno == logging.ERROR and "broken" in r.getMessage() for r in caplog.records)


# -- scripts/gpu-check --------------------------------------------------------------


def load_gpu_check():
    path = REPO / "scripts" / "gpu-check"
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(path))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_gpu_check_without_a_gpu_exits_2_with_one_line():
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-check")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "no" in done.stderr.lower()


def test_gpu_check_reports_cost_overhead_and_agreement():
    check = load_gpu_check()
    backend = EmulatedBackend([EmulatedModel("H100", "nvidia", 80, 70, 700)], seed=5)
    out = io.StringIO()
    code = check.run_check(backend, seconds=0.4, hz=50, use_load=False, out=out)
    text = out.getvalue()
    assert code == 0
    assert "median" in text and "p99" in text and "% of one core" in text
    assert "counter vs integrated power" in text


# -- MI300X compute partitions (issue 17) ----------------------------------------------


def partitioned_card(mode: str, n: int, power_w: float = 560.0, serial: str = "0xCAFE") -> list[FakeAmdGpu]:
    """One MI300X in `mode`: n handles sharing one ASIC serial; partition 0 reports the socket."""
    return [FakeAmdGpu(uuid=f"{serial}-{i}", hip_id=i, partition=mode, partition_id=i, asic_serial=serial,
                       bdf=f"0000:0c:00.{i}", vram_b=MI300X_VRAM_B // n, power_w=power_w) for i in range(n)]


@pytest.mark.parametrize("mode, n", [("DPX", 2), ("QPX", 4), ("CPX", 8)])
def test_each_partition_is_a_gpu_with_an_equal_share_of_the_cards_power_and_cap(monkeypatch, mode, n):
    fake = FakeAmdSmi(partitioned_card(mode, n))
    monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
    b = AmdSmiBackend(env={})
    devices = b.devices()
    assert len(devices) == n
    for d in devices:
        assert (d.partition_mode, d.partitions, d.model) == (mode, n, "AMD Instinct MI300X")
        assert d.capabilities.power and d.capabilities.energy_counter
        assert b.read(d.uuid).power_w == pytest.approx(560.0 / n)
        assert b.power_limit(d.uuid).current_w == pytest.approx(750.0 / n)


def test_partition_energy_adds_up_to_the_card_and_agrees_with_its_power(monkeypatch):
    gpus = partitioned_card("CPX", 8)
    fake = FakeAmdSmi(gpus)
    monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
    clock = Clock()
    b = AmdSmiBackend(env={}, clock=clock)
    uuids = [d.uuid for d in b.devices()]
    first = {u: b.read(u) for u in uuids}
    readings = {u: [first[u]] for u in uuids}
    card_before = gpus[0].energy_uj
    for _ in range(100):
        clock.now += 0.1
        fake.advance(0.1)
        for u in uuids:
            readings[u].append(b.read(u))
    card_j = (gpus[0].energy_uj - card_before) / 1e6
    deltas = [readings[u][-1].energy_j - readings[u][0].energy_j for u in uuids]
    assert sum(deltas) == pytest.approx(card_j, rel=1e-3)  # no partition counted twice
    for u in uuids:
        assert trapezoid_j(readings[u]) == pytest.approx(deltas[0], rel=0.01)


def test_a_partition_reads_its_cards_socket_even_when_partition_0_is_not_visible(monkeypatch):
    fake = FakeAmdSmi(partitioned_card("CPX", 8))
    monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
    b = AmdSmiBackend(env={"ROCR_VISIBLE_DEVICES": "5"})
    (d,) = b.devices()
    assert d.index == 5 and d.partitions == 8
    assert b.read(d.uuid).power_w == pytest.approx(70.0)


def test_two_partitioned_cards_are_kept_apart(monkeypatch):
    gpus = partitioned_card("DPX", 2, power_w=400.0, serial="0xA") + partitioned_card("DPX", 2, power_w=600.0,
                                                                                      serial="0xB")
    for i, g in enumerate(gpus):
        g.hip_id = i
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi(gpus).module)
    b = AmdSmiBackend(env={})
    assert [b.read(d.uuid).power_w for d in b.devices()] == [200.0, 200.0, 300.0, 300.0]


def test_spx_cards_are_whole_gpus(amd):
    b = AmdSmiBackend(env={})
    assert all(d.partitions == 1 and d.partition_mode is None for d in b.devices())


class SkewedCounter(GpuBackend):
    """A backend whose energy counter runs `factor` times faster than its power says."""

    def __init__(self, inner: GpuBackend, factor: float) -> None:
        self.inner, self.factor, self.name = inner, factor, inner.name

    def devices(self):
        return self.inner.devices()

    def read(self, uuid):
        from dataclasses import replace

        r = self.inner.read(uuid)
        return replace(r, energy_j=None if r.energy_j is None else r.energy_j * self.factor)

    def power_limit(self, uuid):
        return self.inner.power_limit(uuid)

    def versions(self):
        return self.inner.versions()


def test_gpu_check_prints_versions_and_each_fields_validity(monkeypatch):
    g = FakeNvmlGpu(uuid="GPU-x", unsupported={"instant"})
    g.raw["nvmlDeviceGetUtilizationRates"] = 0xFFFFFFFF
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([g]).module)
    check = load_gpu_check()
    out = io.StringIO()
    with NvmlBackend(env={}) as b:
        check.run_check(b, seconds=0.2, hz=20, use_load=False, out=out)
    text = out.getvalue()
    assert "driver 580.95.05" in text
    assert re.search(r"power\s+70 W ok", text)
    assert re.search(r"utilization\s+GAP", text) and re.search(r"instant power\s+GAP", text)
    assert re.search(r"power limit max\s+700 W ok", text)


def test_gpu_check_fails_when_counter_and_integral_disagree_by_more_than_3_percent():
    check = load_gpu_check()
    for factor, expected in ((1.0, 0), (1.02, 0), (1.05, 3)):
        inner = EmulatedBackend([EmulatedModel("H100", "nvidia", 80, 700, 700)], seed=5)
        out = io.StringIO()
        code = check.run_check(SkewedCounter(inner, factor), seconds=1.0, hz=50, use_load=False, out=out)
        assert code == expected, (factor, out.getvalue())
        assert ("DISAGREE" in out.getvalue()) == (expected == 3)
