"""GPU samples in the store: batched writes, minute rollups, per-job energy (SQLite and PostgreSQL)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from scheduler.samples import SampleStore
from scheduler.store.telemetry_models import gpu_power_minutes, gpu_samples
from telemetry.energy import Sample


@pytest.fixture
def samples(store):
    return SampleStore(store)


def count(store, table) -> int:
    with store.read() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


def test_a_batch_is_written_once_even_if_resent(samples, store):
    batch = [(1, Sample(1000.0 + i, 300.0, 10.0 * i)) for i in range(50)]
    assert samples.write(batch) == 50
    samples.write(batch[:10])  # a retried flush must not duplicate rows
    assert count(store, gpu_samples) == 50


def test_rollup_folds_old_samples_into_minutes_and_keeps_recent_ones(samples, store):
    now = 1_800_000_000.0  # on a minute boundary
    old = [(7, Sample(now - 7200 + i, 100.0 + (i % 2) * 100, None)) for i in range(120)]  # 2 min at 1 Hz
    recent = [(7, Sample(now - 10 + i, 500.0, None)) for i in range(10)]
    samples.write(old + recent)
    folded = samples.rollup(retention_s=3600, now_s=now)
    assert folded == 120
    assert count(store, gpu_samples) == 10
    with store.read() as conn:
        rows = conn.execute(select(gpu_power_minutes).order_by(gpu_power_minutes.c.minute_s)).all()
    assert [r.samples for r in rows] == [60, 60]
    first = rows[0]
    assert (first.min_w, first.mean_w, first.max_w) == (100.0, 150.0, 200.0)
    # 60 samples one second apart cover 60 s at a mean of 150 W.
    assert first.energy_j == pytest.approx(150.0 * 60)


def test_late_samples_for_an_already_rolled_minute_are_merged_not_lost(samples, store):
    now = 1_800_000_000.0
    samples.write([(3, Sample(now - 7200 + i, 100.0, None)) for i in range(0, 60, 2)])
    samples.rollup(retention_s=3600, now_s=now)
    samples.write([(3, Sample(now - 7200 + i, 300.0, None)) for i in range(1, 60, 2)])
    samples.rollup(retention_s=3600, now_s=now)
    with store.read() as conn:
        row = conn.execute(select(gpu_power_minutes)).one()
    assert row.samples == 60
    assert row.mean_w == pytest.approx(200.0)
    assert (row.min_w, row.max_w) == (100.0, 300.0)


def test_job_energy_uses_the_counter_when_it_agrees_with_power(samples):
    t0 = time.time() - 100
    samples.write([(1, Sample(t0 + i, 700.0, 5e6 + 700.0 * i)) for i in range(61)])
    samples.write([(2, Sample(t0 + i, 650.0, 9e6 + 650.0 * i)) for i in range(61)])
    e = samples.job_energy([1, 2], t0, t0 + 60)
    assert e.method == "counter"
    assert e.energy_j == pytest.approx(60 * (700 + 650))


def test_job_energy_falls_back_to_power_when_a_counter_resets(samples):
    t0 = time.time() - 100
    samples.write([(1, Sample(t0 + i, 500.0, (500.0 * i) if i < 30 else 500.0 * (i - 30)))
                   for i in range(61)])
    e = samples.job_energy([1], t0, t0 + 60)
    assert e.method == "integral"
    assert e.energy_j == pytest.approx(30_000.0)


def test_job_energy_includes_exact_start_and_end_readings(samples):
    t0 = time.time() - 100
    samples.write([(1, Sample(t0 + i, 400.0, 400.0 * i)) for i in range(1, 10)])
    extra = {1: [Sample(t0, 400.0, 0.0), Sample(t0 + 10, 400.0, 4000.0)]}
    e = samples.job_energy([1], t0, t0 + 10, extra)
    assert e.energy_j == pytest.approx(4000.0)


def test_no_samples_means_no_figure(samples):
    e = samples.job_energy([42], 0.0, 10.0)
    assert e.energy_j is None and e.method == "none"


def test_a_big_catch_up_rollup_keeps_recent_samples_and_loses_nothing(samples, store):
    """Large rollups take a bulk path on PostgreSQL; either way the minute rows and the
    recent samples must be exactly as after a row-by-row rollup."""
    now = 1_800_000_000.0
    old = [(g, Sample(now - 7200 + i, 200.0, None)) for g in range(1, 5) for i in range(3600)]
    recent = [(g, Sample(now - 600 + i, 400.0, None)) for g in range(1, 5) for i in range(600)]
    samples.write(old)
    samples.write(recent)
    if store.dialect == "postgresql":
        with store.write() as conn:  # statistics as autovacuum would leave them
            conn.exec_driver_sql("ANALYZE gpu_samples")
    assert samples.rollup(retention_s=3600, now_s=now) == len(old)
    assert count(store, gpu_samples) == len(recent)
    with store.read() as conn:
        minutes = conn.execute(select(func.count(), func.sum(gpu_power_minutes.c.samples))
                               .select_from(gpu_power_minutes)).one()
    assert tuple(minutes) == (4 * 60, len(old))
