"""The savings mode of bench/forecast_eval.py: the share of the perfect-forecast saving a
forecast keeps when an hourly greedy planner in GAIA's setting plans on it, and the forecast
methods it compares, each issued only from what is known before its tick."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.forecast_methods import (  # noqa: E402
    AsOf, climatology_matrix, own_matrix, persistence_matrix, run_method, sarimax_forecast_rows, sarimax_matrix)
from bench.forecast_savings import (  # noqa: E402
    Jobs, evaluate_zone, kept_pct, next_day_scores, place_arrivals, planning_hours, replay_greedy, saving_pct)

H = 3600.0


def one_job(arrival_h: float, length_h: float, gpus: int = 1) -> Jobs:
    return Jobs(np.array([arrival_h * H]), np.array([length_h * H]), np.array([float(gpus)]))


def static_rows(curve: list[float], n_ticks: int, horizon_h: int) -> np.ndarray:
    """An issue matrix whose every tick believes `curve` (curve[k]: hour k)."""
    padded = np.array(curve + [curve[-1]] * (n_ticks + horizon_h), float)
    return np.stack([padded[i:i + horizon_h] for i in range(n_ticks)])


def synthetic(days: int, seed: int = 1) -> np.ndarray:
    """A daily-shaped intensity with a slowly wandering level and noise, hourly."""
    rng = np.random.default_rng(seed)
    hours = np.arange(24 * days)
    level = 300 + 60 * np.sin(2 * np.pi * hours / (24 * 9.3))
    return level + 80 * np.sin(2 * np.pi * (hours % 24) / 24) + rng.normal(0, 15, len(hours))


# -- the decision rule and the kept share on a hand-made curve --------------------------------

TRUE = [400.0, 400.0, 400.0, 300.0, 400.0, 100.0] + [400.0] * 40


def test_a_perfect_forecast_moves_a_job_to_the_cheapest_hour_of_its_window():
    job = one_job(0, 1)
    starts = replay_greedy(static_rows(TRUE, 30, 30), np.arange(30), job)
    assert starts[0] == 5 * H
    assert saving_pct(np.array(TRUE), 0, job, starts) == pytest.approx(75.0)  # 400 -> 100


def test_a_forecast_that_misplaces_the_cheap_hour_keeps_part_of_the_saving():
    job = one_job(0, 1)
    believed = TRUE.copy()
    believed[3], believed[5] = 50.0, 400.0  # it thinks hour 3 is the cheapest, and hour 5 dear
    starts = replay_greedy(static_rows(believed, 30, 30), np.arange(30), job)
    assert starts[0] == 3 * H
    saving = saving_pct(np.array(TRUE), 0, job, starts)
    assert saving == pytest.approx(25.0)  # 400 -> 300 on the true curve
    assert kept_pct(saving, 75.0) == pytest.approx(100 / 3)


def test_a_job_waiting_for_a_later_hour_is_planned_again_with_the_newer_forecast():
    job = one_job(0.5, 1)
    rows = static_rows(TRUE, 30, 30)
    rows[1] = np.array(TRUE[1:31])
    rows[1][0] = 10.0  # the forecast issued at hour 1 finds hour 1 the cheapest
    starts = replay_greedy(rows, np.arange(30), job)
    assert starts[0] == 1 * H


def test_a_job_never_starts_later_than_its_slack_allows():
    job = one_job(0, 2)
    curve = [400.0] * 30 + [1.0] * 30  # the cheap hours lie past the 24 h of slack
    starts = replay_greedy(static_rows(curve, 40, 40), np.arange(40), job)
    assert starts[0] <= 24 * H


def test_a_job_costs_its_gpus_times_the_intensity_over_its_run():
    two = one_job(0, 1.5, gpus=2)
    grams = saving_pct(np.array(TRUE), 0, two, np.array([4.5 * H]))  # half of hour 4, all of hour 5
    assert grams == pytest.approx(100 * (1.5 * 400 - (0.5 * 400 + 100)) / (1.5 * 400))


def test_nothing_to_keep_when_the_perfect_forecast_saves_nothing():
    assert kept_pct(3.0, 0.0) is None


# -- whole zones: perfect keeps everything, nothing keeps more --------------------------------

def test_the_perfect_forecast_keeps_all_of_its_saving_and_no_method_keeps_more():
    arr = synthetic(60)
    base = 24 * 20000
    trace = Jobs(np.array([0.0, 1800.0, 7 * H, 13.2 * H, 30 * H]), np.array([900.0, 3 * H, 0.5 * H, 10 * H, 2 * H]),
                 np.array([1.0, 2.0, 1.0, 4.0, 1.0]))
    jobs = Jobs(trace.arrival_s + (base + 24 * 40) * H, trace.length_s, trace.gpus)
    r = evaluate_zone("Z", arr, base, jobs, ("perfect", "persistence", "climatology"))
    assert r.methods["perfect"]["kept_pct"] == pytest.approx(100.0)
    assert r.methods["perfect"]["saving_pct"] > 0
    for name in ("persistence", "climatology"):
        assert r.methods[name]["kept_pct"] <= 100.0 + 1e-9
    assert r.methods["perfect"]["mape_24h_pct"] == 0.0
    assert r.methods["perfect"]["rank_corr_24h"] == pytest.approx(1.0)


def test_scores_of_the_next_day_rank_a_reversed_forecast_at_minus_one():
    actual = np.tile(np.arange(1.0, 25.0), (3, 1))
    mape, rank = next_day_scores(actual[:, ::-1].copy(), actual)
    assert rank == pytest.approx(-1.0)
    assert mape > 0


def test_jobs_are_planned_in_every_hour_from_their_arrival_to_their_latest_start_and_no_other():
    jobs = Jobs(np.array([0.5 * H, 100.2 * H]), np.array([60.0, 60.0]), np.array([1.0, 1.0]))
    assert planning_hours(jobs).tolist() == list(range(0, 25)) + list(range(100, 125))


def test_the_year_arrivals_every_four_weeks_are_one_week_in_every_four():
    trace = Jobs(np.array([0.0]), np.array([60.0]), np.array([1.0]))
    jobs = place_arrivals(trace, "year", 2022, every_weeks=4)
    assert len(jobs) == 14 and np.all(np.diff(jobs.arrival_s) == 28 * 86400)


def test_the_year_arrivals_repeat_the_trace_every_week_inside_the_year():
    trace = Jobs(np.array([0.0, 3600.0 * 100]), np.array([60.0, 60.0]), np.array([1.0, 1.0]))
    jobs = place_arrivals(trace, "year", 2022)
    first = 1640995200.0  # 2022-01-01 00:00 UTC
    assert jobs.arrival_s.min() == first
    assert jobs.arrival_s.max() < first + 365 * 86400
    assert len(jobs) == 2 * 52 + 1  # 53 copies of the first job, 52 of the one 100 h in


# -- as-of: a forecast issued at tick t reads nothing from t on --------------------------------

def later_changed(arr: np.ndarray, from_index: int, seed: int = 9) -> np.ndarray:
    out = arr.copy()
    out[from_index:] = np.random.default_rng(seed).uniform(0, 1000, len(arr) - from_index)
    return out


@pytest.mark.parametrize("method", ["persistence", "climatology"])
def test_simple_methods_forecast_the_same_whatever_comes_after_the_tick(method):
    arr = synthetic(40)
    tick = 24 * 35 + 7
    fn = persistence_matrix if method == "persistence" else climatology_matrix
    before, _ = fn(arr, 0, np.array([tick]), 48)
    after, _ = fn(later_changed(arr, tick), 0, np.array([tick]), 48)
    assert np.array_equal(before, after)
    changed_before, _ = fn(later_changed(arr, tick - 1), 0, np.array([tick]), 48)
    assert not np.array_equal(before, changed_before)  # it does read the newest known hour


def test_the_sarimax_baseline_forecasts_the_same_whatever_comes_after_the_tick():
    arr = synthetic(12)
    ticks = np.array([24 * 10 + 5])
    before, _ = sarimax_matrix(arr, 0, ticks, 30)
    after, _ = sarimax_matrix(later_changed(arr, int(ticks[0])), 0, ticks, 30)
    assert np.allclose(before, after)


def test_the_own_forecaster_forecasts_the_same_whatever_comes_after_the_tick():
    arr = synthetic(30)
    base = 24 * 19000
    ticks = np.array([base + 24 * 28 + 3])
    before, _ = own_matrix(arr, base, ticks, 80, refit_h=24)
    after, _ = own_matrix(later_changed(arr, int(ticks[0] - base)), base, ticks, 80, refit_h=24)
    assert np.array_equal(before, after)


def test_the_as_of_view_hides_every_later_hour():
    view = AsOf(np.array([1.0, np.nan, 3.0, 4.0]), 100, 102)
    assert view.get(102) == 3.0 and view.get(103) is None and view.get(101) is None
    assert sorted(view) == [100, 102] and len(view) == 2


# -- the bench forecasts what the forecasters themselves forecast -----------------------------

def test_the_own_matrix_is_the_learned_forecasters_prediction_then_the_baseline():
    from telemetry.grid.forecast import baseline_forecast
    from telemetry.grid.forecast_model import MAX_MODEL_HORIZON_H, LearnedForecaster

    arr = synthetic(30, seed=3)
    base = 24 * 19000
    tick = base + 24 * 27 + 11
    refit_h = 48
    got, _ = own_matrix(arr, base, np.array([tick]), MAX_MODEL_HORIZON_H + 5, refit_h=refit_h)
    values = {base + i: float(v) for i, v in enumerate(arr)}
    fit_hour = (tick - 1) - (tick - 1) % refit_h
    model = LearnedForecaster.fit(values, fit_hour)
    targets = list(range(tick, tick + MAX_MODEL_HORIZON_H))
    assert np.allclose(got[0, :MAX_MODEL_HORIZON_H], model.predict(values, tick - 1, targets))
    beyond = baseline_forecast(values, tick - 1, range(tick + MAX_MODEL_HORIZON_H, tick + MAX_MODEL_HORIZON_H + 5))
    assert np.allclose(got[0, MAX_MODEL_HORIZON_H:], beyond)


def test_the_sarimax_steps_match_statsmodels_own_forecast():
    from bench.forecast_methods import _sarimax_fit

    arr = synthetic(9)
    y = arr[:168] - arr[:168].mean()
    res = _sarimax_fit(y, None)
    assert np.allclose(sarimax_forecast_rows(res, np.empty(0), np.array([0]), 30)[0], res.forecast(30))
    extra = arr[168:173] - arr[:168].mean()
    assert np.allclose(sarimax_forecast_rows(res, extra, np.array([5]), 30)[0], res.extend(extra).forecast(30))


def test_an_unknown_method_is_refused_with_the_list():
    with pytest.raises(ValueError, match="persistence"):
        run_method("oracle", np.ones(10), 0, np.array([5]), 3, refit_h=168)
