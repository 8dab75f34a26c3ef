"""A fake `amdsmi` (AMD SMI Python package) over scripted GPUs, for tests.

Only the vendor module is faked: carbonsched's own amdsmi backend runs unchanged on top of
it. Its shapes follow the amdsmi 7.0.2 package from PyPI (amdsmi/amdsmi_interface.py,
amdsmi_exception.py, amdsmi_wrapper.py), and tests/telemetry/test_gpu_backends.py checks every
function, parameter list, result key, exception class and status code used here against the
installed package's source:

- `amdsmi_get_power_info(processor_handle)` returns socket_power, current_socket_power,
  average_socket_power, gfx/soc/mem_voltage and power_limit, and turns only 0xFFFF into
  "N/A" (the wrapper's own loop): an unsupported 32-bit field arrives as 0xFFFFFFFF.
  MI300-class chips have current_socket_power (average is unsupported), MI200 the average.
- `amdsmi_get_energy_count` returns energy_accumulator (ticks of counter_resolution µJ) and
  timestamp; ROCm before 6.2.1 named the ticks `power` (energy_key="power").
- power caps (`amdsmi_get_power_cap_info`) are in microwatts and are not validated by the
  wrapper; `amdsmi_get_gpu_vram_info` gives vram_size in MiB, `amdsmi_get_gpu_memory_total`
  bytes; `amdsmi_get_gpu_activity` turns 0xFFFF into "N/A".
- compute partitions: `amdsmi_get_gpu_compute_partition` returns "SPX", "DPX", "QPX" or
  "CPX"; `amdsmi_get_gpu_memory_partition` the memory (NPS) mode, "NPS1" or "NPS4";
  `amdsmi_get_gpu_kfd_info` gives current_partition_id. Socket power and energy are
  reported on partition 0 only ("N/A"/sentinel on the others), as on real MI300X in CPX mode.
- AmdSmiLibraryException carries `err_code`; handles are checked by type as the real
  interface does (AmdSmiParameterException).

Memory sizes default to what real drivers report (see the GPU byte counts in
tests/telemetry/test_gpu_backends.py, each with its public source).

    fake = FakeAmdSmi([FakeAmdGpu(...), ...])
    monkeypatch.setitem(sys.modules, "amdsmi", fake.module)
"""

from __future__ import annotations

import enum
import types
from dataclasses import dataclass, field

NA = "N/A"

UINT16_MAX, UINT32_MAX, UINT64_MAX = 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
MI300X_VRAM_B = 206141652992  # 196,592 MiB: 8 x the 25,767,706,624 B a CPX partition reports

STATUS = {
    "AMDSMI_STATUS_SUCCESS": 0, "AMDSMI_STATUS_INVAL": 1, "AMDSMI_STATUS_NOT_SUPPORTED": 2,
    "AMDSMI_STATUS_NOT_YET_IMPLEMENTED": 3, "AMDSMI_STATUS_FAIL_LOAD_MODULE": 4,
    "AMDSMI_STATUS_FAIL_LOAD_SYMBOL": 5, "AMDSMI_STATUS_DRM_ERROR": 6, "AMDSMI_STATUS_TIMEOUT": 8, "AMDSMI_STATUS_RETRY": 9,
    "AMDSMI_STATUS_NO_PERM": 10, "AMDSMI_STATUS_IO": 12, "AMDSMI_STATUS_FILE_ERROR": 14,
    "AMDSMI_STATUS_INIT_ERROR": 18, "AMDSMI_STATUS_BUSY": 30, "AMDSMI_STATUS_NOT_FOUND": 31,
    "AMDSMI_STATUS_NOT_INIT": 32, "AMDSMI_STATUS_DRIVER_NOT_LOADED": 34,
    "AMDSMI_STATUS_NO_DATA": 40, "AMDSMI_STATUS_AMDGPU_RESTART_ERR": 54,
    "AMDSMI_STATUS_UNKNOWN_ERROR": 0xFFFFFFFF,
}


class AmdSmiInitFlags(enum.IntFlag):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1 << 0
    INIT_AMD_GPUS = 1 << 1


class AmdSmiMemoryType(enum.IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class AmdSmiException(Exception):
    """Base of the package's exceptions."""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        names = {v: k for k, v in STATUS.items()}
        self.err_info = names.get(err_code, "AMDSMI_STATUS_UNKNOWN_ERROR")

    def get_error_code(self) -> int:
        return self.err_code

    def __str__(self) -> str:
        return f"An error occured with code: {self.err_code}({self.err_info})"


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(STATUS["AMDSMI_STATUS_RETRY"])


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(STATUS["AMDSMI_STATUS_TIMEOUT"])


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, receivedValue: object, expectedType: type, msg: str | None = None) -> None:
        super().__init__(msg or f"Invalid parameter: {type(receivedValue)} (expected {expectedType})")


