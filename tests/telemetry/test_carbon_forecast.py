"""telemetry.grid.forecast: the own-forecast baseline used when no provider forecast exists.

F(T) = P(T) + A * 0.97^h, with P the mean of the same hour on the 7 most recent days known
at issue time and A the newest hour's deviation from its own profile. It must never read an
hour after the issue time, must say "no value" rather than invent one, and its quality
figures are the ones measured by bench/forecast_eval.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from telemetry.grid.forecast import (
    EXPECTED_MAPE_PCT,
    MAX_HORIZON_H,
    baseline_forecast,
    epoch_hour,
    expected_mape_pct,
    hour_start,
    hourly_means,
    persistence_forecast,
)

L = 500_000  # an epoch hour to issue forecasts at (the newest known hour)


def daily_pattern(days: int, level: float = 100.0, swing: float = 50.0, last: int = L) -> dict[int, float]:
    """`days` of an exact daily cycle ending at hour `last`: value = level + swing at noon."""
    return {h: level + (swing if h % 24 == 12 else 0.0) for h in range(last - 24 * days + 1, last + 1)}


def test_epoch_hours_round_trip():
    t = datetime(2022, 6, 1, 13, 45, tzinfo=timezone.utc)
    assert hour_start(epoch_hour(t)) == datetime(2022, 6, 1, 13, 0, tzinfo=timezone.utc)


def test_a_steady_daily_cycle_is_forecast_exactly():
    values = daily_pattern(days=8)
    targets = list(range(L + 1, L + 73))
    out = baseline_forecast(values, L, targets)
    assert out == pytest.approx([150.0 if t % 24 == 12 else 100.0 for t in targets])


def test_the_newest_hours_deviation_persists_near_term_and_fades():
    values = daily_pattern(days=8)
    values[L] += 40.0                  # today runs 40 above the usual level at this hour
    near, far = baseline_forecast(values, L, [L + 1, L + 71])
    usual_near = 150.0 if (L + 1) % 24 == 12 else 100.0
    usual_far = 150.0 if (L + 71) % 24 == 12 else 100.0
    assert near == pytest.approx(usual_near + 40.0 * 0.97)
    assert far == pytest.approx(usual_far + 40.0 * 0.97 ** 71)


def test_it_never_reads_an_hour_after_the_issue_time():
    values = daily_pattern(days=10)
    clean = baseline_forecast(values, L, range(L + 1, L + 169))
    poisoned = dict(values)
    for h in range(L + 1, L + 24 * 9):
        poisoned[h] = 1e9               # the future, which a forecaster must not see
    assert baseline_forecast(poisoned, L, range(L + 1, L + 169)) == clean
    assert persistence_forecast(poisoned, L, [L + 5]) == [values[L]]


def test_without_history_there_is_no_value_not_a_zero():
    assert baseline_forecast({}, L, [L + 1, L + 30]) == [None, None]
    six_hours = {h: 100.0 for h in range(L - 5, L + 1)}
    out = baseline_forecast(six_hours, L, [L + 10, L + 24, L + 25])
    assert out[0] is None                   # its hour yesterday (L - 14) is not in the history
    assert out[1] == pytest.approx(100.0)   # yesterday's same hour is L itself
    assert out[2] is None


def test_targets_before_the_issue_or_beyond_the_horizon_get_no_value():
    values = daily_pattern(days=14)
    assert baseline_forecast(values, L, [L, L - 5, L + MAX_HORIZON_H + 1]) == [None, None, None]


def test_a_missing_day_is_skipped():
    values = daily_pattern(days=9, level=10.0, swing=0.0)
    values[L + 1 - 24] = 1e6            # yesterday at the target's hour: an outlier ...
    del values[L + 1 - 24]              # ... that then went missing: a hole, skipped
    assert baseline_forecast(values, L, [L + 1]) == [pytest.approx(10.0)]


def test_a_forecast_is_never_negative():
    # the newest hour is usually a 100 g peak but came in at 0: anomaly -100
    values = {h: (100.0 if (h - L) % 24 == 0 else 10.0) for h in range(L - 24 * 8, L)}
    values[L] = 0.0
    (out,) = baseline_forecast(values, L, [L + 1])
    assert out == 0.0                   # 10 - 100 * 0.97 would be negative


def test_hourly_means_average_sub_hourly_periods_and_spread_long_ones():
    base = L * 3600
    five_min = [(base + 300 * i, 300, float(i)) for i in range(12)]          # 0..11 within one hour
    daily = [(base + 24 * 3600, 86400, 7.0)]
    hourly = hourly_means(five_min + daily)
    assert hourly[L] == pytest.approx(5.5)
    assert all(hourly[L + 24 + i] == 7.0 for i in range(24))


def test_expected_error_grows_with_the_horizon_and_is_the_measured_table():
    assert expected_mape_pct(24) == EXPECTED_MAPE_PCT[24]
    assert expected_mape_pct(1) <= expected_mape_pct(24) <= expected_mape_pct(72) <= expected_mape_pct(1000)
    assert EXPECTED_MAPE_PCT[24] < 10.0   # bench/forecast_eval.py: median over 16 zones, 2022


def test_persistence_carries_the_newest_value():
    values = {L - 1: 3.0, L: 4.0}
    assert persistence_forecast(values, L, [L + 1, L + 24]) == [4.0, 4.0]
    t = hour_start(L) + timedelta(hours=24)
    assert epoch_hour(t) == L + 24
