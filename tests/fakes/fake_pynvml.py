"""A fake `pynvml` (nvidia-ml-py) over scripted GPUs, for tests on machines without NVIDIA.

Only the vendor module is faked: carbonsched's own NVML backend runs unchanged on top of it.
The names, constants and signatures mirror nvidia-ml-py (checked against the installed one
by tests/telemetry/test_gpu_backends.py), and the fake behaves like the driver where it matters:
milliwatts and millijoules, an energy counter that advances with `advance()`, per-field
return codes from nvmlDeviceGetFieldValues, NVMLError carrying `.value`.

MIG: a GPU with `mig_mode` set answers nvmlDeviceGetMigMode with [current, pending] (None:
a part without MIG, NVML_ERROR_NOT_SUPPORTED, as on Volta); its `migs` are the slots
nvmlDeviceGetMigDeviceHandleByIndex reads (None: an empty slot, NVML_ERROR_NOT_FOUND; past
nvmlDeviceGetMaxMigDeviceCount, NVML_ERROR_INVALID_ARGUMENT). A MIG handle answers
nvmlDeviceGetUUID with "MIG-<uuid>" (R470 and later), nvmlDeviceGetMemoryInfo with its own
memory, nvmlDeviceGetGpuInstanceId / nvmlDeviceGetComputeInstanceId, and
nvmlDeviceGetAttributes with its slice counts (the fields of c_nvmlDeviceAttributes); a
whole-GPU handle answers the instance-id calls with NVML_ERROR_INVALID_ARGUMENT.

Names and memory totals are what the driver reports (nvidia-smi shows nvmlDeviceGetName and
nvmlDeviceGetMemoryInfo.total): see REPORTED below, each with its public source.

    fake = FakeNvml([FakeNvmlGpu(...), ...])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from types import SimpleNamespace

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999

NVML_FI_DEV_POWER_INSTANT = 186
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_VALUE_TYPE_UNSIGNED_SHORT = 6

NVML_DEVICE_ARCH_VOLTA = 5
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_HOPPER = 9
NVML_DEVICE_ARCH_BLACKWELL = 10
NVML_DEVICE_ARCH_UNKNOWN = 0xFFFFFFFF

NVML_DEVICE_MIG_DISABLE = 0x0
NVML_DEVICE_MIG_ENABLE = 0x1

CONSTANTS = {k: v for k, v in dict(globals()).items() if k.startswith("NVML_")}

MIB = 2**20
# (name as nvmlDeviceGetName returns it, memory total in bytes as nvmlDeviceGetMemoryInfo
# returns it, enforced power limit in mW). Sources: public nvidia-smi output.
REPORTED = {
    # NVIDIA/nccl#1264, wilicc/gpu-burn#114: "NVIDIA H100 80GB HBM3 ... 81559MiB ... 700W"
    "H100": ("NVIDIA H100 80GB HBM3", 81559 * MIB, 700_000),
    # modal-labs/modal-client#2797: A100 80GB 81920MiB, A100 40GB 40960MiB
    "A100": ("NVIDIA A100-SXM4-80GB", 81920 * MIB, 400_000),
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", 40960 * MIB, 400_000),
    # fastfetch-cli/fastfetch#1658: "NVIDIA H100 NVL", dedicated total 99961274368 B
    "H100-NVL": ("NVIDIA H100 NVL", 99961274368, 400_000),
    # NVIDIA/TensorRT-LLM#10278: "NVIDIA B200 ... 183359MiB ... 1000W"
    "B200": ("NVIDIA B200", 183359 * MIB, 1_000_000),
    # NVIDIA/mig-parted#120 gives the name "NVIDIA H200"; its memory total was not found in
    # public output here: 143771 MiB is an assumption (141 GB of HBM3e less a reserve).
    "H200": ("NVIDIA H200", 143771 * MIB, 700_000),
}


class NVMLError(Exception):
    """Like pynvml.NVMLError: the return code is `.value`."""

    _names = {v: k for k, v in CONSTANTS.items() if k.startswith("NVML_ERROR_")}

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self._names.get(self.value, f"NVML Error with code {self.value}")


@dataclass
class FakeMig:
    """One MIG device (a GPU instance with one compute instance over all of it). Sizes as the
    driver reports them: e.g. an A100-SXM4-40GB 3g.20gb instance shows 20224 MiB in nvidia-smi
    (seansiddens/mps-test README); its share of SMs is slices/7 of the GPU's (MIG User Guide)."""

    uuid: str = "MIG-00000000-0000-0000-0000-000000000001"
    gpu_instance_id: int = 7
    compute_instance_id: int = 0
    slices: int = 1
    memory_mib: int = 9984
    multiprocessors: int = 16


