"""Writing the carbon-signal store: readings, trace-file imports, forgetting a zone.

Every write counts one more change of each zone it touched (`carbon_table.bump_versions`) in
its own transaction, so readers in any process notice it, and tells the readers of this
process (`on_change`: `CarbonSignals` drops its cached signal of the zone).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from sqlalchemy import Connection

from scheduler import carbon_table
from scheduler.clock import utcnow
from scheduler.store import Store
from telemetry.grid.csv_import import ParsedTrace, read_trace
from telemetry.grid.readings import KIND_ACTUAL, KIND_FORECAST, SIGNALS, IntensityReading


@dataclass
class ImportResult:
    path: str
    fmt: str
    zones: list[str]
    signals: list[str]
    rows_read: int
    rows_stored: int
    duplicates: int
    conflicting_duplicates: int
    out_of_order: int
    missing: int
    first: datetime | None
    last: datetime | None
    elapsed_s: float
    # Values without an issue time whose period had not ended at import time (`imported_at`).
    # As actuals (the default) they count as known only when their period ends, so no plan
    # and no `carbon show` uses them before that; with `as_forecast` they were stored as a
    # forecast issued at `imported_at` instead.
    future_values: int = 0
    future_first: datetime | None = None
    future_last: datetime | None = None
    as_forecast: bool = False
    imported_at: datetime | None = None
    #: the detected step (period length) of each zone's rows, seconds
    step_s: dict[str, int] = field(default_factory=dict)


class CarbonWrites:
    """Upserts, imports and deletions of carbon-intensity values.

    `clock` says when "now" is for imports (values whose period has not ended yet);
    `on_change(zones)` is told of every zone a write touched.
    """

    def __init__(self, store: Store, *, clock: Callable[[], datetime] = utcnow,
                 on_change: Callable[[Iterable[str]], None] | None = None) -> None:
        self.store = store
        self._clock = clock
        self._on_change = on_change

    def _changed(self, zones: Iterable[str]) -> None:
        if self._on_change is not None:
            self._on_change(zones)

    def store_readings(self, readings: Iterable[IntensityReading],
                       progress: Callable[[int, int], None] | None = None) -> int:
        """Upsert readings (same zone/signal/kind/source/period/issue replaces); return the count.

        One transaction. Big batches on PostgreSQL go through COPY into a temporary table and
        one INSERT ... ON CONFLICT (a year of hourly values in well under a second); small
        ones (live fetches) are plain upserts, retried on transient errors like every write.
        """
        by_key: dict[tuple, dict] = {}
        for r in readings:
            if r.signal not in SIGNALS or r.kind not in (KIND_ACTUAL, KIND_FORECAST):
                raise ValueError(f"bad reading: signal {r.signal!r}, kind {r.kind!r}")
            by_key[(r.zone, r.signal, r.kind, r.source, r.at, r.issued_at)] = {
                "zone": r.zone, "signal": r.signal, "kind": r.kind, "source": r.source, "at": r.at,
                "issued_at": r.issued_at, "duration_s": int(r.duration_s),
                "gco2_per_kwh": float(r.gco2_per_kwh), "estimated": r.estimated}
        rows = list(by_key.values())
        if not rows:
            return 0
        zones = sorted({r["zone"] for r in rows})
        dialect = self.store.dialect
        if dialect == "postgresql" and len(rows) >= carbon_table.COPY_MIN_ROWS:
            def write(conn: Connection) -> int:
                n = carbon_table.copy_upsert(conn, rows, progress)
                carbon_table.bump_versions(conn, dialect, zones)
                return n
        else:
            stmt = carbon_table.upsert_statement(dialect)
            chunk = carbon_table.INSERT_CHUNK_ROWS

            def write(conn: Connection) -> int:
                for i in range(0, len(rows), chunk):
                    conn.execute(stmt, rows[i:i + chunk])
                    if progress is not None:
                        progress(min(i + chunk, len(rows)), len(rows))
                carbon_table.bump_versions(conn, dialect, zones)
                return len(rows)

        n = self.store.transact(write)
        self._changed(zones)
        return n

    def forget_zone(self, zone: str) -> int:
        """Delete every intensity value, fetch record and status of `zone` (a zone imported
        by mistake, or under a wrong id); the number of values deleted. Jobs already priced
        keep their figures; the zone's data version moves, so readers' caches are invalidated."""
        return self.store.transact(lambda conn: carbon_table.delete_zone(conn, self.store.dialect, zone))

    def import_file(self, path: str | Path, *, fmt: str | None = None, zone: str | None = None,
                    tz: str = "UTC", progress: Callable[[str, int, int], None] | None = None,
                    as_forecast: bool = False) -> ImportResult:
        """Read a trace file (CsvFormatError if malformed) and store it; see telemetry.grid.csv_import.

        A row without an issue time is an actual, known at the end of its period. Rows whose
        period has not ended yet (now: the clock) are counted in `future_values`: as actuals
        nothing uses them before their period ends. `as_forecast` stores those rows as a
        forecast issued now instead, which plans and `carbon show` use at once; rows already
        over stay actuals, and rows with their own issue time keep it.
        """
        t0 = time.perf_counter()
        now = self._clock()
        parse_progress = (lambda done, total: progress("read", done, total)) if progress else None
        trace: ParsedTrace = read_trace(path, fmt=fmt, zone=zone, tz=tz, progress=parse_progress)
        future = [i for i, r in enumerate(trace.readings) if r.kind == KIND_ACTUAL and r.issued_at > now]
        readings = trace.readings
        if as_forecast and future:
            readings = list(readings)
            for i in future:
                readings[i] = replace(readings[i], kind=KIND_FORECAST, issued_at=now)
        store_progress = (lambda done, total: progress("store", done, total)) if progress else None
        stored = self.store_readings(readings, store_progress)
        return ImportResult(path=trace.path, fmt=trace.fmt, zones=trace.zones, signals=trace.signals,
                            rows_read=trace.rows, rows_stored=stored, duplicates=trace.duplicates,
                            conflicting_duplicates=trace.conflicting_duplicates,
                            out_of_order=trace.out_of_order, missing=trace.missing, first=trace.first,
                            last=trace.last, elapsed_s=time.perf_counter() - t0,
                            future_values=len(future),
                            future_first=min((trace.readings[i].at for i in future), default=None),
                            future_last=max((trace.readings[i].at for i in future), default=None),
                            as_forecast=as_forecast, imported_at=now, step_s=dict(trace.duration_s))
