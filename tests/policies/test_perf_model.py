"""The cross-vendor performance and energy model (policies/model/perf_model.py), as a specification.

- A part no worse in bandwidth, compute (every precision), memory and power limit, under the
  same vendor's software, is never predicted slower or later to first token, on the
  planner's own path (the model times the measured correction), with no tolerance; the
  model alone is also never less energy-efficient per token.
- Memory: a 70B model in BF16 does not fit on one 80 GB GPU and fits on one MI300X; every
  configuration ML.ENERGY ran fits.
- Every named workload (profile classes, CLI names) has a preset; no figure is NaN.
- A measured (workload, GPU) is the model times a correction smooth in batch; unmeasured
  GPUs say roofline.
- The serving stack is a fitted factor per vendor and engine, from MLPerf results: an AMD
  part is not predicted ahead of its NVIDIA peer where MLPerf says parity.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import fields, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.model import perf_model as pm

BATCHES = (1, 8, 64, 256)


def dominates(a: pm.Part, b: pm.Part) -> bool:
    """a is no worse than b in bandwidth, every precision's compute, memory and power limit,
    and runs the same vendor's software."""
    return (pm.vendor(a.name) == pm.vendor(b.name) and a.hbm_tb_per_s >= b.hbm_tb_per_s
            and a.memory_gib >= b.memory_gib and a.tdp_w >= b.tdp_w
            and all(a.peak_tflops.get(k, 0.0) >= v for k, v in b.peak_tflops.items()))


def assert_no_slower(better: pm.Prediction, worse: pm.Prediction) -> None:
    """No tolerance: the planner's figures keep the hardware order exactly."""
    assert better.output_tokens_per_s >= worse.output_tokens_per_s
    assert better.prompts_per_s >= worse.prompts_per_s
    assert better.tpot_p95_ms <= worse.tpot_p95_ms
    assert better.ttft_p95_ms <= worse.ttft_p95_ms
    assert better.fits or not worse.fits


def assert_no_worse(better: pm.Prediction, worse: pm.Prediction) -> None:
    tol = 1e-9
    assert better.output_tokens_per_s >= worse.output_tokens_per_s * (1 - tol)
    assert better.j_per_token <= worse.j_per_token * (1 + tol)
    assert better.tpot_p95_ms <= worse.tpot_p95_ms * (1 + tol)
    assert better.ttft_p95_ms <= worse.ttft_p95_ms * (1 + tol)
    assert better.fits or not worse.fits


def inference_presets() -> list[pm.Workload]:
    return [w for w in pm.presets().values() if w.kind == "inference"]


def test_dominating_catalog_parts_are_never_worse_at_any_operating_point():
    """The model alone: never slower, never more joules per token."""
    parts = [p for p in pm.parts().values()]
    pairs = [(a, b) for a, b in itertools.permutations(parts, 2) if dominates(a, b)]
    assert len(pairs) >= 5, "the catalog should hold several dominating pairs (e.g. H200 over H100)"
    for (a, b), w, batch, tp in itertools.product(pairs, pm.presets().values(), BATCHES, (1, 2, 8)):
        for precision in b.peak_tflops:
            point = pm.OperatingPoint(batch, precision, tp)
            assert_no_worse(pm.predict(w, a, point, use_measurements=False),
                            pm.predict(w, b, point, use_measurements=False))


def test_on_the_planners_path_a_dominating_part_is_never_slower_with_no_tolerance():
    """The path the planner, profiles, bench.model and the simulator use (measured
    corrections on), every batch limit of the frontier: H200 is never slower than H100
    (although H100 was measured and H200 never was), B200 never slower than either."""
    parts = [p for name, p in pm.parts().items() if name in pm.catalog()]
    pairs = [(a, b) for a, b in itertools.permutations(parts, 2) if dominates(a, b)]
    names = {(a.name, b.name) for a, b in pairs}
    assert {("H200", "H100"), ("B200", "H100"), ("B200", "H200"), ("MI325X", "MI300X")} <= names
    for (a, b), w in itertools.product(pairs, inference_presets()):
        for batch, tp in itertools.product((1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), (1, 2, 4, 8)):
            point = pm.OperatingPoint(batch, w.precision, tp)
            if not b.supports(w.precision):
                continue
            assert_no_slower(pm.predict(w, a.name, point), pm.predict(w, b.name, point))


def test_h200_takes_h100s_measured_correction_and_so_is_never_the_slower():
    w = pm.preset("llm-chat-8b")
    for batch in (64, 512):
        h100, h200 = (pm.predict(w, g, pm.OperatingPoint(batch, "bf16", 1)) for g in ("H100", "H200"))
        assert h200.speed_correction == h100.speed_correction != 1.0
        assert "H100 rows" in h200.sources["correction"]
        assert h200.tpot_p95_ms <= h100.tpot_p95_ms