@dataclass
class FakeNvmlGpu:
    """One scripted GPU. Set `lost` to make it fall off the bus; lower `energy_mj` to make
    the counter go backwards; list function names (or "instant") in `unsupported`."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    pci: tuple[int, int, int] = (0, 0x1B, 0)
    arch: int = NVML_DEVICE_ARCH_HOPPER
    memory_total_b: int = 81559 * 2**20  # what an H100 80GB HBM3 reports (see REPORTED)
    # Raw values a call returns instead of the modelled one, by function name (sentinels,
    # odd firmware): e.g. {"nvmlDeviceGetPowerUsage": 0xFFFFFFFF}.
    raw: dict[str, object] = field(default_factory=dict)
    power_w: float = 70.0
    instant_w: float | None = None  # None: equal to power_w
    energy_mj: float = 5_000_000.0
    util_pct: int = 0
    limit_mw: int = 700_000
    min_limit_mw: int = 200_000
    max_limit_mw: int = 700_000
    default_limit_mw: int = 700_000
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    calls: int = 0
    # Setting a limit needs root: False makes nvmlDeviceSetPowerManagementLimit answer
    # NVML_ERROR_NO_PERMISSION, as it does for a non-admin caller.
    privileged: bool = True
    # MIG: the current and pending mode (None: the part has no MIG), the slots (None: empty).
    mig_mode: tuple[int, int] | None = None
    migs: list[FakeMig | None] = field(default_factory=list)
    max_migs: int = 7


class FakeNvml:
    """The fake driver state and the module object that exposes it."""

    def __init__(self, gpus: list[FakeNvmlGpu], *, init_error: int | None = None,
                 bytes_strings: bool = False) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.bytes_strings = bytes_strings
        self.initialized = 0
        self.shutdowns = 0
        # Every nvmlDeviceSetPowerManagementLimit call: (uuid, limit in mW, NVML return code).
        self.set_calls: list[tuple[str, int, int]] = []
        self.module = self._build_module()

    def advance(self, seconds: float) -> None:
        """Let time pass: every GPU's counter grows by its power over `seconds`."""
        for g in self.gpus:
            g.energy_mj += g.power_w * seconds * 1000.0

    # -- the module -----------------------------------------------------------------------

    def _text(self, s: str) -> str | bytes:
        return s.encode() if self.bytes_strings else s

    def _gpu(self, handle: SimpleNamespace, fn: str) -> FakeNvmlGpu:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        g = handle.gpu
        g.calls += 1
        if g.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in g.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return g

    def _build_module(self) -> types.ModuleType:
        fake = self
        m = types.ModuleType("pynvml")
        m.__dict__.update(CONSTANTS)
        m.NVMLError = NVMLError

        def nvmlInit():
            if fake.init_error is not None:
                raise NVMLError(fake.init_error)
            fake.initialized += 1

        def nvmlShutdown():
            if not fake.initialized:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            fake.initialized -= 1
            fake.shutdowns += 1

        def nvmlDeviceGetCount():
            if not fake.initialized:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            return len(fake.gpus)

        def nvmlDeviceGetHandleByIndex(index):
            if not fake.initialized:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            if not 0 <= index < len(fake.gpus):
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            return SimpleNamespace(gpu=fake.gpus[index])

        def nvmlDeviceGetHandleByUUID(uuid):
            for g in fake.gpus:
                if g.uuid == (uuid.decode() if isinstance(uuid, bytes) else uuid):
                    return SimpleNamespace(gpu=g)
            raise NVMLError(NVML_ERROR_NOT_FOUND)

        def nvmlDeviceGetName(handle):
            return fake._text(fake._gpu(handle, "nvmlDeviceGetName").name)

        def nvmlDeviceGetUUID(handle):
            g = fake._gpu(handle, "nvmlDeviceGetUUID")
            mig = getattr(handle, "mig", None)
            return fake._text(mig.uuid if mig is not None else g.uuid)

        def nvmlDeviceGetMemoryInfo(handle, version=None):
            g = fake._gpu(handle, "nvmlDeviceGetMemoryInfo")
            mig = getattr(handle, "mig", None)
            total = mig.memory_mib * 2**20 if mig is not None else g.memory_total_b
            return SimpleNamespace(total=total, free=total, used=0)

        def nvmlDeviceGetMigMode(device):
            g = fake._gpu(device, "nvmlDeviceGetMigMode")
            if g.mig_mode is None or getattr(device, "mig", None) is not None:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return list(g.mig_mode)

        def nvmlDeviceGetMaxMigDeviceCount(device):
            g = fake._gpu(device, "nvmlDeviceGetMaxMigDeviceCount")
            if g.mig_mode is None:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return g.max_migs

        def nvmlDeviceGetMigDeviceHandleByIndex(device, index):
            g = fake._gpu(device, "nvmlDeviceGetMigDeviceHandleByIndex")
            if g.mig_mode is None:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            if not 0 <= index < g.max_migs:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            if g.mig_mode[0] != NVML_DEVICE_MIG_ENABLE or index >= len(g.migs) or g.migs[index] is None:
                raise NVMLError(NVML_ERROR_NOT_FOUND)
            return SimpleNamespace(gpu=g, mig=g.migs[index])

        def _mig_of(device, fn):
            fake._gpu(device, fn)
            mig = getattr(device, "mig", None)
            if mig is None:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            return mig

        def nvmlDeviceGetGpuInstanceId(device):
            return _mig_of(device, "nvmlDeviceGetGpuInstanceId").gpu_instance_id

        def nvmlDeviceGetComputeInstanceId(device):
            return _mig_of(device, "nvmlDeviceGetComputeInstanceId").compute_instance_id

        def nvmlDeviceGetAttributes(device):
            mig = _mig_of(device, "nvmlDeviceGetAttributes")
            return SimpleNamespace(multiprocessorCount=mig.multiprocessors, sharedCopyEngineCount=mig.slices,
                                   sharedDecoderCount=0, sharedEncoderCount=0, sharedJpegCount=0,
                                   sharedOfaCount=0, gpuInstanceSliceCount=mig.slices,
                                   computeInstanceSliceCount=mig.slices, memorySizeMB=mig.memory_mib)

        def nvmlDeviceGetPciInfo(handle):
            g = fake._gpu(handle, "nvmlDeviceGetPciInfo")
            domain, bus, device = g.pci
            return SimpleNamespace(domain=domain, bus=bus, device=device,
                                   busId=f"{domain:08X}:{bus:02X}:{device:02X}.0".encode())

        def nvmlDeviceGetArchitecture(device):
            return fake._gpu(device, "nvmlDeviceGetArchitecture").arch

        def nvmlDeviceGetPowerUsage(handle):
            g = fake._gpu(handle, "nvmlDeviceGetPowerUsage")
            return g.raw.get("nvmlDeviceGetPowerUsage", int(round(g.power_w * 1000)))

        def nvmlDeviceGetFieldValues(handle, fieldIds):
            g = fake._gpu(handle, "nvmlDeviceGetFieldValues")
            out = []
            for fid in fieldIds:
                if fid == NVML_FI_DEV_POWER_INSTANT and "instant" not in g.unsupported:
                    watts = g.power_w if g.instant_w is None else g.instant_w
                    out.append(SimpleNamespace(fieldId=fid, nvmlReturn=NVML_SUCCESS,
                                               valueType=NVML_VALUE_TYPE_UNSIGNED_INT,
                                               value=SimpleNamespace(uiVal=int(round(watts * 1000)))))
                else:
                    out.append(SimpleNamespace(fieldId=fid, nvmlReturn=NVML_ERROR_NOT_SUPPORTED,
                                               valueType=NVML_VALUE_TYPE_UNSIGNED_INT,
                                               value=SimpleNamespace(uiVal=0)))
            return out

        def nvmlDeviceGetTotalEnergyConsumption(handle):
            g = fake._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption")
            return g.raw.get("nvmlDeviceGetTotalEnergyConsumption", int(g.energy_mj))

        def nvmlDeviceGetUtilizationRates(handle):
            g = fake._gpu(handle, "nvmlDeviceGetUtilizationRates")
            return SimpleNamespace(gpu=g.raw.get("nvmlDeviceGetUtilizationRates", g.util_pct), memory=0)

        def nvmlDeviceGetEnforcedPowerLimit(handle):
            g = fake._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit")
            return g.raw.get("nvmlDeviceGetEnforcedPowerLimit", g.limit_mw)

        def nvmlSystemGetDriverVersion():
            if not fake.initialized:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            return fake._text("580.95.05")

        def nvmlSystemGetNVMLVersion():
            if not fake.initialized:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            return fake._text("13.580.95.05")

        def nvmlSystemGetCudaDriverVersion():
            if not fake.initialized:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            return 13000

        def nvmlDeviceGetPowerManagementLimit(handle):
            return fake._gpu(handle, "nvmlDeviceGetPowerManagementLimit").limit_mw

        def nvmlDeviceGetPowerManagementLimitConstraints(handle):
            g = fake._gpu(handle, "nvmlDeviceGetPowerManagementLimitConstraints")
            return [g.min_limit_mw, g.max_limit_mw]

        def nvmlDeviceSetPowerManagementLimit(handle, limit):
            # NVML API reference: limit in milliwatts within the constraints (else
            # NVML_ERROR_INVALID_ARGUMENT); root only (else NVML_ERROR_NO_PERMISSION).
            try:
                g = fake._gpu(handle, "nvmlDeviceSetPowerManagementLimit")
            except NVMLError as e:
                fake.set_calls.append((handle.gpu.uuid, limit, e.value))
                raise
            if isinstance(limit, bool) or not isinstance(limit, int):
                raise TypeError(f"limit must be an int of milliwatts (c_uint), not {limit!r}")
            code = NVML_SUCCESS
            if not g.privileged:
                code = NVML_ERROR_NO_PERMISSION
            elif not g.min_limit_mw <= limit <= g.max_limit_mw:
                code = NVML_ERROR_INVALID_ARGUMENT
            fake.set_calls.append((g.uuid, limit, code))
            if code != NVML_SUCCESS:
                raise NVMLError(code)
            g.limit_mw = limit

        def nvmlDeviceGetPowerManagementDefaultLimit(handle):
            return fake._gpu(handle, "nvmlDeviceGetPowerManagementDefaultLimit").default_limit_mw

        for fn in list(locals().values()):
            if callable(fn) and getattr(fn, "__name__", "").startswith("nvml"):
                setattr(m, fn.__name__, fn)
        return m


FUNCTIONS = [name for name in vars(FakeNvml([]).module) if name.startswith("nvml")]
