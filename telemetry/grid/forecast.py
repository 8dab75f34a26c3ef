"""The own-forecast baseline: carbon intensity ahead when no provider gives a forecast.

Method ("7-day same-hour profile plus a decaying anomaly"), on hourly values:

- Issue time: the forecast is made knowing only hours up to L, the newest complete hour
  known at that moment (its start, in whole hours). The horizon of a target hour T is
  h = T - L hours (h >= 1).
- Profile: P(T) = mean of the values at T - 24k h for the first `PROFILE_DAYS` (7) whole
  days k >= ceil(h / 24) that have a value, so only hours known at issue time are used
  (a missing day is skipped; at most 3 extra days are searched). This carries the daily
  shape: solar dips, evening peaks.
- Anomaly: A = v(L) - mean of v(L - 24j), j = 1..7: how far today runs above or below its
  usual level for this hour.
- Forecast: F(T) = max(0, P(T) + A * 0.97^h). The anomaly (weather, outages) persists
  near term and fades over about a day (0.97^24 = 0.48, 0.97^72 = 0.11), leaving the profile.
- No profile day available (less than a day of history), or h beyond `MAX_HORIZON_H`
  (7 days): no value. The caller falls back to the static table and reports why.

The parameters were chosen on 2021 and 2022 Electricity Maps data of 16 zones by comparing
plain profiles, profile/persistence blends and this anomaly form for horizons of 1-72 h;
this one was best or near best at every horizon. `bench/forecast_eval.py` measures it
against persistence (the newest known value carried forward, which at 24 h ahead is the
value 24 h before the target) on all hours of 2022: at 24 h ahead the median MAPE over the
16 zones is 7.3% against 7.85% for persistence, better in 15 of 16 zones (CA-ON, with
near-zero hours, is the exception); at 6 h ahead 6.4% against 14.6%. The medians by
horizon are `EXPECTED_MAPE_PCT`, the quality figure reported with every own forecast.
It is a baseline: a provider's forecast (weather-aware) should beat it and is preferred.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone

PROFILE_DAYS = 7
EXTRA_SEARCH_DAYS = 3
ANOMALY_DECAY_PER_HOUR = 0.97
MAX_HORIZON_H = 7 * 24
METHOD = "7-day same-hour profile + anomaly decaying 0.97/h"

#: Median over 16 zones of the 2022 MAPE (%) by horizon (hours), from bench/forecast_eval.py.
EXPECTED_MAPE_PCT: dict[int, float] = {1: 2.2, 6: 6.4, 24: 7.3, 48: 8.6, 72: 9.2, 168: 10.2}

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def epoch_hour(t: datetime) -> int:
    """Whole hours since 1970-01-01 UTC of the hour containing `t` (aware)."""
    return int((t - _EPOCH).total_seconds() // 3600)


def hour_start(hour: int) -> datetime:
    """The aware UTC start of epoch hour `hour`."""
    return _EPOCH + timedelta(hours=hour)


def expected_mape_pct(horizon_h: float) -> float:
    """The measured typical MAPE (%) of this baseline `horizon_h` hours ahead (interpolated)."""
    keys = sorted(EXPECTED_MAPE_PCT)
    if horizon_h <= keys[0]:
        return EXPECTED_MAPE_PCT[keys[0]]
    if horizon_h >= keys[-1]:
        return EXPECTED_MAPE_PCT[keys[-1]]
    i = bisect.bisect_left(keys, horizon_h)
    lo, hi = keys[i - 1], keys[i]
    frac = (horizon_h - lo) / (hi - lo)
    return round(EXPECTED_MAPE_PCT[lo] + frac * (EXPECTED_MAPE_PCT[hi] - EXPECTED_MAPE_PCT[lo]), 1)


def hourly_means(points: Iterable[tuple[float, int, float]]) -> dict[int, float]:
    """Hourly values (by epoch hour) from (start as epoch seconds, duration_s, value) periods.

    Sub-hourly periods (5-min MOER, half-hour UK values) are averaged into the hour they start
    in; periods of an hour or more give their value to every hour they cover.
    """
    out: dict[int, float] = {}
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for at_s, duration_s, value in points:
        if duration_s == 3600 and at_s % 3600 == 0:
            out[int(at_s) // 3600] = value  # the common case: one hourly value per hour
            continue
        first = int(at_s // 3600)
        span = int(duration_s) // 3600 or 1
        for hour in range(first, first + span):
            sums[hour] = sums.get(hour, 0.0) + value
            counts[hour] = counts.get(hour, 0) + 1
    for hour, total in sums.items():
        if hour not in out:
            out[hour] = total / counts[hour]
    return out


def baseline_forecast(
    values: Mapping[int, float],
    last_known_hour: int,
    target_hours: Iterable[int],
    *,
    profile_days: int = PROFILE_DAYS,
    decay_per_hour: float = ANOMALY_DECAY_PER_HOUR,
    max_horizon_h: int = MAX_HORIZON_H,
) -> list[float | None]:
    """Forecast gCO2/kWh for each of `target_hours` (epoch hours) from hourly `values`.

    Only `values` at or before `last_known_hour` are used, whatever else the mapping holds,
    so a replay cannot peek at the future. None where the method has no value (see the
    module docstring); never a made-up zero.
    """
    get = values.get
    last = get(last_known_hour)
    ref = [v for v in (get(last_known_hour - 24 * j) for j in range(1, profile_days + 1)) if v is not None]
    anomaly = last - sum(ref) / len(ref) if last is not None and ref else 0.0
    out: list[float | None] = []
    for target in target_hours:
        h = target - last_known_hour
        if h < 1 or h > max_horizon_h:
            out.append(None)
            continue
        k_min = -(-h // 24)
        total = 0.0
        n = 0
        for k in range(k_min, k_min + profile_days + EXTRA_SEARCH_DAYS):
            v = get(target - 24 * k)
            if v is not None:
                total += v
                n += 1
                if n == profile_days:
                    break
        if not n:
            out.append(None)
            continue
        out.append(max(0.0, total / n + anomaly * decay_per_hour ** h))
    return out


def persistence_forecast(values: Mapping[int, float], last_known_hour: int,
                         target_hours: Iterable[int]) -> list[float | None]:
    """Plain persistence: the newest known hourly value, carried forward to every target."""
    last = values.get(last_known_hour)
    return [last if target > last_known_hour else None for target in target_hours]


#: Days of sub-hourly history the intra-hour shape is learned from (within the history the
#: signal store reads for an own forecast: PROFILE_DAYS + EXTRA_SEARCH_DAYS).
SHAPE_DAYS = 7


def native_step_s(points: Iterable[tuple[float, int, float]]) -> int:
    """The step of a zone's newest rows: the period of its latest (at_s, duration_s, value)."""
    newest = max(points, key=lambda p: p[0], default=None)
    return int(newest[1]) if newest is not None else 3600


