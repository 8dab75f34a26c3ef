"""All SQL on the carbon-intensity tables: the one home of reads and writes of `carbon_intensity`
(and of the per-zone data versions and fallback status kept beside it).

The as-of reads (`scheduler.carbon.CarbonSignals`), the writes and imports
(`scheduler.carbon_writes`), the climatology and the simulator's replay of the store
(`scheduler.simulate.shadow`) all read the table through here, so its rules live once:

- a value counts as known at `as_of` only when its row's `issued_at` is at or before it;
- of several versions of one period (re-imports, provider revisions) the newest issue wins;
- a period holds from its timestamp for its `duration_s`, and a later period cuts an earlier
  one short (`actual_periods`).

The hot-path statements are prebuilt once per dialect (`IntensityQueries`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from sqlalchemy import Connection, Float, Integer, Row, bindparam, cast, delete, extract, func, insert, select, update

from scheduler.clock import utcnow
from scheduler.store import Store
from scheduler.store.carbon_models import carbon_fetches, carbon_intensity, carbon_zone_status, carbon_zone_versions
from telemetry.grid.forecast import hourly_means
from telemetry.grid.readings import KIND_ACTUAL, KIND_FORECAST

MAX_PERIOD_S = 86400          # the longest row period a point-in-time read looks back over
INSERT_CHUNK_ROWS = 5000
COPY_MIN_ROWS = 1000          # PostgreSQL batches this big are bulk-loaded with COPY

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def from_epoch(seconds: float) -> datetime:
    return _EPOCH + timedelta(seconds=seconds)


def epoch_s(t: datetime) -> float:
    return (t - _EPOCH).total_seconds()


class IntensityQueries:
    """The hot-path statements, built once per dialect with bind parameters.

    Prebuilt statements skip SQLAlchemy's per-call construction and cache-key work, and the
    history query returns period starts as epoch seconds computed by the database, so the
    few hundred rows an own forecast reads need no datetime conversion in Python.
    """

    def __init__(self, dialect: str) -> None:
        ci = carbon_intensity.c
        if dialect == "sqlite":
            at_epoch = cast(func.strftime("%s", ci.at), Integer)
        else:
            at_epoch = cast(extract("epoch", ci.at), Float)
        series = (ci.zone == bindparam("zone"), ci.signal == bindparam("signal"))
        self.intensity = (
            select(ci.at, ci.duration_s, ci.gco2_per_kwh, ci.source, ci.issued_at, ci.estimated)
            .where(*series, ci.kind == KIND_ACTUAL, ci.at <= bindparam("t"), ci.at > bindparam("since"))
            .order_by(ci.at.desc(), ci.issued_at.desc()).limit(1))
        self.intensity_as_of = (
            select(ci.at, ci.duration_s, ci.gco2_per_kwh, ci.source, ci.issued_at, ci.estimated)
            .where(*series, ci.kind == KIND_ACTUAL, ci.at <= bindparam("t"), ci.at > bindparam("since"),
                   ci.issued_at <= bindparam("as_of"))
            .order_by(ci.at.desc(), ci.issued_at.desc()).limit(1))
        #: actuals of [since, end) known at as_of, period starts in epoch seconds
        self.history = (
            select(at_epoch, ci.duration_s, ci.gco2_per_kwh)
            .where(*series, ci.kind == KIND_ACTUAL, ci.at >= bindparam("since"), ci.at < bindparam("end"),
                   ci.issued_at <= bindparam("as_of"))
            .order_by(ci.at, ci.issued_at))
        self.actuals = (
            select(ci.at, ci.duration_s, ci.gco2_per_kwh, ci.source, ci.issued_at)
            .where(*series, ci.kind == KIND_ACTUAL, ci.at >= bindparam("since"), ci.at < bindparam("end"),
                   ci.issued_at <= bindparam("as_of"))
            .order_by(ci.at, ci.issued_at))
        latest_issue = (select(func.max(ci.issued_at))
                        .where(*series, ci.kind == KIND_FORECAST, ci.issued_at <= bindparam("as_of"),
                               ci.issued_at >= bindparam("oldest"))
                        .scalar_subquery())
        self.live = (
            select(ci.at, ci.duration_s, ci.gco2_per_kwh, ci.source, ci.issued_at)
            .where(*series, ci.kind == KIND_FORECAST, ci.issued_at == latest_issue,
                   ci.at < bindparam("end"), ci.at >= bindparam("since"))
            .order_by(ci.at))


_QUERIES: dict[str, IntensityQueries] = {}


def queries(dialect: str) -> IntensityQueries:
    """The prebuilt statements of `dialect` (built on first use, shared)."""
    q = _QUERIES.get(dialect)
    if q is None:
        q = _QUERIES[dialect] = IntensityQueries(dialect)
    return q


# -- reads ------------------------------------------------------------------------------------

def newest_by_period(rows: Iterable[Sequence[Any]]) -> dict[Any, Any]:
    """Period start -> the rest of its newest row, from rows ordered by (at, issued_at) whose
    first column is the period start: the newest issue of each period wins."""
    latest: dict[Any, Any] = {}
    for row in rows:
        latest[row[0]] = row
    return latest


def history(conn: Connection, q: IntensityQueries, zone: str, signal: str, since: datetime, end: datetime,
            as_of: datetime) -> dict[float, tuple[int, float]]:
    """Actuals of [since, end) known at `as_of`: period start (epoch s) -> (duration_s, value),
    the newest issue of each period."""
    rows = conn.execute(q.history, {"zone": zone, "signal": signal, "as_of": as_of, "end": end,
                                    "since": since}).all()
    return newest_by_period_s(rows)


def newest_by_period_s(rows: Iterable[Sequence[Any]]) -> dict[float, tuple[int, float]]:
    """`history` rows (at_s, duration_s, value) ordered by (at, issued_at) as period start ->
    (duration_s, value) of its newest issue."""
    return {at_s: (d, v) for at_s, d, v in rows}


def hourly_history(store: Store, zone: str, signal: str, since: datetime, end: datetime,
                   as_of: datetime) -> dict[int, float]:
    """Hourly means (epoch hour -> value) of the actuals of [since, end) known at `as_of`."""
    with store.read() as conn:
        latest = history(conn, queries(store.dialect), zone, signal, since, end, as_of)
    return hourly_means((at_s, d, v) for at_s, (d, v) in latest.items())


class Period(NamedTuple):
    """One recorded actual period, cut short where the next one starts."""

    start: datetime
    end: datetime
    gco2_per_kwh: float
    source: str


def actual_periods(conn: Connection, zone: str, signal: str, start: datetime, end: datetime) -> list[Period]:
    """Recorded actual periods of `zone` overlapping [start, end] (the newest issue of each;
    a later period cuts an earlier one short)."""
    ci = carbon_intensity.c
    rows = conn.execute(
        select(ci.at, ci.duration_s, ci.gco2_per_kwh, ci.source, ci.issued_at)
        .where(ci.zone == zone, ci.signal == signal, ci.kind == KIND_ACTUAL,
               ci.at <= end, ci.at > start - timedelta(seconds=MAX_PERIOD_S))
        .order_by(ci.at, ci.issued_at)).all()
    ordered = sorted(newest_by_period(rows).values(), key=lambda r: r.at)
    out: list[Period] = []
    for i, r in enumerate(ordered):
        stop = r.at + timedelta(seconds=r.duration_s)
        if i + 1 < len(ordered):
            stop = min(stop, ordered[i + 1].at)
        if stop > start and r.at <= end and stop > r.at:
            out.append(Period(r.at, stop, r.gco2_per_kwh, r.source))
    return out


def zones_with_data(conn: Connection, zones: Sequence[str]) -> set[str]:
    """Which of `zones` have any carbon data at all (of any kind and signal)."""
    ci = carbon_intensity.c
    return set(conn.execute(select(ci.zone).distinct().where(ci.zone.in_(list(zones)))).scalars())


def actual_sources(conn: Connection, zones: Sequence[str], since: datetime, until: datetime) -> list[Row]:
    """(source, zone, signal, rows) of the actuals of `zones` whose periods may overlap
    [since, until)."""
    ci = carbon_intensity.c
    return conn.execute(select(ci.source, ci.zone, ci.signal, func.count()).where(
        ci.zone.in_(list(zones)), ci.kind == KIND_ACTUAL, ci.at < until,
        ci.at >= since - timedelta(seconds=MAX_PERIOD_S))
        .group_by(ci.source, ci.zone, ci.signal)).all()


def zone_signals(store: Store, zone: str) -> set[str]:
    """The signals a zone has any rows of."""
    ci = carbon_intensity.c
    with store.read() as conn:
        return set(conn.execute(select(ci.signal).where(ci.zone == zone).distinct()).scalars())


def replay_actuals(conn: Connection, zones: Sequence[str]) -> list[Row]:
    """Every actual row of `zones` (zone, signal, at, duration_s, gco2_per_kwh), by zone and
    time: what a replay of the store's history prices with."""
    ci = carbon_intensity.c
    return conn.execute(
        select(ci.zone, ci.signal, ci.at, ci.duration_s, ci.gco2_per_kwh)
        .where(ci.kind == KIND_ACTUAL, ci.zone.in_(zones))
        .order_by(ci.zone, ci.at)).all()


