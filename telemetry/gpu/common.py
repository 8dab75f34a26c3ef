"""The GPU backend interface shared by the NVML, amdsmi and emulated backends.

Backends return plain readings. Vendor exceptions never cross this boundary: each backend
translates them into the exceptions below with `translate_vendor_errors`, keeping the vendor
exception as `__cause__` for the log.
"""

from __future__ import annotations

import abc
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger(__name__)
_log = log

# All-ones values that vendor libraries return for "not supported / no data" in unsigned
# fields: amdsmi.amdsmi_interface.MaxUIntegerTypes (UINT16_T, UINT32_T, UINT64_T; the 7.0.2
# wrapper turns only some of them into "N/A", e.g. amdsmi_get_power_info only 0xFFFF) and
# NVML's unsigned returns (NVML_VALUE_NOT_AVAILABLE is 0xFFFFFFFF / ULL all-ones in nvml.h).
SENTINELS = frozenset({0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})
# A board never draws more than this multiple of its rated power (its power cap, or the
# catalog's TDP); above it a reading is a unit mix-up or garbage, and is dropped.
MAX_POWER_OVER_RATED = 1.5
# With nothing to compare against, no accelerator board draws this much (MI355X: 1.4 kW).
MAX_PLAUSIBLE_POWER_W = 3000.0


def valid_number(value: Any, *, low: float = 0.0, high: float | None = None) -> float | None:
    """The one validity gate every vendor reading passes through: a float, or None (a gap).

    None for: anything not a real number ("N/A", None, bools, strings), NaN/inf, the
    all-ones sentinels in SENTINELS, values below `low` (negative counters and powers are
    impossible) and, when given, values above `high` (physically impossible for the part).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and value in SENTINELS:
        return None
    number = float(value)
    if number != number or number in (float("inf"), float("-inf")):
        return None
    if number < low or (high is not None and number > high):
        return None
    return number


def check_limit_in_range(limit: PowerLimit, limit_w: float, what: str) -> None:
    """PowerLimitOutOfRange unless `limit_w` lies within the range `limit` reports (a bound
    that is not reported is not checked; the driver checks it too)."""
    if not isinstance(limit_w, (int, float)) or limit_w != limit_w or limit_w <= 0:
        raise PowerLimitOutOfRange(f"{what}: {limit_w!r} is not a power limit in watts")
    # Half a watt of slack: the range comes from the driver in mW/uW and is shown rounded.
    if limit.min_w is not None and limit_w < limit.min_w - 0.5:
        raise PowerLimitOutOfRange(f"{what}: {limit_w:.1f} W is below the minimum {limit.min_w:.1f} W")
    if limit.max_w is not None and limit_w > limit.max_w + 0.5:
        raise PowerLimitOutOfRange(f"{what}: {limit_w:.1f} W is above the maximum {limit.max_w:.1f} W")


def power_ceiling_w(*rated_w: float | None) -> float:
    """The highest power reading accepted for a board rated at `rated_w` (cap, TDP, ...)."""
    known = [r for r in rated_w if r]
    return MAX_POWER_OVER_RATED * max(known) if known else MAX_PLAUSIBLE_POWER_W

class GpuError(Exception):
    """Base of every error a GPU backend raises."""


class GpuLibraryMissing(GpuError):
    """The vendor library is not installed or its shared object cannot be loaded (normal)."""


class GpuDriverError(GpuError):
    """The vendor library loaded but the driver did not answer (broken install: loud)."""


class GpuNotSupported(GpuError):
    """The device does not support this query."""


class GpuPermissionDenied(GpuDriverError):
    """The call needs a privilege this process lacks (setting a power limit needs root:
    NVML answers NVML_ERROR_NO_PERMISSION, AMD SMI AMDSMI_STATUS_NO_PERM). A subclass of
    GpuDriverError, as a read refused for privilege always was."""


class PowerLimitOutOfRange(GpuError, ValueError):
    """A power limit outside the range the driver accepts (checked before the vendor call)."""


class GpuNotFound(GpuError):
    """No GPU with that UUID is managed by this backend."""


class GpuLost(GpuError):
    """The device fell off the bus or stopped responding; it must not be scheduled."""


@dataclass(frozen=True)
class GpuCapabilities:
    """What a device answered when it was probed at start, so readers know what to expect.

    `power_kind` says what `PowerReading.power_w` is on this device: "average_1s" (NVML on
    Ampere and later except GA100), "instant", "average" (amdsmi average_socket_power, window
    chosen by firmware) or "modelled" (emulated). `notes` explain anything missing or odd.
    """

    power: bool
    instant_power: bool
    energy_counter: bool
    utilization: bool
    power_limit: bool
    power_kind: str | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PowerLimit:
    """The board power limit and the range an operator may set it to, in watts."""

    current_w: float | None
    min_w: float | None = None
    max_w: float | None = None
    default_w: float | None = None


@dataclass(frozen=True)
class MigInstance:
    """One MIG device of an NVIDIA GPU in MIG mode, as NVML enumerates it.

    `uuid` is NVML's "MIG-<uuid>", the name CUDA_VISIBLE_DEVICES takes for it. `slices` is
    its GPU instance's compute slices (nvmlDeviceGetAttributes gpuInstanceSliceCount, the
    "1" of 1g.10gb) and `memory_mib` its memory (nvmlDeviceGetMemoryInfo of the MIG device):
    the profile's name and share of the GPU follow from them and the part (in `scheduler`,
    which knows the catalog).
    """

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int | None
    slices: int | None
    memory_mib: float | None


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as a backend enumerates it.

    `index` is the vendor's own device number (CUDA's for NVIDIA in PCI bus order, ROCm's for
    AMD): the number that goes into CUDA_VISIBLE_DEVICES or ROCR_VISIBLE_DEVICES. It stays the
    physical number even when the agent itself runs with a visible-devices restriction.
    """

    index: int
    uuid: str
    name: str
    model: str
    vendor: str
    memory_gib: float
    pci_bus_id: str | None = None
    power_limit: PowerLimit | None = None
    capabilities: GpuCapabilities | None = None
    # A compute partition of a larger card (AMD MI300 CPX/DPX/QPX): the mode, and how many
    # partitions the card is split into. Power, energy and the power limit reported for a
    # partition are its equal share of the card's (see telemetry.gpu.amd).
    partition_mode: str | None = None
    partitions: int = 1
    # The card's memory partition (NPS) mode, where AMD SMI reports one (NPS1, NPS4, ...).
    memory_partition: str | None = None
    # NVIDIA MIG: whether MIG mode is on now, and the MIG devices configured on the GPU. A GPU
    # in MIG mode runs jobs only on its instances: CUDA never sees it whole.
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()