def intra_hour_shape(points: Iterable[tuple[float, int, float]], step_s: int, last_known_hour: int,
                     days: int = SHAPE_DAYS) -> dict[int, tuple[float, ...]]:
    """How a zone's value typically moves inside an hour, by UTC hour of day.

    From the sub-hourly rows (at_s, duration_s, value) of period `step_s` (dividing an hour)
    in the `days` days up to and including epoch hour `last_known_hour` (so only what is
    known at the issue): for each complete hour, each part's value over the hour's mean;
    per hour of day, the mean of those ratios, scaled so that they average 1. An hourly
    forecast times its hour's shape keeps its hourly mean and gains the sub-hourly pattern
    the zone has shown lately (GB's half-hour settlement periods). Hours of day without a
    complete hour of data are left out (flat).
    """
    parts = 3600 // step_s
    if parts <= 1 or 3600 % step_s:
        return {}
    lo = (last_known_hour + 1 - 24 * days) * 3600
    hi = (last_known_hour + 1) * 3600
    by_hour: dict[int, dict[int, float]] = {}
    for at_s, duration_s, value in points:
        if int(duration_s) != step_s or not lo <= at_s < hi or at_s % step_s:
            continue
        h = int(at_s // 3600)
        by_hour.setdefault(h, {})[int((at_s - h * 3600) // step_s)] = value
    sums: dict[int, list[float]] = {}
    counts: dict[int, int] = {}
    for h, vals in by_hour.items():
        if len(vals) != parts:
            continue
        mean = sum(vals.values()) / parts
        if mean <= 0:
            continue
        acc = sums.setdefault(h % 24, [0.0] * parts)
        for k in range(parts):
            acc[k] += vals[k] / mean
        counts[h % 24] = counts.get(h % 24, 0) + 1
    out: dict[int, tuple[float, ...]] = {}
    for hod, acc in sums.items():
        ratios = [a / counts[hod] for a in acc]
        norm = sum(ratios) / parts
        out[hod] = tuple(r / norm for r in ratios)
    return out