def replay_forecasts(conn: Connection, zones: Sequence[str]) -> list[Row]:
    """Every forecast row of `zones` (zone, signal, issued_at, at, duration_s, gco2_per_kwh),
    by zone, issue and time."""
    ci = carbon_intensity.c
    return conn.execute(
        select(ci.zone, ci.signal, ci.issued_at, ci.at, ci.duration_s, ci.gco2_per_kwh)
        .where(ci.kind == KIND_FORECAST, ci.zone.in_(zones))
        .order_by(ci.zone, ci.issued_at, ci.at)).all()


def newest_actual(conn: Connection, zone: str, signal: str, now: datetime) -> Row | None:
    """The newest actual row (at, duration_s, issued_at, source) of a zone known at `now`."""
    ci = carbon_intensity.c
    return conn.execute(
        select(ci.at, ci.duration_s, ci.issued_at, ci.source)
        .where(ci.zone == zone, ci.signal == signal, ci.kind == KIND_ACTUAL, ci.issued_at <= now)
        .order_by(ci.at.desc()).limit(1)).first()


def newest_forecast_issue(conn: Connection, zone: str, signal: str, now: datetime) -> datetime | None:
    """When the newest forecast of a zone known at `now` was issued."""
    ci = carbon_intensity.c
    return conn.execute(
        select(func.max(ci.issued_at)).where(ci.zone == zone, ci.signal == signal,
                                             ci.kind == KIND_FORECAST, ci.issued_at <= now)).scalar()


