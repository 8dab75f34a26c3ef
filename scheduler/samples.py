"""GPU telemetry in the store: batched sample writes, minute rollups, and what is read back
for a job: its energy, and the power series that splits its carbon among intensity periods.

Raw samples are kept for a retention window (default 1 h), then rolled up into one row per
GPU and minute (min/mean/max power, energy) and deleted, so the store stays small for
months. A minute's energy is its mean power times the span its samples cover
(n samples -> n sampling intervals), which equals the trapezoid integral for steady sampling.

The core module for samples: the agent writes and measures through it, the daemon rolls up,
and accounting reads a run's power and counter notes with the same query and edge margin.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, insert, select, text

from scheduler.store import Store
from scheduler.store.telemetry_models import gpu_power_minutes, gpu_samples
from telemetry.energy import EnergyEstimate, Sample, clip_window, combine_methods, window_energy

log = logging.getLogger(__name__)

DEFAULT_RETENTION_S = 3600.0
# Readings this far outside a job's window are fetched to interpolate its exact edges.
EDGE_MARGIN_S = 5.0

#: One sample of a GPU of the store: (its id in `gpus`, the reading). The agent's readings
#: (`telemetry.sampler.Reading`) are samples already; only the id is added.
StoredSample = tuple[int, Sample]


@dataclass(frozen=True)
class JobEnergy:
    """A job's energy over its GPUs (None: some GPU unmeasured), the weakest method used,
    and each GPU's own estimate."""

    energy_j: float | None
    method: str
    per_gpu: dict[int, EnergyEstimate]


def energy_note_of(per_gpu: Mapping[int, EnergyEstimate]) -> str | None:
    """One line from `JobEnergy.per_gpu`: why GPUs were not measured by their counter (kept
    on the job as its energy note, for the receipt)."""
    return _counter_notes(sorted(per_gpu.items()))


def _counter_notes(estimates: Iterable[tuple[int, EnergyEstimate]]) -> str | None:
    notes = [f"GPU {gid}: {e.note}" for gid, e in estimates if e.note and e.method != "counter"]
    return "; ".join(notes) or None


def read_samples(conn: Connection, gpu_id: int, start_s: float, end_s: float) -> list[Sample]:
    """The raw samples of one GPU over [start, end], in time order."""
    s = gpu_samples.c
    return [Sample(r.t_s, r.power_w, r.energy_j) for r in conn.execute(
        select(s.t_s, s.power_w, s.energy_j)
        .where(s.minute_s >= int(start_s // 60) * 60, s.minute_s <= int(end_s // 60) * 60,
               s.gpu_id == gpu_id, s.t_s >= start_s, s.t_s <= end_s).order_by(s.t_s))]


def _around(conn: Connection, gpu_id: int, start_s: float, end_s: float) -> list[Sample]:
    """The raw samples of one GPU over [start, end] and EDGE_MARGIN_S either side, the
    readings that interpolate the window's exact edges."""
    return read_samples(conn, gpu_id, start_s - EDGE_MARGIN_S, end_s + EDGE_MARGIN_S)


def power_series(conn: Connection, gpu_ids: Sequence[int], start_s: float,
                 end_s: float) -> tuple[list[list[Sample]], str]:
    """Per GPU, its power over a run and where it came from: raw samples ("power-samples"),
    else minute means at mid-minute ("minute-means"); none at all for some GPU: ([], "time")."""
    series: list[list[Sample]] = []
    weighting = "power-samples"
    for gid in gpu_ids:
        raw = [p for p in _around(conn, gid, start_s, end_s) if p.power_w is not None]
        if len(raw) >= 2:
            series.append(raw)
            continue
        m = gpu_power_minutes.c
        minutes = conn.execute(select(m.minute_s, m.mean_w).where(
            m.gpu_id == gid, m.minute_s >= int(start_s // 60) * 60, m.minute_s <= end_s,
            m.mean_w.is_not(None)).order_by(m.minute_s)).all()
        if minutes:
            series.append([Sample(ms + 30.0, w, None) for ms, w in minutes])
            weighting = "minute-means"
        else:
            return [], "time"
    return series, weighting


def counter_note(conn: Connection, gpu_ids: Sequence[int], start_s: float, end_s: float) -> str | None:
    """Why the counter was not used for a run, re-derived from the raw samples while they
    are kept (GPUs whose samples are gone say nothing)."""
    estimates = []
    for gid in gpu_ids:
        pts = _around(conn, gid, start_s, end_s)
        if len(pts) >= 2:
            estimates.append((gid, window_energy(clip_window(pts, start_s, end_s))))
    return _counter_notes(estimates)


class SampleStore:
    """The GPU samples of one store: the agent writes and measures jobs, the daemon rolls up."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def write(self, samples: Sequence[StoredSample]) -> int:
        """Insert a batch in one transaction; duplicates (same GPU and time) are skipped."""
        if not samples:
            return 0
        seen = set()
        rows = []
        for gpu_id, s in samples:
            key = (gpu_id, s.t_s)
            if key in seen:
                continue
            seen.add(key)
            rows.append({"minute_s": int(s.t_s // 60) * 60, "gpu_id": gpu_id, "t_s": s.t_s,
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
        """The raw samples of one GPU over [start, end], in time order."""
        with self.store.read() as conn:
            return read_samples(conn, gpu_id, start_s, end_s)

    def job_energy(self, gpu_ids: Iterable[int], start_s: float, end_s: float,
                   extra: dict[int, list[Sample]] | None = None) -> JobEnergy:
        """Energy of the job's GPUs over [start, end], per GPU by the best trustworthy method.

        `extra` adds readings not (yet) in the store, e.g. the counters read at claim and end.
        The window's edges are interpolated from the readings around them.
        """
        per_gpu: dict[int, EnergyEstimate] = {}
        with self.store.read() as conn:
            for gid in gpu_ids:
                pts = _around(conn, gid, start_s, end_s) + list((extra or {}).get(gid, []))
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
