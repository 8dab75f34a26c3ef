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

`CarbonSignals` is the store-backed `scheduler.carbon_signal.CarbonSignal` (the as-of reads
above, the zone's climatology, data versions and an overview of the zones); what it holds
besides does the other jobs: `writes` (`scheduler.carbon_writes`: readings, imports,
forgetting a zone) and `providers` (`scheduler.carbon_refresh`: live providers, called by
`providers.refresh(zone)` at most once per `min_interval_s` per endpoint across all
processes, with back-offs). All SQL on the table is in `scheduler.carbon_table`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Connection, Row
from sqlalchemy.exc import SQLAlchemyError

from policies.types import Climatology
from scheduler import carbon_table
from scheduler.carbon_climatology import Climatologies, store_history
from scheduler.carbon_config import CarbonConfig
from scheduler.carbon_model import ForecastModels
from scheduler.carbon_providers import PROVIDER_SIGNAL
from scheduler.carbon_refresh import PROVIDER_WIDE, ProviderRefresh
from scheduler.carbon_signal import (KIND_STATIC, LEVELS, SOURCE_OWN, SOURCE_STATIC, CarbonForecast, ForecastPoint,
                                     IntensityValue)
from scheduler.carbon_table import MAX_PERIOD_S, from_epoch
from scheduler.carbon_writes import CarbonWrites
from scheduler.clock import utcnow
from scheduler.store import Store
from scheduler.timeparse import utc_aware
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
from telemetry.grid.readings import KIND_ACTUAL, KIND_FORECAST, SIGNAL_AVERAGE
from telemetry.grid.static import STATIC_EXPECTED_MAPE_PCT, static_intensity

log = logging.getLogger(__name__)

CURRENT_WINDOW_S = 900        # queries with as_of this close to now update the zone status
SIGNAL_CACHE_S = 60.0
# History the own forecast may read: the profile days and their spare days before the
# newest known hour, plus a day of slack (see telemetry.grid.forecast).
OWN_LOOKBACK_H = 24 * (PROFILE_DAYS + EXTRA_SEARCH_DAYS + 1) + 1

_ORDER = {level: i for i, level in enumerate(LEVELS)}


# -- the forecast chain's pieces --------------------------------------------------------------

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


@dataclass
class _Known:
    """What the store knows of a zone at `as_of` for one forecast window."""

    latest: dict[float, tuple[int, float]]   # actual periods (epoch s) -> (duration_s, value)
    record_end: datetime | None              # where the known actuals end
    actual_rows: list[Row]                   # the actual rows reaching into the window
    live_rows: list[Row]                     # the newest live forecast run's rows


@dataclass
class _Own:
    """The own forecast's part of a window, and what it says about its quality."""

    points: list[ForecastPoint] = field(default_factory=list)
    hours_ahead: list[int] = field(default_factory=list)
    used_model: bool = False
    shaped: str = ""  # the sub-hourly split of the own forecast, named in `method`


def _level_of(p: ForecastPoint) -> str:
    if p.kind == KIND_ACTUAL:
        return "actual"
    if p.kind == KIND_STATIC:
        return "static"
    return "own" if p.source == SOURCE_OWN else "live"


# -- the signal store -------------------------------------------------------------------------

class CarbonSignals:
    """The store-backed carbon signal: as-of intensity and forecast queries, the zones'
    climatology and overview; `writes` and `providers` do the writing and the refreshing.

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
        self._track_status = track_status
        self._signal_cache: dict[str, tuple[float, str | None]] = {}
        self._seen_versions: dict[str, int] = {}  # data_versions' last answer per zone
        self._levels: dict[tuple[str, str], str] = {}
        self._levels_lock = threading.Lock()
        self._q = carbon_table.queries(store.dialect)
        self._models = ForecastModels(self._model_history, inline=self.config.model_fit_inline) \
            if self.config.own_forecast == "model" else None
        self._climatologies = Climatologies(store_history(store), static=self.config.static,
                                            label=lambda zone, signal: f"{zone} {signal} actuals")
        self.writes = CarbonWrites(store, clock=clock, on_change=self._forget_signals)
        self.providers = ProviderRefresh(store, self.config, self.writes, clock=clock, clients=clients)

    def _forget_signals(self, zones: Iterable[str]) -> None:
        for zone in zones:
            self._signal_cache.pop(zone, None)

    def _model_history(self, zone: str, signal: str, last_known_hour: int, as_of: datetime) -> dict[int, float]:
        """Hourly actuals of a zone up to `last_known_hour`, as recorded by `as_of`, for a fit."""
        end = hour_start(last_known_hour + 1)
        since = end - timedelta(hours=24 * MODEL_TRAIN_DAYS + MODEL_LOOKBACK_H)
        return carbon_table.hourly_history(self.store, zone, signal, since, end, as_of)

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
        signals = carbon_table.zone_signals(self.store, zone)
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

    def climatology(self, zone: str, signal: str, as_of: datetime) -> Climatology | None:
        """The zone's climatology as of the start of `as_of`'s day (None: no history and no
        static value, or the store could not be read: the curve's last value holds past its end)."""
        try:
            return self._climatologies.for_zone(zone, signal, as_of)
        except SQLAlchemyError as e:
            log.warning("carbon history of zone %s unreadable, no climatology past the forecast: %s", zone, e)
            return None

    def forecast(self, zone: str, start: datetime, end: datetime, as_of: datetime | None = None,
                 *, signal: str | None = None) -> CarbonForecast:
        """Values for [start, end) as known at `as_of` (default now): see the module docstring."""
        start, end = utc_aware(start, "start"), utc_aware(end, "end")
        as_of = utc_aware(as_of, "as_of") if as_of is not None else self._clock()
        if end <= start:
            raise ValueError(f"forecast window is empty: start {start} is not before end {end}")
        sig = signal or self.signal_of(zone) or SIGNAL_AVERAGE
        known = self._known(zone, sig, start, end, as_of)
        notes: list[str] = []
        # 1. actuals known by as_of, 2. the newest live forecast run
        points, uncovered = _cover([(start, end)], _actual_items(known.actual_rows, start))
        if uncovered:
            live, uncovered = self._live(zone, known.live_rows, uncovered, as_of, notes)
            points += live
        # 3. own forecast, 4. static: only after the end of the record
        past_gaps, ahead = _split(uncovered, known.record_end)
        own = _Own()
        if ahead:
            own, ahead = self._own(zone, sig, known.latest, ahead, as_of, notes)
            points += own.points
        if ahead:
            static, ahead = self._static(zone, sig, ahead, notes)
            points += static
        points.sort(key=lambda p: p.at)
        result = _judged(zone, sig, start, end, as_of, points, sorted(past_gaps + ahead), own, notes)
        if self._track_status and abs((as_of - self._clock()).total_seconds()) <= CURRENT_WINDOW_S:
            self._note_level(zone, sig, result.level, result.source, result.reason)
        return result

    def _known(self, zone: str, sig: str, start: datetime, end: datetime, as_of: datetime) -> _Known:
        """Read what the store knew at `as_of`: the actuals the own forecast may use (and
        where the record ends), those in the window, and the newest live run."""
        params = {"zone": zone, "signal": sig, "as_of": as_of, "end": end,
                  "since": min(start, as_of) - timedelta(hours=OWN_LOOKBACK_H)}
        live_params = {"zone": zone, "signal": sig, "as_of": as_of, "end": end,
                       "oldest": as_of - timedelta(seconds=self.config.forecast_max_age_s),
                       "since": start - timedelta(seconds=MAX_PERIOD_S)}
        with self.store.read() as conn:
            rows = conn.execute(self._q.history, params).all()
            live_rows = conn.execute(self._q.live, live_params).all()
            latest = carbon_table.newest_by_period_s(rows)
            record_end_s = max((at_s + d for at_s, d, _ in rows), default=None)
            in_window = record_end_s is not None and record_end_s > carbon_table.epoch_s(start)
            actual_rows = (conn.execute(self._q.actuals, {**params, "since": start - timedelta(
                seconds=MAX_PERIOD_S)}).all() if in_window else [])
        return _Known(latest, from_epoch(record_end_s) if record_end_s is not None else None, actual_rows, live_rows)

    def _live(self, zone: str, rows: list[Row], uncovered: list[tuple[datetime, datetime]], as_of: datetime,
              notes: list[str]) -> tuple[list[ForecastPoint], list[tuple[datetime, datetime]]]:
        """Step 2: cover what is left with the newest live forecast run; say why not."""
        items = [_Item(r.at, r.at + timedelta(seconds=r.duration_s), r.gco2_per_kwh, KIND_FORECAST,
                       r.source, r.issued_at) for r in rows]
        got, uncovered = _cover(uncovered, items)
        if not items:
            zc = self.config.zones.get(zone)
            if zc is not None and zc.provider:
                notes.append(f"no {zc.provider} forecast issued in the "
                             f"{_hours(self.config.forecast_max_age_s)} before {_iso(as_of)}")
            else:
                notes.append(f"no live forecast provider for {zone}")
        elif uncovered:
            notes.append(f"live forecast issued {_iso(items[0].issued_at)} ends "
                         f"{_iso(max(i.until for i in items))}")
        return got, uncovered

    def _own(self, zone: str, sig: str, latest: dict[float, tuple[int, float]],
             ahead: list[tuple[datetime, datetime]], as_of: datetime, notes: list[str]
             ) -> tuple[_Own, list[tuple[datetime, datetime]]]:
        """Step 3: the own forecast from the known history (the learned model where fitted,
        else the baseline), at the data's own step."""
        own = _Own()
        hourly = hourly_means((at_s, d, v) for at_s, (d, v) in latest.items())
        if not hourly:
            notes.append(f"no {zone} ({sig}) history in the {OWN_LOOKBACK_H // 24} d before {_iso(as_of)} "
                         "for an own forecast")
            return own, ahead
        last_known = max(hourly)
        targets = sorted({h for a, b in ahead
                          for h in range(epoch_hour(a), epoch_hour(b - timedelta(microseconds=1)) + 1)})
        values = baseline_forecast(hourly, last_known, targets)
        learned = self._models.get(zone, sig, last_known, as_of) if self._models is not None else None
        if learned is not None:
            model_values = learned.predict(hourly, last_known, targets)
            own.used_model = any(v is not None for v in model_values)
            values = [m if m is not None else b for m, b in zip(model_values, values)]
        # at the data's own step: sub-hourly data gets each hour split by the zone's
        # recent intra-hour shape (telemetry.grid.forecast.intra_hour_shape)
        history = [(at_s, d, v) for at_s, (d, v) in latest.items()]
        step_s = native_step_s(history)
        shape = intra_hour_shape(history, step_s, last_known) if step_s < 3600 else {}
        parts = 3600 // step_s if shape else 1
        part = timedelta(seconds=3600 // parts)
        if shape:
            own.shaped = (f"; hours split into {step_s // 60}-min steps by the last "
                          f"{SHAPE_DAYS} days' intra-hour shape")
        items = []
        for h, v in zip(targets, values):
            if v is not None:
                at = hour_start(h)
                ratios = shape.get(h % 24, (1.0,) * parts)
                for k in range(parts):
                    a = at + k * part
                    items.append(_Item(a, a + part, v * ratios[k], KIND_FORECAST, SOURCE_OWN, as_of))
        own.points, ahead = _cover(ahead, items)
        if ahead:
            notes.append(f"own forecast needs history within {MAX_HORIZON_H // 24} d: newest known "
                         f"hour starts {_iso(hour_start(last_known))}")
        own.hours_ahead = [(epoch_hour(p.at) - last_known) for p in own.points]
        return own, ahead

    def _static(self, zone: str, sig: str, ahead: list[tuple[datetime, datetime]], notes: list[str]
                ) -> tuple[list[ForecastPoint], list[tuple[datetime, datetime]]]:
        """Step 4: the static yearly average (average signal only)."""
        static = static_intensity(zone, self.config.static) if sig == SIGNAL_AVERAGE else None
        if static is None:
            notes.append(f"no static value for {zone} ({sig})")
            return [], ahead
        return [ForecastPoint(a, b, static.gco2_per_kwh, KIND_STATIC, SOURCE_STATIC, None) for a, b in ahead], []

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
            carbon_table.note_zone_status(conn, zone, level, source, reason, now)

        self.store.transact(write)

    def zone_status(self, zone: str) -> dict | None:
        """The recorded fallback level of a zone ({level, source, reason, since}) or None."""
        row = carbon_table.zone_status(self.store, zone)
        return None if row is None else {"level": row.level, "source": row.source, "reason": row.reason,
                                         "since": row.since}

    def data_versions(self, zones: Iterable[str]) -> dict[str, int]:
        """How often each zone's carbon data has changed (0: never written), one small query.

        Anything that caches what it read of a zone (the planner's curves) compares these
        between uses: an import or a provider refresh in any process changes them. A zone
        whose version moved since the last call also drops its cached signal here.
        """
        wanted = sorted(set(zones))
        if not wanted:
            return {}
        got = carbon_table.read_versions(self.store, wanted)
        out = {z: int(got.get(z, 0)) for z in wanted}
        for z, v in out.items():
            if self._seen_versions.get(z, v) != v:
                self._signal_cache.pop(z, None)
            self._seen_versions[z] = v
        return out

    # -- overview ---------------------------------------------------------------------------

    def freshness(self, zone: str, signal: str | None = None, now: datetime | None = None) -> dict:
        """How current the zone's data is: newest actual, newest forecast issue, provider calls."""
        now = utc_aware(now, "now") if now is not None else self._clock()
        sig = signal or self.signal_of(zone) or SIGNAL_AVERAGE
        zc = self.config.zones.get(zone)
        with self.store.read() as conn:
            actual = carbon_table.newest_actual(conn, zone, sig, now)
            issued = carbon_table.newest_forecast_issue(conn, zone, sig, now)
            fetches = carbon_table.fetch_records(conn, zone, zc.provider if zc is not None else None,
                                                 PROVIDER_WIDE)
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
        with self.store.read() as conn:
            groups = carbon_table.series_summary(conn)
            statuses = carbon_table.zone_statuses(conn)
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


def _actual_items(rows: list[Row], start: datetime) -> list[_Item]:
    """The newest version of each actual period reaching past `start`, as items."""
    newest = carbon_table.newest_by_period(rows)
    items = [_Item(at, at + timedelta(seconds=r.duration_s), r.gco2_per_kwh, KIND_ACTUAL, r.source, r.issued_at)
             for at, r in newest.items()]
    return [i for i in items if i.until > start]


def _judged(zone: str, sig: str, start: datetime, end: datetime, as_of: datetime, points: list[ForecastPoint],
            gaps: list[tuple[datetime, datetime]], own: _Own, notes: list[str]) -> CarbonForecast:
    """The forecast with its level, source and quality, judged on the part of the window at
    or after as_of: the worst level of a point there."""
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
            mape = (expected_model_mape_pct if own.used_model else expected_mape_pct)(
                max(own.hours_ahead) if own.hours_ahead else 1)
        elif level == "static":
            mape = STATIC_EXPECTED_MAPE_PCT
    reason = "; ".join(notes) if notes and level in ("own", "static", "none") else None
    return CarbonForecast(zone=zone, signal=sig, start=start, end=end, as_of=as_of,
                          points=tuple(points), gaps=tuple(gaps), level=level, source=source,
                          expected_mape_pct=mape, reason=reason,
                          method=(MODEL_METHOD if own.used_model else METHOD) + own.shaped if level == "own" else None)


def _iso(t: datetime | None) -> str:
    if t is None:
        return "never"
    return t.astimezone(timezone.utc).isoformat(timespec="minutes").replace("+00:00", "Z")


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g} h"