def test_the_inversions_of_issue_18_are_gone():
    for name in ("llm-chat-8b", "llm-chat-70b", "llm-code", "llm-reason"):
        w = pm.preset(name)
        point = pm.OperatingPoint(64, "bf16", 4 if name == "llm-chat-70b" else 1)
        mi300x, mi325x, mi355x = (pm.predict(w, g, point) for g in ("MI300X", "MI325X", "MI355X"))
        assert mi325x.prompts_per_s >= mi300x.prompts_per_s and mi355x.prompts_per_s >= mi325x.prompts_per_s
        assert mi325x.j_per_prompt <= mi300x.j_per_prompt and mi355x.j_per_prompt <= mi325x.j_per_prompt


part_figures = st.tuples(st.floats(0.5, 10.0), st.floats(50.0, 5000.0), st.floats(16.0, 512.0),
                         st.floats(200.0, 2000.0), st.booleans())


def make_part(name: str, bw: float, bf16: float, mem: float, tdp: float, fp8: bool) -> pm.Part:
    peak = {"bf16": bf16, "fp8": 2 * bf16} if fp8 else {"bf16": bf16}
    return pm.Part(name, mem, bw, peak, tdp)


@settings(max_examples=150, deadline=None)
@given(base=part_figures, gains=st.tuples(*(st.floats(1.0, 3.0) for _ in range(4))), fp8_gain=st.booleans(),
       workload=st.sampled_from(sorted(n for n, w in pm.presets().items() if w.kind == "inference")),
       batch=st.sampled_from((1, 4, 32, 128, 512, 2048)), tp=st.sampled_from((1, 2, 4, 8)))
def test_a_part_better_in_every_figure_is_never_predicted_worse(base, gains, fp8_gain, workload, batch, tp):
    bw, bf16, mem, tdp, fp8 = base
    worse = make_part("worse", bw, bf16, mem, tdp, fp8)
    better = make_part("better", bw * gains[0], bf16 * gains[1], mem * gains[2], tdp * gains[3], fp8 or fp8_gain)
    assert dominates(better, worse)
    w = pm.preset(workload)
    for precision in worse.peak_tflops:
        point = pm.OperatingPoint(batch, precision, tp)
        assert_no_worse(pm.predict(w, better, point), pm.predict(w, worse, point))


def test_70b_bf16_does_not_fit_on_one_80gb_gpu_but_fits_on_one_mi300x():
    w = pm.preset("llm-chat-70b")
    one = pm.OperatingPoint(1, "bf16", 1)
    for gpu in ("H100", "A100"):
        p = pm.predict(w, gpu, one)
        assert not p.fits and p.memory_needed_gib > p.memory_available_gib
    assert pm.predict(w, "MI300X", one).fits
    assert pm.predict(w, "H100", pm.OperatingPoint(1, "bf16", 2)).fits
    assert pm.predict(w, "H100", pm.OperatingPoint(1, "fp8", 1)).fits  # 70 GB of FP8 weights


def test_memory_need_grows_with_batch_until_it_no_longer_fits():
    w = pm.preset("llm-chat-70b")
    needs = [pm.memory_needed_gib(w, pm.OperatingPoint(b, "bf16", 1)) for b in (1, 64, 4096)]
    assert needs[0] < needs[1] < needs[2]
    assert pm.predict(w, "MI300X", pm.OperatingPoint(1, "bf16", 1)).fits
    assert not pm.predict(w, "MI300X", pm.OperatingPoint(4096, "bf16", 1)).fits


def test_every_profile_class_and_cli_workload_name_has_a_preset():
    classes = {"llm-chat-8b", "llm-chat-70b", "llm-code", "llm-reason", "train"}  # the old profiles.toml's
    for name in classes | {"llm-inference", "finetune", "eval"}:
        w = pm.preset(name)
        assert w.mean_output_tokens > 0 and w.total_params_b >= w.active_params_b > 0
    with pytest.raises(ValueError, match="known: "):
        pm.preset("llm-chat-9000b")


def test_train_and_finetune_are_labelled_nominal_everywhere():
    for name in ("train", "finetune"):
        p = pm.predict(pm.preset(name), "H100", pm.OperatingPoint(8, "bf16", 8))
        assert set(p.sources.values()) == {"nominal"}


def test_no_figure_is_nan_or_infinite_on_any_part_and_frontier_point():
    for w, gpu in itertools.product(pm.presets().values(), pm.parts()):
        points = pm.frontier(w, gpu, precisions=("bf16", "fp8", "fp4")) if w.kind == "inference" else [
            pm.predict(w, gpu, pm.OperatingPoint(8, "bf16", 8))]
        for p in points:
            for f in fields(p):
                v = getattr(p, f.name)
                if isinstance(v, float):
                    assert math.isfinite(v) and v >= 0, (w.name, gpu, p.point, f.name, v)


def test_a_precision_the_part_lacks_is_refused():
    with pytest.raises(ValueError, match="no fp8"):
        pm.predict(pm.preset("llm-chat-8b"), "A100", pm.OperatingPoint(8, "fp8", 1))
    with pytest.raises(ValueError, match="no fp4"):
        pm.predict(pm.preset("llm-chat-8b"), "MI300X", pm.OperatingPoint(8, "fp4", 1))
    assert pm.predict(pm.preset("llm-chat-8b"), "MI355X", pm.OperatingPoint(8, "fp4", 1)).fits


