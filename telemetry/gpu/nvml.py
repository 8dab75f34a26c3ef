"""NVIDIA GPUs through NVML (`nvidia-ml-py`, imported as `pynvml`).

Indices: CUDA with CUDA_DEVICE_ORDER=PCI_BUS_ID (which carbonsched sets for every job)
counts GPUs in PCI bus order (domain, bus, device). NVML usually enumerates in that order
too, but does not promise it, so this backend sorts by PCI address itself and numbers the
GPUs 0..n-1 in that order: `GpuDevice.index` is the CUDA_VISIBLE_DEVICES index of a job.
If CUDA_VISIBLE_DEVICES is set in the agent's own environment, the agent manages only the
GPUs it names (indices counted in PCI bus order, or GPU UUIDs); they keep their physical
index (see `telemetry.gpu.visible`).

MIG: a GPU whose MIG mode is on (nvmlDeviceGetMigMode: current mode NVML_DEVICE_MIG_ENABLE)
lists its MIG devices: nvmlDeviceGetMaxMigDeviceCount slots, each read with
nvmlDeviceGetMigDeviceHandleByIndex (NVML_ERROR_NOT_FOUND: an empty slot), its UUID
("MIG-<uuid>", what CUDA_VISIBLE_DEVICES takes), nvmlDeviceGetGpuInstanceId and
nvmlDeviceGetComputeInstanceId, its memory (nvmlDeviceGetMemoryInfo of the MIG handle) and its
GPU instance's compute slices (nvmlDeviceGetAttributes gpuInstanceSliceCount). Power and
energy exist only for the whole GPU: NVML reports neither per MIG device.

Power: nvmlDeviceGetPowerUsage (mW) is a 1 s average on Ampere and later except GA100
(A100/A30), and instantaneous before; where the driver supports the NVML_FI_DEV_POWER_INSTANT
field the instantaneous value is also read. Energy: nvmlDeviceGetTotalEnergyConsumption,
mJ since the driver was loaded (Volta and later).

Validity: every number read from NVML goes through `telemetry.gpu.common.valid_number`:
all-ones values (NVML_VALUE_NOT_AVAILABLE, 0xFFFFFFFF and its 16/64-bit forms), negative
values and a power above MAX_POWER_OVER_RATED times the larger of the enforced power limit
and the catalog TDP (passed in by the agent) are gaps (None), never numbers.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from telemetry.gpu.common import (
    CounterWatch,
    GpuCapabilities,
    GpuDevice,
    GpuDriverError,
    GpuError,
    GpuLibraryMissing,
    GpuLost,
    GpuNotSupported,
    GpuPermissionDenied,
    MigInstance,
    PowerLimit,
    PowerReading,
    VendorBackend,
    check_limit_in_range,
    power_ceiling_w,
    translate_vendor_errors,
    valid_number,
)
from telemetry.gpu.visible import select_visible

log = logging.getLogger(__name__)

_GA100 = re.compile(r"\bA(100|30)\b")
_VALUE_FIELDS = {"NVML_VALUE_TYPE_DOUBLE": "dVal", "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
                 "NVML_VALUE_TYPE_UNSIGNED_LONG": "ulVal",
                 "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal",
                 "NVML_VALUE_TYPE_SIGNED_LONG_LONG": "sllVal",
                 "NVML_VALUE_TYPE_SIGNED_INT": "siVal", "NVML_VALUE_TYPE_UNSIGNED_SHORT": "usVal"}


def load_pynvml() -> ModuleType:
    """Import the vendor module; GpuLibraryMissing when it is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as e:
        raise GpuLibraryMissing(f"nvidia-ml-py (pynvml) is not importable: {e}") from e


def _text(value: str | bytes) -> str:
    """Old nvidia-ml-py versions return bytes, newer ones str."""
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class _Device:
    info: GpuDevice
    handle: Any