def series_summary(conn: Connection) -> list[Row]:
    """Per (zone, signal, kind, source): rows, first and last period start, newest issue."""
    ci = carbon_intensity.c
    return conn.execute(
        select(ci.zone, ci.signal, ci.kind, ci.source, func.count(), func.min(ci.at),
               func.max(ci.at), func.max(ci.issued_at))
        .group_by(ci.zone, ci.signal, ci.kind, ci.source)).all()


def zone_statuses(conn: Connection) -> dict[str, Row]:
    return {r.zone: r for r in conn.execute(select(carbon_zone_status)).all()}


def zone_status(store: Store, zone: str) -> Row | None:
    with store.read() as conn:
        return conn.execute(select(carbon_zone_status).where(carbon_zone_status.c.zone == zone)).first()


def note_zone_status(conn: Connection, zone: str, level: str, source: str, reason: str | None,
                     now: datetime) -> None:
    """Record a zone's fallback level (only a change moves `since`)."""
    zs = carbon_zone_status.c
    row = conn.execute(select(zs.level).where(zs.zone == zone)).first()
    if row is None:
        conn.execute(insert(carbon_zone_status).values(zone=zone, level=level, source=source, reason=reason,
                                                       since=now))
    elif row.level != level:
        conn.execute(update(carbon_zone_status).where(zs.zone == zone)
                     .values(level=level, source=source, reason=reason, since=now))


def read_versions(store: Store, zones: Sequence[str]) -> dict[str, int]:
    """The stored data versions of `zones` (absent: never written)."""
    v = carbon_zone_versions.c
    with store.read() as conn:
        return dict(conn.execute(select(v.zone, v.version).where(v.zone.in_(zones))).all())


# -- writes -----------------------------------------------------------------------------------

