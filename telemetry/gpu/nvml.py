"""NVIDIA GPUs through NVML (`nvidia-ml-py`, imported as `pynvml`).

NVML enumerates devices in PCI bus order, which is also CUDA's order when
CUDA_DEVICE_ORDER=PCI_BUS_ID; carbonsched sets that variable for every job it starts, so the
NVML index is the CUDA_VISIBLE_DEVICES index.
"""

from __future__ import annotations

import functools
import logging

from telemetry.gpu.common import (
    GpuBackend,
    GpuDevice,
    GpuDriverError,
    GpuLibraryMissing,
    GpuLost,
    GpuNotSupported,
    PowerReading,
)

log = logging.getLogger(__name__)


def _translate(fn):
    """Map pynvml.NVMLError into carbonsched's GPU exceptions."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except self._nvml.NVMLError as e:
            code = getattr(e, "value", None)
            nv = self._nvml
            if code == getattr(nv, "NVML_ERROR_NOT_SUPPORTED", object()):
                raise GpuNotSupported(str(e)) from e
            if code in (getattr(nv, "NVML_ERROR_GPU_IS_LOST", object()),
                        getattr(nv, "NVML_ERROR_UNKNOWN", object())):
                raise GpuLost(str(e)) from e
            if code in (getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", object()),
                        getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", object())):
                raise GpuLibraryMissing(str(e)) from e
            raise GpuDriverError(str(e)) from e

    return wrapper


class NvmlBackend(GpuBackend):
    name = "nvml"

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as e:
            raise GpuLibraryMissing("nvidia-ml-py (pynvml) is not installed") from e
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            if getattr(e, "value", None) == getattr(pynvml, "NVML_ERROR_LIBRARY_NOT_FOUND", None):
                raise GpuLibraryMissing(f"libnvidia-ml.so not found: {e}") from e
            raise GpuDriverError(f"NVML init failed: {e}") from e
        self._handles = self._enumerate()

    @_translate
    def _enumerate(self) -> list:
        nv = self._nvml
        return [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]

    @_translate
    def devices(self) -> list[GpuDevice]:
        nv = self._nvml
        out = []
        for i, h in enumerate(self._handles):
            name = nv.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            uuid = nv.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            out.append(GpuDevice(index=i, uuid=uuid, name=name, model=name, vendor="nvidia",
                                 memory_gib=round(mem.total / 2**30, 1)))
        return out

    @_translate
    def read(self, uuid: str) -> PowerReading:
        nv = self._nvml
        h = nv.nvmlDeviceGetHandleByUUID(uuid)
        power_w = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        try:
            energy_j = nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0
        except nv.NVMLError as e:
            if getattr(e, "value", None) != nv.NVML_ERROR_NOT_SUPPORTED:
                raise
            energy_j = None
        util = nv.nvmlDeviceGetUtilizationRates(h).gpu
        return PowerReading(uuid=uuid, power_w=power_w, energy_j=energy_j, utilization_pct=float(util))

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as e:
            log.warning("NVML shutdown failed: %s", e)
