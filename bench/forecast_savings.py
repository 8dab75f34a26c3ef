"""Forecasts judged by what they are for: the share of the perfect-forecast saving each keeps.

`bench/forecast_eval.py --savings` runs this. For one zone and year it replays a simple
carbon-aware planner in GAIA's setting on each method's forecasts (`bench/forecast_methods.py`:
the own forecaster, persistence, climatology, a LiteCast-style SARIMAX, and the perfect
forecast) and measures the result on the true intensity:

- Jobs: pai_1k (GAIA's trace: 1,000 jobs over 7 days, 1-4 GPUs, 5 min to 60 h, half under
  an hour). `gaia` arrivals: the trace once from `GAIA_START` (2022-10-19 16:00 UTC), the
  start of `bench/simulate_bench.py gaia`. `year` arrivals: the trace folded into the year,
  one copy every 7 days from 1 January 00:00 UTC (52 copies, ~52,000 jobs), so every hour and
  weekday and season is sampled with the same arrival pattern and length mix; `every_weeks`
  N keeps every N-th copy (a cheaper run: only the hours some job is planned in are
  forecast); a job whose latest finish falls past the data is left out. Why pai_1k and not a
  uniform grid of arrivals: it is the trace GAIA and the simulator's `gaia` scenario use, so
  the length mix (half the jobs under an hour, a few over a day) and the daytime arrival
  pattern are GAIA's, and the kept share can be checked against the simulator's.
- The planner (GAIA's setting: a pool that is never full, 24 h of slack, hourly planning,
  greedy against run-at-arrival), as `bench/simulate_bench.py gaia` sets the simulator up
  (a 1,024-GPU node that pai_1k never fills; `plan_interval` 3600 s with planning at every
  submit; 15-min slots; the job may start up to 24 h after its arrival): at its arrival and
  then at every whole hour until it starts, a job is given the start among now, now + 15
  min, .. , arrival + 24 h that minimises its FORECAST grams (its GPUs x the forecast
  intensity integrated over its run; ties: the earliest). The forecast is the one issued at
  the hour holding `now` (newest known hour: the one before). If that start falls before the
  next whole hour the job starts there; otherwise it waits and is planned again at the next
  hour with the newer forecast, as every queued job is re-planned at every tick in the
  simulator.
- Saving = grams if every job runs at its arrival (fifo on a never-full pool) minus grams at
  the chosen starts, both on the TRUE intensity, in % of the former. Kept = a method's saving
  / the perfect forecast's saving, in %.

How it relates to the simulator: the same trace, slack, tick and slots, the same forecast
issue rule and (for `own`) the same forecaster and refit rule (`REFIT_H`, weekly by default).
Left out: the simulator's other machinery (placement, short-job packing, dispatch order; none
binds on a pool that is never full), and past 48 h its planner prices the climatology
(`CarbonCurve.tail`) where here every method forecasts the whole window (it matters only for
the few jobs longer than a day). The cheap replay is what makes a year of 16 zones affordable:
a simulator year per zone and method would take hours. `--arrivals gaia --no-prior-year`
(history from the year's start only, as `simulate_bench.py gaia` loads it) on DE-LU and
US-CAL-CISO is the check against the simulator's kept share (docs/benchmarks.md).
Also reported per method: MAPE and the mean Spearman rank correlation of the next 24 h
(horizons 1-24 of every tick; MAPE over hours with an actual value above 0).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench.forecast_methods import METHODS, run_method

GAIA_START = datetime(2022, 10, 19, 16, tzinfo=timezone.utc)  # bench/simulate_bench.py
MAX_WAIT_S = 24 * 3600.0
SLOT_S = 900.0
HOUR_S = 3600
FOLD_PERIOD_H = 7 * 24
#: The simulator's refit interval of the learned model (scheduler.simulate.forecasts.REFIT_H).
DEFAULT_REFIT_H = 168


@dataclass
class Jobs:
    """Jobs as arrays: arrival (epoch seconds), run length (seconds), GPUs."""

    arrival_s: np.ndarray
    length_s: np.ndarray
    gpus: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival_s)

    def take(self, keep: np.ndarray) -> "Jobs":
        return Jobs(self.arrival_s[keep], self.length_s[keep], self.gpus[keep])


def read_trace(path: Path) -> Jobs:
    """pai_1k-style trace (arrival offsets from 0) via the simulator's reader."""
    from scheduler.simulate.traces import read_jobs

    trace = read_jobs(path)
    jobs = [j for j in trace.jobs if j.est_runtime_s]
    return Jobs(np.array([j.arrival_s for j in jobs], float), np.array([j.est_runtime_s for j in jobs], float),
                np.array([j.gpus for j in jobs], float))