class ProcessorHandle:
    """Stands in for amdsmi_wrapper.amdsmi_processor_handle."""

    def __init__(self, gpu: FakeAmdGpu) -> None:
        self.gpu = gpu


@dataclass
class FakeAmdGpu:
    """One scripted GPU (or one compute partition of a card).

    `generation`: "mi300" (current_socket_power; average is unsupported), "mi200" (average
    only) or "rocm7" (socket_power only). `unsupported_power` is what an unsupported power
    field holds: 0xFFFFFFFF (as the 7.0.2 wrapper passes it on) or 0xFFFF (which it turns
    into "N/A"). `power_unit`: "W" or "uW". `energy_key`: "energy_accumulator" or "power".
    Lower `energy_uj` to make the counter go backwards; set `lost` to make calls fail with
    `lost_status` (`lost_failures` times, then work again; None: forever). `overrides` maps
    a (function, key) to the raw value that call returns, to script odd firmware.

    Partitions: `partition` ("SPX", "DPX", "QPX", "CPX") and `partition_id`; the GPUs of one
    card share `asic_serial` and the card's power and counter are those of its partition 0.
    """

    market_name: str = "AMD Instinct MI300X"
    uuid: str = "7eff74a1-0000-1000-8000-000000000000"
    hip_id: int | None = 0
    kfd_node_id: int | None = None
    bdf: str = "0000:0c:00.0"
    vram_b: int = MI300X_VRAM_B
    generation: str = "mi300"
    unsupported_power: int = UINT32_MAX
    power_w: float = 140.0
    power_unit: str = "W"
    cap_w: float = 750.0
    energy_key: str = "energy_accumulator"
    counter_resolution_uj: float = 15.259
    energy_uj: float = 9e9
    gfx_activity: int = 0
    asic_serial: str = "0x5F3A1C0DE0000001"
    partition: str = "SPX"
    partition_id: int = 0
    memory_partition: str = "NPS1"  # amdsmi_get_gpu_memory_partition: NPS1, NPS2, NPS4, NPS8
    overrides: dict[tuple[str, str], object] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    lost_status: str = "AMDSMI_STATUS_FILE_ERROR"
    lost_failures: int | None = None
    calls: int = 0
    # The card's default cap (0: cap_w as created) and whether the caller may set it
    # (False: amdsmi_set_power_cap answers AMDSMI_STATUS_NO_PERM, as for a non-root caller).
    default_cap_w: float = 0.0
    privileged: bool = True

    def __post_init__(self) -> None:
        if not self.default_cap_w:
            self.default_cap_w = self.cap_w


