"""An emulated GPU fleet for machines without GPUs.

Each device draws its idle power when free and a load-dependent power between 70% and 95%
of TDP while a job runs, with ±2% noise per reading. A caller that knows what the job really
draws (the agent's emulated truth, `scheduler.node.emulation`) sets it with
`set_busy_power_w` before `set_busy`: the GPU then draws that (within idle..TDP) instead. The energy counter advances only when
the GPU is read, by the trapezoid of the previous and the new power reading over the time
between them, so it equals exactly the trapezoid integral of the power a single reader
sees: a test that compares the counter with integrated power checks the consumer, not the
noise of the model.

For tests, faults can be injected: `lose(uuid)` makes the GPU fall off the bus (reads raise
GpuLost), `counter_fault(uuid, "backwards")` restarts its counter from zero at the next read
(as a driver reload does), `counter_fault(uuid, "stuck")` freezes the counter while power
keeps flowing, and `counter_fault(uuid, None)` lets it count on from where it is.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from telemetry.gpu.common import (
    CounterWatch,
    GpuBackend,
    GpuCapabilities,
    GpuDevice,
    GpuError,
    GpuLost,
    GpuNotFound,
    PowerLimit,
    PowerReading,
)

COUNTER_FAULTS = ("backwards", "stuck")
_CAPABILITIES = GpuCapabilities(power=True, instant_power=True, energy_counter=True,
                                utilization=True, power_limit=True, power_kind="modelled",
                                notes=("emulated: power and energy are modelled, not measured",))


@dataclass(frozen=True)
class EmulatedModel:
    """The few facts the emulator needs about a GPU model (from the hardware catalog)."""

    model: str
    vendor: str
    memory_gib: float
    idle_w: float
    tdp_w: float


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


class EmulatedBackend(GpuBackend):
    name = "emulated"
    emulated = True

    def __init__(self, models: list[EmulatedModel], *, node: str = "node", seed: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
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
            self._devices.append(GpuDevice(
                index=index,
                uuid=str(uuid.uuid5(uuid.NAMESPACE_DNS, f"carbonsched-emulated/{node}/{i}/{m.model}")),
                name=f"Emulated {m.model}", model=m.model, vendor=m.vendor,
                memory_gib=m.memory_gib, pci_bus_id=None,
                power_limit=PowerLimit(current_w=m.tdp_w, min_w=m.idle_w, max_w=m.tdp_w,
                                       default_w=m.tdp_w),
                capabilities=_CAPABILITIES))
        now = clock()
        self._state = {d.uuid: _State(model=m, power_w=m.idle_w, last_s=now)
                       for d, m in zip(self._devices, models)}

    def devices(self) -> list[GpuDevice]:
        with self._lock:
            return [d for d in self._devices if not self._state[d.uuid].lost]

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
            m = self._get(uuid).model
        return PowerLimit(current_w=m.tdp_w, min_w=m.idle_w, max_w=m.tdp_w, default_w=m.tdp_w)

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
