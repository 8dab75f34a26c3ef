"""Pick the GPU backend for this node: NVML, then amdsmi; None when neither finds a GPU.

A missing vendor library is normal (logged at info, next backend). A library that loads but
fails to talk to its driver is a broken installation and is logged as an error; the next
backend is still tried, and `probe_backends` returns the error so a caller can refuse to
fall back to emulation on a node whose GPUs are merely broken.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from telemetry.gpu.common import GpuBackend, GpuDriverError, GpuError, GpuLibraryMissing

log = logging.getLogger(__name__)

BackendFactory = Callable[[], GpuBackend]


def default_factories() -> list[tuple[str, BackendFactory]]:
    """The real vendor backends, in the order they are tried."""
    from telemetry.gpu.amd import AmdSmiBackend
    from telemetry.gpu.nvml import NvmlBackend

    return [("nvml", NvmlBackend), ("amdsmi", AmdSmiBackend)]


def probe_backends(factories: Sequence[tuple[str, BackendFactory]] | None = None,
                   ) -> tuple[GpuBackend | None, list[tuple[str, GpuError]]]:
    """The first backend that sees at least one GPU, and the broken backends met on the way."""
    broken: list[tuple[str, GpuError]] = []
    for name, factory in factories if factories is not None else default_factories():
        try:
            backend = factory()
        except GpuLibraryMissing as e:
            log.info("GPU backend %s not available: %s", name, e)
            continue
        except GpuDriverError as e:
            log.error("GPU backend %s is installed but broken: %s", name, e)
            broken.append((name, e))
            continue
        except GpuError as e:
            log.error("GPU backend %s failed to start: %s", name, e)
            broken.append((name, e))
            continue
        devices = backend.devices()
        if devices:
            log.info("using GPU backend %s with %d GPUs: %s", name, len(devices),
                     ", ".join(f"{d.index}:{d.name}" for d in devices))
            return backend, broken
        log.info("GPU backend %s loaded but sees no GPU", name)
        backend.close()
    return None, broken


def detect_backend(factories: Sequence[tuple[str, BackendFactory]] | None = None) -> GpuBackend | None:
    """Return the first vendor backend that sees at least one GPU, else None."""
    return probe_backends(factories)[0]
