"""The learned carbon forecast: gradient-boosted trees on lags and calendar, with quantiles.

What it is and why (numbers from `bench/forecast_eval.py`, see docs/benchmarks.md):

- One LightGBM model per zone predicts the value of target hour T = L + h (h = 1 ..
  `MAX_MODEL_HORIZON_H` hours) from what is known when the forecast is issued, L being the
  newest known hour. Horizon is a feature, so one model serves every horizon ("direct"
  multi-horizon forecasting; no recursion, so no compounding of its own errors).
- Features (`FEATURES`): the horizon; hour of day, weekday and season of T and the hour of
  L; the newest values v(L), v(L-1) .. v(L-23) (a few of them), the last day's mean and its
  change from the day before; the same hour on the newest known days v(T - 24k) and a week
  before v(T - 168); the 7-day same-hour profile and the profile-plus-decaying-anomaly
  baseline of `telemetry.grid.forecast`. Every value is divided by the mean of the week up
  to L (the "level"), and so is the target: the model learns shapes, not absolute levels, so
  it carries over between seasons and years whose level differs (a coal-heavy winter, a
  windy spring). The prediction is multiplied back by the level.
- Loss: L1 on that ratio, i.e. close to the relative error MAPE measures.
- Quantiles: split-conformal. A first model is fitted on all but the last `CALIBRATION_DAYS`
  of the history and predicts those days out of sample; the quantiles of actual / forecast
  per horizon band are kept, and the final model (fitted on all history) multiplies its
  point forecast by them. No extra model per quantile, and the intervals are measured on
  data the model had not seen.
- Strictly as-of: `fit(values, last_known_hour)` and `predict(values, last_known_hour, ...)`
  read only hours <= last_known_hour, whatever else `values` holds (the tests change every
  later value and compare). A training row's target is itself <= last_known_hour.

Candidates measured before this one was chosen (24 h MAPE and next-24 h rank correlation on
2022, four zones): persistence, seasonal-naive, the 7-day profile + anomaly baseline,
per-horizon ridge regression on the same features, and this model; see docs/benchmarks.md.
Beyond `MAX_MODEL_HORIZON_H` (and when a zone has less than `MIN_HISTORY_DAYS` of history)
the caller uses the baseline.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from telemetry.grid.forecast import ANOMALY_DECAY_PER_HOUR, PROFILE_DAYS

log = logging.getLogger(__name__)

METHOD = "gradient-boosted trees on lags + calendar (LightGBM), split-conformal quantiles"
MAX_MODEL_HORIZON_H = 72
MIN_HISTORY_DAYS = 21
CALIBRATION_DAYS = 28
TRAIN_DAYS = 365
#: Every `ORIGIN_STEP_H`-th hour is a training origin (neighbouring origins add little).
ORIGIN_STEP_H = 3
TRAIN_HORIZONS_H: tuple[int, ...] = tuple(range(1, 25)) + tuple(range(26, MAX_MODEL_HORIZON_H + 1, 2))
QUANTILES: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)
#: Horizon bands (inclusive upper bounds, hours) over which conformal quantiles are pooled.
BANDS_H: tuple[int, ...] = (1, 3, 6, 12, 24, 36, 48, 72)
#: Hours of history a prediction reads before L: the week's level, and profile days back
#: from the furthest horizon.
LOOKBACK_H = 24 * (-(-MAX_MODEL_HORIZON_H // 24) + PROFILE_DAYS + 1) + 1

FEATURES = ("h", "hour_T", "weekday_T", "season_sin", "season_cos", "hour_L",
            "v_L", "v_L-1", "v_L-2", "v_L-3", "v_L-6", "v_L-12", "v_L-23", "mean24", "trend24",
            "same_hour_k0", "same_hour_k0+1", "same_hour_week", "profile7", "baseline")

#: Small, strongly regularised trees: neighbouring origins are near copies of each other, and
#: 300 rounds of 31 leaves fitted 2021 closely and 2022 worse than the baseline.
LGBM_PARAMS = {"objective": "l1", "num_boost_round": 100, "learning_rate": 0.05, "num_leaves": 15,
               "min_data_in_leaf": 300, "bagging_fraction": 0.7, "bagging_freq": 1, "feature_fraction": 0.8,
               "lambda_l2": 10.0, "num_threads": 1, "seed": 7, "deterministic": True, "verbosity": -1}
#: One model per horizon band (inclusive, hours): in one model for all horizons the 1-hour rows
#: (1/48 of the data) were fitted worse than the baseline alone.
MODEL_BANDS_H: tuple[tuple[int, int], ...] = ((1, 6), (7, 24), (25, MAX_MODEL_HORIZON_H))


BASELINE_COL = FEATURES.index("baseline")


def from_model(raw: np.ndarray, x: np.ndarray, level: np.ndarray) -> np.ndarray:
    """gCO2/kWh from the model's output: it predicts the baseline's error over the level."""
    return (x[:, BASELINE_COL] + raw) * level


class NotEnoughHistory(ValueError):
    """Too little history known at the issue time to fit the model."""


def dense(values: Mapping[int, float], first: int, last: int) -> np.ndarray:
    """Hours first .. last (inclusive) of `values` as a float array, NaN where missing."""
    out = np.full(last - first + 1, np.nan)
    get = values.get
    for i, hour in enumerate(range(first, last + 1)):
        v = get(hour)
        if v is not None:
            out[i] = v
    return out


def _window_mean(arr: np.ndarray, ends: np.ndarray, width: int) -> np.ndarray:
    """Mean of arr[end - width + 1 .. end] for each end, NaN ignored (NaN if all missing)."""
    filled = np.nan_to_num(arr, nan=0.0)
    have = (~np.isnan(arr)).astype(float)
    cs = np.concatenate(([0.0], np.cumsum(filled)))
    cn = np.concatenate(([0.0], np.cumsum(have)))
    lo = np.clip(ends - width + 1, 0, None)
    s = cs[ends + 1] - cs[lo]
    n = cn[ends + 1] - cn[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, s / np.maximum(n, 1), np.nan)


def _take(arr: np.ndarray, idx: np.ndarray) -> np.ndarray:
    ok = (idx >= 0) & (idx < len(arr))
    out = np.full(idx.shape, np.nan)
    out[ok] = arr[idx[ok]]
    return out


def features(arr: np.ndarray, base_hour: int, origins: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray]:
    """Feature rows (len(origins) x len(FEATURES)) and levels for target = origin + h.

    `arr[i]` is the value of epoch hour base_hour + i; `origins` are indices of the newest
    known hour L. Only arr[<= origin] is read (the seasonal lags T - 24k use k >= ceil(h/24)).
    """
    origins = np.asarray(origins, dtype=np.int64)
    targets = origins + h
    level = _window_mean(arr, origins, 168)
    level = np.where(np.isnan(level) | (level < 1.0), 1.0, level)
    k0 = -(-h // 24)
    abs_t = base_hour + targets
    days_t = abs_t // 24
    season = 2 * math.pi * (abs_t / (24 * 365.2425))
    v_l = _take(arr, origins)
    mean24 = _window_mean(arr, origins, 24)
    mean24_prev = _window_mean(arr, origins - 24, 24)
    prof = np.stack([_take(arr, targets - 24 * k) for k in range(k0, k0 + PROFILE_DAYS)])
    profile = _nanmean0(prof)
    ref = np.stack([_take(arr, origins - 24 * j) for j in range(1, PROFILE_DAYS + 1)])
    anomaly = np.nan_to_num(v_l - _nanmean0(ref), nan=0.0)
    baseline = np.maximum(0.0, profile + anomaly * ANOMALY_DECAY_PER_HOUR ** h)
    week = _take(arr, targets - 168) if h <= 168 else np.full(origins.shape, np.nan)
    cols = [
        np.full(origins.shape, float(h)), (abs_t % 24).astype(float), ((days_t + 3) % 7).astype(float),
        np.sin(season), np.cos(season), ((base_hour + origins) % 24).astype(float),
        v_l / level, _take(arr, origins - 1) / level, _take(arr, origins - 2) / level,
        _take(arr, origins - 3) / level, _take(arr, origins - 6) / level, _take(arr, origins - 12) / level,
        _take(arr, origins - 23) / level, mean24 / level, (mean24 - mean24_prev) / level,
        _take(arr, targets - 24 * k0) / level, _take(arr, targets - 24 * (k0 + 1)) / level, week / level,
        profile / level, baseline / level,
    ]
    return np.column_stack(cols), level


def _nanmean0(stack: np.ndarray) -> np.ndarray:
    """Column means ignoring NaN; NaN where a column has no value (without a warning)."""
    have = ~np.isnan(stack)
    n = have.sum(axis=0)
    s = np.where(have, stack, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, s / np.maximum(n, 1), np.nan)


def _band(h: int) -> int:
    for i, top in enumerate(BANDS_H):
        if h <= top:
            return i
    return len(BANDS_H) - 1


def _training_rows(arr: np.ndarray, base_hour: int, last_idx: int, first_origin: int,
                   horizons: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, ratio targets and horizons of every training row whose target <= last_idx."""
    xs, ys, hs = [], [], []
    for h in horizons:
        origins = np.arange(first_origin, last_idx - h + 1, ORIGIN_STEP_H, dtype=np.int64)
        if not len(origins):
            continue
        actual = arr[origins + h]
        keep = ~np.isnan(actual) & ~np.isnan(arr[origins])
        origins, actual = origins[keep], actual[keep]
        if not len(origins):
            continue
        x, level = features(arr, base_hour, origins, h)
        xs.append(x)
        ys.append((actual - x[:, BASELINE_COL] * level) / level)
        hs.append(np.full(len(origins), h))
    if not xs:
        return np.empty((0, len(FEATURES))), np.empty(0), np.empty(0)
    return np.vstack(xs), np.concatenate(ys), np.concatenate(hs)


