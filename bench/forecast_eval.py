#!/usr/bin/env python3
"""How good is carbonsched's own carbon forecast? MAPE at 24 h ahead vs plain persistence.

Forecasting method under test: `telemetry.grid.forecast.baseline_forecast`, the fallback the
scheduler uses when no provider forecast exists ("7-day same-hour profile + anomaly
decaying 0.97/h"):

    F(T) = max(0, P(T) + A * 0.97^h)
    P(T) = mean of the value at T - 24k h over the 7 most recent whole days k >= ceil(h/24)
           that are known at issue time (missing days skipped)
    A    = v(L) - mean of v(L - 24j), j = 1..7     (how unusual the newest known hour is)

where L is the newest complete hour known when the forecast is issued and h = T - L the
horizon in hours. See the module docstring of telemetry/grid/forecast.py.

Definitions used here:

- "h hours ahead": the target hour T starts h hours after the start of the newest hour known
  at issue time (L = T - h). At 24 h this is the day-ahead setting of a planner.
- Persistence: the newest known value carried forward, F(T) = v(L). At 24 h ahead that is
  exactly the value 24 h before the target (the classic "same hour yesterday").
- MAPE: mean over target hours of |F - v| / v, in %, over hours with v > 0 (CA-ON has hours
  at 0 g/kWh, where a percentage error is undefined; they are counted in `zero_h` and left
  out). MAE in gCO2/kWh is shown too because MAPE explodes for near-zero grids (CA-ON).
- Data: Electricity Maps hourly direct average intensity from ../shared/data/carbon
  (ODbL 1.0). Targets are all 8,760 hours of 2022; 2021 provides the history for early
  January, and no value at or after T is ever used for T.

Run: `.venv/bin/python bench/forecast_eval.py [--data DIR] [--zones Z,Z,...] [--json FILE]`
(--data: the zone folders, or the shared carbon folder holding electricitymaps/).
`--savings` judges forecasts by what they are for: the share of the perfect-forecast saving
each method keeps when a greedy planner in GAIA's setting plans on it (bench/forecast_savings.py;
methods in bench/forecast_methods.py), with `--plot FILE` for a bar chart.
`--rolling` compares the candidate forecasters instead (`rolling_evaluate`):
persistence, seasonal-naive, the baseline, ridge, the learned LightGBM model and an ensemble,
on rolling origins over the year, MAPE/MAE at 1/6/24/48 h and the next 24 h's rank correlation.
A script, not a test. The medians of the horizon table are `EXPECTED_MAPE_PCT` in
telemetry/grid/forecast.py (the quality figure the scheduler reports with own forecasts).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from telemetry.grid.csv_import import read_trace  # noqa: E402
from telemetry.grid.forecast import baseline_forecast, epoch_hour, persistence_forecast  # noqa: E402

SHARED = Path(os.environ.get("CARBONSCHED_SHARED_DATA", ROOT.parent / "shared" / "data"))
DEFAULT_DATA = SHARED / "carbon" / "electricitymaps"
DEFAULT_JOBS = SHARED / "jobs" / "pai_1k.csv"
YEAR = 2022
HORIZONS_H = (1, 6, 24, 48, 72, 168)


def load_zone(folder: Path) -> tuple[str, dict[int, float]]:
    """The zone id and its hourly values (epoch hour -> gCO2/kWh) for YEAR-1 and YEAR."""
    values: dict[int, float] = {}
    zone = folder.name
    for year in (YEAR - 1, YEAR):
        path = folder / f"{folder.name}_{year}_hourly.csv"
        if not path.exists():
            continue
        trace = read_trace(path, fmt="electricitymaps")
        zone = trace.zones[0]
        for r in trace.readings:
            values[epoch_hour(r.at)] = r.gco2_per_kwh
    return zone, values


def evaluate(values: dict[int, float], horizon_h: int) -> dict:
    """MAPE/MAE of the baseline and of persistence at one horizon over the year's hours."""
    from datetime import datetime, timezone

    first = epoch_hour(datetime(YEAR, 1, 1, tzinfo=timezone.utc))
    last = epoch_hour(datetime(YEAR + 1, 1, 1, tzinfo=timezone.utc))
    ape_b: list[float] = []
    ape_p: list[float] = []
    ae_b: list[float] = []
    ae_p: list[float] = []
    zero = skipped = 0
    for target in range(first, last):
        actual = values.get(target)
        if actual is None:
            continue
        issue = target - horizon_h
        # both forecasters read only hours <= issue (tested in tests/telemetry/test_carbon_forecast.py)
        b = baseline_forecast(values, issue, [target])[0]
        p = persistence_forecast(values, issue, [target])[0]
        if b is None or p is None:
            skipped += 1
            continue
        ae_b.append(abs(b - actual))
        ae_p.append(abs(p - actual))
        if actual <= 0:
            zero += 1
            continue
        ape_b.append(abs(b - actual) / actual)
        ape_p.append(abs(p - actual) / actual)
    return {
        "hours": len(ae_b), "zero_h": zero, "skipped_h": skipped,
        "mape_baseline_pct": 100 * statistics.fmean(ape_b), "mape_persistence_pct": 100 * statistics.fmean(ape_p),
        "mae_baseline": statistics.fmean(ae_b), "mae_persistence": statistics.fmean(ae_p),
    }



