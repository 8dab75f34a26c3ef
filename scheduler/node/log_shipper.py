"""Copy a running job's stdout and stderr from its node into the store, so that
`carbonsched logs JOB` (and `logs --follow`) works on the head node for a job that another
node's agent ran: agents share state with the daemon only through the store (issue 28).

Each agent tick copies what the log files gained since the last copy, in chunks of at most
CHUNK_BYTES, up to MAX_STORED_BYTES per stream (a job that writes more keeps its full log
on its node; `logs` then says the copy is truncated); once more when the job ends, before
its final state is written, so a reader that sees the job ended has all of its output.
Where the agent shares the daemon's state directory (one machine) nothing is copied: the
daemon reads the files themselves.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from sqlalchemy import func, insert, select

from scheduler.store import Store
from scheduler.store.models import job_log_chunks

log = logging.getLogger(__name__)

CHUNK_BYTES = 256 * 1024
MAX_STORED_BYTES = 16 * 1024 * 1024
STREAMS = ("stdout", "stderr")


class LogShipper:
    def __init__(self, store: Store, log_paths: Callable[[int], tuple[Path, Path]], *,
                 min_interval_s: float = 2.0, max_bytes: int = MAX_STORED_BYTES) -> None:
        self.store = store
        self._log_paths = log_paths
        self.min_interval_s = min_interval_s
        self.max_bytes = max_bytes
        self._shipped: dict[tuple[int, str], int] = {}
        self._last = 0.0

    def tick(self, job_ids: Iterable[int]) -> int:
        """Copy new output of the running jobs, at most every `min_interval_s`; bytes copied."""
        now = time.monotonic()
        if now - self._last < self.min_interval_s:
            return 0
        self._last = now
        return sum(self.ship(j) for j in job_ids)

    def ship(self, job_id: int) -> int:
        """Copy what job `job_id`'s log files gained since the last copy; bytes copied."""
        rows = []
        for stream, path in zip(STREAMS, self._log_paths(job_id)):
            done = self._done(job_id, stream)
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            end = min(size, self.max_bytes)
            if end <= done:
                continue
            with open(path, "rb") as f:
                f.seek(done)
                at = done
                while at < end:
                    data = f.read(min(CHUNK_BYTES, end - at))
                    if not data:
                        break
                    rows.append({"job_id": job_id, "stream": stream, "offset": at, "data": data})
                    at += len(data)
        if not rows:
            return 0
        with self.store.write() as conn:
            conn.execute(insert(job_log_chunks), rows)
        for r in rows:
            self._shipped[(job_id, r["stream"])] = r["offset"] + len(r["data"])
        return sum(len(r["data"]) for r in rows)

    def forget(self, job_id: int) -> None:
        for stream in STREAMS:
            self._shipped.pop((job_id, stream), None)

    def _done(self, job_id: int, stream: str) -> int:
        """Bytes of the stream already in the store (read once, e.g. after an agent restart)."""
        key = (job_id, stream)
        if key not in self._shipped:
            c = job_log_chunks.c
            with self.store.read() as conn:
                self._shipped[key] = int(conn.execute(
                    select(func.coalesce(func.max(c.offset + func.length(c.data)), 0))
                    .where(c.job_id == job_id, c.stream == stream)).scalar_one())
        return self._shipped[key]
