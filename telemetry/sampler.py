"""A background sampler: reads every GPU of a backend at a steady rate and buffers readings.

The sampler only measures; whoever owns it drains the buffer and stores the readings (the
agent writes them to the store in batches). Its loop waits on "stop, or the next deadline",
never a bare sleep, and it keeps its own cost figures so an operator can see what sampling
costs: reads, errors, dropped readings, time per read, CPU seconds of the sampling thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from telemetry.energy import Sample
from telemetry.gpu.common import GpuBackend, GpuError, GpuLost, GpuNotSupported

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Reading(Sample):
    """One GPU's sample at one moment, with the device it came from; `t_s` is Unix time in
    seconds. A `Sample`, so the energy functions and the sample store take it as it is."""

    uuid: str


@dataclass
class SamplerStats:
    reads: int = 0
    errors: int = 0
    dropped: int = 0
    read_s: float = 0.0
    cpu_s: float = 0.0
    rounds: int = 0
    late_rounds: int = 0

    @property
    def mean_read_us(self) -> float:
        return 1e6 * self.read_s / self.reads if self.reads else 0.0


class Sampler:
    """Samples all devices of `backend` at `hz` on a daemon thread."""

    def __init__(self, backend: GpuBackend, *, hz: float = 1.0, max_buffer: int = 1_000_000,
                 on_lost: Callable[[str, str], None] | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        if not 0 < hz <= 1000:
            raise ValueError(f"sampling rate must be in (0, 1000] Hz, got {hz}")
        self.backend = backend
        self.hz = hz
        self._uuids = [d.uuid for d in backend.devices()]
        self._buffer: deque[Reading] = deque()
        self._max_buffer = max_buffer
        self._lock = threading.Lock()
        self._latest: dict[str, Reading] = {}
        self._lost: set[str] = set()
        self._on_lost = on_lost or (lambda uuid, why: None)
        self._clock = wall_clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._burst_until = 0.0
        self._burst_hz = hz
        self.stats = SamplerStats()

    # -- control ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def burst(self, hz: float, duration_s: float) -> None:
        """Sample faster for a while (e.g. around a job's start and end)."""
        self._burst_hz = max(hz, self.hz)
        self._burst_until = time.monotonic() + duration_s

    # -- output -------------------------------------------------------------------------

    def drain(self) -> list[Reading]:
        """All readings since the last drain, oldest first."""
        with self._lock:
            out = list(self._buffer)
            self._buffer.clear()
        return out

    def pending(self) -> int:
        """Readings waiting to be drained (a growing number means the writer falls behind)."""
        with self._lock:
            return len(self._buffer)

    def latest(self) -> dict[str, Reading]:
        with self._lock:
            return dict(self._latest)

    def lost(self) -> set[str]:
        with self._lock:
            return set(self._lost)

    def sample_once(self) -> list[Reading]:
        """Read every healthy device now; also used by the thread."""
        out = []
        for uuid in self._uuids:
            if uuid in self._lost:
                continue
            t0 = time.perf_counter()
            try:
                r = self.backend.read(uuid)
            except GpuLost as e:
                with self._lock:
                    self._lost.add(uuid)
                log.error("GPU %s lost: %s; it will not be scheduled", uuid, e)
                self._on_lost(uuid, str(e))
                continue
            except (GpuNotSupported, GpuError) as e:
                self.stats.errors += 1
                log.warning("GPU %s read failed: %s", uuid, e)
                continue
            finally:
                self.stats.read_s += time.perf_counter() - t0
            self.stats.reads += 1
            out.append(Reading(self._clock(), r.power_w, r.energy_j, r.utilization_pct, uuid=uuid))
        with self._lock:
            for reading in out:
                self._latest[reading.uuid] = reading
            room = self._max_buffer - len(self._buffer)
            if room < len(out):
                self.stats.dropped += len(out) - max(room, 0)
                out = out[:max(room, 0)]
            self._buffer.extend(out)
        return out

    def _period_s(self) -> float:
        hz = self._burst_hz if time.monotonic() < self._burst_until else self.hz
        return 1.0 / hz

    def _run(self) -> None:
        cpu0 = time.thread_time()
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            self.stats.rounds += 1
            self.stats.cpu_s = time.thread_time() - cpu0
            next_at += self._period_s()
            now = time.monotonic()
            if next_at < now:  # fell behind: skip missed rounds rather than burst to catch up
                self.stats.late_rounds += 1
                next_at = now
            self._stop.wait(next_at - now)