# ---- rolling-origin comparison of candidate forecasters (issue 26) ----------------------------

ROLLING_ZONES = ("DE-LU", "GB", "US-CAL-CISO", "SG")
ROLLING_HORIZONS_H = (1, 6, 24, 48)
CANDIDATES = ("persistence", "seasonal-naive", "baseline", "ridge", "lgbm", "ensemble")


def _ridge_fit(arr, base_hour: int, last_idx: int, first_origin: int, horizons, lam: float = 1.0) -> dict:
    """One ridge regression per horizon on the learned model's features (NaN -> 1.0, the level)."""
    import numpy as np
    from telemetry.grid.forecast_model import ORIGIN_STEP_H, features

    out = {}
    for h in horizons:
        origins = np.arange(first_origin, last_idx - h + 1, ORIGIN_STEP_H, dtype=np.int64)
        actual = arr[origins + h]
        keep = ~np.isnan(actual) & ~np.isnan(arr[origins])
        x, level = features(arr, base_hour, origins[keep], h)
        xx = _ridge_design(x)
        y = actual[keep] / level
        a = xx.T @ xx + lam * np.eye(xx.shape[1])
        out[h] = np.linalg.solve(a, xx.T @ y)
    return out


def _ridge_design(x):
    """Ridge design: one-hot hour of T, the value features, NaN as 1.0 (= the week's level)."""
    import numpy as np

    hour = x[:, 1].astype(int)
    onehot = np.zeros((len(x), 24))
    onehot[np.arange(len(x)), hour] = 1.0
    vals = np.nan_to_num(x[:, 6:], nan=1.0)
    return np.column_stack([onehot, x[:, 3:5], vals])