def test_a_measured_configuration_is_the_model_times_a_correction_smooth_in_batch():
    w = pm.preset("llm-chat-8b")
    rows = [r for r in pm.fit_rows() if r["dataset"] == "mlenergy-v3" and r["gpu"] == "H100"
            and r["model_id"] == "meta-llama/Llama-3.1-8B-Instruct" and r["num_gpus"] == 1]
    assert len(rows) >= 5
    errors = []
    for r in rows:
        p = pm.predict(w, "H100", pm.OperatingPoint(r["max_num_seqs"], "bf16", 1))
        model = pm.predict(w, "H100", p.point, use_measurements=False)
        assert p.output_tokens_per_s == pytest.approx(model.output_tokens_per_s * p.speed_correction, rel=1e-12)
        assert p.sources["throughput"] == p.sources["power"] == "corrected"
        assert "H100 rows (n=" in p.sources["correction"]
        errors.append(abs(p.output_tokens_per_s / r["output_tokens_per_s"] - 1))
    assert statistics.median(errors) <= 0.10  # a smooth line through the rows, not the rows themselves
    # smooth: log correction is a quadratic in log batch between the measured limits (its third
    # differences at evenly spaced log batches vanish; it bends: the second do not), flat outside
    c = [math.log(pm.predict(w, "H100", pm.OperatingPoint(b, "bf16", 1)).speed_correction) for b in (16, 32, 64, 128)]
    assert c[3] - 3 * c[2] + 3 * c[1] - c[0] == pytest.approx(0.0, abs=1e-9)
    assert abs(c[2] - 2 * c[1] + c[0]) > 1e-4
    lo, hi = min(r["max_num_seqs"] for r in rows), max(r["max_num_seqs"] for r in rows)
    assert pm.predict(w, "H100", pm.OperatingPoint(max(1, lo // 2), "bf16", 1)).speed_correction == \
        pm.predict(w, "H100", pm.OperatingPoint(lo, "bf16", 1)).speed_correction
    assert pm.predict(w, "H100", pm.OperatingPoint(hi * 2, "bf16", 1)).speed_correction == \
        pm.predict(w, "H100", pm.OperatingPoint(hi, "bf16", 1)).speed_correction


def test_a_mixture_of_experts_measured_expert_parallel_corrects_the_planners_group_of_that_many_gpus():
    """ML.ENERGY v3 ran Qwen3-Coder-30B-A3B on two H100s at EP 2, TP 1. The planner's
    2-GPU point of llm-code is drawn through those rows (and says so), and predicts each
    within 10 % out of sample, with the row itself left out of its correction; the model
    alone is up to 15 % fast (batch 96-382)."""
    w = pm.preset("llm-code")
    rows = [r for r in pm.fit_rows() if r["dataset"] == "mlenergy-v3" and r["gpu"] == "H100"
            and r["model_id"] == "Qwen/Qwen3-Coder-30B-A3B-Instruct" and r["num_gpus"] == 2]
    assert len(rows) >= 5 and all(r["expert_parallel"] == 2 and r["tensor_parallel"] == 1 for r in rows)
    assert [r["source"] for r in pm.correction_rows(w, "H100", 2, "bf16")] == [r["source"] for r in rows]
    for r in rows:
        point = pm.OperatingPoint(r["max_num_seqs"], "bf16", 2)
        held_out = pm.predict(w, "H100", point, leave_out=r)
        assert abs(held_out.output_tokens_per_s / r["output_tokens_per_s"] - 1) <= 0.10, r["max_num_seqs"]
    p = pm.predict(w, "H100", pm.OperatingPoint(128, "bf16", 2))
    assert "H100 rows (n=11, EP 2)" in p.sources["correction"] and p.sources["throughput"] == "corrected"
    # the single-GPU point keeps its own rows
    assert "EP" not in pm.predict(w, "H100", pm.OperatingPoint(128, "bf16", 1)).sources["correction"]


def test_a_correction_bends_only_where_enough_batch_limits_were_measured():
    """A quadratic from `CURVE_MIN_BATCHES` measured limits; fewer draw a line (a curve
    through two or three points would be the measured rows again); one, a constant."""
    xs = [3.0, 4.0, 5.0, 6.0, 7.0]
    bent = [0.1 * (x - 5.0) ** 2 for x in xs]
    assert len(pm._curve(xs, bent)) == 3 and pm._curve(xs, bent)[0] == pytest.approx(0.1)
    assert len(pm._curve(xs[:pm.CURVE_MIN_BATCHES - 1], bent[:pm.CURVE_MIN_BATCHES - 1])) == 2
    assert pm._curve([4.0, 4.0], [0.1, 0.3]) == pytest.approx((0.2,))


def test_b200_follows_its_own_rows_where_they_put_it_above_h100():
    """ML.ENERGY measured B200 on llm-chat-8b far below its roofline at small batches (3,810
    tok/s at batch 32, 12 % above H100's 3,391). The planner's path keeps that (within 10 %),
    where a correction borrowed from H100 put it 29-32 % too fast, and still never below
    H100's prediction."""
    w = pm.preset("llm-chat-8b")
    rows = {r["max_num_seqs"]: r for r in pm.fit_rows() if r["dataset"] == "mlenergy-v3" and r["gpu"] == "B200"
            and r["model_id"] == "meta-llama/Llama-3.1-8B-Instruct" and r["num_gpus"] == 1}
    for batch in (32, 64):
        point = pm.OperatingPoint(batch, "bf16", 1)
        b200, h100 = pm.predict(w, "B200", point), pm.predict(w, "H100", point)
        assert abs(b200.output_tokens_per_s / rows[batch]["output_tokens_per_s"] - 1) <= 0.10
        assert b200.output_tokens_per_s >= h100.output_tokens_per_s
        assert "B200 rows" in b200.sources["correction"]
    # where its own rows would put it below a part it dominates (ML.ENERGY's B200 ran slower
    # than H100 at batch 128-511), it is raised to that part's prediction, and says so
    point = pm.OperatingPoint(128, "bf16", 1)
    b200, h200 = pm.predict(w, "B200", point), pm.predict(w, "H200", point)
    assert b200.output_tokens_per_s >= h200.output_tokens_per_s
    assert b200.output_tokens_per_s == pytest.approx(h200.output_tokens_per_s, rel=1e-9)
    assert b200.sources["correction"].endswith("raised to H200's predicted speed")


def test_a_row_left_out_of_its_correction_is_predicted_out_of_sample():
    """bench.model's leave-one-row-out check of the planner's path: the held-out row moves
    only its own GPU's correction, and the prediction it gets is not the in-sample one."""
    w = pm.preset("llm-chat-8b")
    row = next(r for r in pm.fit_rows() if r["dataset"] == "mlenergy-v3" and r["gpu"] == "H100"
               and r["model_id"] == "meta-llama/Llama-3.1-8B-Instruct" and r["max_num_seqs"] == 128)
    point = pm.OperatingPoint(128, "bf16", 1)
    held = pm.predict(w, "H100", point, leave_out=row)
    assert held.output_tokens_per_s != pm.predict(w, "H100", point).output_tokens_per_s
    assert pm.correction_from(w, "H100", 1, "bf16", row).rows == pm.correction_of(w, "H100", 1, "bf16").rows - 1
    assert pm.predict(w, "MI300X", point, leave_out=row).output_tokens_per_s == \
        pm.predict(w, "MI300X", point).output_tokens_per_s


def test_unmeasured_gpus_say_roofline_and_measured_ones_corrected():
    w = pm.preset("llm-chat-8b")
    point = pm.OperatingPoint(100, "bf16", 1)  # a batch limit no row has
    assert pm.predict(w, "MI325X", point).sources["throughput"] == "roofline"
    assert pm.predict(w, "MI325X", point).sources["power"] == "power-model"
    assert pm.predict(w, "MI325X", point).power_uncertainty_rel >= pm.fit().power_rel_rms > 0
    assert pm.predict(w, "H100", point).sources["throughput"] == "corrected"
    assert pm.predict(w, "H200", point).sources["throughput"] == "roofline+correction"
    assert pm.predict(w, "H100", pm.OperatingPoint(100, "bf16", 8)).sources["throughput"] == "fitted"


def test_every_configuration_ml_energy_ran_fits_in_memory():
    """The memory rule counts each sequence at its mean context (input + output / 2), as the
    step model does: the batches that were measured running (each configuration's achieved
    mean batch, rounded down) are never refused."""
    by_model = {pm._PRESET_MODELS[n][0]: pm.preset(n) for n in pm._PRESET_MODELS}
    checked = 0
    for r in pm.fit_rows():
        w = by_model.get(r["model_id"])
        if r["dataset"] != "mlenergy-v3" or w is None or r["task"] != w.task or r["num_gpus"] != r["tensor_parallel"]:
            continue
        p = pm.predict(w, r["gpu"], pm.OperatingPoint(int(r["avg_batch_size"]), "bf16", r["tensor_parallel"]))
        assert p.fits, (r["source"], p.memory_needed_gib, p.memory_available_gib)
        checked += 1
    assert checked >= 40
    reason = pm.preset("llm-reason")
    assert pm.predict(reason, "H100", pm.OperatingPoint(64, "bf16", 1)).fits


def test_more_batch_gives_more_throughput_and_longer_tpot():
    w = pm.preset("llm-chat-8b")
    small, big = (pm.predict(w, "MI300X", pm.OperatingPoint(b, "bf16", 1)) for b in (8, 256))
    assert big.output_tokens_per_s > small.output_tokens_per_s
    assert big.tpot_p50_ms > small.tpot_p50_ms
    assert big.j_per_token < small.j_per_token


def test_the_fit_is_physical():
    f = pm.fit()
    assert 0 < f.eta_mem <= 1 and 0 < f.eta_compute <= 1
    assert f.t0_ms >= 0 and f.p_static_w >= 0 and f.e_byte_pj >= 0 and f.e_flop_pj >= 0
    assert min(f.per_layer_us, f.allreduce_us, f.per_seq_us, f.e_seq_mj, f.v2_t0_ms, f.v2_per_seq_us,
               f.v2_per_worker_ms) >= 0
    assert f.overlap_p >= 1
    assert f.itl_p95_over_step >= f.itl_p50_over_step > 0
    assert set(f.gpus) == {"A100-SXM4-40GB", "B200", "H100"}


def test_leave_one_gpu_out_fits_exclude_that_gpu():
    for gpu in pm.fit().gpus:
        assert gpu not in pm.fit(exclude_gpu=gpu).gpus


def test_p95_latency_uses_the_output_length_spread():
    w = pm.preset("llm-chat-8b")
    p = pm.predict(w, "H200", pm.OperatingPoint(32, "bf16", 1))
    spread = pm.measurements()["length_spread"]["output_p95_over_mean"]
    assert p.latency_p95_ms == pytest.approx(p.ttft_p50_ms + spread * w.mean_output_tokens * p.tpot_p50_ms)
    assert p.ttft_p95_ms > p.ttft_p50_ms and p.tpot_p95_ms > p.tpot_p50_ms


def test_a_parametric_workload_needs_no_preset():
    w = pm.Workload("my-13b", 13.0, 13.0, mean_input_tokens=500, mean_output_tokens=200)
    small = pm.predict(w, "MI300X", pm.OperatingPoint(16, "bf16", 1))
    bigger = pm.predict(replace(w, total_params_b=26.0, active_params_b=26.0), "MI300X",
                        pm.OperatingPoint(16, "bf16", 1))
    assert bigger.output_tokens_per_s < small.output_tokens_per_s
    assert bigger.memory_needed_gib > small.memory_needed_gib


def test_every_public_figure_carries_its_source():
    data = pm.measurements()
    results = pm.mlperf_results()
    for m in results:
        assert {"round", "division", "submitter", "system", "part", "accelerators", "scenario", "precision",
                "tokens_per_s", "framework", "engine", "source"} <= set(m)
        assert m["part"] in pm.parts() and m["accelerators"] >= 1 and m["tokens_per_s"] > 0
        assert m["source"].startswith("https://github.com/") and "/blob/" in m["source"]
    assert {m["round"] for m in results} >= {"v4.1", "v5.0", "v5.1"}
    assert {m["part"] for m in results} >= {"MI300X", "MI325X", "MI355X", "H100", "H200", "B200"}
    assert any("A100" in g for g in pm.mlperf_gaps())
    for section in ("datasheet", "architecture"):
        assert all(entry["source"] for entry in data[section])
    assert data["length_spread"]["source"] and data["missing"]["figures"]
    for r in pm.mlenergy_rows():
        assert r["source"].startswith(("mlenergy_v3/tasks/", "mlenergy_v2/llm_text_generation/"))
        assert r["gpu"] in pm.parts()


def test_the_software_stack_is_a_fitted_factor_per_vendor_and_engine():
    rocm = pm.stack_of("MI300X")
    assert (rocm.vendor, rocm.engine) == ("amd", "vllm@fp8") and rocm.results >= 6  # bf16: FP8's, the nearest
    assert 0.4 < rocm.factor < 0.9 and rocm.spread > 0  # AMD's tuned vLLM well behind NVIDIA's tuned stack
    assert set(rocm.rounds) >= {"v4.1", "v5.1"}
    assert rocm.label().startswith(f"ROCm/vLLM stack factor {rocm.factor:.2f} +- ")
    assert pm.stack_of("H100") is pm.REFERENCE_FACTOR and pm.stack_of("H100").factor == 1.0
    p = pm.predict(pm.preset("llm-chat-8b"), "MI300X", pm.OperatingPoint(64, "bf16", 1))
    assert p.stack == rocm and p.sources["stack"] == rocm.label()


def test_a_held_out_round_is_predicted_from_the_rounds_around_it_and_the_planners_factor():
    speeds = {("nvidia", "tensorrt-llm", "v4.0"): [1.0], ("nvidia", "tensorrt-llm", "v5.0"): [4.0],
              ("amd", "vllm", "v4.0"): [0.5], ("amd", "vllm", "v5.0"): [2.0]}
    # NVIDIA's own stack in v4.1, between v4.0 and v5.0: halfway in log speed
    assert pm.stack_factor_for("nvidia", "tensorrt-llm", "v4.1", speeds) == pytest.approx(2.0)
    # another stack: NVIDIA's speed of that round times its factor relative to NVIDIA (0.5)
    assert pm.stack_factor_for("amd", "vllm", "v4.1", speeds) == pytest.approx(1.0)
    # after the last round: the last one's speed, not an extrapolated trend
    assert pm.stack_factor_for("nvidia", "tensorrt-llm", "v6.0", speeds) == pytest.approx(4.0)
    assert pm.stack_factor_for("amd", "vllm", "v6.0", speeds) == pytest.approx(2.0)
    # a round it has results in: their own speed
    assert pm.stack_factor_for("amd", "vllm", "v5.0", speeds) == pytest.approx(2.0)
    assert pm.stack_factor_for("amd", "llmboost", "v5.0", speeds) is None


def test_the_stack_factor_is_per_precision_and_mi355x_fp4_is_near_b200_as_mlperf_measures():
    """MLPerf v6.0/v6.1 llama2-70b per GPU, FP4: MI355X 12,484-13,315 against B200 12,699-12,994
    (parity); AMD's FP8 results on MI300X/MI325X sit at ~0.65 of NVIDIA's speed, its FP4 ones
    at ~0.9: one factor for both put MI355X 30 % behind B200 on the planner's path."""
    fp4, fp8 = pm.stack_of("MI355X", precision="fp4"), pm.stack_of("MI355X", precision="fp8")
    assert (fp4.engine, fp8.engine) == ("vllm@fp4", "vllm@fp8") and fp4.factor > fp8.factor
    assert pm.stack_of("MI355X", precision="bf16") == fp8 and "FP4 results" in fp4.label()
    assert pm.stack_of("B200", precision="fp4") is pm.REFERENCE_FACTOR
    w = pm.preset("mlperf-llama2-70b")
    p = pm.predict(replace(w, precision="fp4"), "MI355X", pm.OperatingPoint(256, "fp4", 1))
    assert p.stack == fp4
    amd = best_tokens_per_gpu(replace(w, precision="fp4"), "MI355X")
    nvidia = best_tokens_per_gpu(replace(w, precision="fp4"), "B200")
    assert 0.85 <= amd / nvidia <= 1.15


def test_each_mlperf_result_has_a_stack_speed_that_reproduces_it():
    f = pm.fit()
    speeds = dict(pm._speeds(f))
    offline = [i for i, m in enumerate(pm.mlperf_results()) if m["scenario"] == "Offline"]
    assert len(speeds) >= 0.9 * len(offline)
    for i, v in list(speeds.items())[::7]:
        m = pm.mlperf_results()[i]
        assert pm.mlperf_best_tokens_per_gpu_s(m, f, v) == pytest.approx(m["tokens_per_s"] / m["accelerators"],
                                                                          rel=1e-3)


def best_tokens_per_gpu(w: pm.Workload, gpu: str) -> float:
    return max(p.output_tokens_per_s / p.point.tp for p in pm.frontier(w, gpu)
               if p.tpot_p95_ms <= 200 and p.ttft_p95_ms <= 2000)


def test_an_amd_part_is_not_predicted_ahead_of_its_nvidia_peer_where_mlperf_says_parity():
    """MLPerf llama2-70b per GPU: MI300X 2,939-3,014 vs H100 3,017-3,066 (v4.1), MI325X 4,241
    vs H200 4,374 (v5.0): parity, NVIDIA slightly ahead; the data sheets say AMD 1.3-1.6x."""
    w = pm.preset("mlperf-llama2-70b")
    assert best_tokens_per_gpu(w, "MI300X") <= best_tokens_per_gpu(w, "H100")
    assert best_tokens_per_gpu(w, "MI325X") <= best_tokens_per_gpu(w, "H200")
    # ... and it is the stack factor that does it: at CUDA's speed the roofline puts AMD ahead
    f = pm.fit()
    m300 = next(m for m in pm.mlperf_results() if m["part"] == "MI300X" and m["scenario"] == "Offline")
    h100 = next(m for m in pm.mlperf_results() if m["part"] == "H100" and m["scenario"] == "Offline"
                and m["accelerators"] == 8)
    assert pm.mlperf_best_tokens_per_gpu_s(m300, f) > pm.mlperf_best_tokens_per_gpu_s(h100, f)


def test_memory_bound_work_loses_least_to_a_lagging_stack_and_that_comes_out_of_the_model():
    """The factor divides what software sets, not HBM streaming: where bytes dominate (8B at
    batch 1) MI300X is nearer H100 than where per-sequence and compute work dominate."""
    w = pm.preset("llm-chat-8b")
    ratio = {b: pm.predict(w, "MI300X", pm.OperatingPoint(b, "bf16", 1)).output_tokens_per_s
             / pm.predict(w, "H100", pm.OperatingPoint(b, "bf16", 1), use_measurements=False).output_tokens_per_s
             for b in (1, 1024)}
    assert ratio[1] > ratio[1024] + 0.05
    seventy = pm.preset("llm-chat-70b")  # 70B BF16 fits one MI300X, not one H100: per GPU, AMD ahead
    one = pm.predict(seventy, "MI300X", pm.OperatingPoint(1, "bf16", 1))
    two = pm.predict(seventy, "H100", pm.OperatingPoint(1, "bf16", 2))
    assert one.fits and two.fits and one.output_tokens_per_s > two.output_tokens_per_s / 2


def test_best_point_meets_every_latency_limit_and_a_tighter_limit_costs_energy():
    w = pm.preset("llm-chat-70b")
    loose = pm.best_point(w, "MI300X", tpot_p95_ms=200)
    tight = pm.best_point(w, "MI300X", tpot_p95_ms=40)
    assert loose is not None and tight is not None
    assert loose.tpot_p95_ms <= 200 and tight.tpot_p95_ms <= 40 and tight.fits and loose.fits
    assert tight.j_per_prompt >= loose.j_per_prompt
    assert pm.best_point(w, "MI300X", tpot_p95_ms=0.001) is None
    unconstrained = pm.best_point(w, "MI300X")
    assert unconstrained is not None and unconstrained.j_per_prompt <= loose.j_per_prompt
    assert {p.point.precision for p in pm.frontier(w, "MI300X")} == {"bf16"}  # no silent quantisation
    fp8 = pm.best_point(w, "MI300X", tpot_p95_ms=200, precisions=("bf16", "fp8"))
    assert fp8 is not None and fp8.j_per_prompt <= loose.j_per_prompt


# ---------------------------------------------------------------------------- the terms of the fit


def test_a_mixture_of_experts_reads_the_experts_its_batch_routes_to():
    code = pm.preset("llm-code")  # Qwen3-Coder-30B-A3B: 128 experts, 8 per token
    assert code.experts == 128 and code.experts_active == 8
    assert code.weights_read_b(1) == pytest.approx(code.active_params_b)
    reads = [code.weights_read_b(b) for b in (1, 2, 8, 64, 1024)]
    assert all(a < b for a, b in itertools.pairwise(reads))
    assert reads[-1] == pytest.approx(code.total_params_b, rel=1e-6)
    # 8 tokens touch 1 - (15/16)^8 = 40 % of the 28.8B expert parameters (+ 1.2B shared),
    # about half of the 8 x 3B that min(total, active x batch) assumed
    experts_b = (30.0 - 3.0) / (1 - 8 / 128)
    assert reads[2] == pytest.approx(30.0 - experts_b + experts_b * (1 - (15 / 16) ** 8))
    assert reads[2] < 0.55 * min(code.total_params_b, 8 * code.active_params_b)
    dense = pm.preset("llm-chat-8b")
    assert dense.weights_read_b(1) == dense.weights_read_b(512) == dense.total_params_b
    no_experts_known = replace(code, experts=0, experts_active=0)
    assert no_experts_known.weights_read_b(4) == pytest.approx(4 * code.active_params_b)


def test_layers_come_from_the_architecture_or_scale_with_size():
    assert pm.preset("llm-chat-70b").n_layers() == 80 and pm.preset("llm-code").n_layers() == 48
    w = pm.Workload("x", 8.0, 8.0, 100, 100)
    assert w.n_layers() == pytest.approx(32)
    assert replace(w, total_params_b=70.0, active_params_b=70.0).n_layers() == pytest.approx(80, abs=1.5)
    assert replace(w, layers=40).n_layers() == 40


def test_tensor_parallelism_costs_all_reduce_latency_per_layer():
    f = pm.fit()
    assert f.allreduce_us > 0 and f.per_layer_us > 0
    w = pm.preset("llm-chat-70b")
    point = pm.OperatingPoint(8, "bf16", 2)
    free = pm.predict(w, "MI300X", point, f=replace(f, allreduce_us=0.0))
    paid = pm.predict(w, "MI300X", point, f=f)
    assert paid.tpot_p50_ms - free.tpot_p50_ms == pytest.approx(  # software latency: at ROCm's stack speed
        f.itl_p50_over_step * f.allreduce_us * w.n_layers() / 1e3 / pm.stack_of("MI300X").factor, rel=1e-6)
    one = pm.OperatingPoint(8, "bf16", 1)
    assert pm.predict(w, "MI300X", one, f=f).tpot_p50_ms == pm.predict(
        w, "MI300X", one, f=replace(f, allreduce_us=0.0)).tpot_p50_ms


def test_ml_energy_v2_software_terms_never_reach_a_prediction():
    f = pm.fit()
    assert f.v2_per_seq_us > f.per_seq_us  # v2's older stack: more CPU time per sequence
    no_v2 = replace(f, v2_t0_ms=0.0, v2_per_seq_us=0.0, v2_per_worker_ms=0.0)
    for gpu, tp in (("H100", 2), ("MI325X", 1)):
        point = pm.OperatingPoint(64, "bf16", tp)
        assert pm.predict(pm.preset("llm-chat-8b"), gpu, point, f=f) == pm.predict(
            pm.preset("llm-chat-8b"), gpu, point, f=no_v2)
    v2_row = next(r for r in pm.fit_rows() if r["dataset"] == "mlenergy-v2")
    assert pm.reproduce_row(v2_row, f)["tokens_per_s"] < pm.reproduce_row(v2_row, no_v2)["tokens_per_s"]


def test_nnls_matches_a_brute_force_over_active_sets():
    rng = np.random.default_rng(7)
    for _ in range(20):
        a = rng.normal(size=(30, 5)) * rng.uniform(1e-3, 1e3, size=5)  # badly scaled columns, as in the fit
        b = rng.normal(size=30)
        x = pm._nnls(a, b)
        assert (x >= 0).all()
        best = math.inf
        for free in itertools.product((False, True), repeat=5):
            z = np.zeros(5)
            idx = [i for i in range(5) if free[i]]
            if idx:
                z[idx] = np.linalg.lstsq(a[:, idx], b, rcond=None)[0]
            if (z >= 0).all():
                best = min(best, float(np.sum((a @ z - b) ** 2)))
        assert float(np.sum((a @ x - b) ** 2)) == pytest.approx(best, rel=1e-7, abs=1e-9)


def test_a_held_out_gpus_rows_do_not_move_its_leave_one_out_fit(monkeypatch):
    rows = pm.fit_rows()
    for gpu in ("H100", "A100-SXM4-40GB"):
        reference = pm.fit.__wrapped__(gpu)
        doubled = tuple({**r, "output_tokens_per_s": 2 * r["output_tokens_per_s"],
                         "power_w_all_gpus": 3 * r["power_w_all_gpus"]} if r["gpu"] == gpu else r for r in rows)
        monkeypatch.setattr(pm, "fit_rows", lambda doubled=doubled: doubled)
        assert pm.fit.__wrapped__(gpu) == reference
        monkeypatch.setattr(pm, "fit_rows", lambda: rows)


def test_the_fit_reproduces_its_rows_and_predicts_held_out_gpus():
    """A floor under the validation of bench.model (the targets are per row <= 10 % and
    held-out medians <= 20 %; see the module docstring for where they are missed)."""
    f = pm.fit()
    errs = [abs(pm.reproduce_row(r, f)["tokens_per_s"] / r["output_tokens_per_s"] - 1) for r in pm.fit_rows()]
    assert statistics.median(errs) < 0.08 and sum(e <= 0.10 for e in errs) >= 0.7 * len(errs)
    v3 = [r for r in pm.fit_rows() if r["dataset"] == "mlenergy-v3"]
    power = [abs(pm.reproduce_row(r, f)["power_w"] / r["power_w_all_gpus"] - 1) for r in v3]
    assert statistics.median(power) < 0.08
    for gpu in f.gpus:
        held = pm.fit(exclude_gpu=gpu)
        by_model: dict[tuple, list[float]] = {}
        for r in pm.fit_rows():
            if r["gpu"] == gpu:
                by_model.setdefault((r["model_id"], r["dataset"]), []).append(
                    abs(pm.reproduce_row(r, held)["tokens_per_s"] / r["output_tokens_per_s"] - 1))
        assert all(statistics.median(v) < 0.25 for v in by_model.values()), (gpu, by_model)


def test_ml_energy_v2s_effective_input_lets_its_measured_batches_fit_in_memory():
    v2 = [r for r in pm.fit_rows() if r["dataset"] == "mlenergy-v2"]
    for gpu in (None, "H100", "A100-SXM4-40GB"):
        f = pm.fit(exclude_gpu=gpu)
        for r in v2:
            if r["gpu"] == gpu:
                continue
            w = pm._row_workload(r, f.input_tokens["chat"])
            context = f.input_tokens["chat"] + r["mean_output_tokens"] / 2
            kv_gib = r["avg_batch_size"] * context * w.kv_bytes() / pm.GIB
            weights_gib = w.total_params_b * 1e9 * 2 / pm.GIB
            assert weights_gib + kv_gib <= pm.MEMORY_UTILIZATION * pm.parts()[r["gpu"]].memory_gib * r["num_gpus"]
    # the ceiling binds somewhere: a row it comes from would not fit one grid step higher
    assert pm._max_input_tokens(v2) < pm._INPUT_GRID[-1]
    assert pm._max_input_tokens([]) == math.inf


# ---------------------------------------------------------------------------- TTFT (issue 27)


def test_ttft_queues_prefills_at_the_points_batch_and_grows_with_it():
    """Chunked prefill shares steps with decode: at batch B the prompts that start each step
    need B x input / output prefill tokens of a budget of 8,192 - B; a prompt waits for the
    prefills ahead of it. So TTFT is more than one step plus one prompt's prefill, and at a
    large batch more than the prompt's own chunks and its first step: the wait."""
    from policies.model.operating_point import parse_spec

    w = parse_spec("llm:70b")  # the Azure conv trace's lengths: 1,155 in, 211 out
    small, big = (pm.predict(w, "H100", pm.OperatingPoint(b, "bf16", 8)) for b in (16, 1024))
    for p in (small, big):
        step_ms = p.tpot_p50_ms / pm.fit().itl_p50_over_step
        assert p.ttft_p50_ms > 2 * step_ms  # at least a prefill step and the first token's
        assert p.ttft_p95_ms > p.ttft_p50_ms
    assert big.ttft_p50_ms > small.ttft_p50_ms
    step_ms = big.tpot_p50_ms / pm.fit().itl_p50_over_step
    no_wait_ms = (max(1.0, w.mean_input_tokens / (pm.PREFILL_TOKEN_BUDGET - 1024)) + 1) * step_ms
    assert big.ttft_p50_ms > 1.2 * no_wait_ms
    assert math.isfinite(pm.predict(w, "H100", pm.OperatingPoint(4096, "bf16", 8)).ttft_p95_ms)


def test_a_realistic_ttft_slo_binds():
    """A 300 ms TTFT (MLPerf's interactive scenario asks 450 ms) moves llm:70b on 8 H100s to
    another point than TPOT alone picks, and the choice says TTFT bound it."""
    from policies.model.operating_point import Slos, choose

    free = choose("llm:70b", "H100", 8, Slos(tpot_ms=200.0))
    tight = choose("llm:70b", "H100", 8, Slos(ttft_ms=300.0, tpot_ms=200.0))
    assert free.ttft_p95_ms > 300.0
    assert "ttft" in tight.binding and tight.ttft_p95_ms <= 300.0
    assert tight.point != free.point and tight.j_per_prompt >= free.j_per_prompt
