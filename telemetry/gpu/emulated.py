"""An emulated GPU fleet for machines without GPUs.

Each device draws its idle power when free and a load-dependent power between 70% and 95%
of TDP while a job runs, with a little noise, and integrates that into a monotonic energy
counter, so the rest of carbonsched behaves as on a real node.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass

from telemetry.gpu.common import GpuBackend, GpuDevice, GpuNotSupported, PowerReading


@dataclass(frozen=True)
class EmulatedModel:
    """The few facts the emulator needs about a GPU model (from the hardware catalog)."""

    model: str
    vendor: str
    memory_gib: float
    idle_w: float
    tdp_w: float


class EmulatedBackend(GpuBackend):
    name = "emulated"
    emulated = True

    def __init__(self, models: list[EmulatedModel], *, node: str = "node", seed: int | None = None,
                 clock=time.monotonic) -> None:
        self._clock = clock
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        # Each vendor numbers its own GPUs from 0, as CUDA and ROCm do on a real mixed node.
        per_vendor: dict[str, int] = {}
        vendor_index = []
        for m in models:
            vendor_index.append(per_vendor.get(m.vendor, 0))
            per_vendor[m.vendor] = vendor_index[-1] + 1
        self._devices = [
            GpuDevice(
                index=vendor_index[i],
                uuid=str(uuid.uuid5(uuid.NAMESPACE_DNS, f"carbonsched-emulated/{node}/{i}/{m.model}")),
                name=f"Emulated {m.model}",
                model=m.model,
                vendor=m.vendor,
                memory_gib=m.memory_gib,
            )
            for i, m in enumerate(models)
        ]
        self._by_uuid = {d.uuid: i for i, d in enumerate(self._devices)}
        self._models = list(models)
        now = clock()
        self._busy = [False] * len(models)
        self._load = [0.0] * len(models)
        self._energy_j = [0.0] * len(models)
        self._power_w = [m.idle_w for m in models]
        self._last = [now] * len(models)

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def _slot(self, uuid: str) -> int:
        try:
            return self._by_uuid[uuid]
        except KeyError:
            raise GpuNotSupported(f"no emulated GPU with UUID {uuid}") from None

    def set_busy(self, uuid: str, busy: bool) -> None:
        index = self._slot(uuid)
        with self._lock:
            self._advance(index)
            self._busy[index] = busy
            self._load[index] = self._rng.uniform(0.70, 0.95) if busy else 0.0

    def read(self, uuid: str) -> PowerReading:
        index = self._slot(uuid)
        with self._lock:
            self._advance(index)
            return PowerReading(
                uuid=uuid,
                power_w=round(self._power_w[index], 1),
                energy_j=self._energy_j[index],
                utilization_pct=95.0 if self._busy[index] else 0.0,
            )

    def _advance(self, index: int) -> None:
        now = self._clock()
        dt = max(0.0, now - self._last[index])
        m = self._models[index]
        target = m.idle_w + (m.tdp_w - m.idle_w) * self._load[index]
        new_power = max(m.idle_w * 0.9, target * self._rng.uniform(0.98, 1.02))
        self._energy_j[index] += (self._power_w[index] + new_power) / 2 * dt
        self._power_w[index] = new_power
        self._last[index] = now