def place_arrivals(trace: Jobs, mode: str, year: int, every_weeks: int = 1) -> Jobs:
    """`gaia`: the trace once from GAIA_START; `year`: one copy every `every_weeks` x 7 days
    through `year` (1: back to back; 4: 13 weeks spread over the year, for a cheaper run)."""
    if mode == "gaia":
        return Jobs(trace.arrival_s + GAIA_START.timestamp(), trace.length_s, trace.gpus)
    if mode != "year":
        raise ValueError(f"unknown arrivals {mode!r}; use gaia or year")
    first = datetime(year, 1, 1, tzinfo=timezone.utc).timestamp()
    end = datetime(year + 1, 1, 1, tzinfo=timezone.utc).timestamp()
    period_s = FOLD_PERIOD_H * HOUR_S * every_weeks
    copies = int(math.ceil((end - first) / period_s))
    offsets = first + period_s * np.arange(copies)
    arrival = (trace.arrival_s[None, :] + offsets[:, None]).ravel()
    keep = arrival < end
    n = copies
    return Jobs(arrival[keep], np.tile(trace.length_s, n)[keep], np.tile(trace.gpus, n)[keep])


def integral(curve: np.ndarray, first_hour: int, t0_s: np.ndarray, t1_s: np.ndarray) -> np.ndarray:
    """Integral (value x seconds) of the hourly step curve (curve[k]: hour first_hour + k) over
    [t0, t1]; the times must lie inside the curve."""
    grid = (first_hour + np.arange(len(curve) + 1)) * float(HOUR_S)
    cum = np.concatenate([[0.0], np.cumsum(curve) * HOUR_S])
    return np.interp(t1_s, grid, cum) - np.interp(t0_s, grid, cum)


