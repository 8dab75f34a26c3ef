"""An emulated GPU fleet for machines without GPUs.

Each device draws its idle power when free and a load-dependent power between 70% and 95%
of TDP while a job runs, with ±2% noise per reading. A caller that knows what the job really
draws (the agent's emulated truth, `scheduler.node.emulation`) sets it with
`set_busy_power_w` before `set_busy`: the GPU then draws that (within idle..TDP) instead. The energy counter advances only when
the GPU is read, by the trapezoid of the previous and the new power reading over the time
between them, so it equals exactly the trapezoid integral of the power a single reader
sees: a test that compares the counter with integrated power checks the consumer, not the
noise of the model.

Power limits: `set_power_limit` works as on a real board (within idle..TDP, the default
being the TDP) and the GPU then never draws more than its limit. A real limit outlives the
process that set it (until a driver reload), so with `limits_path` the fleet keeps its
limits in that file, and a fresh backend over the same file (the agent restarted after a
crash) finds the GPUs still limited, as it would on real hardware. `set_calls` records every
call. `deny_power_limits` makes setting a limit fail as it does without root.

For tests, faults can be injected: `lose(uuid)` makes the GPU fall off the bus (reads raise
GpuLost), `counter_fault(uuid, "backwards")` restarts its counter from zero at the next read
(as a driver reload does), `counter_fault(uuid, "stuck")` freezes the counter while power
keeps flowing, and `counter_fault(uuid, None)` lets it count on from where it is.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from telemetry.gpu.common import (
    CounterWatch,
    GpuBackend,
    GpuCapabilities,
    GpuDevice,
    GpuError,
    GpuLost,
    GpuNotFound,
    GpuPermissionDenied,
    MigInstance,
    PowerLimit,
    PowerReading,
    check_limit_in_range,
)

COUNTER_FAULTS = ("backwards", "stuck")
_CAPABILITIES = GpuCapabilities(power=True, instant_power=True, energy_counter=True,
                                utilization=True, power_limit=True, power_kind="modelled",
                                notes=("emulated: power and energy are modelled, not measured",))


@dataclass(frozen=True)
class EmulatedModel:
    """The few facts the emulator needs about a GPU model (from the hardware catalog).

    Partition layouts: `mig` lists the MIG devices of an NVIDIA GPU in MIG mode as (compute
    slices, memory MiB) each (empty: MIG off); an AMD compute partition is one EmulatedModel
    per partition with its `partition_mode` and `partitions` (its memory and power already
    its share of the card's) and the card's `memory_partition`."""

    model: str
    vendor: str
    memory_gib: float
    idle_w: float
    tdp_w: float
    mig: tuple[tuple[int, float], ...] = ()
    partition_mode: str | None = None
    partitions: int = 1
    memory_partition: str | None = None


@dataclass
class _State:
    model: EmulatedModel
    busy: bool = False
    load: float = 0.0
    power_w: float = 0.0
    energy_j: float = 0.0   # the model's true integral
    counter_j: float = 0.0  # what the (possibly faulty) counter reports
    last_s: float = 0.0
    lost: bool = False
    fault: str | None = None
    busy_w: float | None = None  # what the next busy period draws (None: the load model)
    limit_w: float = 0.0  # the board power limit now (the TDP by default)


class EmulatedBackend(GpuBackend):
    name = "emulated"
    emulated = True

    def __init__(self, models: list[EmulatedModel], *, node: str = "node", seed: int | None = None,
                 clock: Callable[[], float] = time.monotonic, limits_path: Path | None = None,
                 deny_power_limits: bool = False) -> None:
        self._clock = clock
        self._limits_path = limits_path
        self.deny_power_limits = deny_power_limits
        self.set_calls: list[tuple[str, float]] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._watch = CounterWatch()
        self._closed = False
        # Each vendor numbers its own GPUs from 0, as CUDA and ROCm do on a real mixed node.
        per_vendor: dict[str, int] = {}
        self._devices: list[GpuDevice] = []
        for i, m in enumerate(models):
            index = per_vendor.get(m.vendor, 0)
            per_vendor[m.vendor] = index + 1
            gpu_uuid = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"carbonsched-emulated/{node}/{i}/{m.model}"))
            migs = tuple(MigInstance(
                uuid="MIG-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{gpu_uuid}/mig/{k}")),
                gpu_instance_id=k + 1, compute_instance_id=0, slices=slices, memory_mib=memory_mib)
                for k, (slices, memory_mib) in enumerate(m.mig))
            self._devices.append(GpuDevice(
                index=index, uuid=gpu_uuid,
                name=f"Emulated {m.model}", model=m.model, vendor=m.vendor,
                memory_gib=m.memory_gib, pci_bus_id=None,
                power_limit=PowerLimit(current_w=m.tdp_w, min_w=m.idle_w, max_w=m.tdp_w,
                                       default_w=m.tdp_w),
                capabilities=_CAPABILITIES, partition_mode=m.partition_mode,
                partitions=m.partitions, memory_partition=m.memory_partition,
                mig_enabled=bool(m.mig), mig_instances=migs))
        now = clock()
        self._state = {d.uuid: _State(model=m, power_w=m.idle_w, last_s=now, limit_w=m.tdp_w)
                       for d, m in zip(self._devices, models)}
        for uuid_, limit_w in self._load_limits().items():
            if uuid_ in self._state:
                s = self._state[uuid_]
                s.limit_w = min(s.model.tdp_w, max(s.model.idle_w, float(limit_w)))

    def _load_limits(self) -> dict[str, float]:
        if self._limits_path is None:
            return {}
        try:
            return {str(k): float(v) for k, v in json.loads(self._limits_path.read_text()).items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, AttributeError):
            return {}  # a torn or foreign file: the boards start at their defaults

    def _save_limits(self) -> None:
        """Write every GPU's limit (the board state that outlives this process) atomically."""
        if self._limits_path is None:
            return
        data = {u: s.limit_w for u, s in self._state.items()}
        tmp = self._limits_path.with_name(self._limits_path.name + ".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self._limits_path)

    def devices(self) -> list[GpuDevice]:
        with self._lock:
            return [replace(d, power_limit=replace(d.power_limit, current_w=self._state[d.uuid].limit_w))
                    for d in self._devices if not self._state[d.uuid].lost]

    def _get(self, uuid: str) -> _State:
        if self._closed:
            raise GpuError("the emulated backend is closed")
        try:
            return self._state[uuid]
        except KeyError:
            raise GpuNotFound(f"no emulated GPU with UUID {uuid}") from None

    def set_busy(self, uuid: str, busy: bool) -> None:
        """Start or stop the modelled load; the power changes at the next read."""
        with self._lock:
            s = self._get(uuid)
            s.busy = busy
            if busy and s.busy_w is not None:
                s.load = (s.busy_w - s.model.idle_w) / max(1e-9, s.model.tdp_w - s.model.idle_w)
            else:
                s.load = self._rng.uniform(0.70, 0.95) if busy else 0.0
            if not busy:
                s.busy_w = None

    def set_busy_power_w(self, uuid: str, power_w: float | None) -> None:
        """The power the GPU draws in its next busy period (clamped to idle..TDP); None: the
        load model's 70-95 % of TDP. Cleared when the GPU goes idle."""
        with self._lock:
            s = self._get(uuid)
            s.busy_w = None if power_w is None else min(s.model.tdp_w, max(s.model.idle_w, power_w))

    def read(self, uuid: str) -> PowerReading:
        with self._lock:
            s = self._get(uuid)
            if s.lost:
                raise GpuLost(f"emulated GPU {uuid} has fallen off the bus")
            now = self._clock()
            m = s.model
            target = m.idle_w + (m.tdp_w - m.idle_w) * s.load
            power = round(max(m.idle_w * 0.9, target * self._rng.uniform(0.98, 1.02)), 3)
            power = min(power, s.limit_w)  # the board never draws above its limit
            added = (s.power_w + power) / 2 * max(0.0, now - s.last_s)
            s.energy_j += added
            if s.fault == "backwards":
                s.counter_j, s.fault = 0.0, None  # restarts from zero, once
            elif s.fault != "stuck":
                s.counter_j += added
            s.power_w, s.last_s = power, now
            counter = s.counter_j
            util = round(100 * s.load, 1)
        return PowerReading(uuid=uuid, power_w=power, energy_j=counter, utilization_pct=util,
                            instant_power_w=power, timestamp_s=now,
                            energy_reset=self._watch.observe(uuid, counter))

    def power_limit(self, uuid: str) -> PowerLimit:
        with self._lock:
            s = self._get(uuid)
            m, current = s.model, s.limit_w
        return PowerLimit(current_w=current, min_w=m.idle_w, max_w=m.tdp_w, default_w=m.tdp_w)

    def set_power_limit(self, uuid: str, limit_w: float) -> PowerLimit:
        with self._lock:
            s = self._get(uuid)
            if s.lost:
                raise GpuLost(f"emulated GPU {uuid} has fallen off the bus")
            self.set_calls.append((uuid, limit_w))
            if self.deny_power_limits:
                raise GpuPermissionDenied(f"emulated GPU {uuid}: setting a power limit needs root "
                                          "(emulated NVML_ERROR_NO_PERMISSION)")
            check_limit_in_range(PowerLimit(current_w=s.limit_w, min_w=s.model.idle_w,
                                            max_w=s.model.tdp_w), limit_w, f"emulated GPU {uuid}")
            s.limit_w = float(limit_w)
            self._save_limits()
        return self.power_limit(uuid)

    # -- fault injection (tests) ------------------------------------------------------------

    def lose(self, uuid: str) -> None:
        """Make the GPU fall off the bus: reads raise GpuLost and devices() leaves it out."""
        with self._lock:
            self._get(uuid).lost = True

    def counter_fault(self, uuid: str, fault: str | None) -> None:
        """Make the energy counter misbehave ("backwards" or "stuck"), or heal it (None)."""
        if fault is not None and fault not in COUNTER_FAULTS:
            raise ValueError(f"unknown counter fault {fault!r}; expected one of {COUNTER_FAULTS}")
        with self._lock:
            self._get(uuid).fault = fault

    def true_energy_j(self, uuid: str) -> float:
        """The model's own integral up to the last read, whatever the counter says."""
        with self._lock:
            return self._get(uuid).energy_j

    def close(self) -> None:
        self._closed = True
