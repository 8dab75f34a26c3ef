"""The carbon-signal store: what a kWh costs in gCO2eq per zone, now and ahead, as of a time.

Readings from `telemetry.grid` (trace files, Electricity Maps, WattTime, the UK Carbon
Intensity API) are stored in `carbon_intensity`; this module answers two questions:

- `intensity(zone, t)`: the recorded (actual) value at t. A row holds from its timestamp
  until the next one, but never past the end of its own period (Electricity Maps' hourly
  rows are averages over the hour starting at the timestamp): beyond that is a gap, and a
  gap is `None`, never a zero.
- `forecast(zone, start, end, as_of)`: the best values for [start, end) known at `as_of`,
  per slot in this order, with each point's kind and source:
    1. actuals known by `as_of` (imported traces count as known at the end of their period);
    2. the newest provider ("live") forecast issued at or before `as_of` and not older than
       `forecast_max_age_s`;
    3. after the end of the record only: the own forecast from history
       (`telemetry.grid.forecast`, using only hours known at `as_of`);
    4. after the end of the record only: the static yearly average (clearly flagged);
    5. otherwise a gap, reported in `gaps`. Holes inside the record are always gaps.
  Nothing issued after `as_of` is ever used, so a simulator replaying history with
  `as_of=t` cannot see the future. (The static table is a constant without an issue time.)
  The result carries the fallback `level` reached (actual, live, own, static, none), its
  `source`, an expected error and the reason for a downgrade. Each change of level of a
  zone is logged once and recorded in `carbon_zone_status` (for queries about "now").

Average and marginal signals are never mixed: a query uses one signal, by default the
zone's configured one, else its live provider's (WattTime: marginal), else the one its data
has (average when it has both). The static table is average-only.

Live providers are called by `refresh(zone)`, at most once per `min_interval_s` per
endpoint across all processes (the `carbon_fetches` table is the shared gate), with a
back-off after failures and the provider's Retry-After after a 429.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Float, Integer, and_, bindparam, cast, extract, func, insert, select, update

from scheduler.carbon_model import ForecastModels
from scheduler.store import Store
from scheduler.lifecycle import utcnow
from scheduler.store.carbon_models import carbon_fetches, carbon_intensity, carbon_zone_status, carbon_zone_versions
from scheduler.timeparse import utc_aware
from telemetry.grid.csv_import import ParsedTrace, read_trace
from telemetry.grid.forecast import (
    EXTRA_SEARCH_DAYS,
    MAX_HORIZON_H,
    METHOD,
    PROFILE_DAYS,
    SHAPE_DAYS,
    baseline_forecast,
    epoch_hour,
    expected_mape_pct,
    hour_start,
    hourly_means,
    intra_hour_shape,
    native_step_s,
)
from telemetry.grid.forecast_model import LOOKBACK_H as MODEL_LOOKBACK_H
from telemetry.grid.forecast_model import METHOD as MODEL_METHOD
from telemetry.grid.forecast_model import TRAIN_DAYS as MODEL_TRAIN_DAYS
from telemetry.grid.forecast_model import expected_model_mape_pct
from telemetry.grid.readings import (
    KIND_ACTUAL,
    KIND_FORECAST,
    SIGNAL_AVERAGE,
    SIGNAL_MARGINAL,
    SIGNALS,
    GridAuthError,
    GridConfigError,
    GridError,
    GridRateLimited,
    IntensityReading,
)
from telemetry.grid.static import STATIC_EXPECTED_MAPE_PCT, static_intensity

log = logging.getLogger(__name__)

KIND_STATIC = "static"
SOURCE_OWN = "own-forecast"
SOURCE_STATIC = "static"
LEVELS = ("actual", "live", "own", "static", "none")  # best to worst
PROVIDERS = ("electricitymaps", "watttime", "ukgrid")
PROVIDER_SIGNAL = {"electricitymaps": SIGNAL_AVERAGE, "watttime": SIGNAL_MARGINAL, "ukgrid": SIGNAL_AVERAGE}
MAX_PERIOD_S = 86400          # the longest row period intensity() looks back over
CURRENT_WINDOW_S = 900        # queries with as_of this close to now update the zone status
SIGNAL_CACHE_S = 60.0
INSERT_CHUNK_ROWS = 5000
COPY_MIN_ROWS = 1000          # PostgreSQL batches this big are bulk-loaded with COPY

#: Default minimum seconds between calls per (provider, endpoint): the API call budget.
DEFAULT_MIN_INTERVAL_S = {
    ("electricitymaps", "latest"): 900, ("electricitymaps", "history"): 3600,
    ("electricitymaps", "forecast"): 3600, ("watttime", "forecast"): 300,
    ("ukgrid", "fw48h"): 1800,
}
FAILURE_BACKOFF_S = (60, 120, 300, 600, 1800, 3600)
AUTH_FAILURE_BACKOFF_S = 3600
PROVIDER_WIDE = "*"           # the carbon_fetches zone/endpoint of account-wide back-offs


# -- results --------------------------------------------------------------------------------

@dataclass(frozen=True)
class IntensityValue:
    """A recorded value at one moment, with the period it holds for and where it came from."""

    zone: str
    at: datetime
    gco2_per_kwh: float
    kind: str
    signal: str
    source: str
    valid_from: datetime
    valid_until: datetime
    issued_at: datetime | None
    estimated: bool | None = None


@dataclass(frozen=True)
class ForecastPoint:
    """One constant piece of a forecast: [at, until) at gco2_per_kwh.

    kind is "actual", "forecast" or "static"; source names the provider, "own-forecast" or
    "static"; issued_at is when the value was known (None for static).
    """

    at: datetime
    until: datetime
    gco2_per_kwh: float
    kind: str
    source: str
    issued_at: datetime | None


@dataclass(frozen=True)
class CarbonForecast:
    """Values for [start, end) as known at `as_of`, with gaps, source and quality."""

    zone: str
    signal: str
    start: datetime
    end: datetime
    as_of: datetime
    points: tuple[ForecastPoint, ...]
    gaps: tuple[tuple[datetime, datetime], ...]
    level: str
    source: str
    expected_mape_pct: float | None
    reason: str | None = None
    method: str | None = None

    @property
    def complete(self) -> bool:
        return not self.gaps

    def value_at(self, t: datetime) -> float | None:
        """The value holding at t, or None in a gap or outside the window."""
        for p in self.points:
            if p.at <= t < p.until:
                return p.gco2_per_kwh
        return None

    def mean_gco2_per_kwh(self, start: datetime | None = None, end: datetime | None = None) -> float | None:
        """Time-weighted mean over [start, end) (default the window); None if a gap is inside."""
        start = start or self.start
        end = end or self.end
        if any(a < end and b > start for a, b in self.gaps):
            return None
        total = weight = 0.0
        for p in self.points:
            a, b = max(p.at, start), min(p.until, end)
            if b > a:
                s = (b - a).total_seconds()
                total += p.gco2_per_kwh * s
                weight += s
        if weight + 1e-6 < (end - start).total_seconds():
            return None
        return total / weight if weight else None


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


@dataclass
class RefreshReport:
    zone: str
    provider: str | None
    fetched: dict[str, int] = field(default_factory=dict)   # endpoint -> rows stored
    skipped: dict[str, str] = field(default_factory=dict)   # endpoint -> why (cached, backing off)
    errors: dict[str, str] = field(default_factory=dict)    # endpoint -> error


# -- configuration --------------------------------------------------------------------------

def _seconds(value: Any, name: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    from scheduler.timeparse import parse_duration

    try:
        return parse_duration(str(value))
    except ValueError as e:
        raise ValueError(f"carbon config {name}: {e}") from None


@dataclass
class ZoneConfig:
    """How one zone gets its signal: which live provider (if any) and which signal."""

    zone: str
    provider: str | None = None
    region: str | None = None          # the provider's own id for the zone (default: zone)
    signal: str | None = None          # average | marginal; None: whatever the data has
    horizon_hours: int = 72


@dataclass
class CarbonConfig:
    """The `[carbon]` section of the config file, with credentials from the environment.

    ```toml
    [carbon]
    electricitymaps_token_file = "/etc/carbonsched/credentials/electricitymaps_token"  # root-only
    watttime_username = "..."          # or CARBONSCHED_WATTTIME_USERNAME
    watttime_password_file = "/etc/carbonsched/credentials/watttime_password"          # root-only
    timeout = "10s"
    forecast_max_age = "6h"
    own_forecast = "model"             # or "baseline" (profile + anomaly only)
    model_fit = "background"           # or "inline" (fit in the querying thread)
    [carbon.zones.DE]
    provider = "electricitymaps"
    [carbon.zones.CAISO_NORTH]
    provider = "watttime"
    [carbon.zones.GB]
    provider = "ukgrid"
    [carbon.static]                    # own yearly averages, gCO2eq/kWh
    FR = 56
    ```
    Each secret comes from CARBONSCHED_<KEY>, else the key itself (only in a root-only config),
    else `<key>_file`, else the systemd credential of that name (scheduler.credentials).
    Secrets never appear in repr() or logs.
    """

    zones: dict[str, ZoneConfig] = field(default_factory=dict)
    electricitymaps_token: str | None = field(default=None, repr=False)
    watttime_username: str | None = None
    watttime_password: str | None = field(default=None, repr=False)
    electricitymaps_url: str | None = None
    watttime_url: str | None = None
    ukgrid_url: str | None = None
    emission_factor: str = "direct"
    timeout_s: float = 10.0
    retries: int = 2
    forecast_max_age_s: float = 6 * 3600.0
    #: the own forecast: "model" (learned, telemetry.grid.forecast_model; the baseline serves
    #: beyond its 72 h and until it is fitted) or "baseline" (profile + anomaly only)
    own_forecast: str = "model"
    #: fit the learned model in the querying thread (True) or in the background (False)
    model_fit_inline: bool = False
    min_interval_s: dict[tuple[str, str], float] = field(default_factory=lambda: dict(DEFAULT_MIN_INTERVAL_S))
    static: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None,
                    env: Mapping[str, str] | None = None) -> CarbonConfig:
        """Build from the parsed config file (its `carbon` table) and the environment.

        The environment wins over the file, as for every other setting. ValueError on a bad
        value.
        """
        env = os.environ if env is None else env
        section = dict((config or {}).get("carbon", {}) or {})
        cfg = cls()
        cfg.electricitymaps_token = _secret(section, env, "electricitymaps_token")
        cfg.watttime_username = env.get("CARBONSCHED_WATTTIME_USERNAME") or section.get("watttime_username")
        cfg.watttime_password = _secret(section, env, "watttime_password")
        cfg.electricitymaps_url = section.get("electricitymaps_url")
        cfg.watttime_url = section.get("watttime_url")
        cfg.ukgrid_url = section.get("ukgrid_url")
        cfg.emission_factor = str(section.get("emission_factor", "direct"))
        if cfg.emission_factor not in ("direct", "lifecycle"):
            raise ValueError("carbon config emission_factor: use direct or lifecycle")
        if "timeout" in section:
            cfg.timeout_s = _seconds(section["timeout"], "timeout")
        if "retries" in section:
            cfg.retries = int(section["retries"])
        if "forecast_max_age" in section:
            cfg.forecast_max_age_s = _seconds(section["forecast_max_age"], "forecast_max_age")
        if "own_forecast" in section:
            cfg.own_forecast = str(section["own_forecast"])
            if cfg.own_forecast not in ("model", "baseline"):
                raise ValueError(f"carbon config own_forecast: {cfg.own_forecast!r}; use model or baseline")
        if "model_fit" in section:
            fit = str(section["model_fit"])
            if fit not in ("background", "inline"):
                raise ValueError(f"carbon config model_fit: {fit!r}; use background or inline")
            cfg.model_fit_inline = fit == "inline"
        for key, value in (section.get("min_interval") or {}).items():
            provider, _, endpoint = str(key).partition(".")
            cfg.min_interval_s[(provider, endpoint)] = _seconds(value, f"min_interval.{key}")
        for zone, value in (section.get("static") or {}).items():
            v = float(value)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"carbon config static.{zone}: {value!r} is not a valid intensity")
            cfg.static[str(zone)] = v
        for zone, zc in (section.get("zones") or {}).items():
            if not isinstance(zc, Mapping):
                raise ValueError(f"carbon config zones.{zone}: expected a table")
            provider = zc.get("provider")
            if provider in ("", "none"):
                provider = None
            if provider is not None and provider not in PROVIDERS:
                raise ValueError(f"carbon config zones.{zone}.provider: {provider!r}; "
                                 f"use one of {', '.join(PROVIDERS)} or none")
            signal = zc.get("signal")
            if signal is not None and signal not in SIGNALS:
                raise ValueError(f"carbon config zones.{zone}.signal: use average or marginal")
            cfg.zones[str(zone)] = ZoneConfig(zone=str(zone), provider=provider, region=zc.get("region"),
                                              signal=signal, horizon_hours=int(zc.get("horizon_hours", 72)))
        return cfg


def _secret(section: Mapping[str, Any], env: Mapping[str, str], key: str) -> str | None:
    """A provider's secret: CARBONSCHED_<KEY>, else `key` in [carbon] (only in a root-only
    config: `config check` refuses it in one others can read), else the root-only file named
    by `<key>_file`, else the systemd credential `key` (issue 48)."""
    from scheduler.credentials import read_credential, read_secret

    if env.get("CARBONSCHED_" + key.upper()):
        return env["CARBONSCHED_" + key.upper()]
    inline, file = section.get(key), section.get(key + "_file")
    if inline is not None and file is not None:
        raise ValueError(f"carbon config {key} and {key}_file are both set: keep one ({key}_file)")
    if inline is not None:
        return str(inline)
    if file is not None:
        try:
            return read_secret(str(file))
        except ValueError as e:
            raise ValueError(f"carbon config {key}_file: {e}") from None
    return read_credential(key, env)


# -- the signal store -----------------------------------------------------------------------

_ORDER = {level: i for i, level in enumerate(LEVELS)}


@dataclass(slots=True)
class _Item:
    at: datetime
    until: datetime
    value: float
    kind: str
    source: str
    issued_at: datetime | None


def _cover(uncovered: list[tuple[datetime, datetime]], items: list[_Item]
           ) -> tuple[list[ForecastPoint], list[tuple[datetime, datetime]]]:
    """Fill the uncovered intervals from time-sorted items; return points and what is left."""
    points: list[ForecastPoint] = []
    rest: list[tuple[datetime, datetime]] = []
    j = 0
    for a, b in uncovered:
        while j < len(items) and items[j].until <= a:
            j += 1
        cur = a
        k = j
        while cur < b and k < len(items) and items[k].at < b:
            it = items[k]
            k += 1
            if it.until <= cur:
                continue
            if it.at > cur:
                rest.append((cur, it.at))
                cur = it.at
            stop = min(it.until, b)
            points.append(ForecastPoint(cur, stop, it.value, it.kind, it.source, it.issued_at))
            cur = stop
        if cur < b:
            rest.append((cur, b))
    return points, rest


def _split(segments: list[tuple[datetime, datetime]], at: datetime | None
           ) -> tuple[list[tuple[datetime, datetime]], list[tuple[datetime, datetime]]]:
    """Segments before `at` and from `at` on (everything is "after" when at is None)."""
    if at is None:
        return [], list(segments)
    before, after = [], []
    for a, b in segments:
        if b <= at:
            before.append((a, b))
        elif a >= at:
            after.append((a, b))
        else:
            before.append((a, at))
            after.append((at, b))
    return before, after


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _from_epoch(seconds: float) -> datetime:
    return _EPOCH + timedelta(seconds=seconds)


class _Queries:
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


class CarbonSignals:
    """Intensity and forecast queries over the store, imports, and live-provider refreshes.

    `clock` is injectable (the simulator's clock); `clients` maps provider names to client
    objects (tests pass fakes), otherwise they are built from `config` on first use.
    `track_status`: log each change of a zone's fallback level once and record it in the
    store (the daemon); the CLI turns it off and prints the level instead.
    Thread-safe for queries; one instance per process is enough.
    """

    def __init__(self, store: Store, config: CarbonConfig | None = None, *,
                 clock: Callable[[], datetime] = utcnow,
                 clients: Mapping[str, Any] | None = None,
                 track_status: bool = True) -> None:
        self.store = store
        self.config = config or CarbonConfig()
        self._clock = clock
        self._clients: dict[str, Any] = dict(clients or {})
        self._track_status = track_status
        self._signal_cache: dict[str, tuple[float, str | None]] = {}
        self._seen_versions: dict[str, int] = {}  # data_versions' last answer per zone
        self._levels: dict[tuple[str, str], str] = {}
        self._levels_lock = threading.Lock()
        self._q = _Queries(store.dialect)
        self._models = ForecastModels(self._model_history, inline=self.config.model_fit_inline) \
            if self.config.own_forecast == "model" else None

    def _model_history(self, zone: str, signal: str, last_known_hour: int, as_of: datetime) -> dict[int, float]:
        """Hourly actuals of a zone up to `last_known_hour`, as recorded by `as_of`, for a fit."""
        end = hour_start(last_known_hour + 1)
        params = {"zone": zone, "signal": signal, "as_of": as_of, "end": end,
                  "since": end - timedelta(hours=24 * MODEL_TRAIN_DAYS + MODEL_LOOKBACK_H)}
        with self.store.read() as conn:
            rows = conn.execute(self._q.history, params).all()
        latest = {at_s: (d, v) for at_s, d, v in rows}
        return hourly_means((at_s, d, v) for at_s, (d, v) in latest.items())

    # -- signal resolution ------------------------------------------------------------------

    def signal_of(self, zone: str) -> str | None:
        """The signal a zone's queries use: the configured one, else its live provider's
        (WattTime: marginal; the others: average), else its data's (average first), else None."""
        zc = self.config.zones.get(zone)
        if zc is not None and zc.signal:
            return zc.signal
        if zc is not None and zc.provider:
            return PROVIDER_SIGNAL[zc.provider]
        now = time.monotonic()
        hit = self._signal_cache.get(zone)
        if hit is not None and now - hit[0] < SIGNAL_CACHE_S:
            return hit[1]
        with self.store.read() as conn:
            signals = set(conn.execute(select(carbon_intensity.c.signal).where(
                carbon_intensity.c.zone == zone).distinct()).scalars())
        signal = SIGNAL_AVERAGE if SIGNAL_AVERAGE in signals else (min(signals) if signals else None)
        self._signal_cache[zone] = (now, signal)
        return signal

    # -- queries ----------------------------------------------------------------------------

    def intensity(self, zone: str, t: datetime, *, signal: str | None = None,
                  as_of: datetime | None = None) -> IntensityValue | None:
        """The recorded value at `t`, or None in a gap (never a zero).

        With `as_of`, only values known at that time count (the simulator's view).
        """
        t = utc_aware(t, "t")
        sig = signal or self.signal_of(zone)
        if sig is None:
            return None
        params = {"zone": zone, "signal": sig, "t": t, "since": t - timedelta(seconds=MAX_PERIOD_S)}
        if as_of is None:
            stmt = self._q.intensity
        else:
            stmt = self._q.intensity_as_of
            params["as_of"] = utc_aware(as_of, "as_of")
        with self.store.read() as conn:
            row = conn.execute(stmt, params).first()
        if row is None:
            return None
        until = row.at + timedelta(seconds=row.duration_s)
        if t >= until:
            return None
        return IntensityValue(zone=zone, at=t, gco2_per_kwh=row.gco2_per_kwh, kind=KIND_ACTUAL,
                              signal=sig, source=row.source, valid_from=row.at, valid_until=until,
                              issued_at=row.issued_at, estimated=row.estimated)

    def forecast(self, zone: str, start: datetime, end: datetime, as_of: datetime | None = None,
                 *, signal: str | None = None) -> CarbonForecast:
        """Values for [start, end) as known at `as_of` (default now): see the module docstring."""
        start, end = utc_aware(start, "start"), utc_aware(end, "end")
        as_of = utc_aware(as_of, "as_of") if as_of is not None else self._clock()
        if end <= start:
            raise ValueError(f"forecast window is empty: start {start} is not before end {end}")
        sig = signal or self.signal_of(zone) or SIGNAL_AVERAGE
        # History the own forecast may read: the profile days and their spare days before the
        # newest known hour, plus a day of slack (see telemetry.grid.forecast).
        lookback_h = 24 * (PROFILE_DAYS + EXTRA_SEARCH_DAYS + 1) + 1
        params = {"zone": zone, "signal": sig, "as_of": as_of, "end": end,
                  "since": min(start, as_of) - timedelta(hours=lookback_h)}
        live_params = {"zone": zone, "signal": sig, "as_of": as_of, "end": end,
                       "oldest": as_of - timedelta(seconds=self.config.forecast_max_age_s),
                       "since": start - timedelta(seconds=MAX_PERIOD_S)}
        with self.store.read() as conn:
            history_rows = conn.execute(self._q.history, params).all()
            live_rows = conn.execute(self._q.live, live_params).all()
            # 1. actuals: the newest version of each period; details only for those in the window
            start_s = (start - _EPOCH).total_seconds()
            latest: dict[float, tuple[int, float]] = {}
            record_end_s: float | None = None
            for at_s, duration_s, value in history_rows:
                latest[at_s] = (duration_s, value)
                until_s = at_s + duration_s
                if record_end_s is None or until_s > record_end_s:
                    record_end_s = until_s
            in_window = record_end_s is not None and record_end_s > start_s
            actual_rows = (conn.execute(self._q.actuals, {**params, "since": start - timedelta(
                seconds=MAX_PERIOD_S)}).all() if in_window else [])
        record_end = _from_epoch(record_end_s) if record_end_s is not None else None
        newest: dict[datetime, Any] = {}
        for r in actual_rows:
            newest[r.at] = r
        actual_items = [_Item(at, at + timedelta(seconds=r.duration_s), r.gco2_per_kwh, KIND_ACTUAL,
                              r.source, r.issued_at) for at, r in newest.items()]
        actual_items = [i for i in actual_items if i.until > start]
        points, uncovered = _cover([(start, end)], actual_items)

        # 2. the newest live forecast run
        notes: list[str] = []
        live_items = [_Item(r.at, r.at + timedelta(seconds=r.duration_s), r.gco2_per_kwh, KIND_FORECAST,
                            r.source, r.issued_at) for r in live_rows]
        if uncovered:
            got, uncovered = _cover(uncovered, live_items)
            points += got
            if not live_items:
                zc = self.config.zones.get(zone)
                if zc is not None and zc.provider:
                    notes.append(f"no {zc.provider} forecast issued in the "
                                 f"{_hours(self.config.forecast_max_age_s)} before {_iso(as_of)}")
                else:
                    notes.append(f"no live forecast provider for {zone}")
            elif uncovered:
                notes.append(f"live forecast issued {_iso(live_items[0].issued_at)} ends "
                             f"{_iso(max(i.until for i in live_items))}")

        # 3. own forecast, 4. static: only after the end of the record
        past_gaps, ahead = _split(uncovered, record_end)
        own_points: list[ForecastPoint] = []
        own_h: list[int] = []
        used_model = False
        shaped = ""  # the sub-hourly split of the own forecast, named in `method`
        if ahead:
            hourly = hourly_means((at_s, d, v) for at_s, (d, v) in latest.items())
            if hourly:
                last_known = max(hourly)
                targets = sorted({h for a, b in ahead
                                  for h in range(epoch_hour(a), epoch_hour(b - timedelta(microseconds=1)) + 1)})
                values = baseline_forecast(hourly, last_known, targets)
                learned = self._models.get(zone, sig, last_known, as_of) if self._models is not None else None
                if learned is not None:
                    model_values = learned.predict(hourly, last_known, targets)
                    used_model = any(v is not None for v in model_values)
                    values = [m if m is not None else b for m, b in zip(model_values, values)]
                own_items = []
                # at the data's own step: sub-hourly data gets each hour split by the zone's
                # recent intra-hour shape (telemetry.grid.forecast.intra_hour_shape)
                history = [(at_s, d, v) for at_s, (d, v) in latest.items()]
                step_s = native_step_s(history)
                shape = intra_hour_shape(history, step_s, last_known) if step_s < 3600 else {}
                parts = 3600 // step_s if shape else 1
                part = timedelta(seconds=3600 // parts)
                if shape:
                    shaped = (f"; hours split into {step_s // 60}-min steps by the last "
                              f"{SHAPE_DAYS} days' intra-hour shape")
                for h, v in zip(targets, values):
                    if v is not None:
                        at = hour_start(h)
                        ratios = shape.get(h % 24, (1.0,) * parts)
                        for k in range(parts):
                            a = at + k * part
                            own_items.append(_Item(a, a + part, v * ratios[k], KIND_FORECAST, SOURCE_OWN, as_of))
                own_points, ahead = _cover(ahead, own_items)
                if ahead:
                    notes.append(f"own forecast needs history within {MAX_HORIZON_H // 24} d: newest known "
                                 f"hour starts {_iso(hour_start(last_known))}")
                own_h = [(epoch_hour(p.at) - last_known) for p in own_points]
            else:
                notes.append(f"no {zone} ({sig}) history in the {lookback_h // 24} d before {_iso(as_of)} "
                             "for an own forecast")
            points += own_points
        static_points: list[ForecastPoint] = []
        if ahead:
            static = static_intensity(zone, self.config.static) if sig == SIGNAL_AVERAGE else None
            if static is not None:
                static_points = [ForecastPoint(a, b, static.gco2_per_kwh, KIND_STATIC, SOURCE_STATIC, None)
                                 for a, b in ahead]
                ahead = []
            else:
                notes.append(f"no static value for {zone} ({sig})")
            points += static_points
        gaps = sorted(past_gaps + ahead)
        points.sort(key=lambda p: p.at)

        # level, source, quality: judged on the part of the window at or after as_of
        horizon_from = as_of if end > as_of else start
        relevant = [p for p in points if p.until > horizon_from] or points
        level = "none"
        source = "none"
        mape: float | None = None
        if relevant:
            worst = max(relevant, key=lambda p: _ORDER[_level_of(p)])
            level = _level_of(worst)
            source = worst.source
            if level == "actual":
                mape = 0.0
            elif level == "own":
                mape = (expected_model_mape_pct if used_model else expected_mape_pct)(max(own_h) if own_h else 1)
            elif level == "static":
                mape = STATIC_EXPECTED_MAPE_PCT
        reason = "; ".join(notes) if notes and level in ("own", "static", "none") else None
        result = CarbonForecast(zone=zone, signal=sig, start=start, end=end, as_of=as_of,
                                points=tuple(points), gaps=tuple(gaps), level=level, source=source,
                                expected_mape_pct=mape, reason=reason,
                                method=(MODEL_METHOD if used_model else METHOD) + shaped if level == "own" else None)
        if self._track_status and abs((as_of - self._clock()).total_seconds()) <= CURRENT_WINDOW_S:
            self._note_level(zone, sig, level, source, reason)
        return result

    def _note_level(self, zone: str, signal: str, level: str, source: str, reason: str | None) -> None:
        """Log a change of a zone's fallback level once, and record it in carbon_zone_status."""
        key = (zone, signal)
        with self._levels_lock:
            previous = self._levels.get(key)
            if previous == level:
                return
            self._levels[key] = level
        zc = self.config.zones.get(zone)
        configured = zc is not None and zc.provider is not None
        if level in ("own", "static", "none"):
            log_fn = log.warning if (configured or level != "own") else log.info
            log_fn("carbon %s: forecasts now from %s (%s level)%s", zone, source, level,
                   f": {reason}" if reason else "")
        elif previous in ("own", "static", "none"):
            log.info("carbon %s: forecasts back to %s (%s level)", zone, source, level)
        now = self._clock()

        def write(conn: Connection) -> None:
            row = conn.execute(select(carbon_zone_status.c.level).where(
                carbon_zone_status.c.zone == zone)).first()
            if row is None:
                conn.execute(insert(carbon_zone_status).values(zone=zone, level=level, source=source,
                                                               reason=reason, since=now))
            elif row.level != level:
                conn.execute(update(carbon_zone_status).where(carbon_zone_status.c.zone == zone)
                             .values(level=level, source=source, reason=reason, since=now))

        self.store.transact(write)

    def zone_status(self, zone: str) -> dict | None:
        """The recorded fallback level of a zone ({level, source, reason, since}) or None."""
        with self.store.read() as conn:
            row = conn.execute(select(carbon_zone_status).where(carbon_zone_status.c.zone == zone)).first()
        return None if row is None else {"level": row.level, "source": row.source, "reason": row.reason,
                                         "since": row.since}

    # -- writing ----------------------------------------------------------------------------

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
        if self.store.dialect == "postgresql" and len(rows) >= COPY_MIN_ROWS:
            def write(conn: Connection) -> int:
                n = _copy_upsert(conn, rows, progress)
                self._bump_versions(conn, zones)
                return n
        else:
            stmt = self._upsert_statement()

            def write(conn: Connection) -> int:
                for i in range(0, len(rows), INSERT_CHUNK_ROWS):
                    conn.execute(stmt, rows[i:i + INSERT_CHUNK_ROWS])
                    if progress is not None:
                        progress(min(i + INSERT_CHUNK_ROWS, len(rows)), len(rows))
                self._bump_versions(conn, zones)
                return len(rows)

        n = self.store.transact(write)
        for zone in zones:
            self._signal_cache.pop(zone, None)
        return n

    def forget_zone(self, zone: str) -> int:
        """Delete every intensity value, fetch record and status of `zone` (a zone imported
        by mistake, or under a wrong id); the number of values deleted. Jobs already priced
        keep their figures; the zone's caches are invalidated like after a write."""
        from sqlalchemy import delete

        def tx(conn: Connection) -> int:
            n = conn.execute(delete(carbon_intensity).where(carbon_intensity.c.zone == zone)).rowcount
            conn.execute(delete(carbon_fetches).where(carbon_fetches.c.zone == zone))
            conn.execute(delete(carbon_zone_status).where(carbon_zone_status.c.zone == zone))
            self._bump_versions(conn, [zone])
            return int(n or 0)

        return self.store.transact(tx)

    def _bump_versions(self, conn: Connection, zones: Iterable[str]) -> None:
        """Count one more change of each zone's carbon data, in the writing transaction, so
        readers in other processes (the planner) notice it (`data_versions`)."""
        if self.store.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as dialect_insert
        else:
            from sqlalchemy.dialects.sqlite import insert as dialect_insert
        now = utcnow()
        stmt = dialect_insert(carbon_zone_versions)
        stmt = stmt.on_conflict_do_update(index_elements=[carbon_zone_versions.c.zone], set_={
            "version": carbon_zone_versions.c.version + 1, "updated_at": stmt.excluded.updated_at})
        conn.execute(stmt, [{"zone": z, "version": 1, "updated_at": now} for z in zones])

    def data_versions(self, zones: Iterable[str]) -> dict[str, int]:
        """How often each zone's carbon data has changed (0: never written), one small query.

        Anything that caches what it read of a zone (the planner's curves) compares these
        between uses: an import or a provider refresh in any process changes them. A zone
        whose version moved since the last call also drops its cached signal here.
        """
        wanted = sorted(set(zones))
        if not wanted:
            return {}
        with self.store.read() as conn:
            got = dict(conn.execute(select(carbon_zone_versions.c.zone, carbon_zone_versions.c.version)
                                    .where(carbon_zone_versions.c.zone.in_(wanted))).all())
        out = {z: int(got.get(z, 0)) for z in wanted}
        for z, v in out.items():
            if self._seen_versions.get(z, v) != v:
                self._signal_cache.pop(z, None)
            self._seen_versions[z] = v
        return out

    def _upsert_statement(self):
        if self.store.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as dialect_insert
        else:
            from sqlalchemy.dialects.sqlite import insert as dialect_insert
        stmt = dialect_insert(carbon_intensity)
        key = [c.name for c in carbon_intensity.primary_key.columns]
        return stmt.on_conflict_do_update(index_elements=key, set_={
            "duration_s": stmt.excluded.duration_s, "gco2_per_kwh": stmt.excluded.gco2_per_kwh,
            "estimated": stmt.excluded.estimated})

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

    # -- live providers ---------------------------------------------------------------------

    def _client(self, provider: str):
        client = self._clients.get(provider)
        if client is not None:
            return client
        cfg = self.config
        common = {"timeout_s": cfg.timeout_s, "retries": cfg.retries, "clock": self._clock}
        if provider == "electricitymaps":
            from telemetry.grid.electricitymaps import DEFAULT_BASE_URL, ElectricityMapsClient

            client = ElectricityMapsClient(cfg.electricitymaps_token or "",
                                           base_url=cfg.electricitymaps_url or DEFAULT_BASE_URL,
                                           emission_factor=cfg.emission_factor, **common)
        elif provider == "watttime":
            from telemetry.grid.watttime import DEFAULT_BASE_URL, WattTimeClient

            client = WattTimeClient(cfg.watttime_username or "", cfg.watttime_password or "",
                                    base_url=cfg.watttime_url or DEFAULT_BASE_URL, **common)
        elif provider == "ukgrid":
            from telemetry.grid.ukgrid import DEFAULT_BASE_URL, UkCarbonIntensityClient

            client = UkCarbonIntensityClient(base_url=cfg.ukgrid_url or DEFAULT_BASE_URL, **common)
        else:
            raise GridConfigError(f"unknown carbon provider {provider!r}")
        self._clients[provider] = client
        return client

    def _calls(self, provider: str, zone: str, region: str, horizon_hours: int
               ) -> list[tuple[str, Callable[[], list[IntensityReading]]]]:
        def client():
            return self._client(provider)

        def relabel(readings: Iterable[IntensityReading | None]) -> list[IntensityReading]:
            from dataclasses import replace

            return [r if r.zone == zone else replace(r, zone=zone) for r in readings if r is not None]

        if provider == "electricitymaps":
            return [("history", lambda: relabel(client().history(region))),
                    ("latest", lambda: relabel([client().latest(region)])),
                    ("forecast", lambda: relabel(client().forecast(region, horizon_hours)))]
        if provider == "watttime":
            return [("forecast", lambda: relabel(client().forecast(region, min(horizon_hours, 72))))]
        if provider == "ukgrid":
            return [("fw48h", lambda: relabel(client().forecast_48h(zone)))]
        raise GridConfigError(f"unknown carbon provider {provider!r}")

    def refresh(self, zone: str, *, force: bool = False) -> RefreshReport:
        """Fetch the zone's live values into the store, within the call budget.

        Each endpoint is called only when its `min_interval_s` has passed since the last
        call by any process (`force` skips that wait but never a back-off after errors or
        a 429). Errors are recorded and reported, never raised: the forecast chain falls
        back by itself.
        """
        zc = self.config.zones.get(zone)
        report = RefreshReport(zone=zone, provider=zc.provider if zc else None)
        if zc is None or zc.provider is None:
            report.skipped["*"] = "no live provider configured"
            return report
        provider = zc.provider
        for endpoint, call in self._calls(provider, zone, zc.region or zone, zc.horizon_hours):
            interval = self.config.min_interval_s.get((provider, endpoint), 3600)
            why_not = self._claim(provider, zone, endpoint, interval, force)
            if why_not:
                report.skipped[endpoint] = why_not
                continue
            try:
                readings = call()
            except GridError as e:
                report.errors[endpoint] = str(e)
                self._record_failure(provider, zone, endpoint, e)
                if isinstance(e, (GridAuthError, GridConfigError, GridRateLimited)):
                    break  # the other endpoints would fail the same way
                continue
            n = self.store_readings(readings)
            report.fetched[endpoint] = n
            self._record_success(provider, zone, endpoint, interval, n)
        return report

    def refresh_all(self, *, force: bool = False) -> list[RefreshReport]:
        """Refresh every zone that has a live provider configured."""
        return [self.refresh(z, force=force) for z, zc in sorted(self.config.zones.items()) if zc.provider]

    def _fetch_row(self, conn: Connection, provider: str, zone: str, endpoint: str):
        """The carbon_fetches row of one endpoint, created if missing, locked on PostgreSQL."""
        fc = carbon_fetches.c
        key = and_(fc.provider == provider, fc.zone == zone, fc.endpoint == endpoint)
        row = conn.execute(select(carbon_fetches).where(key).with_for_update()).first()
        if row is None:
            if self.store.dialect == "postgresql":
                from sqlalchemy.dialects.postgresql import insert as dialect_insert
            else:
                from sqlalchemy.dialects.sqlite import insert as dialect_insert
            conn.execute(dialect_insert(carbon_fetches).values(
                provider=provider, zone=zone, endpoint=endpoint, failures=0, calls=0).on_conflict_do_nothing())
            row = conn.execute(select(carbon_fetches).where(key).with_for_update()).first()
        return row, key

    def _claim(self, provider: str, zone: str, endpoint: str, interval_s: float, force: bool) -> str | None:
        """Reserve the right to call an endpoint now; None if granted, else why not.

        A provider-wide row (zone and endpoint "*") holds back-offs that concern the whole
        account: a 429 or refused credentials stop every endpoint of every zone.
        """
        def claim(conn: Connection) -> str | None:
            now = self._clock()
            account, _ = self._fetch_row(conn, provider, PROVIDER_WIDE, PROVIDER_WIDE)
            if account.failures and account.next_allowed_at is not None and now < account.next_allowed_at:
                return (f"backing off {provider} until {_iso(account.next_allowed_at)} after: "
                        f"{account.last_error}")
            row, key = self._fetch_row(conn, provider, zone, endpoint)
            if row.next_allowed_at is not None and now < row.next_allowed_at:
                if row.failures:
                    return f"backing off after {row.failures} failure(s) until {_iso(row.next_allowed_at)}"
                if not force:
                    return f"cached: last call {_iso(row.last_attempt_at)}, next after {_iso(row.next_allowed_at)}"
            conn.execute(update(carbon_fetches).where(key).values(
                last_attempt_at=now, next_allowed_at=now + timedelta(seconds=interval_s), calls=row.calls + 1))
            return None

        return self.store.transact(claim)

    def _record_success(self, provider: str, zone: str, endpoint: str, interval_s: float, rows: int) -> None:
        now = self._clock()

        def write(conn: Connection) -> int:
            row, key = self._fetch_row(conn, provider, zone, endpoint)
            conn.execute(update(carbon_fetches).where(key).values(
                last_success_at=now, next_allowed_at=now + timedelta(seconds=interval_s), failures=0,
                rows=rows, last_error=None))
            account, account_key = self._fetch_row(conn, provider, PROVIDER_WIDE, PROVIDER_WIDE)
            if account.failures:
                conn.execute(update(carbon_fetches).where(account_key).values(failures=0, last_error=None))
            return row.failures

        if self.store.transact(write):
            log.info("carbon %s: %s %s works again (%d values)", zone, provider, endpoint, rows)

    def _record_failure(self, provider: str, zone: str, endpoint: str, error: GridError) -> None:
        now = self._clock()
        account_wide = isinstance(error, (GridRateLimited, GridAuthError, GridConfigError))

        def write(conn: Connection) -> tuple[int, datetime]:
            row, key = self._fetch_row(conn, provider, zone, endpoint)
            failures = row.failures + 1
            if isinstance(error, GridRateLimited):
                wait_s = max(error.retry_after_s or 0.0, FAILURE_BACKOFF_S[min(failures, len(FAILURE_BACKOFF_S)) - 1])
            elif isinstance(error, (GridAuthError, GridConfigError)):
                wait_s = AUTH_FAILURE_BACKOFF_S
            else:
                wait_s = FAILURE_BACKOFF_S[min(failures, len(FAILURE_BACKOFF_S)) - 1]
            until = now + timedelta(seconds=wait_s)
            message = str(error)[:500]
            conn.execute(update(carbon_fetches).where(key).values(
                failures=failures, next_allowed_at=until, last_error=message))
            if account_wide:
                account, account_key = self._fetch_row(conn, provider, PROVIDER_WIDE, PROVIDER_WIDE)
                conn.execute(update(carbon_fetches).where(account_key).values(
                    failures=account.failures + 1, next_allowed_at=until, last_error=message,
                    last_attempt_at=now))
            return failures, until

        failures, until = self.store.transact(write)
        if failures == 1:
            log.warning("carbon %s: %s %s failed, not calling %s before %s: %s", zone, provider, endpoint,
                        provider if account_wide else "it", _iso(until), error)
        else:
            log.debug("carbon %s: %s %s failed again (%d): %s", zone, provider, endpoint, failures, error)

    # -- overview ---------------------------------------------------------------------------

    def freshness(self, zone: str, signal: str | None = None, now: datetime | None = None) -> dict:
        """How current the zone's data is: newest actual, newest forecast issue, provider calls."""
        now = utc_aware(now, "now") if now is not None else self._clock()
        sig = signal or self.signal_of(zone) or SIGNAL_AVERAGE
        ci, fc = carbon_intensity.c, carbon_fetches.c
        with self.store.read() as conn:
            actual = conn.execute(
                select(ci.at, ci.duration_s, ci.issued_at, ci.source)
                .where(ci.zone == zone, ci.signal == sig, ci.kind == KIND_ACTUAL, ci.issued_at <= now)
                .order_by(ci.at.desc()).limit(1)).first()
            issued = conn.execute(
                select(func.max(ci.issued_at)).where(ci.zone == zone, ci.signal == sig,
                                                     ci.kind == KIND_FORECAST, ci.issued_at <= now)).scalar()
            zc = self.config.zones.get(zone)
            wanted = fc.zone == zone
            if zc is not None and zc.provider:
                wanted = wanted | ((fc.provider == zc.provider) & (fc.zone == PROVIDER_WIDE) & (fc.failures > 0))
            fetches = conn.execute(select(carbon_fetches).where(wanted)
                                   .order_by(fc.provider, fc.endpoint)).all()
        out: dict[str, Any] = {"now": now, "latest_actual_at": None, "latest_actual_until": None,
                               "latest_actual_age_s": None, "latest_actual_source": None,
                               "latest_forecast_issued_at": issued,
                               "forecast_age_s": (now - issued).total_seconds() if issued else None,
                               "fetches": []}
        if actual is not None:
            until = actual.at + timedelta(seconds=actual.duration_s)
            out.update(latest_actual_at=actual.at, latest_actual_until=until,
                       latest_actual_age_s=max(0.0, (now - until).total_seconds()),
                       latest_actual_source=actual.source)
        for f in fetches:
            out["fetches"].append({"provider": f.provider, "endpoint": f.endpoint,
                                   "last_attempt_at": f.last_attempt_at, "last_success_at": f.last_success_at,
                                   "next_allowed_at": f.next_allowed_at, "failures": f.failures,
                                   "calls": f.calls, "last_error": f.last_error})
        return out

    def zones(self) -> list[dict]:
        """Every zone with data, a configured provider or a recorded status, with a summary."""
        ci = carbon_intensity.c
        with self.store.read() as conn:
            groups = conn.execute(
                select(ci.zone, ci.signal, ci.kind, ci.source, func.count(), func.min(ci.at),
                       func.max(ci.at), func.max(ci.issued_at))
                .group_by(ci.zone, ci.signal, ci.kind, ci.source)).all()
            statuses = {r.zone: r for r in conn.execute(select(carbon_zone_status)).all()}
        by_zone: dict[str, dict] = {}

        def entry(zone: str) -> dict:
            if zone not in by_zone:
                zc = self.config.zones.get(zone)
                static = static_intensity(zone, self.config.static)
                by_zone[zone] = {"zone": zone, "signals": [], "sources": [], "actual_rows": 0,
                                 "forecast_rows": 0, "first_actual_at": None, "last_actual_at": None,
                                 "last_forecast_issued_at": None,
                                 "provider": zc.provider if zc else None,
                                 "static_gco2_per_kwh": static.gco2_per_kwh if static else None,
                                 "status": None}
            return by_zone[zone]

        for zone, sig, kind, source, count, first, last, issued in groups:
            e = entry(zone)
            if sig not in e["signals"]:
                e["signals"].append(sig)
            if source not in e["sources"]:
                e["sources"].append(source)
            if kind == KIND_ACTUAL:
                e["actual_rows"] += count
                e["first_actual_at"] = min(filter(None, [e["first_actual_at"], first]))
                e["last_actual_at"] = max(filter(None, [e["last_actual_at"], last]))
            else:
                e["forecast_rows"] += count
                e["last_forecast_issued_at"] = max(filter(None, [e["last_forecast_issued_at"], issued]))
        for zone in self.config.zones:
            entry(zone)
        for zone, st in statuses.items():
            entry(zone)["status"] = {"level": st.level, "source": st.source, "reason": st.reason,
                                     "since": st.since}
        for e in by_zone.values():
            e["signals"].sort()
            e["sources"].sort()
        return [by_zone[z] for z in sorted(by_zone)]


_COPY_COLUMNS = ("zone", "signal", "kind", "source", "at", "issued_at", "duration_s", "gco2_per_kwh",
                 "estimated")


def _copy_upsert(conn: Connection, rows: list[dict], progress: Callable[[int, int], None] | None) -> int:
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


def _level_of(p: ForecastPoint) -> str:
    if p.kind == KIND_ACTUAL:
        return "actual"
    if p.kind == KIND_STATIC:
        return "static"
    return "own" if p.source == SOURCE_OWN else "live"


def _iso(t: datetime | None) -> str:
    if t is None:
        return "never"
    return t.astimezone(timezone.utc).isoformat(timespec="minutes").replace("+00:00", "Z")


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g} h"
