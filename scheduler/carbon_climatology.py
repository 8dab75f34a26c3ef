"""A zone's typical carbon intensity by month and hour of the day, as of a time.

A forecast covers two or three days; a job that runs for ten must be priced over ten. Past
the forecast's end the planner prices a zone at its **climatology** (`policies.types.
Climatology`, the curve's `tail`): 12 x 24 values, the typical intensity at each UTC hour of
a day in each month. It is a plain, documented average, not a forecaster
(`telemetry.grid.forecast` is the forecaster); this module computes it:

- from the zone's hourly actuals of the `LOOKBACK_DAYS` before the as-of time (never a
  value from after it: in the store, only rows issued by then; in the simulator, only the
  trace's hours that ended by then);
- cell (month, hour): the mean of that month's values at that hour, where the lookback
  holds at least `MIN_CELL_DAYS` of them; else the mean at that hour over the whole
  lookback (at least `MIN_HOUR_DAYS` values), i.e. the daily shape of what is known; else
  the zone's static yearly mean (`telemetry.grid.static`, average signal only); else the
  mean of whatever the lookback holds;
- no history and no static value: no climatology (the curve's last value holds, as before).

Both the daemon and the simulator ask one `Climatologies` (cached per zone, signal and UTC
day: it is computed as of the start of the day, so it changes once a day however often the
planner ticks), over the store's history (`store_history`) or the trace's past hours.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone

import numpy as np

from policies.types import CLIMATOLOGY_CELLS, Climatology
from scheduler import carbon_table
from scheduler.store import Store
from telemetry.grid.readings import SIGNAL_AVERAGE
from telemetry.grid.static import static_intensity

log = logging.getLogger(__name__)

LOOKBACK_DAYS = 365
MIN_CELL_DAYS = 7   # values a (month, hour) cell needs to stand on its own
MIN_HOUR_DAYS = 3   # values an hour of the day needs for the fallback over the whole lookback
_HOUR_S = 3600
_DAY_S = 86400


def climatology_from_hourly(hours: np.ndarray, values: np.ndarray, *, static_g_per_kwh: float | None = None,
                            label: str = "") -> Climatology | None:
    """The climatology of hourly values at epoch hours `hours` (see the module docstring for
    the rule); `label` names the data in the result's source (e.g. "DE actuals")."""
    hours = np.asarray(hours, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(values)
    hours, values = hours[ok], values[ok]
    if hours.size == 0:
        if static_g_per_kwh is None:
            return None
        return Climatology((float(static_g_per_kwh),) * CLIMATOLOGY_CELLS,
                           source=f"static yearly mean {static_g_per_kwh:.0f} g/kWh (no history{_of(label)})")
    hour_of_day = hours % 24
    month0 = (hours * _HOUR_S).astype("datetime64[s]").astype("datetime64[M]").astype(np.int64) % 12
    cell = month0 * 24 + hour_of_day
    cell_n = np.bincount(cell, minlength=CLIMATOLOGY_CELLS)
    cell_sum = np.bincount(cell, weights=values, minlength=CLIMATOLOGY_CELLS)
    hour_n = np.bincount(hour_of_day, minlength=24)
    hour_sum = np.bincount(hour_of_day, weights=values, minlength=24)
    by_hour = np.where(hour_n >= MIN_HOUR_DAYS, hour_sum / np.maximum(hour_n, 1), np.nan)
    fallback = float(static_g_per_kwh) if static_g_per_kwh is not None else float(values.mean())
    by_hour = np.where(np.isnan(by_hour), fallback, by_hour)
    out = np.where(cell_n >= MIN_CELL_DAYS, cell_sum / np.maximum(cell_n, 1), np.tile(by_hour, 12))
    months = int(((cell_n >= MIN_CELL_DAYS).reshape(12, 24).all(axis=1)).sum())
    first = datetime.fromtimestamp(int(hours.min()) * _HOUR_S, timezone.utc)
    last = datetime.fromtimestamp((int(hours.max()) + 1) * _HOUR_S, timezone.utc)
    source = (f"typical by month and UTC hour from {hours.size} h{_of(label)} {first:%Y-%m-%d}..{last:%Y-%m-%d} "
              f"({months} of 12 months on their own")
    if months < 12:
        source += (", the rest by hour of day" if (hour_n >= MIN_HOUR_DAYS).all() else
                   f", the rest at {'the static yearly mean' if static_g_per_kwh is not None else 'the mean'}"
                   f" {fallback:.0f} g/kWh where thin")
    return Climatology(tuple(float(v) for v in out), source=source + ")")


def _of(label: str) -> str:
    return f" of {label}" if label else ""


#: (zone, signal, as_of) -> the epoch hours and values of the zone's hourly actuals of the
#: `LOOKBACK_DAYS` before `as_of` that ended by then
History = Callable[[str, str, datetime], tuple[np.ndarray, np.ndarray]]


class Climatologies:
    """Climatologies of zones as of a day's start, from a history of hourly actuals.

    `for_zone(zone, signal, now)` computes from the hours the history knew at the start of
    the UTC day holding `now` (so never a value from after `now`) and caches the answer per
    (zone, signal, day). The daemon's history is the store's (`store_history`), the
    simulator's its traces'; `static` overrides the built-in static table (the carbon
    config's `static`), `label(zone, signal)` names the data in the result's source.
    """

    def __init__(self, history: History, *, static: Mapping[str, float] | None = None,
                 label: Callable[[str, str], str]) -> None:
        self._history = history
        self.static = dict(static) if static is not None else None
        self._label = label
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str, int], Climatology | None] = {}

    def for_zone(self, zone: str, signal: str, now: datetime) -> Climatology | None:
        day = int(now.timestamp() // _DAY_S)
        key = (zone, signal, day)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        as_of = datetime.fromtimestamp(day * _DAY_S, timezone.utc)
        hours, values = self._history(zone, signal, as_of)
        static = static_intensity(zone, self.static) if signal == SIGNAL_AVERAGE else None
        result = climatology_from_hourly(hours, values, static_g_per_kwh=None if static is None else static.gco2_per_kwh,
                                         label=self._label(zone, signal))
        with self._lock:
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = result
        log.debug("climatology of %s (%s) as of %s: %s", zone, signal, as_of, result.source if result else None)
        return result


def store_history(store: Store) -> History:
    """The history of a carbon-signal store: hourly actuals of the lookback known at `as_of`
    (the newest version of each period), from `scheduler.carbon_table`."""
    def hourly(zone: str, signal: str, as_of: datetime) -> tuple[np.ndarray, np.ndarray]:
        since = as_of - timedelta(days=LOOKBACK_DAYS)
        known = carbon_table.hourly_history(store, zone, signal, since, as_of, as_of)
        end_s = as_of.timestamp()
        kept = {h: v for h, v in known.items() if (h + 1) * _HOUR_S <= end_s}
        return (np.fromiter(kept.keys(), dtype=np.int64, count=len(kept)),
                np.fromiter(kept.values(), dtype=np.float64, count=len(kept)))

    return hourly
