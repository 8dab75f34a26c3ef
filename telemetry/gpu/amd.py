"""AMD GPUs through AMD SMI (the `amdsmi` Python package that ships with ROCm).

This module is `amd.py`, not `amdsmi.py`: a module named like the vendor package shadows it
whenever its own directory lands on sys.path (running a file from here, some test runners),
and `import amdsmi` would then import this file. The vendor package is imported only inside
`load_amdsmi()`, because it misbehaves at import time: without libamd_smi.so it raises
KeyError or OSError (not ImportError) and prints to stdout.

Indices: ROCR_VISIBLE_DEVICES counts GPUs in ROCm's (ROCr's) enumeration order, which is the
order of the KFD topology nodes. `GpuDevice.index` is that number: the `hip_id` AMD SMI
reports where it has amdsmi_get_gpu_enumeration_info (ROCm 6.4+), else the GPU's rank by KFD
node id, else AMD SMI's handle order. ROCR_VISIBLE_DEVICES (then HIP_VISIBLE_DEVICES or
CUDA_VISIBLE_DEVICES, which count within it) in the agent's own environment restrict which
GPUs this agent manages; they keep their physical index.

Readings differ by ROCm version and chip, and this backend accepts each spelling:
power is `current_socket_power` on MI300 and later, `average_socket_power` on MI200 (the
other is "N/A"), `socket_power` in some newer releases; some versions report microwatts
instead of watts (see `power_watts`). The energy counter is `energy_accumulator` (ROCm
6.2.1+) or `power` (before) times `counter_resolution`, in microjoules.

Validity: every field read from AMD SMI goes through `telemetry.gpu.common.valid_number`.
AMD SMI marks unsupported fields with "N/A" or all-ones values (0xFFFF, 0xFFFFFFFF,
0xFFFFFFFFFFFFFFFF); the 7.0.2 wrapper turns only some of them into "N/A"
(`amdsmi_get_power_info` converts 0xFFFF only, so an unsupported `average_socket_power` on an
MI300 arrives as 4294967295). Such a value, a negative one, or a power above
MAX_POWER_OVER_RATED times the board's cap (or the catalog TDP the agent passes in) is a gap
(None), never a number.

Compute partitions (MI300X/MI325X in DPX, QPX or CPX mode): one card shows up as 2, 4 or 8
handles, each with its own UUID, and the agent places jobs on each partition as on a GPU of
its own (ROCR_VISIBLE_DEVICES takes the partition's index). Power and energy exist only per
socket: AMD SMI reports them on the card's first partition (current_partition_id 0) and "N/A"
on the others. This backend reads them once per card from that partition and attributes to
each partition an equal share (socket value / number of partitions): the counter, the power
and the power cap alike, so the counter still matches the integral of power per partition,
the shares add up to the card, and no partition is counted twice. An equal share rather than
a split by activity: per-partition activity is not reported on every firmware, and a split by
activity would make each partition's counter depend on the sampling cadence. A job on one
partition of an otherwise idle card is so charged 1/N of the card's draw, idle power included.

Memory partitions: amdsmi_get_gpu_memory_partition gives the card's NPS mode ("NPS1",
"NPS4", ...; AMD SMI docs, Memory Partition Functions); it is reported with each device (a
partition's memory is its share of the card's in either mode, as AMD SMI reports it).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
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

# AMD SMI status codes (amdsmi_wrapper.AMDSMI_STATUS_*), used when the installed package does
# not expose its wrapper module; values from ROCm 6.x amdsmi.h.
_STATUS_DEFAULTS = {
    "NOT_SUPPORTED": 2, "NOT_YET_IMPLEMENTED": 3, "FAIL_LOAD_MODULE": 4, "FAIL_LOAD_SYMBOL": 5,
    "NO_PERM": 10, "IO": 12, "FILE_ERROR": 14, "INIT_ERROR": 18, "NOT_FOUND": 31, "NOT_INIT": 32,
    "DRIVER_NOT_LOADED": 34, "NO_DATA": 40, "AMDGPU_RESTART_ERR": 54,
}
_UNSUPPORTED = ("NOT_SUPPORTED", "NOT_YET_IMPLEMENTED", "NO_DATA")
# Failures of a call that worked at start that mean the device itself is gone.
_GONE = ("DRIVER_NOT_LOADED", "AMDGPU_RESTART_ERR", "IO", "NOT_FOUND", "FILE_ERROR")
# The first of these with a valid value is the headline power; on MI300 and later
# `average_socket_power` is unsupported (N/A or 0xFFFFFFFF), on MI200 `current_socket_power` is.
_POWER_KEYS = ("current_socket_power", "socket_power", "average_socket_power")
_INSTANT_KEYS = ("current_socket_power", "socket_power")
_PARTITION_MODES = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4, "CPX": 8}
_MICRO = 1e-6


def load_amdsmi() -> ModuleType:
    """Import the vendor package quietly; a missing library is GpuLibraryMissing."""
    noise = io.StringIO()
    try:
        with contextlib.redirect_stdout(noise):
            return importlib.import_module("amdsmi")
    except ImportError as e:
        raise GpuLibraryMissing(f"the amdsmi Python package is not importable: {e}") from e
    except (KeyError, OSError) as e:
        raise GpuLibraryMissing(f"amdsmi is installed but libamd_smi.so could not be loaded "
                                f"({type(e).__name__}: {e}); is ROCm installed?") from e
    except AttributeError as e:
        raise GpuDriverError(f"the amdsmi package does not match the installed ROCm library: {e}") from e
    finally:
        if noise.getvalue().strip():
            log.debug("amdsmi printed on import: %s", noise.getvalue().strip())


def number(value: Any) -> float | None:
    """A numeric reading, or None for "N/A", an all-ones sentinel or a negative value."""
    return valid_number(value)


def cap_watts(raw: Any) -> float | None:
    """A power cap in watts. AMD SMI reports caps in microwatts (ROCm 6+); a value below 100 000
    can only be watts, since no GPU has a cap under 0.1 W or over 100 kW. Sentinels, 0 and
    anything above 100 kW (after conversion) are no cap."""
    value = number(raw)
    if value is None or value <= 0:
        return None
    watts = value * _MICRO if value >= 100_000 else value
    return watts if watts <= 100_000 else None


def power_watts(raw: Any, cap_w: float | None, rated_w: float | None = None) -> float | None:
    """A power reading in watts, whichever unit this ROCm version used; None when invalid.

    Readings in watts are at most about 1.5 times the board's power cap; the same reading in
    microwatts is a million times larger. So a value above 1000 times the cap (or above
    100 000 when the cap is unknown) is microwatts. The sentinel is checked before the unit
    (UINT32_MAX is not 4294.97 W), and the result must be plausible for the board
    (`power_ceiling_w` of its cap and rated power).
    """
    value = number(raw)
    if value is None:
        return None
    limit = 1000 * cap_w if cap_w else 100_000
    watts = value * _MICRO if value > limit else value
    return watts if watts <= power_ceiling_w(cap_w, rated_w) else None


def _share(limit: PowerLimit, shares: int) -> PowerLimit:
    """A partition's equal share of its card's power limit."""
    if shares <= 1:
        return limit
    return PowerLimit(*(None if v is None else v / shares
                        for v in (limit.current_w, limit.min_w, limit.max_w, limit.default_w)))


@dataclass
class _Device:
    info: GpuDevice
    handle: Any
    cap_w: float | None  # the whole card's cap (a partition's share is cap_w / partitions)
    power_key: str | None
    instant_key: str | None
    socket_handle: Any = None  # where power and energy are read: the card's first partition


class AmdSmiBackend(VendorBackend):
    """All AMD GPUs this agent may manage, probed once at start."""

    name = "amdsmi"
    vendor_label = "AMD"

    def __init__(self, *, env: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._am = load_amdsmi()
        base = getattr(self._am, "AmdSmiException", None)
        if base is None:
            raise GpuDriverError("the amdsmi package has no AmdSmiException; unsupported version")
        self._vendor_errors: tuple[type[BaseException], ...] = (base,)
        wrapper = getattr(self._am, "amdsmi_wrapper", None)
        self._status = {name: getattr(wrapper, f"AMDSMI_STATUS_{name}", code)
                        for name, code in _STATUS_DEFAULTS.items()}
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

    def _status_of(self, e: BaseException) -> int | None:
        code = getattr(e, "err_code", None)
        if code is None and hasattr(e, "get_error_code"):
            code = e.get_error_code()
        return None if code is None else abs(int(code))

    def _is(self, code: int | None, names: tuple[str, ...]) -> bool:
        return code is not None and code in {self._status[n] for n in names}

    def _translate(self, e: BaseException, call: str) -> GpuError:
        """The GpuError for an AMD SMI exception raised after start-up, by its status code."""
        code = self._status_of(e)
        msg = f"amdsmi {call}: {e}"
        if self._is(code, _UNSUPPORTED):
            return GpuNotSupported(msg)
        if self._is(code, _GONE):
            return GpuLost(msg)
        if self._is(code, ("NO_PERM",)):
            return GpuPermissionDenied(msg)
        if self._is(code, ("NOT_INIT", "INIT_ERROR")):
            return GpuDriverError(msg)
        return GpuError(msg)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self._vendor_errors as e:
            raise self._translate(e, getattr(fn, "__name__", "call")) from e

    def _optional(self, notes: list[str] | None, what: str, fn: Callable[..., Any] | None,
                  *args: Any) -> Any:
        """A query that may be unsupported (or absent from this amdsmi version): None then."""
        if fn is None:
            if notes is not None:
                notes.append(f"{what}: not in this amdsmi version")
            return None
        try:
            return self._call(fn, *args)
        except GpuLost:
            raise
        except GpuError as e:
            if notes is not None:
                notes.append(f"{what}: {e}")
            return None

    def _supported(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A query that worked at start: None if it is no longer supported; other errors raise."""
        try:
            return self._call(fn, *args)
        except GpuNotSupported:
            return None

    # -- start-up -------------------------------------------------------------------------

    def _init(self) -> None:
        am = self._am
        flags = getattr(getattr(am, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
        try:
            am.amdsmi_init() if flags is None else am.amdsmi_init(flags)
        except self._vendor_errors as e:
            if self._is(self._status_of(e), ("FAIL_LOAD_MODULE", "FAIL_LOAD_SYMBOL")):
                raise GpuLibraryMissing(f"AMD SMI could not load its library: {e}") from e
            raise GpuDriverError(f"AMD SMI did not initialise ({e}); is the amdgpu driver "
                                 f"loaded and /dev/kfd accessible?") from e

    @translate_vendor_errors
    def _enumerate(self, env: Mapping[str, str]) -> list[_Device]:
        am = self._am
        found = []
        for position, handle in enumerate(am.amdsmi_get_processor_handles()):
            try:
                uuid = self._call(am.amdsmi_get_gpu_device_uuid, handle)
            except GpuError as e:
                log.warning("AMD GPU handle %d skipped: %s", position, e)
                continue
            enum = self._optional(None, "", getattr(am, "amdsmi_get_gpu_enumeration_info", None),
                                  handle) or {}
            kfd = self._optional(None, "", getattr(am, "amdsmi_get_gpu_kfd_info", None), handle) or {}
            mode = self._optional(None, "", getattr(am, "amdsmi_get_gpu_compute_partition", None),
                                  handle)
            nps = self._optional(None, "", getattr(am, "amdsmi_get_gpu_memory_partition", None),
                                 handle)
            found.append({"handle": handle, "uuid": uuid, "position": position,
                          "memory_partition": nps.strip().upper() if isinstance(nps, str)
                          and nps.strip().upper().startswith("NPS") else None,
                          "hip_id": number(enum.get("hip_id")), "hip_uuid": enum.get("hip_uuid"),
                          "node_id": number(kfd.get("node_id")),
                          "partition_id": number(kfd.get("current_partition_id")),
                          "partition_mode": mode.strip().upper() if isinstance(mode, str)
                          and mode.strip().upper() in _PARTITION_MODES else None,
                          "card": self._card_key(handle, position)})
        physical = self._number(found)
        self._group_partitions(physical)
        chosen = select_visible(physical, env.get("ROCR_VISIBLE_DEVICES"),
                                var="ROCR_VISIBLE_DEVICES",
                                ids_of=lambda f: [f["uuid"], f["hip_uuid"] or ""])
        within, var = env.get("HIP_VISIBLE_DEVICES"), "HIP_VISIBLE_DEVICES"
        if within is None:
            within, var = env.get("CUDA_VISIBLE_DEVICES"), "CUDA_VISIBLE_DEVICES"
        chosen = select_visible(chosen, within, var=var,
                                ids_of=lambda f: [f["uuid"], f["hip_uuid"] or ""])
        devices = []
        for f in chosen:
            try:
                devices.append(self._describe(f))
            except GpuLost as e:
                log.error("AMD GPU %d (%s) is lost at start-up and is not managed: %s",
                          f["index"], f["uuid"], e)
            except GpuError as e:
                log.error("AMD GPU %d (%s) could not be probed and is not managed: %s",
                          f["index"], f["uuid"], e)
        return devices

    def _card_key(self, handle: Any, position: int) -> str:
        """What identifies the physical card a handle belongs to: its ASIC serial (the same on
        every partition of a card), else its PCI domain:bus:device, else the handle itself."""
        am = self._am
        try:
            asic = self._call(am.amdsmi_get_gpu_asic_info, handle) or {}
            serial = asic.get("asic_serial")
            if isinstance(serial, str) and serial.strip("0xX") and serial != "N/A":
                return f"serial:{serial}"
            bdf = self._call(am.amdsmi_get_gpu_device_bdf, handle)
            if isinstance(bdf, str) and "." in bdf:
                return f"pci:{bdf.rsplit('.', 1)[0]}"
        except GpuError:
            pass  # an unreadable handle is its own card; _describe reports what fails
        return f"handle:{position}"

    @staticmethod
    def _group_partitions(physical: list[dict]) -> None:
        """Give each handle its card's partition count and the handle power is read from.

        Only handles that report a partitioned mode (not SPX) are grouped: in SPX each card
        is one handle, whatever the serials say."""
        cards: dict[str, list[dict]] = {}
        for f in physical:
            f["partitions"], f["socket_handle"] = 1, f["handle"]
            if f["partition_mode"] not in (None, "SPX"):
                cards.setdefault(f["card"], []).append(f)
        for members in cards.values():
            first = min(members, key=lambda m: (m["partition_id"] is None, m["partition_id"] or 0,
                                                m["index"]))
            for m in members:
                m["partitions"], m["socket_handle"] = len(members), first["handle"]
            expected = _PARTITION_MODES.get(first["partition_mode"] or "", len(members))
            if first["partition_mode"] != "CPX" and expected != len(members):
                log.warning("AMD card %s is in %s mode but shows %d partitions; power is "
                            "shared among the %d found", first["card"], first["partition_mode"],
                            len(members), len(members))

    @staticmethod
    def _number(found: list[dict]) -> list[dict]:
        """Put the GPUs in ROCr order and give each its ROCr index."""
        hip = [f["hip_id"] for f in found]
        if found and None not in hip and len(set(hip)) == len(hip):
            ordered = sorted(found, key=lambda f: f["hip_id"])
            for f in ordered:
                f["index"] = int(f["hip_id"])
            return ordered
        nodes = [f["node_id"] for f in found]
        if found and None not in nodes and len(set(nodes)) == len(nodes):
            ordered = sorted(found, key=lambda f: f["node_id"])
        else:
            ordered = list(found)
            if found:
                log.warning("AMD SMI gave neither HIP ids nor KFD node ids; assuming its handle "
                            "order is ROCm's device order")
        for i, f in enumerate(ordered):
            f["index"] = i
        return ordered

    def _describe(self, f: dict) -> _Device:
        am, handle, socket = self._am, f["handle"], f["socket_handle"]
        shares = f["partitions"]
        notes: list[str] = []
        asic = self._optional(notes, "ASIC info", am.amdsmi_get_gpu_asic_info, handle) or {}
        name = asic.get("market_name")
        name = name.strip() if isinstance(name, str) and name.strip() not in ("", "N/A") else "AMD GPU"
        card_limit = self._limits(socket, notes)
        cap_w = card_limit.current_w if card_limit is not None else None
        power = self._optional(notes, "power", am.amdsmi_get_power_info, socket) or {}
        if cap_w is None:
            cap_w = cap_watts(power.get("power_limit"))
        rated = self.rated_power_w(f["uuid"])
        power_key = next((k for k in _POWER_KEYS
                          if power_watts(power.get(k), cap_w, rated) is not None), None)
        instant_key = next((k for k in _INSTANT_KEYS
                            if power_watts(power.get(k), cap_w, rated) is not None), None)
        for k in _POWER_KEYS:
            if k in power and power[k] != "N/A" and power_watts(power[k], cap_w, rated) is None:
                notes.append(f"power: {k}={power[k]!r} is not a valid reading (sentinel, "
                             f"negative or impossible for the board); ignored")
        if power_key is None and power:
            notes.append("power: no socket power field has a valid value")
        elif power_key is not None and power_watts(power[power_key], cap_w) == 0:
            notes.append("power reads 0 W (on an MI250/MI250X the odd die's power is reported "
                         "on its sibling)")
        energy = self._energy_j(socket, notes)
        activity = self._optional(notes, "utilization", am.amdsmi_get_gpu_activity, handle) or {}
        memory_gib = self._memory_gib(handle, notes)
        bdf = self._optional(None, "", getattr(am, "amdsmi_get_gpu_device_bdf", None), handle)
        if shares > 1:
            notes.append(f"compute partition {f['partition_id']} of {shares} ({f['partition_mode']}):"
                         f" power, energy and power cap are an equal 1/{shares} share of the card's")
        caps = GpuCapabilities(
            power=power_key is not None, instant_power=instant_key is not None,
            energy_counter=energy is not None,
            utilization=valid_number(activity.get("gfx_activity"), high=100) is not None,
            power_limit=cap_w is not None,
            power_kind=None if power_key is None else
            ("average" if power_key == "average_socket_power" else "instant"),
            notes=tuple(notes))
        limit = _share(card_limit, shares) if card_limit is not None else None
        info = GpuDevice(index=f["index"], uuid=f["uuid"], name=name, model=name, vendor="amd",
                         memory_gib=memory_gib, pci_bus_id=bdf, power_limit=limit, capabilities=caps,
                         partition_mode=f["partition_mode"] if shares > 1 else None,
                         partitions=shares, memory_partition=f["memory_partition"])
        return _Device(info, handle, cap_w, power_key, instant_key, socket)

    def _memory_gib(self, handle: Any, notes: list[str]) -> float:
        am = self._am
        vram = getattr(getattr(am, "AmdSmiMemoryType", None), "VRAM", None)
        if vram is not None:
            total_b = number(self._optional(None, "", getattr(am, "amdsmi_get_gpu_memory_total", None),
                                            handle, vram))
            if total_b:
                return round(total_b / 2**30, 2)
        info = self._optional(notes, "memory", getattr(am, "amdsmi_get_gpu_vram_info", None), handle)
        size_mb = number((info or {}).get("vram_size"))  # MiB (amdsmi_vram_info_t.vram_size)
        if not size_mb:
            notes.append("memory: no valid VRAM total")
        return round(size_mb / 1024, 2) if size_mb else 0.0

    def _limits(self, handle: Any, notes: list[str] | None) -> PowerLimit | None:
        info = self._optional(notes, "power cap", self._am.amdsmi_get_power_cap_info, handle)
        if not info:
            return None
        default = info.get("default_power_cap", info.get("power_cap_default"))
        return PowerLimit(current_w=cap_watts(info.get("power_cap")),
                          min_w=cap_watts(info.get("min_power_cap")),
                          max_w=cap_watts(info.get("max_power_cap")),
                          default_w=cap_watts(default))

    def _energy_j(self, handle: Any, notes: list[str] | None) -> float | None:
        """The counter in joules; at start-up (`notes` given) any failure means "no counter",
        when reading only an unsupported query does."""
        if notes is not None:
            got = self._optional(notes, "energy counter", self._am.amdsmi_get_energy_count, handle)
        else:
            got = self._supported(self._am.amdsmi_get_energy_count, handle)
        if not got:
            return None
        ticks = number(got.get("energy_accumulator", got.get("power")))
        resolution_uj = number(got.get("counter_resolution"))
        if ticks is None or not resolution_uj:
            if notes is not None:
                notes.append(f"energy counter: no valid value in {got!r}")
            return None
        return ticks * resolution_uj * _MICRO

    # -- the interface --------------------------------------------------------------------

    def read(self, uuid: str) -> PowerReading:
        """One reading. A device-gone error is retried once before the GPU is declared lost:
        AMD SMI reads sysfs, and one failed read is not proof that the card is gone."""
        dev = self._device(uuid)
        try:
            return self._read(dev)
        except GpuLost as first:
            log.warning("AMD GPU %s: %s; retrying once", uuid, first)
            try:
                return self._read(dev)
            except GpuLost as e:
                self._mark_lost(uuid, e)
                raise

    @translate_vendor_errors
    def _read(self, dev: _Device) -> PowerReading:
        am, h, caps = self._am, dev.handle, dev.info.capabilities
        assert caps is not None
        t = self._clock()
        socket, shares = dev.socket_handle or h, dev.info.partitions
        rated = self.rated_power_w(dev.info.uuid)
        info = self._supported(am.amdsmi_get_power_info, socket) if caps.power else None
        power_w = power_watts(info.get(dev.power_key), dev.cap_w, rated) if info and dev.power_key else None
        instant_w = (power_watts(info.get(dev.instant_key), dev.cap_w, rated)
                     if info and dev.instant_key else None)
        energy_j = self._energy_j(socket, None) if caps.energy_counter else None
        power_w, instant_w, energy_j = (None if v is None else v / shares
                                        for v in (power_w, instant_w, energy_j))
        activity = self._supported(am.amdsmi_get_gpu_activity, h) if caps.utilization else None
        util = valid_number(activity.get("gfx_activity"), high=100) if activity else None
        return PowerReading(uuid=dev.info.uuid, power_w=power_w, energy_j=energy_j,
                            utilization_pct=util, instant_power_w=instant_w, timestamp_s=t,
                            energy_reset=self._watch.observe(dev.info.uuid, energy_j))

    def power_limit(self, uuid: str) -> PowerLimit:
        dev = self._device(uuid)
        limit = self._limits(dev.socket_handle or dev.handle, None)
        if limit is not None:
            limit = _share(limit, dev.info.partitions)
        if limit is None:
            raise GpuNotSupported(f"AMD GPU {uuid} does not report a power cap")
        return limit

    def set_power_limit(self, uuid: str, limit_w: float) -> PowerLimit:
        """amdsmi_set_power_cap(handle, sensor_ind=0, cap) with the cap in microwatts, within
        the min_power_cap..max_power_cap of amdsmi_get_power_cap_info (AMD SMI Python API;
        a caller without root gets AMDSMI_STATUS_NO_PERM). A compute partition shares its
        card's one cap with the other partitions, so it is never set per partition here."""
        dev = self._device(uuid)
        if dev.info.partitions > 1:
            raise GpuNotSupported(f"AMD GPU {uuid} is one of {dev.info.partitions} partitions "
                                  f"({dev.info.partition_mode}) sharing one card power cap; it is "
                                  "not set per job")
        setter = getattr(self._am, "amdsmi_set_power_cap", None)
        if setter is None:
            raise GpuNotSupported("this amdsmi version has no amdsmi_set_power_cap")
        now = self._limits(dev.handle, None)
        if now is None or (now.min_w is None and now.max_w is None):
            raise GpuNotSupported(f"AMD GPU {uuid} reports no settable power cap range")
        check_limit_in_range(now, limit_w, f"AMD GPU {uuid}")
        try:
            self._call(setter, dev.handle, 0, int(round(limit_w * 1e6)))
        except GpuLost as e:
            self._mark_lost(uuid, e)
            raise
        after = self._limits(dev.handle, None)
        if after is None:
            raise GpuNotSupported(f"AMD GPU {uuid} does not report its power cap after setting it")
        with self._lock:
            dev.cap_w = after.current_w if after.current_w is not None else dev.cap_w
        return after

    def versions(self) -> dict[str, str]:
        """AMD SMI library version and amdgpu driver version (of the first GPU)."""
        out: dict[str, str] = {}
        lib = self._optional(None, "", getattr(self._am, "amdsmi_get_lib_version", None))
        if isinstance(lib, dict):
            out["amdsmi library"] = ".".join(str(lib.get(k, "?")) for k in ("major", "minor", "release"))
        package = getattr(self._am, "__version__", None)
        if package:
            out["amdsmi package"] = str(package)
        if self._devices:
            drv = self._optional(None, "", getattr(self._am, "amdsmi_get_gpu_driver_info", None),
                                 self._devices[0].handle)
            if isinstance(drv, dict):
                out["driver"] = f"{drv.get('driver_name', '?')} {drv.get('driver_version', '?')}"
        return out

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._am.amdsmi_shut_down()
        except self._vendor_errors as e:
            log.warning("AMD SMI shutdown failed: %s", e)
