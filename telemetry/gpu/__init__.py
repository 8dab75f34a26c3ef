"""GPU backends: NVML, amdsmi and an emulated fleet behind one interface.

The vendor backends (`telemetry.gpu.nvml.NvmlBackend`, `telemetry.gpu.amd.AmdSmiBackend`)
are not imported here: importing this package never touches a vendor library.
"""

from telemetry.gpu.common import (
    GpuBackend,
    GpuCapabilities,
    GpuDevice,
    GpuDriverError,
    GpuError,
    GpuLibraryMissing,
    GpuLost,
    GpuNotFound,
    GpuNotSupported,
    GpuPermissionDenied,
    MigInstance,
    PowerLimit,
    PowerLimitOutOfRange,
    PowerReading,
)
from telemetry.gpu.detect import detect_backend, probe_backends
from telemetry.gpu.emulated import EmulatedBackend, EmulatedModel

__all__ = [
    "EmulatedBackend",
    "EmulatedModel",
    "GpuBackend",
    "GpuCapabilities",
    "GpuDevice",
    "GpuDriverError",
    "GpuError",
    "GpuLibraryMissing",
    "GpuLost",
    "GpuNotFound",
    "GpuNotSupported",
    "GpuPermissionDenied",
    "MigInstance",
    "PowerLimit",
    "PowerLimitOutOfRange",
    "PowerReading",
    "detect_backend",
    "probe_backends",
]