@dataclass(frozen=True)
class PowerReading:
    """Power and the energy counter of one GPU at one moment.

    `power_w` is the driver's headline power figure (see `GpuCapabilities.power_kind`);
    `instant_power_w` is the instantaneous reading where the device has one. `energy_j` is
    the hardware counter as the device reports it (not corrected); `energy_reset` is True
    when it is lower than this backend's previous reading of the same GPU (driver reload,
    wrap or a faulty counter), so consumers must not difference across it. `timestamp_s` is
    the backend's monotonic clock at the read, for integrating power.
    """

    uuid: str
    power_w: float | None
    energy_j: float | None
    utilization_pct: float | None = None
    instant_power_w: float | None = None
    timestamp_s: float = field(default_factory=time.monotonic)
    energy_reset: bool = False


F = TypeVar("F", bound=Callable[..., Any])


def translate_vendor_errors(fn: F) -> F:
    """Method decorator: vendor exceptions become GpuError subclasses (`raise ... from e`).

    The instance provides `_vendor_errors` (a tuple of the vendor's exception classes) and
    `_translate(e, call)` returning the GpuError to raise. Our own errors pass through.
    """

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except GpuError:
            raise
        except self._vendor_errors as e:
            raise self._translate(e, fn.__name__) from e

    return wrapper  # type: ignore[return-value]


class CounterWatch:
    """Notices an energy counter that went backwards between two reads of the same GPU.

    Counters are passed on as the hardware reports them (the energy code decides whether to
    trust them); this only flags the reading and logs the first time per GPU, so a reset is
    visible rather than silently producing a negative job energy.
    """

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self.resets: dict[str, int] = {}

    def observe(self, uuid: str, energy_j: float | None) -> bool:
        """Record a counter value; True when it is below the previous one."""
        if energy_j is None:
            return False
        with self._lock:
            last = self._last.get(uuid)
            self._last[uuid] = energy_j
            if last is None or energy_j >= last:
                return False
            self.resets[uuid] = self.resets.get(uuid, 0) + 1
            first = uuid not in self._warned
            self._warned.add(uuid)
        if first:
            log.warning("energy counter of GPU %s went backwards (%.1f J -> %.1f J): driver reload, "
                        "wrap or a faulty counter; energy across this point is not measurable "
                        "from the counter", uuid, last, energy_j)
        return True