def rolling_evaluate(values: dict[int, float], *, refit_days: int = 30, candidates=CANDIDATES,
                     horizons_max_h: int = 48) -> dict:
    """Rolling origins over YEAR: every hour of the year is an issue time L (newest known hour).

    Each learned candidate is refitted every `refit_days` days on the hours known at the refit
    (`LearnedForecaster.fit(values, L0)`), then forecasts 1 .. horizons_max_h hours ahead of
    each origin L >= L0 until the next refit, reading only hours <= L. Targets outside YEAR
    are not scored. Returns MAPE/MAE per (candidate, horizon), the mean Spearman rank
    correlation of each origin's next 24 h (origins at 00, 06, 12, 18 UTC, the next 24 h inside
    YEAR) and, for lgbm, the coverage of its 10-90 % and 5-95 % intervals.
    """
    import numpy as np
    from datetime import datetime, timezone
    from telemetry.grid.forecast_model import LearnedForecaster, _band, _interp_quantile, dense, features, from_model

    year_first = epoch_hour(datetime(YEAR, 1, 1, tzinfo=timezone.utc))
    year_end = epoch_hour(datetime(YEAR + 1, 1, 1, tzinfo=timezone.utc))
    base = min(values)
    arr = dense(values, base, max(values))
    H = horizons_max_h
    first_origin = year_first - 1
    origins_all = np.arange(first_origin, year_end - 1)  # epoch hours
    preds = {c: np.full((len(origins_all), H), np.nan) for c in candidates}
    q = {k: np.full((len(origins_all), H), np.nan) for k in (0.05, 0.1, 0.9, 0.95)}
    fit_s: list[float] = []
    for chunk_start in range(0, len(origins_all), 24 * refit_days):
        chunk = origins_all[chunk_start:chunk_start + 24 * refit_days]
        l0 = int(chunk[0])
        idx0 = l0 - base
        oi = chunk - base
        model = ridge = None
        if {"lgbm", "ensemble"} & set(candidates):
            t = time.perf_counter()
            model = LearnedForecaster.fit(values, l0)
            fit_s.append(time.perf_counter() - t)
        if "ridge" in candidates:
            ridge = _ridge_fit(arr[:idx0 + 1], base, idx0, max(0, idx0 - 24 * 365), range(1, H + 1))
        for h in range(1, H + 1):
            # the features read arr[<= origin] only; pass the array cut at each origin's max
            x, level = features(arr[:int(oi[-1]) + 1], base, oi, h)
            j = h - 1
            if "persistence" in candidates:
                preds["persistence"][chunk_start:chunk_start + len(chunk), j] = arr[oi]
            if "seasonal-naive" in candidates:
                preds["seasonal-naive"][chunk_start:chunk_start + len(chunk), j] = x[:, 15] * level
            if "baseline" in candidates:
                preds["baseline"][chunk_start:chunk_start + len(chunk), j] = x[:, 19] * level
            if ridge is not None:
                preds["ridge"][chunk_start:chunk_start + len(chunk), j] = np.maximum(
                    0.0, (_ridge_design(x) @ ridge[h]) * level)
            if model is not None:
                p = np.maximum(0.0, from_model(model.model.predict(x), x, level))
                preds["lgbm" if "lgbm" in candidates else "ensemble"][chunk_start:chunk_start + len(chunk), j] = p
                table = model.ratio_quantiles.get(_band(h))
                for k in q:
                    q[k][chunk_start:chunk_start + len(chunk), j] = p * _interp_quantile(table, k)
    if "ensemble" in candidates and "lgbm" in candidates and "ridge" in candidates:
        preds["ensemble"] = (preds["lgbm"] + preds["ridge"]) / 2
    actual = np.full((len(origins_all), H), np.nan)
    for j in range(H):
        tgt = origins_all + j + 1
        ok = tgt < year_end
        actual[ok, j] = arr[tgt[ok] - base]
    out: dict = {"fit_s_mean": statistics.fmean(fit_s) if fit_s else None, "refits": len(fit_s)}
    for c in candidates:
        row = {}
        for h in ROLLING_HORIZONS_H:
            a, f = actual[:, h - 1], preds[c][:, h - 1]
            ok = ~np.isnan(a) & ~np.isnan(f)
            pos = ok & (a > 0)
            row[f"mape_{h}h_pct"] = float(100 * np.mean(np.abs(f[pos] - a[pos]) / a[pos]))
            row[f"mae_{h}h"] = float(np.mean(np.abs(f[ok] - a[ok])))
        # next-24 h rank correlation, origins at 00/06/12/18 UTC
        rhos = []
        for i in np.flatnonzero((origins_all + 1) % 6 == 0):
            a, f = actual[i, :24], preds[c][i, :24]
            if np.isnan(a).any() or np.isnan(f).any():
                continue
            rhos.append(_spearman(a, f))
        rhos = [r for r in rhos if not math.isnan(r)]
        row["rank_corr_24h"] = float(np.mean(rhos)) if rhos else None
        out[c] = row
    if "lgbm" in candidates:
        cov = {}
        for lo, hi in ((0.1, 0.9), (0.05, 0.95)):
            ok = ~np.isnan(actual) & ~np.isnan(q[lo])
            inside = (actual[ok] >= q[lo][ok]) & (actual[ok] <= q[hi][ok])
            cov[f"{int(lo * 100)}-{int(hi * 100)}"] = float(100 * inside.mean())
        out["lgbm"]["interval_coverage_pct"] = cov
    return out


