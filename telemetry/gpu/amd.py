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
    PowerLimit,
    PowerReading,
    VendorBackend,
    translate_vendor_errors,
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
_POWER_KEYS = ("average_socket_power", "socket_power", "current_socket_power")
_INSTANT_KEYS = ("current_socket_power", "socket_power")
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
    """A numeric reading, or None for AMD SMI's "N/A" (and anything else non-numeric)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def cap_watts(raw: Any) -> float | None:
    """A power cap in watts. AMD SMI reports caps in microwatts (ROCm 6+); a value below 100 000
    can only be watts, since no GPU has a cap under 0.1 W or over 100 kW."""
    value = number(raw)
    if value is None or value <= 0:
        return None
    return value * _MICRO if value >= 100_000 else value


def power_watts(raw: Any, cap_w: float | None) -> float | None:
    """A power reading in watts, whichever unit this ROCm version used.

    Readings in watts are at most about 1.5 times the board's power cap; the same reading in
    microwatts is a million times larger. So a value above 1000 times the cap (or above
    100 000 when the cap is unknown) is microwatts.
    """
    value = number(raw)
    if value is None:
        return None
    limit = 1000 * cap_w if cap_w else 100_000
    return value * _MICRO if value > limit else value


@dataclass
class _Device:
    info: GpuDevice
    handle: Any
    cap_w: float | None
    power_key: str | None
    instant_key: str | None


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
        if self._is(code, ("NOT_INIT", "INIT_ERROR", "NO_PERM")):
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
            found.append({"handle": handle, "uuid": uuid, "position": position,
                          "hip_id": number(enum.get("hip_id")), "hip_uuid": enum.get("hip_uuid"),
                          "node_id": number(kfd.get("node_id"))})
        physical = self._number(found)
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
        am, handle = self._am, f["handle"]
        notes: list[str] = []
        asic = self._optional(notes, "ASIC info", am.amdsmi_get_gpu_asic_info, handle) or {}
        name = asic.get("market_name")
        name = name if isinstance(name, str) and name not in ("", "N/A") else "AMD GPU"
        limit = self._limits(handle, notes)
        cap_w = limit.current_w if limit is not None else None
        power = self._optional(notes, "power", am.amdsmi_get_power_info, handle) or {}
        if cap_w is None:
            cap_w = cap_watts(power.get("power_limit"))
        power_key = next((k for k in _POWER_KEYS if number(power.get(k)) is not None), None)
        instant_key = next((k for k in _INSTANT_KEYS if number(power.get(k)) is not None), None)
        if power_key is None and power:
            notes.append("power: every socket power field is N/A")
        elif power_key is not None and number(power[power_key]) == 0:
            notes.append("power reads 0 W (on an MI250/MI250X the odd die's power is reported "
                         "on its sibling)")
        energy = self._energy_j(handle, notes)
        activity = self._optional(notes, "utilization", am.amdsmi_get_gpu_activity, handle) or {}
        memory_gib = self._memory_gib(handle, notes)
        bdf = self._optional(None, "", getattr(am, "amdsmi_get_gpu_device_bdf", None), handle)
        caps = GpuCapabilities(
            power=power_key is not None, instant_power=instant_key is not None,
            energy_counter=energy is not None,
            utilization=number(activity.get("gfx_activity")) is not None,
            power_limit=cap_w is not None,
            power_kind=None if power_key is None else
            ("average" if power_key == "average_socket_power" else "instant"),
            notes=tuple(notes))
        info = GpuDevice(index=f["index"], uuid=f["uuid"], name=name, model=name, vendor="amd",
                         memory_gib=memory_gib, pci_bus_id=bdf, power_limit=limit, capabilities=caps)
        return _Device(info, handle, cap_w, power_key, instant_key)

    def _memory_gib(self, handle: Any, notes: list[str]) -> float:
        am = self._am
        vram = getattr(getattr(am, "AmdSmiMemoryType", None), "VRAM", None)
        if vram is not None:
            total_b = number(self._optional(None, "", getattr(am, "amdsmi_get_gpu_memory_total", None),
                                            handle, vram))
            if total_b:
                return round(total_b / 2**30, 1)
        info = self._optional(notes, "memory", getattr(am, "amdsmi_get_gpu_vram_info", None), handle)
        size_mb = number((info or {}).get("vram_size"))
        return round(size_mb / 1024, 1) if size_mb else 0.0

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
        if ticks is None or resolution_uj is None:
            if notes is not None:
                notes.append(f"energy counter: unrecognised fields {sorted(got)}")
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
        info = self._supported(am.amdsmi_get_power_info, h) if caps.power else None
        power_w = power_watts(info.get(dev.power_key), dev.cap_w) if info and dev.power_key else None
        instant_w = power_watts(info.get(dev.instant_key), dev.cap_w) if info and dev.instant_key else None
        energy_j = self._energy_j(h, None) if caps.energy_counter else None
        activity = self._supported(am.amdsmi_get_gpu_activity, h) if caps.utilization else None
        util = number(activity.get("gfx_activity")) if activity else None
        return PowerReading(uuid=dev.info.uuid, power_w=power_w, energy_j=energy_j,
                            utilization_pct=util, instant_power_w=instant_w, timestamp_s=t,
                            energy_reset=self._watch.observe(dev.info.uuid, energy_j))

    def power_limit(self, uuid: str) -> PowerLimit:
        dev = self._device(uuid)
        limit = self._limits(dev.handle, None)
        if limit is None:
            raise GpuNotSupported(f"AMD GPU {uuid} does not report a power cap")
        return limit

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._am.amdsmi_shut_down()
        except self._vendor_errors as e:
            log.warning("AMD SMI shutdown failed: %s", e)
