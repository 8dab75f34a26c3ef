"""The GPU backend interface shared by the NVML, amdsmi and emulated backends.

Backends return plain readings. Vendor exceptions never cross this boundary: each backend
translates them into the exceptions below.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass


class GpuError(Exception):
    """Base of every error a GPU backend raises."""


class GpuLibraryMissing(GpuError):
    """The vendor library is not installed or its shared object cannot be loaded (normal)."""


class GpuDriverError(GpuError):
    """The vendor library loaded but the driver did not answer (broken install: loud)."""


class GpuNotSupported(GpuError):
    """The device does not support this query."""


class GpuLost(GpuError):
    """The device fell off the bus or stopped responding; it must not be scheduled."""


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as a backend enumerates it.

    `index` is the vendor's own device number (CUDA's for NVIDIA in PCI bus order, ROCm's for
    AMD): the number that goes into CUDA_VISIBLE_DEVICES or ROCR_VISIBLE_DEVICES.
    """

    index: int
    uuid: str
    name: str
    model: str
    vendor: str
    memory_gib: float


@dataclass(frozen=True)
class PowerReading:
    """Instantaneous power and the energy counter of one GPU at one moment."""

    uuid: str
    power_w: float | None
    energy_j: float | None
    utilization_pct: float | None = None


class GpuBackend(abc.ABC):
    """A source of GPU inventory and power readings for one node."""

    name: str = "abstract"
    emulated: bool = False

    @abc.abstractmethod
    def devices(self) -> list[GpuDevice]:
        """The GPUs on this node, in visible-devices index order."""

    @abc.abstractmethod
    def read(self, uuid: str) -> PowerReading:
        """Power and energy of one GPU (by UUID) now."""

    def set_busy(self, uuid: str, busy: bool) -> None:
        """Tell an emulated backend a job started or stopped; real hardware ignores this."""

    def close(self) -> None:
        """Release the vendor library."""