class FakeAmdSmi:
    """The fake library state and the module object that exposes it."""

    def __init__(self, gpus: list[FakeAmdGpu], *, init_error: str | None = None,
                 enumeration_info: bool = True, kfd_info: bool = True) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.enumeration_info = enumeration_info
        self.kfd_info = kfd_info
        self.init_flags: list[object] = []
        self.initialized = False
        self.shutdowns = 0
        # Every amdsmi_set_power_cap call: (uuid, sensor_ind, cap in µW, status code).
        self.set_calls: list[tuple[str, int, int, int]] = []
        self.module = self._build_module()

    def advance(self, seconds: float) -> None:
        """Let time pass: every card's accumulator grows by its power over `seconds`."""
        for g in self.gpus:
            if self._primary(g) is g:
                g.energy_uj += g.power_w * seconds * 1e6

    # -- the module -----------------------------------------------------------------------

    def _gpu(self, handle: object, fn: str) -> FakeAmdGpu:
        if not isinstance(handle, ProcessorHandle):
            raise AmdSmiParameterException(handle, ProcessorHandle)
        if not self.initialized:
            raise AmdSmiLibraryException(STATUS["AMDSMI_STATUS_NOT_INIT"])
        g = handle.gpu
        g.calls += 1
        if g.lost:
            if g.lost_failures is not None:
                g.lost_failures -= 1
                if g.lost_failures <= 0:
                    g.lost = False
            raise AmdSmiLibraryException(STATUS[g.lost_status])
        if fn in g.unsupported:
            raise AmdSmiLibraryException(STATUS["AMDSMI_STATUS_NOT_SUPPORTED"])
        return g

    def _primary(self, g: FakeAmdGpu) -> FakeAmdGpu:
        """The partition of g's card that reports the socket's power and energy."""
        if g.partition == "SPX":
            return g
        card = [o for o in self.gpus if o.asic_serial == g.asic_serial and o.partition == g.partition]
        return min(card, key=lambda o: o.partition_id)

    @staticmethod
    def _script(g: FakeAmdGpu, fn: str, result: dict) -> dict:
        """The result with any of the GPU's scripted raw values for this call put in."""
        for (name, key), raw in g.overrides.items():
            if name == fn:
                result[key] = raw
        return result

    @staticmethod
    def _power(g: FakeAmdGpu, watts: float) -> float | int:
        return int(watts * 1e6) if g.power_unit == "uW" else int(round(watts))

    def _build_module(self) -> types.ModuleType:
        fake = self
        m = types.ModuleType("amdsmi")
        m.amdsmi_wrapper = types.SimpleNamespace(**STATUS, amdsmi_processor_handle=ProcessorHandle)
        m.AmdSmiInitFlags = AmdSmiInitFlags
        m.AmdSmiMemoryType = AmdSmiMemoryType
        m.AmdSmiException = AmdSmiException
        m.AmdSmiLibraryException = AmdSmiLibraryException
        m.AmdSmiParameterException = AmdSmiParameterException
        m.AmdSmiRetryException = AmdSmiRetryException
        m.AmdSmiTimeoutException = AmdSmiTimeoutException
        m.__version__ = "7.0.2"

        def amdsmi_init(flag=AmdSmiInitFlags.INIT_AMD_GPUS):
            if not isinstance(flag, AmdSmiInitFlags):
                raise AmdSmiParameterException(flag, AmdSmiInitFlags)
            fake.init_flags.append(flag)
            if fake.init_error is not None:
                raise AmdSmiLibraryException(STATUS[fake.init_error])
            fake.initialized = True

        def amdsmi_shut_down():
            fake.initialized = False
            fake.shutdowns += 1

        def amdsmi_get_processor_handles():
            if not fake.initialized:
                raise AmdSmiLibraryException(STATUS["AMDSMI_STATUS_NOT_INIT"])
            return [ProcessorHandle(g) for g in fake.gpus]

        def amdsmi_get_gpu_device_uuid(processor_handle):
            return fake._gpu(processor_handle, "amdsmi_get_gpu_device_uuid").uuid

        def amdsmi_get_gpu_enumeration_info(processor_handle):
            g = fake._gpu(processor_handle, "amdsmi_get_gpu_enumeration_info")
            return {"drm_render": 128, "drm_card": 0, "hsa_id": NA,
                    "hip_id": NA if g.hip_id is None else g.hip_id,
                    "hip_uuid": "GPU-" + g.uuid.replace("-", "")[:16]}

        def amdsmi_get_gpu_kfd_info(processor_handle):
            g = fake._gpu(processor_handle, "amdsmi_get_gpu_kfd_info")
            return {"kfd_id": 1, "node_id": NA if g.kfd_node_id is None else g.kfd_node_id,
                    "current_partition_id": g.partition_id}

        def amdsmi_get_gpu_device_bdf(processor_handle):
            return fake._gpu(processor_handle, "amdsmi_get_gpu_device_bdf").bdf

        def amdsmi_get_gpu_asic_info(processor_handle):
            g = fake._gpu(processor_handle, "amdsmi_get_gpu_asic_info")
            return fake._script(g, "amdsmi_get_gpu_asic_info", {
                "market_name": g.market_name, "vendor_id": "0x1002", "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
                "subvendor_id": "0x1002", "device_id": "0x74a1", "rev_id": "0x00",
                "asic_serial": g.asic_serial, "oam_id": 0, "num_compute_units": 304,
                "target_graphics_version": "gfx942", "subsystem_id": "0x74a1"})

        def amdsmi_get_gpu_memory_total(processor_handle, mem_type):
            g = fake._gpu(processor_handle, "amdsmi_get_gpu_memory_total")
            if not isinstance(mem_type, AmdSmiMemoryType):
                raise AmdSmiParameterException(mem_type, AmdSmiMemoryType)
            return g.overrides.get(("amdsmi_get_gpu_memory_total", ""), g.vram_b)

        def amdsmi_get_gpu_vram_info(processor_handle):
            g = fake._gpu(processor_handle, "amdsmi_get_gpu_vram_info")
            return fake._script(g, "amdsmi_get_gpu_vram_info", {
                "vram_type": 0, "vram_vendor": "SAMSUNG", "vram_size": g.vram_b // 2**20,
                "vram_bit_width": 8192, "vram_max_bandwidth": NA})

        def amdsmi_get_power_info(processor_handle):
            g = fake._gpu(processor_handle, "amdsmi_get_power_info")
            primary = fake._primary(g)
            value = fake._power(g, primary.power_w)
            off = g.unsupported_power
            info = {"socket_power": off, "current_socket_power": off,
                    "average_socket_power": off, "gfx_voltage": 800, "soc_voltage": 900,
                    "mem_voltage": 1100, "power_limit": fake._power(g, g.cap_w)}
            if g is primary:
                if g.generation == "mi300":
                    info["current_socket_power"] = value
                elif g.generation == "mi200":
                    info["average_socket_power"] = value
                else:
                    info["socket_power"] = value
            info = fake._script(g, "amdsmi_get_power_info", info)
            # The 7.0.2 wrapper's own clean-up: only 0xFFFF becomes "N/A".
            return {k: NA if v == 0xFFFF else v for k, v in info.items()}

        def amdsmi_get_energy_count(processor_handle):
            g = fake._gpu(processor_handle, "amdsmi_get_energy_count")
            primary = fake._primary(g)
            if g is not primary:  # per socket: the other partitions read nothing
                return {g.energy_key: 0, "counter_resolution": 0.0, "timestamp": 0}
            return fake._script(g, "amdsmi_get_energy_count", {
                g.energy_key: int(g.energy_uj / g.counter_resolution_uj),
                "counter_resolution": g.counter_resolution_uj, "timestamp": 1})

        def amdsmi_get_gpu_activity(processor_handle):
            g = fake._gpu(processor_handle, "amdsmi_get_gpu_activity")
            info = fake._script(g, "amdsmi_get_gpu_activity",
                                {"gfx_activity": g.gfx_activity, "umc_activity": 0, "mm_activity": 0xFFFF})
            return {k: NA if v == 0xFFFF else v for k, v in info.items()}

        def amdsmi_get_power_cap_info(processor_handle):
            g = fake._gpu(processor_handle, "amdsmi_get_power_cap_info")
            uw, default_uw = int(g.cap_w * 1e6), int(g.default_cap_w * 1e6)
            return fake._script(g, "amdsmi_get_power_cap_info", {
                "power_cap": uw, "default_power_cap": default_uw, "dpm_cap": 0,
                "min_power_cap": int(0.3 * default_uw), "max_power_cap": default_uw})

        def amdsmi_set_power_cap(processor_handle, sensor_ind, cap):
            # amdsmi_interface: handle, sensor_ind and cap type-checked (AmdSmiParameterException),
            # cap in microwatts; the library refuses a cap outside min..max_power_cap.
            if not isinstance(processor_handle, ProcessorHandle):
                raise AmdSmiParameterException(processor_handle, ProcessorHandle)
            if not isinstance(sensor_ind, int):
                raise AmdSmiParameterException(sensor_ind, int)
            if not isinstance(cap, int):
                raise AmdSmiParameterException(cap, int)
            try:
                g = fake._gpu(processor_handle, "amdsmi_set_power_cap")
            except AmdSmiLibraryException as e:
                fake.set_calls.append((processor_handle.gpu.uuid, sensor_ind, cap, e.err_code))
                raise
            default_uw = int(g.default_cap_w * 1e6)
            status = STATUS["AMDSMI_STATUS_SUCCESS"]
            if not g.privileged:
                status = STATUS["AMDSMI_STATUS_NO_PERM"]
            elif sensor_ind != 0 or not int(0.3 * default_uw) <= cap <= default_uw:
                status = STATUS["AMDSMI_STATUS_INVAL"]
            fake.set_calls.append((g.uuid, sensor_ind, cap, status))
            if status != STATUS["AMDSMI_STATUS_SUCCESS"]:
                raise AmdSmiLibraryException(status)
            g.cap_w = cap / 1e6

        def amdsmi_get_gpu_compute_partition(processor_handle):
            return fake._gpu(processor_handle, "amdsmi_get_gpu_compute_partition").partition

        def amdsmi_get_gpu_memory_partition(processor_handle):
            return fake._gpu(processor_handle, "amdsmi_get_gpu_memory_partition").memory_partition

        def amdsmi_get_lib_version():
            return {"major": 25, "minor": 5, "release": 1, "build": "fake"}

        def amdsmi_get_gpu_driver_info(processor_handle):
            fake._gpu(processor_handle, "amdsmi_get_gpu_driver_info")
            return {"driver_name": "amdgpu", "driver_version": "6.12.12", "driver_date": "N/A"}

        optional = {"amdsmi_get_gpu_enumeration_info": fake.enumeration_info,
                    "amdsmi_get_gpu_kfd_info": fake.kfd_info}
        for fn in list(locals().values()):
            name = getattr(fn, "__name__", "")
            if callable(fn) and name.startswith("amdsmi_") and optional.get(name, True):
                setattr(m, name, fn)
        return m