class GpuBackend(abc.ABC):
    """A source of GPU inventory and power readings for one node.

    Backends are safe to call from several threads (the agent's tick and the sampler).
    Once a GPU is found lost it stays lost for this backend instance: reads raise GpuLost
    at once (a lost GPU can make vendor calls block for seconds) and `devices()` leaves it
    out, so re-registering the node marks it unhealthy.
    """

    name: str = "abstract"
    emulated: bool = False

    @abc.abstractmethod
    def devices(self) -> list[GpuDevice]:
        """The GPUs on this node that are not lost, in visible-devices index order."""

    @abc.abstractmethod
    def read(self, uuid: str) -> PowerReading:
        """Power and energy of one GPU (by UUID) now."""

    def capabilities(self, uuid: str) -> GpuCapabilities:
        """What the GPU answered when probed; GpuNotFound for an unknown UUID."""
        for d in self.devices():
            if d.uuid == uuid and d.capabilities is not None:
                return d.capabilities
        raise GpuNotFound(f"no GPU with UUID {uuid} on the {self.name} backend")

    def power_limit(self, uuid: str) -> PowerLimit:
        """The board power limit now (an operator may have changed it since start)."""
        raise GpuNotSupported(f"the {self.name} backend does not report power limits")

    def set_power_limit(self, uuid: str, limit_w: float) -> PowerLimit:
        """Set the board power limit to `limit_w` watts and return the limit read back.

        The value must lie within the device's [min_w, max_w] (PowerLimitOutOfRange, and the
        vendor is never called). GpuPermissionDenied without the privilege, GpuNotSupported
        where the device has no settable limit. A limit is not persistent across a driver
        reload or reboot; it does outlive the process that set it, so whoever sets one must
        restore it (`restore_power_limit`)."""
        raise GpuNotSupported(f"the {self.name} backend cannot set power limits")

    def restore_power_limit(self, uuid: str) -> PowerLimit:
        """Set the board power limit back to its default; the limit read back."""
        limit = self.power_limit(uuid)
        if limit.default_w is None:
            raise GpuNotSupported(f"GPU {uuid} reports no default power limit to restore")
        return self.set_power_limit(uuid, limit.default_w)

    def set_rated_power_w(self, uuid: str, rated_w: float | None) -> None:
        """Tell the backend the part's rated power (the catalog's TDP), which telemetry cannot
        look up itself: power readings above MAX_POWER_OVER_RATED times the larger of this and
        the board's own cap are dropped as impossible. The agent calls it at registration."""
        rated = getattr(self, "_rated_w", None)
        if rated is None:
            rated = self._rated_w = {}
        rated[uuid] = rated_w

    def rated_power_w(self, uuid: str) -> float | None:
        """What `set_rated_power_w` said for this GPU (None: nothing known)."""
        return getattr(self, "_rated_w", {}).get(uuid)

    def versions(self) -> dict[str, str]:
        """The vendor library's and driver's versions, for diagnostics ({} when unknown)."""
        return {}

    def check(self, uuid: str) -> None:
        """Raise GpuLost if the GPU stopped answering (or GpuError); return quietly if fine."""
        self.read(uuid)

    def set_busy(self, uuid: str, busy: bool) -> None:
        """Tell an emulated backend a job started or stopped; real hardware ignores this."""

    def close(self) -> None:
        """Release the vendor library. Idempotent."""

    def __enter__(self) -> GpuBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class VendorBackend(GpuBackend):
    """Bookkeeping shared by the real vendor backends: devices by UUID, lost GPUs, closing.

    Subclasses set `_lock`, `_devices` (objects with an `info: GpuDevice`), `_by_uuid`,
    `_lost` and `_closed`, and a `vendor_label` for messages.
    """

    vendor_label = "GPU"

    def devices(self) -> list[GpuDevice]:
        with self._lock:
            return [d.info for d in self._devices if d.info.uuid not in self._lost]

    def _device(self, uuid: str):
        with self._lock:
            if self._closed:
                raise GpuError(f"the {self.name} backend is closed")
            if uuid in self._lost:
                raise GpuLost(f"{self.vendor_label} GPU {uuid} was lost earlier")
        try:
            return self._by_uuid[uuid]
        except KeyError:
            raise GpuNotFound(f"no {self.vendor_label} GPU with UUID {uuid} on this node") from None

    def _mark_lost(self, uuid: str, e: GpuLost) -> None:
        with self._lock:
            new = uuid not in self._lost
            self._lost.add(uuid)
        if new:
            _log.error("%s GPU %s is lost (%s); it must not be scheduled until the node is "
                       "repaired and the agent restarted", self.vendor_label, uuid, e)
