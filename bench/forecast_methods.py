"""Forecast methods compared by `bench/forecast_eval.py --savings`, as issue matrices.

Every method answers the same question for a run of issue ticks: at tick t (an epoch hour;
the newest known hour is L = t - 1, as in the simulator's `scheduler.simulate.forecasts`),
what are the values of hours t, t+1, .., t+H-1 (horizons 1 .. H)? The answer is a matrix
F[i, j] = forecast issued at ticks[i] for hour ticks[i] + j, gCO2/kWh.

Input is one dense array `arr` (arr[k] = value of epoch hour base + k, NaN where missing).
As-of: a method reads only arr[<= ticks[i] - 1] for row i (tests/benchmarks/
test_forecast_savings.py changes every later value and compares). Each method has a
fallback where it has nothing (missing history), counted in `MethodRun.fallbacks`.

- `perfect`: the actual values (the upper bound; not a forecast, reads the future).
- `persistence`: the same hour on the newest known day: value at T - 24 * ceil(h / 24), i.e.
  yesterday's same hour for the next 24 h (the simulator's `persistence`).
- `climatology`: the zone's mean by UTC hour of day over the `CLIMATOLOGY_DAYS` (28) days up
  to L, the same for every day ahead.
- `own`: the project's own forecaster as the simulator's `model` runs it: the learned model
  (`telemetry.grid.forecast_model.LearnedForecaster`, fitted through its public `fit` on the
  hours known at the refit hour L - L % refit_h) for horizons up to its `MAX_MODEL_HORIZON_H`,
  the profile + anomaly baseline (`telemetry.grid.forecast.baseline_forecast`) beyond it or
  without a fit, persistence where neither has a value. The model's predictions are computed
  for all ticks of a refit period at once from its `features` (the same rows its `predict`
  builds one tick at a time; the tests compare the two).
- `sarimax`: a LiteCast-style baseline (Joseph, Savadi, Souza, "LiteCast: A Lightweight
  Forecaster for Carbon Optimizations", arXiv 2511.06187: a SARIMAX on only the last 7 days of
  history). Fitted once per day (at 00 UTC, on the 168 hours known then, minus their mean,
  warm-started from the previous day's parameters, at most `SARIMAX_WARM_MAXITER` L-BFGS
  iterations then; the scale concentrated out), order (1,0,1)(1,0,1,24): a small fixed
  order with a daily season; the paper's exact order and its weather inputs are not used
  here (univariate, past intensity only). Between fits the hours that become known are run
  through the fitted model's Kalman filter (no refit), so each hourly tick forecasts from
  the newest known hour like the other methods.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

CLIMATOLOGY_DAYS = 28
SARIMAX_ORDER = (1, 0, 1)
SARIMAX_SEASONAL_ORDER = (1, 0, 1, 24)
SARIMAX_WINDOW_H = 7 * 24
#: A SARIMAX window with fewer known hours than this is not fitted (climatology instead).
SARIMAX_MIN_KNOWN_H = 48
SARIMAX_WARM_MAXITER = 5
METHODS = ("perfect", "own", "persistence", "climatology", "sarimax")


@dataclass
class MethodRun:
    """One method's issue matrix over the ticks, its wall time and how often it fell back."""

    name: str
    forecast: np.ndarray
    seconds: float
    fallbacks: int = 0


class AsOf(Mapping):
    """Hourly values (epoch hour -> value) of `arr` up to and including `last_known_hour` only:
    what a forecaster issued after that hour may read. Later hours do not exist in it."""

    def __init__(self, arr: np.ndarray, base_hour: int, last_known_hour: int) -> None:
        self.arr, self.base, self.last = arr, base_hour, last_known_hour

    def get(self, hour, default=None):
        i = hour - self.base
        if i < 0 or hour > self.last or i >= len(self.arr):
            return default
        v = self.arr[i]
        return default if v != v else float(v)

    def __getitem__(self, hour: int) -> float:
        v = self.get(hour)
        if v is None:
            raise KeyError(hour)
        return v

    def __iter__(self) -> Iterator[int]:
        stop = min(len(self.arr), self.last - self.base + 1)
        return (self.base + int(i) for i in np.flatnonzero(~np.isnan(self.arr[:max(stop, 0)])))

    def __len__(self) -> int:
        stop = min(len(self.arr), self.last - self.base + 1)
        return int((~np.isnan(self.arr[:max(stop, 0)])).sum())