class BandModels:
    """One booster per horizon band; `predict(x)` routes each row by its horizon column."""

    def __init__(self, boosters: dict[tuple[int, int], object]) -> None:
        self.boosters = boosters

    def predict(self, x: np.ndarray) -> np.ndarray:
        out = np.zeros(len(x))
        h = x[:, 0]
        for (lo, hi), booster in self.boosters.items():
            rows = (h >= lo) & (h <= hi)
            if rows.any():
                out[rows] = booster.predict(x[rows])
        return out


def _fit_lgbm(x: np.ndarray, y: np.ndarray, params: Mapping | None = None) -> BandModels:
    import lightgbm  # imported here: the package imports fast and the daemon fits rarely

    p = dict(params or LGBM_PARAMS)
    rounds = int(p.pop("num_boost_round"))
    boosters = {}
    for lo, hi in MODEL_BANDS_H:
        rows = (x[:, 0] >= lo) & (x[:, 0] <= hi)
        if rows.sum() >= 100:
            boosters[(lo, hi)] = lightgbm.train(p, lightgbm.Dataset(x[rows], y[rows]), num_boost_round=rounds)
    return BandModels(boosters)


@dataclass
class LearnedForecaster:
    """A fitted per-zone model: `predict` and `predict_quantiles` for hours after an issue."""

    model: object
    last_known_hour: int
    trained_rows: int
    #: ratio quantiles (actual / forecast) per band: {band index: {q: ratio}}
    ratio_quantiles: dict[int, dict[float, float]] = field(default_factory=dict)
    out_of_sample: bool = True
    method: str = METHOD

    @classmethod
    def fit(cls, values: Mapping[int, float], last_known_hour: int, *, train_days: int = TRAIN_DAYS,
            calibration_days: int = CALIBRATION_DAYS, params: Mapping | None = None) -> "LearnedForecaster":
        """Fit on the hours of `values` up to and including `last_known_hour` (epoch hours).

        Raises NotEnoughHistory with fewer than MIN_HISTORY_DAYS of known values.
        """
        first = last_known_hour - 24 * train_days - LOOKBACK_H
        arr = dense(values, first, last_known_hour)
        known = np.flatnonzero(~np.isnan(arr))
        if len(known) < 24 * MIN_HISTORY_DAYS:
            raise NotEnoughHistory(f"{len(known)} h of history known; the model needs {24 * MIN_HISTORY_DAYS}")
        last_idx = len(arr) - 1
        first_origin = max(int(known[0]) + 7 * 24, 0)
        quantiles: dict[int, dict[float, float]] = {}
        out_of_sample = True
        cal_start = last_idx - 24 * calibration_days
        x_cal_fit, y_cal_fit, _ = _training_rows(arr, first, cal_start, first_origin, TRAIN_HORIZONS_H)
        if len(known) >= 24 * (MIN_HISTORY_DAYS + calibration_days) and len(y_cal_fit) > 1000:
            cal_model = _fit_lgbm(x_cal_fit, y_cal_fit, params)
            # out of sample: origins in the calibration window (targets there too)
            quantiles = cls._calibrate(cal_model, arr, first, cal_start, last_idx)
        x, y, _ = _training_rows(arr, first, last_idx, first_origin, TRAIN_HORIZONS_H)
        model = _fit_lgbm(x, y, params)
        if not quantiles:
            out_of_sample = False
            quantiles = cls._calibrate(model, arr, first, max(first_origin, last_idx - 24 * calibration_days), last_idx)
        return cls(model=model, last_known_hour=last_known_hour, trained_rows=len(y),
                   ratio_quantiles=quantiles, out_of_sample=out_of_sample)

    @staticmethod
    def _calibrate(model, arr: np.ndarray, base_hour: int, from_idx: int, last_idx: int) -> dict[int, dict[float, float]]:
        ratios: dict[int, list[np.ndarray]] = {}
        for h in TRAIN_HORIZONS_H:
            origins = np.arange(from_idx, last_idx - h + 1, 1, dtype=np.int64)
            if not len(origins):
                continue
            actual = arr[origins + h]
            keep = ~np.isnan(actual) & ~np.isnan(arr[origins])
            origins, actual = origins[keep], actual[keep]
            if not len(origins):
                continue
            x, level = features(arr, base_hour, origins, h)
            pred = np.maximum(from_model(model.predict(x), x, level), 1e-6)
            ratios.setdefault(_band(h), []).append(actual / pred)
        out: dict[int, dict[float, float]] = {}
        for band, parts in ratios.items():
            r = np.concatenate(parts)
            out[band] = {q: float(np.quantile(r, q)) for q in QUANTILES}
        return out

    def _predict_arrays(self, values: Mapping[int, float], last_known_hour: int,
                        target_hours: Sequence[int]) -> tuple[list[int], np.ndarray]:
        first = last_known_hour - LOOKBACK_H
        arr = dense(values, first, last_known_hour)
        origin = np.array([len(arr) - 1], dtype=np.int64)
        horizons = [t - last_known_hour for t in target_hours]
        rows, idx = [], []
        levels = []
        for i, h in enumerate(horizons):
            if 1 <= h <= MAX_MODEL_HORIZON_H:
                x, level = features(arr, first, origin, h)
                rows.append(x[0])
                levels.append(level[0])
                idx.append(i)
        if np.isnan(arr[-1]) or not rows:
            return [], np.empty(0)
        x = np.vstack(rows)
        pred = np.maximum(0.0, from_model(self.model.predict(x), x, np.array(levels)))
        return idx, pred

    def predict(self, values: Mapping[int, float], last_known_hour: int,
                target_hours: Iterable[int]) -> list[float | None]:
        """Point forecasts (gCO2/kWh) for `target_hours`, reading only hours <= last_known_hour.

        None for a target outside 1 .. MAX_MODEL_HORIZON_H hours after last_known_hour, or
        when the newest known hour itself has no value (the caller falls back).
        """
        targets = list(target_hours)
        idx, pred = self._predict_arrays(values, last_known_hour, targets)
        out: list[float | None] = [None] * len(targets)
        for i, v in zip(idx, pred.tolist()):
            out[i] = v
        return out

    def predict_quantiles(self, values: Mapping[int, float], last_known_hour: int, target_hours: Iterable[int],
                          quantiles: Sequence[float] = (0.1, 0.5, 0.9)) -> dict[float, list[float | None]]:
        """Forecast quantiles per target: the point forecast x the calibrated ratio quantile."""
        targets = list(target_hours)
        idx, pred = self._predict_arrays(values, last_known_hour, targets)
        out: dict[float, list[float | None]] = {q: [None] * len(targets) for q in quantiles}
        for i, v in zip(idx, pred.tolist()):
            table = self.ratio_quantiles.get(_band(targets[i] - last_known_hour))
            for q in quantiles:
                out[q][i] = max(0.0, v * _interp_quantile(table, q)) if table else v
        return out


