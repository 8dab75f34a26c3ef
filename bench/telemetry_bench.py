#!/usr/bin/env python3
"""Telemetry benchmark: sampler cost and store ingest at 64 GPUs x 10 Hz, and the rollup of
one day of 1 Hz samples for 64 GPUs, on SQLite and PostgreSQL.

    .venv/bin/python bench/telemetry_bench.py [--db sqlite|postgres|both] [--seconds 60]

Targets: sampler CPU <= 5% of one core; ingest keeps up (no backlog, nothing
dropped); rollup of a day (5.5 M rows) <= 10 s. The sampler and the writer run exactly as in
the agent: a sampling thread, and a flush of the buffer into the store once a second.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policies.model.catalog import parse_fleet  # noqa: E402
from scheduler.samples import SampleStore  # noqa: E402
from scheduler.store import Store  # noqa: E402
from telemetry.gpu import EmulatedBackend, EmulatedModel  # noqa: E402
from telemetry.sampler import Sampler  # noqa: E402

PG_ADMIN = os.environ.get("CARBONSCHED_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def fresh_db(kind: str):
    if kind == "sqlite":
        d = tempfile.mkdtemp(prefix="cs-telebench-")
        return f"sqlite:///{d}/bench.db", lambda: None
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from databases import make_pg_database

    return make_pg_database()


def ingest(kind: str, seconds: float, hz: float, gpus: int) -> dict:
    url, drop = fresh_db(kind)
    store = Store(url)
    store.upgrade()
    try:
        backend = EmulatedBackend([EmulatedModel(m.name, m.vendor, m.memory_gib, m.idle_w, m.tdp_w)
                                   for m in parse_fleet(f"{gpus}xMI300X")], node="bench", seed=1)
        for d in backend.devices()[: gpus // 2]:
            backend.set_busy(d.uuid, True)
        gpu_of = {d.uuid: i + 1 for i, d in enumerate(backend.devices())}
        samples = SampleStore(store)
        sampler = Sampler(backend, hz=hz)
        flush_s, written, backlog = [], 0, []
        sampler.start()
        t_end = time.monotonic() + seconds
        next_flush = time.monotonic() + 1.0
        while time.monotonic() < t_end:
            time.sleep(max(0.0, next_flush - time.monotonic()))
            next_flush += 1.0
            batch = sampler.drain()
            t0 = time.perf_counter()
            written += samples.write([(gpu_of[r.uuid], r) for r in batch])
            flush_s.append(time.perf_counter() - t0)
            backlog.append(sampler.pending())
            if len(flush_s) % 10 == 0:
                print(f"  {kind}: {len(flush_s):3d}s  {written:7d} rows  last flush "
                      f"{flush_s[-1] * 1000:5.1f} ms", flush=True)
        sampler.stop()
        stats = sampler.stats
        expected = seconds * hz * gpus
        return {
            "db": kind, "gpus": gpus, "hz": hz, "seconds": seconds,
            "reads": stats.reads, "expected_reads": int(expected), "rows_written": written,
            "late_rounds": stats.late_rounds, "dropped": stats.dropped,
            "sampler_cpu_pct": 100 * stats.cpu_s / seconds,
            "read_us": stats.mean_read_us,
            "flush_ms_p50": 1000 * statistics.median(flush_s),
            "flush_ms_max": 1000 * max(flush_s),
            "max_backlog_rows": max(backlog) if backlog else 0,
        }
    finally:
        store.dispose()
        drop()


def day_rollup(kind: str, gpus: int) -> dict:
    url, drop = fresh_db(kind)
    store = Store(url)
    store.upgrade()
    try:
        day_s = 86400
        t0 = 1_800_000_000.0 - 2 * day_s
        n = day_s * gpus
        print(f"  {kind}: loading {n:,} samples (one day, 1 Hz, {gpus} GPUs) ...", flush=True)
        load_start = time.perf_counter()
        if store.dialect == "postgresql":
            raw = store.engine.raw_connection()
            try:
                with raw.cursor() as cur, cur.copy(
                        "COPY gpu_samples (minute_s, gpu_id, t_s, power_w, energy_j) FROM STDIN") as copy:
                    for g in range(1, gpus + 1):
                        buf = io.StringIO()
                        for i in range(day_s):
                            buf.write(f"{int((t0 + i) // 60) * 60}\t{g}\t{t0 + i}\t{300 + (i % 400)}\t{i * 300.0}\n")
                        copy.write(buf.getvalue())
                raw.commit()
            finally:
                raw.close()
        else:
            raw = store.engine.raw_connection()
            try:
                cur = raw.cursor()
                cur.execute("BEGIN")
                for g in range(1, gpus + 1):
                    cur.executemany("INSERT INTO gpu_samples (minute_s, gpu_id, t_s, power_w, energy_j) "
                                    "VALUES (?,?,?,?,?)",
                                    ((int((t0 + i) // 60) * 60, g, t0 + i, 300.0 + (i % 400), i * 300.0)
                                     for i in range(day_s)))
                cur.execute("COMMIT")
            finally:
                raw.close()
        load_s = time.perf_counter() - load_start
        print(f"  {kind}: loaded in {load_s:.1f}s; rolling up ...", flush=True)
        start = time.perf_counter()
        folded = SampleStore(store).rollup(retention_s=3600, now_s=1_800_000_000.0)
        rollup_s = time.perf_counter() - start
        return {"db": kind, "rows": n, "folded": folded, "rollup_s": rollup_s, "load_s": load_s}
    finally:
        store.dispose()
        drop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--skip-rollup", action="store_true")
    args = ap.parse_args()
    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    ing, rol = [], []
    for kind in kinds:
        print(f"ingest: {args.gpus} emulated GPUs at {args.hz:g} Hz for {args.seconds:g}s on {kind}")
        ing.append(ingest("postgresql" if kind == "postgres" else kind, args.seconds, args.hz, args.gpus))
    if not args.skip_rollup:
        for kind in kinds:
            print(f"rollup: one day of 1 Hz samples for {args.gpus} GPUs on {kind}")
            rol.append(day_rollup("postgresql" if kind == "postgres" else kind, args.gpus))

    print("\n== sampler and ingest ==")
    print(f"{'db':10} {'reads':>8} {'expected':>8} {'late':>5} {'dropped':>7} {'cpu %core':>9} "
          f"{'read µs':>8} {'flush p50 ms':>12} {'flush max ms':>12} {'backlog':>7}  verdict")
    for r in ing:
        ok = r["sampler_cpu_pct"] <= 5.0 and r["dropped"] == 0 and r["max_backlog_rows"] < r["gpus"] * r["hz"] * 2
        print(f"{r['db']:10} {r['reads']:8d} {r['expected_reads']:8d} {r['late_rounds']:5d} {r['dropped']:7d} "
              f"{r['sampler_cpu_pct']:9.2f} {r['read_us']:8.1f} {r['flush_ms_p50']:12.1f} "
              f"{r['flush_ms_max']:12.1f} {r['max_backlog_rows']:7d}  {'PASS' if ok else 'FAIL'}")
    if rol:
        print("\n== rollup of one day (target <= 10 s) ==")
        for r in rol:
            print(f"{r['db']:10} rows {r['rows']:,}  folded {r['folded']:,}  rollup {r['rollup_s']:.2f}s  "
                  f"{'PASS' if r['rollup_s'] <= 10 else 'FAIL'}   (loading took {r['load_s']:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