def replay_greedy(forecast: np.ndarray, ticks: np.ndarray, jobs: Jobs, *, max_wait_s: float = MAX_WAIT_S,
                  slot_s: float = SLOT_S) -> np.ndarray:
    """Start times (epoch s) the hourly greedy planner gives `jobs` on an issue matrix.

    forecast[i, j]: issued at hour ticks[i] (ascending epoch hours) for hour ticks[i] + j. See
    the module docstring for the rule. The ticks must hold every hour from each job's arrival
    to its latest start, and each row must cover the latest finish of the jobs it plans.
    """
    order = np.argsort(jobs.arrival_s, kind="stable")
    arrival_hour = np.floor(jobs.arrival_s / HOUR_S).astype(np.int64)
    starts = np.full(len(jobs), np.nan)
    k = np.arange(int(max_wait_s // slot_s) + 1) * slot_s
    pending = np.empty(0, dtype=np.int64)
    ptr = 0
    for i, hour in enumerate(int(t) for t in ticks):
        hi = ptr
        while hi < len(order) and arrival_hour[order[hi]] <= hour:
            hi += 1
        batch = np.concatenate([pending, order[ptr:hi]])
        ptr = hi
        if not len(batch):
            continue
        now = np.maximum(jobs.arrival_s[batch], hour * float(HOUR_S))
        cand = now[:, None] + k[None, :]
        valid = cand <= (jobs.arrival_s[batch] + max_wait_s)[:, None] + 1e-6
        length = jobs.length_s[batch][:, None]
        cost = integral(forecast[i], hour, cand, cand + length) * jobs.gpus[batch][:, None]
        cost = np.where(valid, cost, np.inf)
        best = cand[np.arange(len(batch)), np.argmin(cost, axis=1)]
        go = best < (hour + 1) * float(HOUR_S)
        starts[batch[go]] = best[go]
        pending = batch[~go]
    if len(pending) or ptr < len(order):
        raise ValueError("the matrix's ticks end before every job has started")
    return starts


def planning_hours(jobs: Jobs, max_wait_s: float = MAX_WAIT_S) -> np.ndarray:
    """The hours at which some job is planned: from its arrival's hour to its latest start's."""
    first = np.floor(jobs.arrival_s / HOUR_S).astype(np.int64)
    last = np.floor((jobs.arrival_s + max_wait_s) / HOUR_S).astype(np.int64)
    origin = int(first.min())
    need = np.zeros(int(last.max()) - origin + 2, dtype=np.int64)
    np.add.at(need, first - origin, 1)
    np.add.at(need, last - origin + 1, -1)
    return origin + np.flatnonzero(np.cumsum(need) > 0)


def job_grams(true: np.ndarray, first_hour: int, jobs: Jobs, starts_s: np.ndarray) -> np.ndarray:
    """Each job's true grams (up to a constant: GPUs x intensity x seconds) started at starts_s."""
    return integral(true, first_hour, starts_s, starts_s + jobs.length_s) * jobs.gpus


def saving_pct(true: np.ndarray, first_hour: int, jobs: Jobs, starts_s: np.ndarray) -> float:
    """Saving against run-at-arrival on the true curve, % of the run-at-arrival grams."""
    at_arrival = job_grams(true, first_hour, jobs, jobs.arrival_s).sum()
    chosen = job_grams(true, first_hour, jobs, starts_s).sum()
    return float(100.0 * (at_arrival - chosen) / at_arrival)


def kept_pct(saving: float, perfect_saving: float) -> float | None:
    """The share of the perfect forecast's saving a method keeps, % (None: nothing to keep)."""
    return 100.0 * saving / perfect_saving if perfect_saving > 0 else None


def next_day_scores(forecast: np.ndarray, actual: np.ndarray) -> tuple[float | None, float | None]:
    """MAPE (%) over horizons 1-24 and the mean Spearman rank correlation of each tick's
    next 24 h (ticks with a missing or flat row left out of the correlation)."""
    f, a = forecast[:, :24], actual[:, :24]
    ok = ~np.isnan(f) & ~np.isnan(a) & (a > 0)
    mape = float(100 * np.mean(np.abs(f[ok] - a[ok]) / a[ok])) if ok.any() else None
    rows = ~np.isnan(f).any(axis=1) & ~np.isnan(a).any(axis=1) & (np.ptp(np.nan_to_num(f), axis=1) > 0) \
        & (np.ptp(np.nan_to_num(a), axis=1) > 0)
    if not rows.any():
        return mape, None
    rf = np.argsort(np.argsort(f[rows], axis=1, kind="stable"), axis=1, kind="stable").astype(float)
    ra = np.argsort(np.argsort(a[rows], axis=1, kind="stable"), axis=1, kind="stable").astype(float)
    rf -= rf.mean(axis=1, keepdims=True)
    ra -= ra.mean(axis=1, keepdims=True)
    rho = (rf * ra).sum(axis=1) / np.sqrt((rf ** 2).sum(axis=1) * (ra ** 2).sum(axis=1))
    return mape, float(rho.mean())


@dataclass
class ZoneResult:
    """One zone's savings table row: per method saving %, kept %, MAPE, rank, seconds."""

    zone: str
    jobs: int
    methods: dict[str, dict] = field(default_factory=dict)


def evaluate_zone(zone: str, arr: np.ndarray, base: int, jobs: Jobs, methods: tuple[str, ...], *,
                  refit_h: int = DEFAULT_REFIT_H, progress=None) -> ZoneResult:
    """Every method's kept share, MAPE and next-24 h rank on one zone (module docstring)."""
    true = _filled(arr)
    end_hour = base + len(arr)
    horizon_h = 2 + int(math.ceil((MAX_WAIT_S + jobs.length_s.max()) / HOUR_S))
    fits_in = (jobs.arrival_s + MAX_WAIT_S + jobs.length_s <= end_hour * HOUR_S) \
        & (jobs.arrival_s >= (base + 1) * HOUR_S)
    jobs = jobs.take(fits_in)
    ticks = planning_hours(jobs)
    actual = run_method("perfect", arr, base, ticks, horizon_h, refit_h=refit_h).forecast
    out = ZoneResult(zone, len(jobs))
    perfect_saving = None
    for name in ("perfect",) + tuple(m for m in methods if m != "perfect"):
        run = run_method(name, arr, base, ticks, horizon_h, refit_h=refit_h,
                         on_fit=progress.tick if progress is not None else None)
        if name == "perfect":
            run.forecast = np.where(np.isnan(run.forecast), _window(true, base, ticks, horizon_h), run.forecast)
        t0 = time.perf_counter()
        starts = replay_greedy(run.forecast, ticks, jobs)
        saving = saving_pct(true, base, jobs, starts)
        replay_s = time.perf_counter() - t0
        if name == "perfect":
            perfect_saving = saving
        mape, rank = next_day_scores(run.forecast, actual)
        out.methods[name] = {"saving_pct": saving, "kept_pct": kept_pct(saving, perfect_saving),
                             "mape_24h_pct": mape, "rank_corr_24h": rank, "forecast_s": run.seconds,
                             "replay_s": replay_s, "fallbacks": run.fallbacks}
        if progress is not None:
            progress.method_done(zone, name, out.methods[name])
    return out


def _filled(arr: np.ndarray) -> np.ndarray:
    """The true curve with missing hours taken from the neighbouring known hours (linear)."""
    missing = np.isnan(arr)
    if not missing.any():
        return arr
    idx = np.arange(len(arr))
    return np.interp(idx, idx[~missing], arr[~missing])


def _window(true: np.ndarray, base: int, ticks: np.ndarray, horizon_h: int) -> np.ndarray:
    idx = np.clip((ticks - base)[:, None] + np.arange(horizon_h)[None, :], 0, len(true) - 1)
    return true[idx]


def load_years(folder: Path, year: int, prior_year: bool = True) -> tuple[np.ndarray, int]:
    """Hourly values of `year - 1` (unless not `prior_year`) and `year` as a dense array and
    its first epoch hour."""
    from telemetry.grid.csv_import import read_trace
    from telemetry.grid.forecast import epoch_hour

    values: dict[int, float] = {}
    for y in (year - 1, year) if prior_year else (year,):
        path = folder / f"{folder.name}_{y}_hourly.csv"
        if path.exists():
            for r in read_trace(path, fmt="electricitymaps").readings:
                values[epoch_hour(r.at)] = r.gco2_per_kwh
    if not values:
        return np.empty(0), 0
    base = min(values)
    arr = np.full(max(values) - base + 1, np.nan)
    for hour, v in values.items():
        arr[hour - base] = v
    return arr, base


def table_lines(results: list[ZoneResult], methods: tuple[str, ...]) -> list[str]:
    """zones x methods: kept % / MAPE % / rank; then the mean over zones and the worst zone."""
    shown = [m for m in methods if m != "perfect"]
    head = f"{'zone':<13} {'jobs':>6} {'perfect':>8}" + "".join(f" {m + ' kept/MAPE/rank':>30}" for m in shown)
    lines = [head]
    for r in results:
        cells = [_cell(r.methods.get(m)) for m in shown]
        lines.append(f"{r.zone:<13} {r.jobs:>6} {r.methods['perfect']['saving_pct']:>7.1f}%" + "".join(
            f" {c:>30}" for c in cells))
    if len(results) > 1:
        for label, agg in (("mean", statistics.fmean), ("worst", min)):
            cells = []
            for m in shown:
                kept = [r.methods[m]["kept_pct"] for r in results if r.methods.get(m, {}).get("kept_pct") is not None]
                zone = min(results, key=lambda r: r.methods[m]["kept_pct"]).zone if label == "worst" else ""
                cells.append(f"{agg(kept):.0f}%{' ' + zone if zone else ''}" if kept else "-")
            perfect = agg([r.methods["perfect"]["saving_pct"] for r in results])
            lines.append(f"{label:<13} {'':>6} {perfect:>7.1f}%"
                         + "".join(f" {c:>30}" for c in cells))
    return lines


def _cell(m: dict | None) -> str:
    if not m:
        return "-"
    kept = f"{m['kept_pct']:.0f}%" if m["kept_pct"] is not None else "-"
    mape = f"{m['mape_24h_pct']:.1f}" if m["mape_24h_pct"] is not None else "-"
    rank = f"{m['rank_corr_24h']:.2f}" if m["rank_corr_24h"] is not None else "-"
    return f"{kept} / {mape} / {rank}"


def plot(results: list[ZoneResult], methods: tuple[str, ...], path: Path, title: str) -> None:
    """Grouped bars: kept % per zone (x) and method (colour), with the 100 % line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [m for m in methods if m != "perfect"]
    zones = [r.zone for r in results]
    width = 0.8 / max(1, len(shown))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(zones) + 2), 4.2))
    x = np.arange(len(zones))
    for k, m in enumerate(shown):
        vals = [r.methods.get(m, {}).get("kept_pct") or 0.0 for r in results]
        ax.bar(x + (k - (len(shown) - 1) / 2) * width, vals, width, label=m)
    ax.axhline(100, color="black", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(zones, rotation=45, ha="right")
    ax.set_ylabel("kept of the perfect-forecast saving (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, ncol=len(shown), loc="upper center", bbox_to_anchor=(0.5, -0.45))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class Progress:
    """Progress of a long run on stderr (a tqdm bar of model fits) and a line per method."""

    def __init__(self, total_fits: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total_fits, unit="fit", file=sys.stderr, dynamic_ncols=True, mininterval=5)

    def tick(self) -> None:
        self.bar.update(1)

    def method_done(self, zone: str, name: str, m: dict) -> None:
        kept = f"{m['kept_pct']:.1f}%" if m["kept_pct"] is not None else "-"
        self.bar.write(f"  {zone} {name}: saving {m['saving_pct']:.2f}%, kept {kept}, MAPE {m['mape_24h_pct']:.2f}%, "
                       f"rank {m['rank_corr_24h']:.3f}, forecast {m['forecast_s']:.1f} s, "
                       f"replay {m['replay_s']:.1f} s, "
                       f"fallbacks {m['fallbacks']}")

    def close(self) -> None:
        self.bar.close()


def expected_fits(jobs: Jobs, methods: tuple[str, ...], refit_h: int) -> int:
    """Model fits a zone needs (own: one per refit period planned in, sarimax: one per day)."""
    ticks = planning_hours(jobs)
    return int(("own" in methods) * len(np.unique((ticks - 1) // refit_h))
               + ("sarimax" in methods) * len(np.unique(ticks // 24)))


def _write_json(args, results: list[ZoneResult], wall_s: float) -> None:
    args.json.write_text(json.dumps({
        "year": args.year, "prior_year": not args.no_prior_year, "arrivals": args.arrivals,
        "every_weeks": args.every_weeks, "jobs_file": args.jobs.name,
        "refit_h": args.refit_h,
        "max_wait_s": MAX_WAIT_S, "slot_s": SLOT_S, "wall_s": wall_s,
        "zones": {r.zone: {"jobs": r.jobs, **r.methods} for r in results}}, indent=2))


def savings_main(args, folders: list[Path]) -> int:
    """`forecast_eval.py --savings`: the table, `--json` and `--plot`."""
    methods = tuple(args.methods.split(","))
    unknown = set(methods) - set(METHODS)
    if unknown:
        print(f"unknown method(s) {', '.join(sorted(unknown))}; use {', '.join(METHODS)}", file=sys.stderr)
        return 2
    jobs = place_arrivals(read_trace(args.jobs), args.arrivals, args.year, args.every_weeks)
    t0 = time.perf_counter()
    results: list[ZoneResult] = []
    progress = Progress(len(folders) * expected_fits(jobs, methods, args.refit_h))
    print(f"Savings kept, {args.year}, GAIA's setting ({args.arrivals} arrivals of {args.jobs.name}"
          + (f" every {args.every_weeks} weeks" if args.arrivals == "year" else "") + ", 24 h slack, "
          f"hourly greedy vs run-at-arrival); own model refitted every {args.refit_h} h", flush=True)
    try:
        for folder in folders:
            arr, base = load_years(folder, args.year, prior_year=not args.no_prior_year)
            if not len(arr):
                continue
            results.append(evaluate_zone(folder.name, arr, base, jobs, methods, refit_h=args.refit_h,
                                         progress=progress))
            if args.json:  # after every zone: a long run stopped early keeps what it measured
                _write_json(args, results, time.perf_counter() - t0)
    finally:
        progress.close()
    wall_s = time.perf_counter() - t0
    print("\n".join(table_lines(results, methods)))
    print(f"cells: kept % of the perfect saving / MAPE % next 24 h / Spearman rank next 24 h; wall {wall_s:.0f} s")
    if args.json:
        _write_json(args, results, wall_s)
    if args.plot:
        plot(results, methods, args.plot, f"Perfect-forecast saving kept, {args.year}, "
                                          f"{args.arrivals} arrivals, GAIA setting")
    return 0