class NvmlBackend(VendorBackend):
    """All NVIDIA GPUs this agent may manage, probed once at start."""

    name = "nvml"
    vendor_label = "NVIDIA"

    def __init__(self, *, env: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._nv = load_pynvml()
        self._vendor_errors = (self._nv.NVMLError,)
        self._clock = clock
        self._lock = threading.Lock()
        self._lost: set[str] = set()
        self._closed = False
        self._watch = CounterWatch()
        self._init()
        try:
            self._devices = self._enumerate(os.environ if env is None else env)
        except BaseException:
            self.close()
            raise
        self._by_uuid = {d.info.uuid: d for d in self._devices}

    # -- vendor error mapping ------------------------------------------------------------

    def _code(self, name: str) -> object:
        return getattr(self._nv, name, object())  # a sentinel never equals a real code

    def _translate(self, e: Exception, call: str) -> GpuError:
        """The GpuError for an NVMLError, by its return code."""
        code = getattr(e, "value", None)
        msg = f"NVML {call}: {e}"
        if code in (self._code("NVML_ERROR_NOT_SUPPORTED"), self._code("NVML_ERROR_FUNCTION_NOT_FOUND")):
            return GpuNotSupported(msg)
        if code in (self._code("NVML_ERROR_GPU_IS_LOST"), self._code("NVML_ERROR_RESET_REQUIRED")):
            return GpuLost(msg)
        if code == self._code("NVML_ERROR_LIBRARY_NOT_FOUND"):
            return GpuLibraryMissing(msg)
        if code == self._code("NVML_ERROR_NO_PERMISSION"):
            return GpuPermissionDenied(msg)
        if code in (self._code("NVML_ERROR_DRIVER_NOT_LOADED"), self._code("NVML_ERROR_UNINITIALIZED"),
                    self._code("NVML_ERROR_LIB_RM_VERSION_MISMATCH")):
            return GpuDriverError(msg)
        return GpuError(msg)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call one NVML function, translating its error (named after the function)."""
        try:
            return fn(*args)
        except self._vendor_errors as e:
            raise self._translate(e, getattr(fn, "__name__", "call")) from e

    def _optional(self, notes: list[str] | None, what: str, fn: Callable[..., Any], *args: Any,
                  tolerate: type[GpuError] = GpuError) -> Any:
        """A call whose failure (of type `tolerate`) only means "not available here": None,
        with a note. A lost GPU always raises."""
        try:
            return self._call(fn, *args)
        except GpuLost:
            raise
        except tolerate as e:
            if notes is not None:
                notes.append(f"{what}: {e}")
            return None

    # -- start-up -------------------------------------------------------------------------

    def _init(self) -> None:
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            if getattr(e, "value", None) == self._code("NVML_ERROR_LIBRARY_NOT_FOUND"):
                raise GpuLibraryMissing(f"libnvidia-ml.so not found: {e}") from e
            raise GpuDriverError(f"NVML did not initialise ({e}); is the NVIDIA driver loaded "
                                 f"and /dev/nvidia* accessible?") from e

    @translate_vendor_errors
    def _enumerate(self, env: Mapping[str, str]) -> list[_Device]:
        nv = self._nv
        found = []
        for i in range(nv.nvmlDeviceGetCount()):
            try:
                handle = self._call(nv.nvmlDeviceGetHandleByIndex, i)
                uuid = _text(self._call(nv.nvmlDeviceGetUUID, handle))
            except GpuError as e:
                log.warning("NVML device %d skipped: %s (if CUDA still sees it, the indices "
                            "of the GPUs after it are off by one)", i, e)
                continue
            pci = self._optional(None, "PCI info", nv.nvmlDeviceGetPciInfo, handle)
            found.append((i, handle, uuid, pci))
        if all(pci is not None for *_, pci in found):
            found.sort(key=lambda f: (f[3].domain, f[3].bus, f[3].device))
        else:
            log.warning("NVML did not give every GPU's PCI address; assuming its own order is "
                        "PCI bus order")
        physical = [(index, handle, uuid, pci) for index, (_, handle, uuid, pci) in enumerate(found)]
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if visible and env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") != "PCI_BUS_ID":
            log.warning("CUDA_VISIBLE_DEVICES=%s is read in PCI bus order (as carbonsched's jobs "
                        "use it), not CUDA's default FASTEST_FIRST order", visible)
        chosen = select_visible(physical, visible, var="CUDA_VISIBLE_DEVICES",
                                ids_of=lambda p: [p[2]])
        devices = []
        for index, handle, uuid, pci in chosen:
            try:
                devices.append(_Device(self._describe(index, handle, uuid, pci), handle))
            except GpuLost as e:
                log.error("NVIDIA GPU %d (%s) is lost at start-up and is not managed: %s", index, uuid, e)
            except GpuError as e:
                log.error("NVIDIA GPU %d (%s) could not be probed and is not managed: %s",
                          index, uuid, e)
        return devices

    def _describe(self, index: int, handle: Any, uuid: str, pci: Any) -> GpuDevice:
        nv = self._nv
        notes: list[str] = []
        name = _text(self._call(nv.nvmlDeviceGetName, handle))
        mem = self._optional(notes, "memory", nv.nvmlDeviceGetMemoryInfo, handle)
        total_b = valid_number(mem.total) if mem is not None else None
        if mem is not None and not total_b:
            notes.append(f"memory: total {mem.total!r} is not a valid byte count")
        limit = self._limits(handle, notes)
        mig_enabled, instances = self._mig(handle, notes)
        caps = self._probe(handle, name, notes, has_limit=limit is not None)
        return GpuDevice(index=index, uuid=uuid, name=name.strip(), model=name.strip(), vendor="nvidia",
                         memory_gib=round(total_b / 2**30, 2) if total_b else 0.0,
                         pci_bus_id=_text(pci.busId) if pci is not None else None,
                         power_limit=limit, capabilities=caps,
                         mig_enabled=mig_enabled, mig_instances=instances)

    def _mig(self, handle: Any, notes: list[str]) -> tuple[bool, tuple[MigInstance, ...]]:
        """Whether MIG mode is on and the GPU's MIG devices (see the module's docstring). A
        GPU or driver without MIG (NVML_ERROR_NOT_SUPPORTED, an nvidia-ml-py without the
        calls) is simply not in MIG mode. A pending mode change counts once it is current
        (it takes a GPU reset)."""
        nv = self._nv
        get_mode = getattr(nv, "nvmlDeviceGetMigMode", None)
        if get_mode is None:
            return False, ()
        mode = self._optional(None, "MIG mode", get_mode, handle, tolerate=GpuNotSupported)
        if mode is None or mode[0] != getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1):
            return False, ()
        instances = []
        for slot in range(self._call(nv.nvmlDeviceGetMaxMigDeviceCount, handle)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nv.NVMLError as e:
                if getattr(e, "value", None) == self._code("NVML_ERROR_NOT_FOUND"):
                    continue  # no MIG device in this slot
                raise self._translate(e, "nvmlDeviceGetMigDeviceHandleByIndex") from e
            instances.append(self._mig_instance(mig, slot, notes))
        if not instances:
            notes.append("MIG mode is on but no MIG device is configured: no job can run here")
        return True, tuple(instances)

    def _mig_instance(self, mig: Any, slot: int, notes: list[str]) -> MigInstance:
        nv = self._nv
        uuid = _text(self._call(nv.nvmlDeviceGetUUID, mig))
        gi = self._call(nv.nvmlDeviceGetGpuInstanceId, mig)
        ci = self._optional(None, "", nv.nvmlDeviceGetComputeInstanceId, mig)
        mem = self._optional(notes, f"MIG device {slot} memory", nv.nvmlDeviceGetMemoryInfo, mig)
        attrs = self._optional(notes, f"MIG device {slot} attributes", nv.nvmlDeviceGetAttributes, mig)
        total_b = valid_number(mem.total) if mem is not None else None
        slices = valid_number(attrs.gpuInstanceSliceCount, low=1) if attrs is not None else None
        return MigInstance(uuid=uuid, gpu_instance_id=int(gi),
                           compute_instance_id=None if ci is None else int(ci),
                           slices=None if slices is None else int(slices),
                           memory_mib=round(total_b / 2**20, 1) if total_b else None)

    def _probe(self, handle: Any, name: str, notes: list[str], *, has_limit: bool) -> GpuCapabilities:
        """Try each power/energy query once; what fails is recorded, not retried per read."""
        nv = self._nv
        power = self._optional(notes, "power", nv.nvmlDeviceGetPowerUsage, handle) is not None
        try:
            instant = self._instant_w(handle) is not None
        except GpuLost:
            raise
        except GpuError as e:
            notes.append(f"instant power: {e}")
            instant = False
        energy = self._optional(notes, "energy counter", nv.nvmlDeviceGetTotalEnergyConsumption,
                                handle) is not None
        util = self._optional(notes, "utilization", nv.nvmlDeviceGetUtilizationRates, handle) is not None
        arch = self._optional(None, "architecture", nv.nvmlDeviceGetArchitecture, handle)
        ampere = getattr(nv, "NVML_DEVICE_ARCH_AMPERE", 7)
        if not power:
            kind = None
        elif arch is None or arch == getattr(nv, "NVML_DEVICE_ARCH_UNKNOWN", 0xFFFFFFFF):
            kind = "unknown"
        elif arch >= ampere and not _GA100.search(name):
            kind = "average_1s"
        else:
            kind = "instant"
        return GpuCapabilities(power=power, instant_power=instant, energy_counter=energy,
                               utilization=util, power_limit=has_limit, power_kind=kind,
                               notes=tuple(notes))

    def _limits(self, handle: Any, notes: list[str] | None) -> PowerLimit | None:
        nv = self._nv
        current = self._optional(notes, "enforced power limit", nv.nvmlDeviceGetEnforcedPowerLimit, handle)
        bounds = self._optional(None, "power limit range",
                                nv.nvmlDeviceGetPowerManagementLimitConstraints, handle)
        default = self._optional(None, "default power limit",
                                 nv.nvmlDeviceGetPowerManagementDefaultLimit, handle)
        lo, hi = bounds if bounds is not None else (None, None)
        # Milliwatts; 0 or a sentinel is "no limit reported".
        watts = [None if not valid_number(v) else v / 1000.0 for v in (current, lo, hi, default)]
        if all(w is None for w in watts):
            return None
        return PowerLimit(*watts)

    def _instant_w(self, handle: Any) -> float | None:
        """NVML_FI_DEV_POWER_INSTANT in watts; the call succeeds even when the field fails."""
        nv = self._nv
        field_id = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)
        if field_id is None:
            raise GpuNotSupported("this nvidia-ml-py has no NVML_FI_DEV_POWER_INSTANT")
        fv = self._call(nv.nvmlDeviceGetFieldValues, handle, [field_id])[0]
        if fv.nvmlReturn != nv.NVML_SUCCESS:
            raise self._translate(nv.NVMLError(fv.nvmlReturn), "field POWER_INSTANT")
        for type_name, attr in _VALUE_FIELDS.items():
            if fv.valueType == getattr(nv, type_name, None):
                milliwatts = valid_number(getattr(fv.value, attr))
                return None if milliwatts is None else milliwatts / 1000.0
        raise GpuNotSupported(f"field POWER_INSTANT has unknown value type {fv.valueType}")

    # -- the interface --------------------------------------------------------------------

    def read(self, uuid: str) -> PowerReading:
        dev = self._device(uuid)
        try:
            return self._read(dev)
        except GpuLost as e:
            self._mark_lost(uuid, e)
            raise

    @translate_vendor_errors
    def _read(self, dev: _Device) -> PowerReading:
        """One reading from the queries the probe found working. A query that stops being
        supported gives None; any other failure raises."""
        nv, h, caps = self._nv, dev.handle, dev.info.capabilities
        assert caps is not None

        def maybe(ok: bool, fn: Callable[..., Any]) -> Any:
            return self._optional(None, "", fn, h, tolerate=GpuNotSupported) if ok else None

        t = self._clock()
        power_mw = maybe(caps.power, nv.nvmlDeviceGetPowerUsage)
        instant_w = None
        if caps.instant_power:
            try:
                instant_w = self._instant_w(h)
            except GpuNotSupported:
                instant_w = None
        energy_mj = valid_number(maybe(caps.energy_counter, nv.nvmlDeviceGetTotalEnergyConsumption))
        util = maybe(caps.utilization, nv.nvmlDeviceGetUtilizationRates)
        limit = dev.info.power_limit
        ceiling = power_ceiling_w(limit.current_w if limit else None, limit.max_w if limit else None,
                                  self.rated_power_w(dev.info.uuid))
        power_mw = valid_number(power_mw, high=1000.0 * ceiling)
        instant_w = valid_number(instant_w, high=ceiling)
        power_w = power_mw / 1000.0 if power_mw is not None else instant_w
        energy_j = energy_mj / 1000.0 if energy_mj is not None else None
        util_pct = valid_number(util.gpu, high=100) if util is not None else None
        return PowerReading(uuid=dev.info.uuid, power_w=power_w, energy_j=energy_j,
                            utilization_pct=util_pct,
                            instant_power_w=instant_w, timestamp_s=t,
                            energy_reset=self._watch.observe(dev.info.uuid, energy_j))

    def power_limit(self, uuid: str) -> PowerLimit:
        dev = self._device(uuid)
        try:
            limit = self._limits(dev.handle, None)
        except GpuLost as e:
            self._mark_lost(uuid, e)
            raise
        if limit is None:
            raise GpuNotSupported(f"NVIDIA GPU {uuid} does not report a power limit")
        return limit

    def set_power_limit(self, uuid: str, limit_w: float) -> PowerLimit:
        """nvmlDeviceSetPowerManagementLimit, in milliwatts, within
        nvmlDeviceGetPowerManagementLimitConstraints (NVML API reference: "Requires root/admin
        permissions"; non-admin callers get NVML_ERROR_NO_PERMISSION, a value out of range
        NVML_ERROR_INVALID_ARGUMENT; "Limit is not persistent across reboots or driver
        unloads"). The limit is checked against the range first, then read back."""
        dev = self._device(uuid)
        try:
            now = self._limits(dev.handle, None)
            if now is None or (now.min_w is None and now.max_w is None):
                raise GpuNotSupported(f"NVIDIA GPU {uuid} reports no settable power limit range")
            check_limit_in_range(now, limit_w, f"NVIDIA GPU {uuid}")
            self._call(self._nv.nvmlDeviceSetPowerManagementLimit, dev.handle, int(round(limit_w * 1000)))
            after = self._limits(dev.handle, None)
        except GpuLost as e:
            self._mark_lost(uuid, e)
            raise
        if after is None:
            raise GpuNotSupported(f"NVIDIA GPU {uuid} does not report its power limit after setting it")
        return after

    def versions(self) -> dict[str, str]:
        """NVIDIA driver, NVML library and CUDA driver API versions, as far as NVML tells."""
        nv, out = self._nv, {}
        for key, fn in (("driver", "nvmlSystemGetDriverVersion"), ("nvml", "nvmlSystemGetNVMLVersion"),
                        ("cuda driver api", "nvmlSystemGetCudaDriverVersion")):
            call = getattr(nv, fn, None)
            value = self._optional(None, "", call) if call is not None else None
            if value is not None:
                out[key] = _text(value) if not isinstance(value, int) else f"{value // 1000}.{value % 1000 // 10}"
        return out

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._nv.nvmlShutdown()
        except self._vendor_errors as e:
            log.warning("NVML shutdown failed: %s", e)
