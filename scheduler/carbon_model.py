"""Fitted learned carbon forecasters per zone for the signal store, refitted as history grows.

`CarbonSignals.forecast` asks `ForecastModels.get(zone, signal, last_known_hour, as_of)` for
a model it may use for an own forecast issued with `last_known_hour` as the newest known
hour. The answer is always as-of safe: only a model fitted on history up to an hour at or
before `last_known_hour`, from rows recorded by `as_of`, is returned, so a replay of the
past (`carbon show --at`, the planner's `as_of`) never sees a value from after its issue.

A model is refitted once it is `refit_h` hours behind (default daily). A fit of a year of
hourly history takes a few seconds, so by default it runs in a background thread (the
history is read first, in the caller's thread) and the query that asked gets the previous
model, or None (the caller then uses the profile +
anomaly baseline and says so in `method`). `inline=True` fits in the caller's thread (the
tests, and one-off CLI queries that want the model's answer).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime

from telemetry.grid.forecast_model import MIN_HISTORY_DAYS, LearnedForecaster, NotEnoughHistory

log = logging.getLogger(__name__)

#: Hours after which a fitted model is refitted, and after which it is not used at all.
REFIT_H = 24
MAX_MODEL_AGE_H = 7 * 24
#: Hours between fit attempts of a zone whose history is too short.
RETRY_SHORT_H = 6

History = Callable[[str, str, int, datetime], dict[int, float]]


class ForecastModels:
    """Per (zone, signal): the fitted models, newest first, and at most one fit at a time."""

    def __init__(self, history: History, *, inline: bool = False, refit_h: int = REFIT_H) -> None:
        self._history = history
        self._inline = inline
        self._refit_h = refit_h
        self._lock = threading.Lock()
        self._models: dict[tuple[str, str], list[LearnedForecaster]] = {}
        self._short: dict[tuple[str, str], int] = {}  # last_known hour of a too-short history
        self._fitting: set[tuple[str, str]] = set()

    def get(self, zone: str, signal: str, last_known_hour: int, as_of: datetime) -> LearnedForecaster | None:
        """The newest usable model for an issue with `last_known_hour` (see the module doc)."""
        key = (zone, signal)
        with self._lock:
            usable = [m for m in self._models.get(key, ())
                      if m.last_known_hour <= last_known_hour
                      and last_known_hour - m.last_known_hour <= MAX_MODEL_AGE_H]
            best = max(usable, key=lambda m: m.last_known_hour, default=None)
            short = self._short.get(key)
            stale = best is None or last_known_hour - best.last_known_hour >= self._refit_h
            if short is not None and 0 <= last_known_hour - short < RETRY_SHORT_H:
                stale = False
            start = stale and key not in self._fitting
            if start:
                self._fitting.add(key)
        if start:
            # the history is read here, in the caller's thread (one query, a day apart): the
            # fit thread never touches the database, so closing the store never races it
            try:
                values = self._history(zone, signal, last_known_hour, as_of)
            except Exception:
                with self._lock:
                    self._fitting.discard(key)
                raise
            if sum(1 for h in values if h <= last_known_hour) < 24 * MIN_HISTORY_DAYS:
                with self._lock:
                    self._fitting.discard(key)
                    self._short[key] = last_known_hour
                return best
            if self._inline:
                self._fit(key, last_known_hour, values)
                return self.get(zone, signal, last_known_hour, as_of) if self._has(key, last_known_hour) else best
            threading.Thread(target=self._fit, args=(key, last_known_hour, values), daemon=True,
                             name=f"carbon-fit-{zone}").start()
        return best

    def _has(self, key: tuple[str, str], last_known_hour: int) -> bool:
        with self._lock:
            return any(m.last_known_hour == last_known_hour for m in self._models.get(key, ()))

    def _fit(self, key: tuple[str, str], last_known_hour: int, values: dict[int, float]) -> None:
        zone, _ = key
        model = None
        try:
            model = LearnedForecaster.fit(values, last_known_hour)
        except NotEnoughHistory as e:
            log.info("carbon %s: forecast model not fitted yet: %s", zone, e)
        except Exception:  # a failed fit must not stop forecasts: the baseline serves meanwhile
            log.exception("carbon %s: fitting the forecast model failed; using the baseline", zone)
        with self._lock:
            self._fitting.discard(key)
            if model is None:
                self._short[key] = last_known_hour
                return
            models = self._models.setdefault(key, [])
            models.append(model)
            models.sort(key=lambda m: m.last_known_hour)
            del models[:-3]  # a replay at an older as_of may need an older one; three are plenty
            self._short.pop(key, None)
        log.info("carbon %s: forecast model fitted on %d rows up to hour %d", zone, model.trained_rows,
                 last_known_hour)
