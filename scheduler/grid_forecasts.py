"""The grid operators' day-ahead wind and solar forecasts in the store: imports and as-of reads.

All SQL on `grid_day_ahead` lives here. Files are read by `telemetry.grid.day_ahead` (both
layouts, hourly mean MW, gaps and duplicated hours refused, the shared file's defects
handled); each hour is stored with the time its forecast was published, and the as-of read
(`day_ahead_as_of`) returns for each hour the newest forecast published at or before the
time asked about, never one published later. That is what keeps a forecaster or a replay
that uses these inputs honest: at 17:59 local time it does not see tomorrow's forecast, at
18:00 it does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, delete, select

from scheduler import carbon_table
from scheduler.clock import utcnow
from scheduler.store import Store
from scheduler.store.grid_models import grid_day_ahead
from telemetry.grid.day_ahead import SOLAR, WIND_FORMS, DayAheadFile, issued_at, read_day_ahead, wind_total

INSERT_CHUNK_ROWS = 5000


@dataclass
class DayAheadImport:
    """What an import of a day-ahead file stored."""

    path: str
    layout: str
    source: str
    zone: str
    area: str | None
    production_types: list[str]
    hours: int
    first: datetime
    last: datetime
    mtu_s: int
    imputed: int
    fixes: list[str] = field(default_factory=list)
    trimmed_rows: int = 0
    first_issued_at: datetime | None = None
    imported_at: datetime | None = None
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class DayAheadValue:
    """One hour's day-ahead forecast as known at some time: mean MW of the hour.

    `wind_mw` is onshore + offshore; None while only one of the two is known (an export of
    one production type imported without the other), as is `solar_mw` without a solar one.
    `issued_at` is the newest issue among the values used.
    """

    at: datetime
    solar_mw: float | None
    wind_mw: float | None
    issued_at: datetime
    imputed: bool
    source: str


def _upsert(dialect: str) -> Any:
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    else:
        from sqlalchemy.dialects.sqlite import insert as dialect_insert
    stmt = dialect_insert(grid_day_ahead)
    key = [c.name for c in grid_day_ahead.primary_key.columns]
    return stmt.on_conflict_do_update(index_elements=key, set_={
        c: getattr(stmt.excluded, c) for c in ("mw", "imputed", "source", "imported_at")})


def store_day_ahead(store: Store, parsed: DayAheadFile, now: datetime) -> int:
    """Store a read file's hours, each issued at its publication time, in one transaction;
    the number of hours.

    A re-import of the same hours replaces them, and wind held the other way for those hours
    (one `wind` value against `wind_onshore` + `wind_offshore`) is deleted, so the store
    keeps one account of each hour's wind: the last imported.
    """
    zone = parsed.zone
    rows = []
    for h in parsed.hours:
        issued = issued_at(h.at, zone)
        rows += [{"zone": zone, "at": h.at, "production_type": kind, "issued_at": issued, "mw": mw,
                  "imputed": h.imputed, "source": parsed.source, "imported_at": now} for kind, mw in h.mw.items()]
    replaced = sorted({other for kind in parsed.production_types for other in WIND_FORMS[kind]})
    stmt = _upsert(store.dialect)
    g = grid_day_ahead.c

    def write(conn: Connection) -> int:
        if replaced:
            conn.execute(delete(grid_day_ahead).where(
                g.zone == zone, g.at >= parsed.hours[0].at, g.at <= parsed.hours[-1].at,
                g.production_type.in_(replaced)))
        for i in range(0, len(rows), INSERT_CHUNK_ROWS):
            conn.execute(stmt, rows[i:i + INSERT_CHUNK_ROWS])
        # the zone's carbon data version moves too: readers caching forecasts built on
        # these inputs notice the change in their one small query per tick
        carbon_table.bump_versions(conn, store.dialect, [zone])
        return len(parsed.hours)

    return store.transact(write)


def import_day_ahead(store: Store, path: str | Path, zone: str, *,
                     clock: Callable[[], datetime] = utcnow) -> DayAheadImport:
    """Read a day-ahead wind and solar file (CsvFormatError, one line, if it is malformed, has
    gaps or duplicated hours: then nothing is stored) and store it for `zone`."""
    t0 = time.perf_counter()
    parsed = read_day_ahead(path, zone)
    now = clock()
    n = store_day_ahead(store, parsed, now)
    return DayAheadImport(path=parsed.path, layout=parsed.layout, source=parsed.source, zone=zone,
                          area=parsed.area, production_types=parsed.production_types, hours=n,
                          first=parsed.hours[0].at, last=parsed.hours[-1].at,
                          mtu_s=parsed.mtu_s, imputed=parsed.imputed, fixes=parsed.fixes,
                          trimmed_rows=parsed.trimmed_rows, first_issued_at=issued_at(parsed.hours[0].at, zone),
                          imported_at=now, elapsed_s=time.perf_counter() - t0)


def day_ahead_as_of(conn: Connection, zone: str, start: datetime, end: datetime,
                    as_of: datetime) -> list[DayAheadValue]:
    """The day-ahead wind and solar forecast of `zone` for the hours in [start, end) as known
    at `as_of`: for each hour and production type its newest forecast issued at or before
    `as_of`; hours with none are absent; by time. Never a value issued after `as_of`."""
    g = grid_day_ahead.c
    rows = conn.execute(
        select(g.at, g.production_type, g.mw, g.issued_at, g.imputed, g.source)
        .where(g.zone == zone, g.at >= start, g.at < end, g.issued_at <= as_of)
        .order_by(g.at, g.issued_at)).all()
    by_hour: dict[datetime, dict[str, Any]] = {}
    for r in rows:                                   # ordered by issue: the newest stays
        by_hour.setdefault(r.at, {})[r.production_type] = r
    out = []
    for at, kinds in by_hour.items():
        mw = {kind: r.mw for kind, r in kinds.items()}
        newest = max(kinds.values(), key=lambda r: r.issued_at)
        out.append(DayAheadValue(at, mw.get(SOLAR), wind_total(mw), newest.issued_at,
                                 any(bool(r.imputed) for r in kinds.values()), newest.source))
    return out


def read_day_ahead_as_of(store: Store, zone: str, start: datetime, end: datetime,
                         as_of: datetime) -> list[DayAheadValue]:
    """`day_ahead_as_of` in a read transaction of its own."""
    with store.read() as conn:
        return day_ahead_as_of(conn, zone, start, end, as_of)


def day_ahead_zones(store: Store) -> list[str]:
    """The zones with any day-ahead forecast stored."""
    with store.read() as conn:
        return list(conn.execute(select(grid_day_ahead.c.zone).distinct().order_by(grid_day_ahead.c.zone)).scalars())


def forget_day_ahead(store: Store, zone: str) -> int:
    """Delete every day-ahead forecast value of `zone` (imported under a wrong zone id, say);
    the number deleted. The zone's data version moves, as with every write."""
    def write(conn: Connection) -> int:
        n = conn.execute(delete(grid_day_ahead).where(grid_day_ahead.c.zone == zone)).rowcount
        carbon_table.bump_versions(conn, store.dialect, [zone])
        return int(n or 0)

    return store.transact(write)