def _interp_quantile(table: Mapping[float, float], q: float) -> float:
    keys = sorted(table)
    if q <= keys[0]:
        return table[keys[0]]
    if q >= keys[-1]:
        return table[keys[-1]]
    for lo, hi in zip(keys, keys[1:]):
        if lo <= q <= hi:
            return table[lo] + (q - lo) / (hi - lo) * (table[hi] - table[lo])
    return 1.0


#: Median over DE-LU, GB, US-CAL-CISO and SG of this model's 2022 rolling-origin MAPE (%) by
#: horizon (hours), from `bench/forecast_eval.py --rolling` (table in docs/benchmarks.md): the
#: quality figure reported with every forecast it makes. Not measured beyond 48 h: the 48 h
#: figure is reported there (an underestimate).
EXPECTED_MAPE_PCT: dict[int, float] = {1: 2.8, 6: 9.1, 24: 14.1, 48: 17.5}


def expected_model_mape_pct(horizon_h: float) -> float:
    """The measured typical MAPE (%) of the learned model `horizon_h` hours ahead (interpolated)."""
    keys = sorted(EXPECTED_MAPE_PCT)
    h = min(max(horizon_h, keys[0]), keys[-1])
    for lo, hi in zip(keys, keys[1:]):
        if lo <= h <= hi:
            return round(EXPECTED_MAPE_PCT[lo] + (h - lo) / (hi - lo) * (EXPECTED_MAPE_PCT[hi] - EXPECTED_MAPE_PCT[lo]), 1)
    return EXPECTED_MAPE_PCT[keys[-1]]