def _dialect_insert(dialect: str) -> Callable[..., Any]:
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    else:
        from sqlalchemy.dialects.sqlite import insert as dialect_insert
    return dialect_insert


def upsert_statement(dialect: str) -> Any:
    """INSERT ... ON CONFLICT (the key) DO UPDATE of value, period and estimated flag."""
    stmt = _dialect_insert(dialect)(carbon_intensity)
    key = [c.name for c in carbon_intensity.primary_key.columns]
    return stmt.on_conflict_do_update(index_elements=key, set_={
        "duration_s": stmt.excluded.duration_s, "gco2_per_kwh": stmt.excluded.gco2_per_kwh,
        "estimated": stmt.excluded.estimated})


def bump_versions(conn: Connection, dialect: str, zones: Iterable[str]) -> None:
    """Count one more change of each zone's carbon data, in the writing transaction, so
    readers in other processes (the planner) notice it (`CarbonSignals.data_versions`)."""
    now = utcnow()
    stmt = _dialect_insert(dialect)(carbon_zone_versions)
    stmt = stmt.on_conflict_do_update(index_elements=[carbon_zone_versions.c.zone], set_={
        "version": carbon_zone_versions.c.version + 1, "updated_at": stmt.excluded.updated_at})
    conn.execute(stmt, [{"zone": z, "version": 1, "updated_at": now} for z in zones])


def delete_zone(conn: Connection, dialect: str, zone: str) -> int:
    """Delete every value, fetch record and status of `zone`; the number of values deleted."""
    n = conn.execute(delete(carbon_intensity).where(carbon_intensity.c.zone == zone)).rowcount
    conn.execute(delete(carbon_fetches).where(carbon_fetches.c.zone == zone))
    conn.execute(delete(carbon_zone_status).where(carbon_zone_status.c.zone == zone))
    bump_versions(conn, dialect, [zone])
    return int(n or 0)


_COPY_COLUMNS = ("zone", "signal", "kind", "source", "at", "issued_at", "duration_s", "gco2_per_kwh",
                 "estimated")


def copy_upsert(conn: Connection, rows: list[dict], progress: Callable[[int, int], None] | None) -> int:
    """PostgreSQL bulk upsert: COPY into a temporary table, then one INSERT ... ON CONFLICT.

    Runs on the driver connection inside the caller's transaction; `rows` have unique keys.
    """
    import psycopg

    cols = ", ".join(f'"{c}"' for c in _COPY_COLUMNS)
    key = ", ".join(f'"{c.name}"' for c in carbon_intensity.primary_key.columns)
    raw = conn.connection.dbapi_connection
    try:
        with raw.cursor() as cur:
            cur.execute("CREATE TEMP TABLE carbon_intensity_import (LIKE carbon_intensity) ON COMMIT DROP")
            with cur.copy(f"COPY carbon_intensity_import ({cols}) FROM STDIN") as copy:
                for i, r in enumerate(rows, 1):
                    copy.write_row(tuple(r[c] for c in _COPY_COLUMNS))
                    if progress is not None and i % INSERT_CHUNK_ROWS == 0:
                        progress(i, len(rows))
            cur.execute(f"INSERT INTO carbon_intensity ({cols}) SELECT {cols} FROM carbon_intensity_import "
                        f"ON CONFLICT ({key}) DO UPDATE SET duration_s = EXCLUDED.duration_s, "
                        "gco2_per_kwh = EXCLUDED.gco2_per_kwh, estimated = EXCLUDED.estimated")
    except psycopg.Error as e:
        from sqlalchemy.exc import DBAPIError

        # hand it to Store.transact as SQLAlchemy's error so transient ones are retried
        raise DBAPIError("COPY carbon_intensity", None, e) from e
    if progress is not None:
        progress(len(rows), len(rows))
    return len(rows)


def fetch_records(conn: Connection, zone: str, provider: str | None, provider_wide: str) -> list[Row]:
    """The provider-call records of a zone, and its provider's account-wide back-off if any."""
    fc = carbon_fetches.c
    wanted = fc.zone == zone
    if provider:
        wanted = wanted | ((fc.provider == provider) & (fc.zone == provider_wide) & (fc.failures > 0))
    return conn.execute(select(carbon_fetches).where(wanted).order_by(fc.provider, fc.endpoint)).all()