def _spearman(a, b) -> float:
    import numpy as np

    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")  # a flat forecast (persistence) ranks nothing
    ra = np.argsort(np.argsort(a, kind="stable"), kind="stable").astype(float)
    rb = np.argsort(np.argsort(b, kind="stable"), kind="stable").astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def rolling_table(zone: str, r: dict) -> list[str]:
    """Rows of the rolling-origin table for one zone."""
    out = [f"{zone}  ({r['refits']} fits, mean fit {r['fit_s_mean'] or 0:.1f} s)",
           f"  {'candidate':<15} {'MAPE 1h':>7} {'6h':>6} {'24h':>6} {'48h':>6} {'MAE 24h':>8} {'rank 24h':>8}"
           f" {'24h vs pers.':>12}"]
    pers = r.get("persistence", {}).get("mape_24h_pct")
    for c, row in r.items():
        if not isinstance(row, dict):
            continue
        vs = f"{100 * (row['mape_24h_pct'] / pers - 1):+.1f}%" if pers else ""
        rank = f"{row['rank_corr_24h']:.3f}" if row.get("rank_corr_24h") is not None else "-"
        cov = row.get("interval_coverage_pct")
        extra = f"  coverage 10-90 {cov['10-90']:.0f}%, 5-95 {cov['5-95']:.0f}%" if cov else ""
        out.append(f"  {c:<15} {row['mape_1h_pct']:>7.2f} {row['mape_6h_pct']:>6.2f} {row['mape_24h_pct']:>6.2f} "
                   f"{row['mape_48h_pct']:>6.2f} {row['mae_24h']:>8.1f} {rank:>8} {vs:>12}{extra}")
    return out


