"""GPU backends: NVML, amdsmi and an emulated fleet behind one interface."""

from telemetry.gpu.common import (
    GpuBackend,
    GpuDevice,
    GpuDriverError,
    GpuError,
    GpuLibraryMissing,
    GpuLost,
    GpuNotSupported,
    PowerReading,
)
from telemetry.gpu.detect import detect_backend
from telemetry.gpu.emulated import EmulatedBackend, EmulatedModel

__all__ = [
    "EmulatedBackend",
    "EmulatedModel",
    "GpuBackend",
    "GpuDevice",
    "GpuDriverError",
    "GpuError",
    "GpuLibraryMissing",
    "GpuLost",
    "GpuNotSupported",
    "PowerReading",
    "detect_backend",
]
