"""Purging finished jobs after the retention (issue 48): without it every cancelled array and
every finished job keeps its command, environment and copied output in the store for ever.

A finished job whose end lies more than `job_retention` ago loses what its request stored
(its command, kept as the program's name alone, and its environment), its output copied
into the store (`job_log_chunks`) and its log files in the daemon's log directory. Its row
stays, with every accounting column (energy, gCO2, placement, times, exit code) and its
events: it is the job's receipt and counts in reports. `purged_at` says when; the purged
bytes no longer count against the owner's `max_stored_mib_per_user`.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import Connection, delete

from scheduler.clock import utcnow
from scheduler.jobs.store import purge, purgeable
from scheduler.store import Store
from scheduler.store.models import job_log_chunks

log = logging.getLogger(__name__)

DEFAULT_RETENTION_S = 30 * 86400.0
PURGE_INTERVAL_S = 3600.0  # how often the daemon purges
BATCH = 500  # jobs per transaction: a purge never holds the store for long


def purge_finished_jobs(store: Store, *, retention_s: float, log_dir: Path | None = None,
                        now: datetime | None = None) -> int:
    """Purge the jobs that ended more than `retention_s` ago and are not purged yet (see the
    module's docstring); returns how many were purged."""
    cutoff = (now or utcnow()) - timedelta(seconds=retention_s)
    done = 0
    while True:
        def tx(conn: Connection) -> list[int]:
            ids = purgeable(conn, cutoff, BATCH)
            if not ids:
                return ids
            purge(conn, ids, lambda: now or utcnow())
            conn.execute(delete(job_log_chunks).where(job_log_chunks.c.job_id.in_(ids)))
            return ids

        ids = store.transact(tx)
        if not ids:
            break
        done += len(ids)
        if log_dir is not None:
            _remove_logs(Path(log_dir), ids)
    if done:
        log.info("purged %d job(s) that ended before %s (job_retention %gs); their accounting records stay",
                 done, cutoff.isoformat(), retention_s)
    return done


def _remove_logs(log_dir: Path, ids: list[int]) -> None:
    """Remove the purged jobs' own log files (and metrics files) in the daemon's log
    directory; the files `--output`/`--error` named belong to their users."""
    for job_id in ids:
        for path in log_dir.glob(f"{job_id}.*"):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("cannot remove the log %s of purged job %s: %s", path, job_id, e)
