"""The node's disk guard: no new jobs while the disk of job logs (or of the run records and
the store) is (nearly) full, and jobs again once space is freed.

A job started on a full disk could not write its output, and its outcome might not be
recordable: better to leave it queued (the planner moves it to other nodes; these GPUs show as
unhealthy with the reason) and say so loudly. Running jobs go on; their supervisors wait for
space to record how they ended.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from sqlalchemy import Connection, update

from scheduler.store import Store
from scheduler.store.models import gpus

log = logging.getLogger(__name__)


def disk_free_bytes(path: Path) -> int:
    """Free bytes for unprivileged writers on the filesystem holding `path` (the seam tests fake)."""
    return shutil.disk_usage(path).free


def disk_places(state_dir: Path, log_root: Path | None) -> list[tuple[Path, str]]:
    """The directories whose disks a new job needs space on: its logs, and the state
    directory (run records, and the SQLite store where there is one) where the logs are
    elsewhere (`log_root`; None: STATE_DIR/logs)."""
    state = Path(state_dir)
    logs = Path(log_root or state / "logs")
    if logs == state / "logs":
        return [(state, "job logs")]
    return [(logs, "job logs"), (state, "run records and the store")]


class DiskGuard:
    """Whether one node's disks have room for new jobs, kept on its GPUs' health in the store."""

    def __init__(self, store: Store, node: str, places: list[tuple[Path, str]], min_free_mib: float) -> None:
        self.store = store
        self.node = node
        self.places = places
        self.min_free_mib = min_free_mib
        self.full = False

    def check(self) -> bool:
        """Stop taking jobs while a disk is (nearly) full, and take them again after: the
        GPUs unhealthy with the reason, then healthy again. Whether that changed now."""
        full, why = False, ""
        for place, what in self.places if self.min_free_mib > 0 else []:
            try:
                free_mib = disk_free_bytes(place) / 2**20
            except OSError as e:
                problem = f"disk full: cannot check free space of {place}: {e}"
            else:
                problem = (f"disk full: {free_mib:.0f} MiB free for {what} in {place} (need "
                           f"{self.min_free_mib:g} MiB, min_free_disk_mib)"
                           if free_mib < self.min_free_mib else None)
            if problem and not full:  # the first one found is the one named
                full, why = True, problem
        if full == self.full:
            return False
        self.full = full
        node = self.node

        def tx(conn: Connection) -> None:
            if full:
                conn.execute(update(gpus).where(gpus.c.node_name == node, gpus.c.healthy.is_(True))
                             .values(healthy=False, unhealthy_reason=why))
            else:
                conn.execute(update(gpus).where(gpus.c.node_name == node,
                                                gpus.c.unhealthy_reason.like("disk full:%"))
                             .values(healthy=True, unhealthy_reason=None))

        self.store.transact(tx)
        if full:
            log.error("node %s takes no new jobs: %s", node, why)
        else:
            log.warning("node %s has disk space again (%.0f MiB free); taking jobs", node, free_mib)
        return True
