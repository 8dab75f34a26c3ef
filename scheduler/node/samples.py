"""GPU telemetry in the store: batched sample writes, minute rollups, per-job energy.

Raw samples are kept for a retention window (default 1 h), then rolled up into one row per
GPU and minute (min/mean/max power, energy) and deleted, so the store stays small for
months. A minute's energy is its mean power times the span its samples cover
(n samples -> n sampling intervals), which equals the trapezoid integral for steady sampling.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, insert, select, text

from scheduler.store import Store
from scheduler.store.telemetry_models import gpu_samples
from telemetry.energy import EnergyEstimate, Sample, clip_window, combine_methods, window_energy

log = logging.getLogger(__name__)

DEFAULT_RETENTION_S = 3600.0
# Readings this far outside a job's window are fetched to interpolate its exact edges.
EDGE_MARGIN_S = 5.0


@dataclass(frozen=True)
class StoredSample:
    gpu_id: int
    t_s: float
    power_w: float | None
    energy_j: float | None
    utilization_pct: float | None = None


@dataclass(frozen=True)
class JobEnergy:
    energy_j: float | None
    method: str
    per_gpu: dict[int, EnergyEstimate]


class SampleStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    def write(self, samples: Sequence[StoredSample]) -> int:
        """Insert a batch in one transaction; duplicates (same GPU and time) are skipped."""
        if not samples:
            return 0
        seen = set()
        rows = []
        for s in samples:
            key = (s.gpu_id, s.t_s)
            if key in seen:
                continue
            seen.add(key)
            rows.append({"minute_s": int(s.t_s // 60) * 60, "gpu_id": s.gpu_id, "t_s": s.t_s,
                         "power_w": s.power_w,
                         "energy_j": s.energy_j, "utilization_pct": s.utilization_pct})
        stmt = insert(gpu_samples)
        if self.store.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            stmt = pg_insert(gpu_samples).on_conflict_do_nothing()
        else:
            stmt = stmt.prefix_with("OR IGNORE")
        self.store.transact(lambda conn: conn.execute(stmt, rows))
        return len(rows)

    def samples(self, gpu_id: int, start_s: float, end_s: float) -> list[Sample]:
        with self.store.read() as conn:
            return [Sample(r.t_s, r.power_w, r.energy_j) for r in conn.execute(
                select(gpu_samples.c.t_s, gpu_samples.c.power_w, gpu_samples.c.energy_j)
                .where(gpu_samples.c.minute_s >= int(start_s // 60) * 60,
                       gpu_samples.c.minute_s <= int(end_s // 60) * 60,
                       gpu_samples.c.gpu_id == gpu_id, gpu_samples.c.t_s >= start_s,
                       gpu_samples.c.t_s <= end_s).order_by(gpu_samples.c.t_s))]

    def job_energy(self, gpu_ids: Iterable[int], start_s: float, end_s: float,
                   extra: dict[int, list[Sample]] | None = None) -> JobEnergy:
        """Energy of the job's GPUs over [start, end], per GPU by the best trustworthy method.

        `extra` adds readings not (yet) in the store, e.g. the counters read at claim and end.
        The window's edges are interpolated from the readings around them.
        """
        per_gpu: dict[int, EnergyEstimate] = {}
        for gid in gpu_ids:
            pts = (self.samples(gid, start_s - EDGE_MARGIN_S, end_s + EDGE_MARGIN_S)
                   + list((extra or {}).get(gid, [])))
            per_gpu[gid] = window_energy(clip_window(pts, start_s, end_s))
        if not per_gpu or any(e.energy_j is None for e in per_gpu.values()):
            return JobEnergy(None, "none", per_gpu)
        return JobEnergy(sum(e.energy_j for e in per_gpu.values()),
                         combine_methods([e.method for e in per_gpu.values()]), per_gpu)

    def rollup(self, *, retention_s: float = DEFAULT_RETENTION_S, now_s: float | None = None) -> int:
        """Fold samples older than the retention window into minute rows; returns rows folded."""
        now_s = time.time() if now_s is None else now_s
        cutoff = int((now_s - retention_s) // 60) * 60  # whole minutes only
        upsert = text("""
            INSERT INTO gpu_power_minutes (gpu_id, minute_s, samples, min_w, mean_w, max_w, energy_j)
            SELECT gpu_id, minute_s, n, min_w, mean_w, max_w,
                   CASE WHEN n > 1 THEN mean_w * span_s * n / (n - 1) END
            FROM (
                SELECT gpu_id, minute_s, COUNT(*) AS n,
                       MIN(power_w) AS min_w, AVG(power_w) AS mean_w, MAX(power_w) AS max_w,
                       MAX(t_s) - MIN(t_s) AS span_s
                FROM gpu_samples WHERE minute_s < :cutoff
                GROUP BY minute_s, gpu_id
            ) AS per_minute WHERE true
            ON CONFLICT (gpu_id, minute_s) DO UPDATE SET
                mean_w = (gpu_power_minutes.mean_w * gpu_power_minutes.samples
                          + excluded.mean_w * excluded.samples)
                         / (gpu_power_minutes.samples + excluded.samples),
                samples = gpu_power_minutes.samples + excluded.samples,
                min_w = MIN(gpu_power_minutes.min_w, excluded.min_w),
                max_w = MAX(gpu_power_minutes.max_w, excluded.max_w),
                energy_j = COALESCE(gpu_power_minutes.energy_j, 0) + COALESCE(excluded.energy_j, 0)
        """)
        if self.store.dialect == "postgresql":
            upsert = text(upsert.text.replace("MIN(gpu_power_minutes.min_w, excluded.min_w)",
                                              "LEAST(gpu_power_minutes.min_w, excluded.min_w)")
                          .replace("MAX(gpu_power_minutes.max_w, excluded.max_w)",
                                   "GREATEST(gpu_power_minutes.max_w, excluded.max_w)"))

        def tx(conn: Connection) -> int:
            if self.store.dialect == "postgresql":
                return self._rollup_postgresql(conn, upsert, cutoff)
            conn.execute(upsert, {"cutoff": cutoff})
            return conn.execute(text("DELETE FROM gpu_samples WHERE minute_s < :cutoff"),
                                {"cutoff": cutoff}).rowcount

        folded = self.store.transact(tx)
        if folded:
            log.info("rolled up %d GPU samples older than %ds into minute rows", folded, retention_s)
        return folded

    @staticmethod
    def _rollup_postgresql(conn: Connection, upsert, cutoff: int) -> int:
        """PostgreSQL: the steady state (a minute at a time) deletes; a big catch-up (most of
        the table is old) sets the few recent rows aside and truncates, which is several
        times faster than deleting millions of rows one by one. Writers wait on the table
        lock for the seconds this takes; the agents' samplers buffer meanwhile."""
        conn.execute(text("SET LOCAL work_mem = '256MB'"))
        conn.execute(text("LOCK TABLE gpu_samples IN EXCLUSIVE MODE"))
        folded = conn.execute(text(
            "SELECT count(*) FROM gpu_samples WHERE minute_s < :cutoff"), {"cutoff": cutoff}).scalar_one()
        if not folded:
            return 0
        keep = conn.execute(text("SELECT count(*) FROM gpu_samples WHERE minute_s >= :cutoff"),
                            {"cutoff": cutoff}).scalar_one()
        conn.execute(upsert, {"cutoff": cutoff})
        if folded > 200_000 and keep < folded / 3:
            conn.execute(text("CREATE TEMP TABLE gpu_samples_keep ON COMMIT DROP AS "
                              "SELECT * FROM gpu_samples WHERE minute_s >= :cutoff"), {"cutoff": cutoff})
            conn.execute(text("TRUNCATE gpu_samples"))
            conn.execute(text("INSERT INTO gpu_samples SELECT * FROM gpu_samples_keep"))
            return folded
        conn.execute(text("DELETE FROM gpu_samples WHERE minute_s < :cutoff"), {"cutoff": cutoff})
        return folded
