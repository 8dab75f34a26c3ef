"""policies.model.energy: seed profiles from the performance model, job shapes, fits, carbon integrals."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

from policies.model.catalog import catalog
from policies.model.energy import (ProfileBook, curve_integral_g_per_kwh_s, fits, generic_runtime_scale, job_gco2,
                             job_shape, seed_profiles, shape_arrays)
from policies.types import CarbonCurve, Profile, QueuedJob
from policies.model.perf_model import OperatingPoint, parts, predict, presets

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


def test_seeds_are_the_performance_models_points_for_every_preset_that_fits():
    """One seed per (preset, catalog model) whose precision the part has and that fits on at
    most 8 GPUs; inference seeds carry a finite latency, nominal training ones none."""
    seeds = seed_profiles()
    by = {(p.workload, p.model): p for p in seeds}
    for name, w in presets().items():
        for model, part in parts().items():
            if model not in catalog():
                continue
            expected = part.supports(w.precision) and (
                w.kind == "train" or predict(w, model, OperatingPoint(1, w.precision, 8)).fits)
            assert ((name, model) in by) == expected, (name, model)
    for p in seeds:
        assert p.prompts_per_s > 0 and 0 < p.power_w <= catalog()[p.model].tdp_w * 1.0001
        if presets()[p.workload].kind == "inference":
            assert 0 < p.latency_p50_ms <= p.latency_p95_ms
        else:
            assert math.isnan(p.latency_p95_ms)
        assert p.source.startswith("perf model: " if presets()[p.workload].kind == "inference" else "nominal: ")


def test_seeds_say_where_each_figure_comes_from():
    by = {(p.workload, p.model): p for p in seed_profiles()}
    assert "throughput corrected" in by[("llm-chat-8b", "H100")].source
    assert "correction x" in by[("llm-chat-8b", "H100")].source and "H100 rows" in by[("llm-chat-8b", "H100")].source
    assert "ROCm/vLLM stack factor" in by[("llm-chat-8b", "MI300X")].source
    assert "throughput roofline" in by[("llm-chat-8b", "MI300X")].source
    assert "power power-model" in by[("llm-chat-8b", "MI300X")].source


def test_seeds_follow_the_hardware_a_part_no_worse_is_never_slower():
    """The issue's inversion (MI325X at half MI300X's throughput) is gone: same compute, more
    bandwidth and memory, so at least as fast per GPU; and H200 is never below H100 although
    H100 was measured and H200 never was (issue 27: one corrected path, no tolerance)."""
    by = {(p.workload, p.model): p for p in seed_profiles()}
    for w in ("llm-chat-8b", "llm-code", "llm-reason"):
        assert by[(w, "MI325X")].prompts_per_s >= by[(w, "MI300X")].prompts_per_s
        assert by[(w, "H200")].prompts_per_s >= by[(w, "H100")].prompts_per_s


def test_later_profiles_override_earlier_ones_for_the_same_key():
    mine = Profile("llm-chat-8b", "H100", 1.0, 100.0, 1.0, 2.0, "measured here (n=3)", 3)
    book = ProfileBook(seed_profiles() + (mine,))
    assert book.get("llm-chat-8b", "h100") == mine
    assert "train" in book.workloads()


def test_a_workload_jobs_runtime_is_prompts_over_k_times_throughput():
    p = Profile("w", "H100", prompts_per_s=5.0, power_w=600.0, latency_p50_ms=1, latency_p95_ms=2)
    job = QueuedJob(1, 4, 0.0, NOW, workload="w", prompts=6000)
    s = job_shape(job, "H100", ProfileBook([p]), 3600.0)
    assert s.runtime_s == pytest.approx(6000 / (4 * 5.0))
    assert s.power_w == 2400.0 and s.energy_j == pytest.approx(2400.0 * 300.0)


def test_a_generic_job_runs_its_estimate_on_the_reference_gpu_and_scales_elsewhere():
    job = QueuedJob(1, 1, 0.0, NOW, est_runtime_s=3600.0)
    book = ProfileBook()
    assert job_shape(job, "H100", book, 60.0).runtime_s == 3600.0
    b200 = job_shape(job, "B200", book, 60.0).runtime_s
    assert b200 == pytest.approx(3600.0 * generic_runtime_scale("B200")) and b200 < 3600.0
    assert job_shape(job, "A100", book, 60.0).runtime_s > 3600.0
    assert job_shape(QueuedJob(2, 1, 0.0, NOW), "H100", book, 600.0).runtime_s == 600.0


def test_fits_checks_memory_then_latency_slo():
    p = Profile("w", "A100", 1.0, 300.0, 100.0, 900.0)
    book = ProfileBook([p])
    assert fits(QueuedJob(1, 1, 100.0, NOW), "A100", 80.0, book) == "memory"
    assert fits(QueuedJob(1, 1, 10.0, NOW, workload="w", latency_slo_ms=500), "A100", 80.0, book) == "slo"
    assert fits(QueuedJob(1, 1, 10.0, NOW, workload="w", latency_slo_ms=1000), "A100", 80.0, book) is None


def test_integral_over_an_intensity_step_is_hand_computable():
    """100 g/kWh for the first hour, 300 after: 30 min before and 30 min after the step."""
    c = CarbonCurve("Z", NOW, 3600.0, (100.0, 300.0))
    start, end = NOW + timedelta(minutes=30), NOW + timedelta(minutes=90)
    assert curve_integral_g_per_kwh_s(c, start, end) == pytest.approx(100 * 1800 + 300 * 1800)
    # 1 kW for that hour at PUE 1.5: 1 kWh x mean 200 g/kWh x 1.5 = 300 g
    assert job_gco2(c, start, 3600.0, 1000.0, pue=1.5) == pytest.approx(300.0)
    # flat beyond the ends: the last value holds
    assert curve_integral_g_per_kwh_s(c, NOW + timedelta(hours=5), NOW + timedelta(hours=6)) == \
        pytest.approx(300 * 3600)
    assert job_gco2(None, start, 3600.0, 1000.0) is None


def test_catalog_rows_carry_fp8_throughput_and_their_data_sheet():
    for m in catalog().values():
        assert m.source.startswith(("AMD", "NVIDIA")) and "http" in m.source
        assert m.fp8_dense_tflops == 0 if m.name.startswith("A100") else m.fp8_dense_tflops >= m.bf16_dense_tflops


def test_shape_arrays_are_job_shape_for_many_jobs_at_once():
    """The vectorised planner path computes exactly (not approximately) what job_shape does:
    workload jobs with and without a prompt count, generic jobs, a workload with no profile."""
    book = ProfileBook(seed_profiles())
    jobs = [QueuedJob(1, 2, 0.0, NOW, workload="llm-chat-8b", prompts=40000),
            QueuedJob(2, 1, 0.0, NOW, workload="llm-code", est_runtime_s=5400.0),
            QueuedJob(3, 4, 0.0, NOW, est_runtime_s=7200.0),
            QueuedJob(4, 1, 0.0, NOW),
            QueuedJob(5, 8, 0.0, NOW, workload="no-such-class", prompts=10, est_runtime_s=0.5),
            QueuedJob(6, 1, 0.0, NOW, workload="train", prompts=3)]
    models = sorted(catalog())
    arrays = shape_arrays(jobs, models, book, 900.0)
    for i, job in enumerate(jobs):
        for c, model in enumerate(models):
            shape = job_shape(job, model, book, 900.0)
            assert arrays.runtime_s[i, c] == shape.runtime_s, (job.id, model)
            assert arrays.power_w[i, c] == shape.power_w, (job.id, model)
    assert arrays.runtime_s[4].min() == 1.0  # clamped like job_shape


def test_integrals_of_many_curves_each_use_their_own_curve():
    """Integrals are memoised per curve object; a fresh curve (even one that reuses a freed
    object's id) is integrated from its own values."""
    for v in range(1, 300):
        c = CarbonCurve("Z", NOW, 3600.0, (float(v), 2.0 * v))
        assert curve_integral_g_per_kwh_s(c, NOW, NOW + timedelta(hours=2)) == pytest.approx(3 * v * 3600)
        assert job_gco2(c, NOW, 3600.0, 1000.0) == pytest.approx(float(v))
