"""Pick the GPU backend for this node: NVML, then amdsmi; None when neither finds a GPU.

A missing vendor library is normal (logged at info, next backend). A library that loads but
fails to talk to its driver is a broken installation and is logged as an error.
"""

from __future__ import annotations

import logging

from telemetry.gpu.common import GpuBackend, GpuDriverError, GpuLibraryMissing

log = logging.getLogger(__name__)


def detect_backend() -> GpuBackend | None:
    """Return the first vendor backend that sees at least one GPU, else None."""
    from telemetry.gpu.nvml import NvmlBackend

    for factory in (NvmlBackend,):
        try:
            backend = factory()
        except GpuLibraryMissing as e:
            log.info("GPU backend %s not available: %s", factory.name, e)
            continue
        except GpuDriverError as e:
            log.error("GPU backend %s is installed but broken: %s", factory.name, e)
            continue
        if backend.devices():
            log.info("using GPU backend %s with %d GPUs", backend.name, len(backend.devices()))
            return backend
        backend.close()
    return None