def forward_filled(arr: np.ndarray) -> np.ndarray:
    """arr with each NaN replaced by the newest earlier value (NaN before the first value)."""
    idx = np.where(np.isnan(arr), 0, np.arange(len(arr)))
    np.maximum.accumulate(idx, out=idx)
    return arr[idx]  # before the first value idx is 0 and arr[0] is NaN: stays NaN


def _clipped(arr: np.ndarray, idx: np.ndarray) -> np.ndarray:
    ok = (idx >= 0) & (idx < len(arr))
    out = np.full(idx.shape, np.nan)
    out[ok] = arr[idx[ok]]
    return out


def perfect_matrix(arr: np.ndarray, base: int, ticks: np.ndarray, horizon_h: int) -> np.ndarray:
    """The actual values of hours ticks[i] + j (NaN past the data)."""
    return _clipped(arr, (ticks - base)[:, None] + np.arange(horizon_h)[None, :])


def persistence_matrix(arr: np.ndarray, base: int, ticks: np.ndarray, horizon_h: int) -> tuple[np.ndarray, int]:
    """Same hour on the newest known day; a missing value: the newest known value before it."""
    j = np.arange(horizon_h)
    back = 24 * (-(-(j + 1) // 24))  # 24 * ceil(h / 24), h = j + 1
    idx = (ticks - base)[:, None] + j[None, :] - back[None, :]  # always <= tick - 1
    raw = _clipped(arr, idx)
    filled = _clipped(forward_filled(arr), idx)
    return filled, int((np.isnan(raw) & ~np.isnan(filled)).sum())


def climatology_matrix(arr: np.ndarray, base: int, ticks: np.ndarray, horizon_h: int,
                       days: int = CLIMATOLOGY_DAYS) -> tuple[np.ndarray, int]:
    """Mean by UTC hour of day over the `days` whole days before each tick (L and earlier)."""
    width = 24 * days
    pad = np.concatenate([np.full(width, np.nan), arr])
    # window of tick t: hours t - width .. t - 1, i.e. pad[(t - base) .. (t - base) + width - 1]
    windows = np.lib.stride_tricks.sliding_window_view(pad, width)[ticks - base]
    by_hour = windows.reshape(len(ticks), days, 24)  # column c: hour of day (t + c) % 24
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(by_hour, axis=1)
    out = means[:, np.arange(horizon_h) % 24]
    missing = np.isnan(out)
    if missing.any():  # an hour of day never seen in the window: the newest known value
        last = _clipped(forward_filled(arr), ticks - base - 1)
        out = np.where(missing, last[:, None], out)
    return out, int(missing.sum())


def own_matrix(arr: np.ndarray, base: int, ticks: np.ndarray, horizon_h: int, refit_h: int,
               on_fit: Callable[[], None] | None = None) -> tuple[np.ndarray, int]:
    """The own forecaster as the simulator's `model` (see the module docstring)."""
    from telemetry.grid.forecast import baseline_forecast
    from telemetry.grid.forecast_model import (MAX_MODEL_HORIZON_H, LearnedForecaster, NotEnoughHistory, features,
                                                from_model)

    out = np.full((len(ticks), horizon_h), np.nan)
    last_known = ticks - 1
    fit_hours = last_known - last_known % refit_h
    for fit_hour in np.unique(fit_hours):
        rows = np.flatnonzero(fit_hours == fit_hour)
        try:
            model = LearnedForecaster.fit(AsOf(arr, base, int(fit_hour)), int(fit_hour))
        except NotEnoughHistory:
            model = None
        if on_fit is not None:
            on_fit()
        if model is None:
            continue
        origins = last_known[rows] - base
        known = arr[: int(origins.max()) + 1]  # features read arr[<= origin] of each row only
        newest_missing = np.isnan(_clipped(arr, origins))
        for j in range(min(horizon_h, MAX_MODEL_HORIZON_H)):
            x, level = features(known, base, origins, j + 1)
            pred = np.maximum(0.0, from_model(model.model.predict(x), x, level))
            pred[newest_missing] = np.nan  # its `predict` gives nothing then: the caller falls back
            out[rows, j] = pred
    fallbacks = 0
    pers, _ = persistence_matrix(arr, base, ticks, horizon_h)
    for i in np.flatnonzero(np.isnan(out).any(axis=1)):
        t = int(ticks[i])
        cols = np.flatnonzero(np.isnan(out[i]))
        values = baseline_forecast(AsOf(arr, base, t - 1), t - 1, [t + int(c) for c in cols])
        for c, v in zip(cols, values):
            if v is None:
                fallbacks += 1
                v = pers[i, c]
            out[i, c] = v
    return out, fallbacks


def _sarimax_fit(y: np.ndarray, start_params):
    from statsmodels.tsa.statespace.sarimax import SARIMAX

    model = SARIMAX(y, order=SARIMAX_ORDER, seasonal_order=SARIMAX_SEASONAL_ORDER, concentrate_scale=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter on short windows
        try:
            # warm-started from yesterday's optimum, a few iterations reach it (measured on DE-LU,
            # 6 days: the log-likelihood within 0.3 of 50 iterations' at a third of the CPU); no
            # parameter covariance (only the point forecast is used)
            res = model.fit(disp=False, start_params=start_params, cov_type="none",
                            maxiter=SARIMAX_WARM_MAXITER if start_params is not None else 50)
        except (ValueError, np.linalg.LinAlgError):
            res = None
        if (res is None or not np.all(np.isfinite(res.params))) and start_params is not None:
            res = model.filter(start_params)  # yesterday's parameters on today's window
    return res if res is not None and np.all(np.isfinite(res.params)) else None


def sarimax_forecast_rows(res, extra: np.ndarray, offsets: np.ndarray, horizon_h: int) -> np.ndarray:
    """Forecasts (len(offsets) x horizon_h) of a fitted SARIMAX from the states after the
    window's end plus `offsets` hours of `extra` (the newer observations, de-meaned): the
    filtered state a(L|L) stepped on by the transition, y = Z a (no intercepts: de-meaned)."""
    states = res.filter_results.filtered_state[:, -1:]
    if len(extra):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ext = res.extend(extra)
        states = np.concatenate([states, ext.filter_results.filtered_state], axis=1)
    ssm = res.model.ssm
    trans = ssm["transition"][:, :, 0] if ssm["transition"].ndim == 3 else ssm["transition"]
    design = ssm["design"][:, :, 0] if ssm["design"].ndim == 3 else ssm["design"]
    a = states[:, offsets]
    out = np.empty((len(offsets), horizon_h))
    for j in range(horizon_h):
        a = trans @ a
        out[:, j] = (design @ a)[0]
    return out


def sarimax_matrix(arr: np.ndarray, base: int, ticks: np.ndarray, horizon_h: int,
                   on_fit: Callable[[], None] | None = None) -> tuple[np.ndarray, int]:
    """LiteCast-style SARIMAX (module docstring): one fit per UTC day, filtered hourly."""
    out = np.full((len(ticks), horizon_h), np.nan)
    clim, _ = climatology_matrix(arr, base, ticks, horizon_h)
    fallbacks = 0
    start_params = None
    day_of = ticks // 24
    for day in np.unique(day_of):
        rows = np.flatnonzero(day_of == day)
        fit_last = int(day) * 24 - 1  # the newest hour known at the day's 00 UTC
        y = _clipped(arr, np.arange(fit_last - SARIMAX_WINDOW_H + 1, fit_last + 1) - base)
        res = None
        if (~np.isnan(y)).sum() >= SARIMAX_MIN_KNOWN_H:
            mean = float(np.nanmean(y))
            res = _sarimax_fit(y - mean, start_params)
        if on_fit is not None:
            on_fit()
        if res is None:
            out[rows] = clim[rows]
            fallbacks += len(rows)
            continue
        start_params = res.params
        offsets = ticks[rows] - 1 - fit_last  # hours known since the fit
        extra = _clipped(arr, np.arange(fit_last + 1, fit_last + 1 + int(offsets.max())) - base) - mean
        out[rows] = np.maximum(0.0, sarimax_forecast_rows(res, extra, offsets, horizon_h) + mean)
    return out, fallbacks


def run_method(name: str, arr: np.ndarray, base: int, ticks: np.ndarray, horizon_h: int, *,
               refit_h: int, on_fit: Callable[[], None] | None = None) -> MethodRun:
    """The issue matrix of method `name` (one of METHODS), timed."""
    t0 = time.perf_counter()
    fallbacks = 0
    if name == "perfect":
        f = perfect_matrix(arr, base, ticks, horizon_h)
    elif name == "persistence":
        f, fallbacks = persistence_matrix(arr, base, ticks, horizon_h)
    elif name == "climatology":
        f, fallbacks = climatology_matrix(arr, base, ticks, horizon_h)
    elif name == "own":
        f, fallbacks = own_matrix(arr, base, ticks, horizon_h, refit_h, on_fit)
    elif name == "sarimax":
        f, fallbacks = sarimax_matrix(arr, base, ticks, horizon_h, on_fit)
    else:
        raise ValueError(f"unknown method {name!r}; use {', '.join(METHODS)}")
    return MethodRun(name, f, time.perf_counter() - t0, fallbacks)