def rolling_main(args, folders: list[Path]) -> int:
    wanted = set(args.zones.split(",")) if args.zones else set(ROLLING_ZONES)
    candidates = tuple(args.candidates.split(","))
    unknown = set(candidates) - set(CANDIDATES)
    if unknown:
        print(f"unknown candidate(s) {', '.join(sorted(unknown))}; use {', '.join(CANDIDATES)}", file=sys.stderr)
        return 2
    results = {}
    print(f"Rolling origins over {YEAR}: every hour an issue time; learned candidates refitted every "
          f"{args.refit_days} d on the hours known then")
    for folder in (f for f in folders if f.name in wanted):
        _, values = load_zone(folder)
        if not values:
            continue
        results[folder.name] = rolling_evaluate(values, refit_days=args.refit_days, candidates=candidates)
        print("\n".join(rolling_table(folder.name, results[folder.name])), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"year": YEAR, "refit_days": args.refit_days, "zones": results}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of <ZONE>/<ZONE>_<YEAR>_hourly.csv")
    ap.add_argument("--zones", help="comma-separated folder names (default: all)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--rolling", action="store_true",
                    help="rolling-origin comparison of the candidate forecasters on "
                         f"{','.join(ROLLING_ZONES)} unless --zones")
    ap.add_argument("--savings", action="store_true",
                    help="share of the perfect-forecast saving each method keeps (GAIA's setting)")
    ap.add_argument("--methods", default="perfect,own,persistence,climatology,sarimax",
                    help="--savings: which methods (default all)")
    ap.add_argument("--arrivals", choices=("year", "gaia"), default="year",
                    help="--savings: the job trace folded into the whole year (default) or once from GAIA's start")
    ap.add_argument("--every-weeks", type=int, default=1,
                    help="--savings --arrivals year: one copy of the trace every N weeks (default 1: all year)")
    ap.add_argument("--no-prior-year", action="store_true",
                    help="--savings: history from the year's start only (as simulate_bench.py gaia loads it)")
    ap.add_argument("--year", type=int, default=YEAR, help=f"--savings: the year judged (default {YEAR})")
    ap.add_argument("--refit-h", type=int, default=168,
                    help="--savings: hours between refits of the own learned model (default 168, the simulator's)")
    ap.add_argument("--jobs", type=Path, default=DEFAULT_JOBS, help="--savings: GAIA-format job trace (default pai_1k)")
    ap.add_argument("--plot", type=Path, help="--savings: also draw kept %% per zone and method here (PNG)")
    ap.add_argument("--refit-days", type=int, default=61, help="--rolling: days between refits (default 61)")
    ap.add_argument("--candidates", default=",".join(CANDIDATES),
                    help=f"--rolling: which of {','.join(CANDIDATES)} (default all)")
    args = ap.parse_args(argv)
    if (args.data / "electricitymaps").is_dir():
        args.data = args.data / "electricitymaps"  # the shared carbon folder was given
    if not args.data.is_dir():
        print(f"no data at {args.data} (needs ../shared/data/carbon/electricitymaps)", file=sys.stderr)
        return 2
    folders = sorted(p for p in args.data.iterdir() if p.is_dir())
    if args.rolling:
        return rolling_main(args, folders)
    if args.zones:
        wanted = set(args.zones.split(","))
        folders = [f for f in folders if f.name in wanted]
    if args.savings:
        from bench.forecast_savings import savings_main

        return savings_main(args, folders)
    t0 = time.perf_counter()
    per_zone: dict[str, dict] = {}
    by_horizon: dict[int, list[float]] = {h: [] for h in HORIZONS_H}
    by_horizon_p: dict[int, list[float]] = {h: [] for h in HORIZONS_H}
    for folder in folders:
        zone, values = load_zone(folder)
        if not values:
            continue
        for h in HORIZONS_H:
            r = evaluate(values, h)
            by_horizon[h].append(r["mape_baseline_pct"])
            by_horizon_p[h].append(r["mape_persistence_pct"])
            if h == 24:
                per_zone[zone] = r
    print(f"Own-forecast baseline vs persistence, {YEAR}, 24 h ahead (target hour starts 24 h after "
          "the newest known hour)")
    print(f"{'zone':<13} {'hours':>5} {'MAPE own %':>10} {'MAPE pers %':>11} {'better':>7} "
          f"{'MAE own':>8} {'MAE pers':>8}")
    wins = 0
    for zone, r in per_zone.items():
        gain = r["mape_persistence_pct"] - r["mape_baseline_pct"]
        wins += gain > 0
        note = f"  ({r['zero_h']} h at 0 left out)" if r["zero_h"] else ""
        print(f"{zone:<13} {r['hours']:>5} {r['mape_baseline_pct']:>10.2f} {r['mape_persistence_pct']:>11.2f} "
              f"{gain:>+7.2f} {r['mae_baseline']:>8.1f} {r['mae_persistence']:>8.1f}{note}")
    mb = [r["mape_baseline_pct"] for r in per_zone.values()]
    mp = [r["mape_persistence_pct"] for r in per_zone.values()]
    if mb:
        print(f"{'median':<13} {'':>5} {statistics.median(mb):>10.2f} {statistics.median(mp):>11.2f}")
        print(f"{'mean':<13} {'':>5} {statistics.fmean(mb):>10.2f} {statistics.fmean(mp):>11.2f}")
        print(f"own forecast better than persistence in {wins} of {len(per_zone)} zones")
    print()
    print("MAPE % by horizon, median over zones (own / persistence)")
    for h in HORIZONS_H:
        if by_horizon[h]:
            print(f"  {h:>3} h: {statistics.median(by_horizon[h]):6.2f} / {statistics.median(by_horizon_p[h]):6.2f}")
    print(f"({time.perf_counter() - t0:.1f} s)")
    if args.json:
        args.json.write_text(json.dumps({
            "year": YEAR, "per_zone_24h": per_zone,
            "median_mape_by_horizon": {h: statistics.median(v) for h, v in by_horizon.items() if v},
            "median_persistence_mape_by_horizon": {h: statistics.median(v) for h, v in by_horizon_p.items() if v},
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
