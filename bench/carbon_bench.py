#!/usr/bin/env python3
"""Carbon-signal store benchmark: a year's import, intensity() and 72 h forecast() latency.

For each database (SQLite file and/or a fresh PostgreSQL database) it:

1. migrates an empty store (not timed);
2. imports one zone's full-year Electricity Maps hourly CSV (8,760 rows) through
   `CarbonWrites.import_file` (parse + validate + upsert, one transaction) and times it;
   target <= 2 s. A second import of the same file (all upserts) is timed for information;
3. imports three more zones untimed, so queries run against a multi-zone table;
4. times `intensity(zone, t)` and `forecast(zone, t, t + 72 h, as_of=t)` at N random hours of
   the year (the forecast takes the own-forecast path: actuals up to t, then the baseline
   from history, as a planner or simulator sees it); targets: median <= 5 ms each.

Run: `.venv/bin/python bench/carbon_bench.py [--db sqlite|postgres|both] [--zone DE-LU]
[--calls 500] [--json FILE]`. PostgreSQL comes from CARBONSCHED_TEST_PG_URL (default
postgresql+psycopg://postgres@127.0.0.1:5432/test; a scratch database is created and
dropped). Needs ../shared/data/carbon/electricitymaps. A script, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DATA = Path(os.environ.get("CARBONSCHED_SHARED_DATA", ROOT.parent / "shared" / "data")) / "carbon" / "electricitymaps"
PG_ADMIN_URL = os.environ.get("CARBONSCHED_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
TARGET_IMPORT_S = 2.0
TARGET_QUERY_MS = 5.0
EXTRA_ZONES = ("GB", "US-CAL-CISO", "AU-NSW")


@contextmanager
def database(kind: str) -> Iterator[str]:
    """A URL of a fresh, empty database of `kind`, removed afterwards."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="carbon-bench-") as d:
            yield f"sqlite:///{d}/bench.db"
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"cs_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def timed_ms(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def bench_one(kind: str, zone_dir: str, year: int, calls: int, seed: int) -> dict:
    from scheduler.carbon import CarbonSignals
    from scheduler.store import Store

    path = DATA / zone_dir / f"{zone_dir}_{year}_hourly.csv"
    with database(kind) as url:
        store = Store(url)
        try:
            store.upgrade()
            signals = CarbonSignals(store, track_status=False)
            t0 = time.perf_counter()
            result = signals.writes.import_file(path)
            import_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            signals.writes.import_file(path)
            reimport_s = time.perf_counter() - t0
            for extra in EXTRA_ZONES:
                p = DATA / extra / f"{extra}_{year}_hourly.csv"
                if p.exists():
                    signals.writes.import_file(p)
            zone = result.zones[0]
            rng = random.Random(seed)
            start = datetime(year, 1, 15, tzinfo=timezone.utc)
            hours = [start + timedelta(hours=rng.randrange(0, 24 * 330), minutes=rng.randrange(60))
                     for _ in range(calls)]
            it = iter(hours)
            signals.intensity(zone, hours[0])  # warm the connection pool and statement cache
            signals.forecast(zone, hours[0], hours[0] + timedelta(hours=72), as_of=hours[0])
            intensity_ms = timed_ms(lambda: signals.intensity(zone, next(it)), calls)
            it = iter(hours)

            def one_forecast() -> None:
                t = next(it)
                fc = signals.forecast(zone, t, t + timedelta(hours=72), as_of=t)
                if fc.gaps or fc.level != "own":
                    raise AssertionError(f"unexpected forecast at {t}: level {fc.level}, gaps {fc.gaps}")

            forecast_ms = timed_ms(one_forecast, calls)
        finally:
            store.dispose()
    return {
        "db": kind, "zone": zone, "file": str(path), "rows": result.rows_stored,
        "import_s": import_s, "reimport_s": reimport_s,
        "intensity_ms_median": statistics.median(intensity_ms),
        "intensity_ms_p95": statistics.quantiles(intensity_ms, n=20)[-1],
        "forecast72h_ms_median": statistics.median(forecast_ms),
        "forecast72h_ms_p95": statistics.quantiles(forecast_ms, n=20)[-1],
        "calls": calls,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    ap.add_argument("--zone", default="DE-LU", help="zone folder under the data dir (default DE-LU)")
    ap.add_argument("--year", type=int, default=2022)
    ap.add_argument("--calls", type=int, default=500, help="queries per measurement (default 500)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    if not (DATA / args.zone).is_dir():
        print(f"no data for {args.zone} under {DATA} (needs ../shared/data)", file=sys.stderr)
        return 2
    kinds = ["sqlite", "postgresql"] if args.db == "both" else ["postgresql" if args.db == "postgres" else "sqlite"]
    results = [bench_one(k, args.zone, args.year, args.calls, args.seed) for k in kinds]

    print(f"carbon store benchmark: {args.zone} {args.year} ({results[0]['rows']:,} rows), "
          f"{args.calls} queries each, median (p95)")
    print(f"{'db':<11} {'measure':<34} {'result':>18} {'target':>10}  verdict")
    failed = False
    for r in results:
        rows = [
            ("import one year (parse+store)", f"{r['import_s']:.3f} s", f"<= {TARGET_IMPORT_S:g} s",
             r["import_s"] <= TARGET_IMPORT_S),
            ("re-import same year (upserts)", f"{r['reimport_s']:.3f} s", "-", None),
            ("intensity(zone, t)", f"{r['intensity_ms_median']:.2f} ({r['intensity_ms_p95']:.2f}) ms",
             f"<= {TARGET_QUERY_MS:g} ms", r["intensity_ms_median"] <= TARGET_QUERY_MS),
            ("forecast(zone, t, t+72h, as_of=t)",
             f"{r['forecast72h_ms_median']:.2f} ({r['forecast72h_ms_p95']:.2f}) ms",
             f"<= {TARGET_QUERY_MS:g} ms", r["forecast72h_ms_median"] <= TARGET_QUERY_MS),
        ]
        for name, value, target, ok in rows:
            verdict = "-" if ok is None else ("PASS" if ok else "FAIL")
            failed |= ok is False
            print(f"{r['db']:<11} {name:<34} {value:>18} {target:>10}  {verdict}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
