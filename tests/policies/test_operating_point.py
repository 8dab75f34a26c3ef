"""The planner's operating point (policies.model.operating_point, issue 18 items 5-6): on each GPU
model the most energy-efficient point of the performance model that fits in memory and meets
every latency SLO; none: the model is excluded ("memory" or "slo"). Presets, learned and
parametric workloads alike; an SLO without a latency model never plans unconstrained."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from policies import get_policy
from policies.model.energy import ProfileBook, fits, job_shape, seed_profiles, shape_arrays
from policies.types import CarbonCurve, GpuSlot, Profile, QueuedJob, Snapshot
from policies.model.operating_point import (Choice, Refusal, Slos, WorkloadSpecError, choose, has_latency_model,
                                      job_choice, latency_model_names, parse_spec, slos_for, tp_degrees)
from policies.model.perf_model import memory_needed_gib, parts, predict, presets
from policies.model.point_annotation import annotate

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
BOOK = ProfileBook(seed_profiles())


def job(workload, gpus=1, **kw) -> QueuedJob:
    return QueuedJob(1, gpus, 0.0, NOW, workload=workload, prompts=kw.pop("prompts", 10_000), **kw)


def fleet(*models: str, per_node: int = 1) -> tuple[GpuSlot, ...]:
    out = []
    for n, model in enumerate(models):
        for i in range(per_node):
            out.append(GpuSlot(id=n * per_node + i + 1, node=f"n{n}", zone="Z", index=i, model=model,
                               memory_gib=parts()[model].memory_gib))
    return tuple(out)


def plan(jobs, gpus, policy="greedy"):
    curve = CarbonCurve("Z", NOW, 3600.0, (100.0,) * 72)
    snap = Snapshot(now=NOW, jobs=tuple(jobs), gpus=gpus, carbon={"Z": curve}, profiles=seed_profiles())
    return snap, annotate(snap, get_policy(policy).plan(snap))


# -- memory ------------------------------------------------------------------------------------

def test_a_70b_bf16_model_does_not_fit_one_80gb_gpu_but_fits_one_mi300x():
    w = presets()["llm-chat-70b"]
    assert w.precision == "bf16" and w.total_params_b >= 70
    for model in ("H100", "A100"):
        assert parts()[model].memory_gib == 80
        assert fits(job("llm-chat-70b"), model, 80.0, BOOK) == "memory"
        assert fits(job("llm-chat-70b", gpus=2), model, 80.0, BOOK) is None  # TP2 holds it
    assert fits(job("llm-chat-70b"), "MI300X", 192.0, BOOK) is None
    c = job_choice("llm-chat-70b", "MI300X", 1, None, None, None)
    assert isinstance(c, Choice) and c.point.tp == 1
    assert memory_needed_gib(w, c.point) <= 0.9 * parts()["MI300X"].memory_gib


@pytest.mark.parametrize("policy", ["fifo", "greedy", "cpsat"])
def test_the_planner_puts_a_70b_job_on_one_gpu_on_the_mi300x_not_the_free_h100(policy):
    gpus = fleet("H100", "MI300X")
    snap, p = plan([job("llm-chat-70b")], gpus, policy)
    (a,) = p.assignments
    assert {g.model for g in gpus if g.id in a.gpu_ids} == {"MI300X"}
    _, p = plan([job("llm-chat-70b")], fleet("H100", "A100"), policy)
    assert not p.assignments and p.unplaced


def test_tensor_parallel_degrees_divide_the_jobs_gpu_count():
    assert tp_degrees(1) == (1,) and tp_degrees(6) == (1, 2) and tp_degrees(8) == (1, 2, 4, 8)
    for k in (1, 2, 3, 4, 6, 8):
        c = job_choice("llm-chat-70b", "H100", k, None, None, None)
        if isinstance(c, Choice):
            assert k % c.point.tp == 0 and c.replicas * c.point.tp == k
            assert c.prompts_per_s == pytest.approx(c.prediction.prompts_per_s * c.replicas)
        else:
            assert k in (1, 3) and c.reason == "memory"  # TP1 only: 130 GiB on one 80 GB GPU


# -- SLOs that bind --------------------------------------------------------------------------

def test_a_tight_tpot_slo_moves_a_preset_to_a_smaller_batch_and_says_it_bound():
    loose = job_choice("llm-chat-70b", "B200", 4, None, 200.0, None)
    tight = job_choice("llm-chat-70b", "B200", 4, None, 40.0, None)
    assert isinstance(loose, Choice) and isinstance(tight, Choice)
    assert tight.tpot_p95_ms <= 40.0 < loose.tpot_p95_ms <= 200.0
    assert tight.point.max_batch < loose.point.max_batch
    assert tight.j_per_prompt > loose.j_per_prompt  # latency costs energy
    assert "tpot" in tight.binding and "TPOT p95" in tight.describe() and "(binding)" in tight.describe()
    # the choice is the cheapest point that meets it: every cheaper point misses it
    cheaper = [p for p in tight_frontier("llm-chat-70b", "B200", 4) if p.j_per_prompt < tight.j_per_prompt - 1e-9]
    assert cheaper and all(p.tpot_p95_ms > 40.0 for p in cheaper)


def tight_frontier(workload, model, k):
    from policies.model.operating_point import _frontier
    return _frontier(workload, model, k)


def test_an_slo_no_point_meets_excludes_the_model_for_slo():
    assert fits(job("llm-inference", latency_slo_ms=1.0), "B200", 180.0, BOOK) == "slo"
    assert fits(job("llm-chat-8b", ttft_slo_ms=0.5), "H100", 80.0, BOOK) == "slo"
    _, p = plan([job("llm-inference", latency_slo_ms=1.0)], fleet("B200", "H100"))
    assert not p.assignments and "slo" in p.unplaced[1]


def test_a_presets_defaults_apply_where_the_job_sets_none_and_its_own_override_them():
    d = slos_for("llm-chat-8b", None, None, None)
    assert d.tpot_ms == 100.0 and d.ttft_ms == 2000.0 and d.latency_ms is None
    assert slos_for("llm-chat-8b", None, 40.0, 9000.0) == Slos(2000.0, 40.0, 9000.0)
    assert slos_for("llm-chat-70b", None, None, None).tpot_ms == 200.0
    assert slos_for("train", None, None, None) == Slos()
    for name, w in presets().items():
        assert has_latency_model(name) == (w.kind == "inference"), name
    assert "train" not in latency_model_names() and "llm-inference" in latency_model_names()


def test_a_learned_workload_keeps_a_latency_and_its_slo_binds():
    """This cluster measured llm-chat-8b at half the seed's speed on H100: the learned profile
    scales the model's latencies up too, so the same SLO needs a smaller batch, and a limit
    the seed point just met is missed at that point."""
    seed = next(p for p in seed_profiles() if (p.workload, p.model) == ("llm-chat-8b", "H100"))
    learned = replace(seed, prompts_per_s=seed.prompts_per_s / 2, power_w=seed.power_w * 0.9,
                      latency_p50_ms=seed.latency_p50_ms * 2, latency_p95_ms=seed.latency_p95_ms * 2,
                      source="measured here (n=5)", samples=5)
    book = ProfileBook(seed_profiles() + (learned,))
    slo = 40.0
    j = job("llm-chat-8b", tpot_slo_ms=slo)
    base, mine = job_shape(j, "H100", BOOK, 3600.0), job_shape(j, "H100", book, 3600.0)
    assert mine.latency_p95_ms is not None and math.isfinite(mine.latency_p95_ms)
    assert mine.operating_point.max_batch < base.operating_point.max_batch
    assert "TPOT p95" in mine.point_note and "(binding)" in mine.point_note
    # at the seed's own point, the learned latency would miss the limit
    c = job_choice("llm-chat-8b", "H100", 1, None, slo, None)
    assert c.tpot_p95_ms * 2 > slo
    # throughput and power follow the learned ratios at the chosen point
    again = job_choice("llm-chat-8b", "H100", 1, None, slo, None, 0.5, 0.9)
    assert again.prompts_per_s == pytest.approx(again.prediction.prompts_per_s * 0.5)
    assert again.power_w == pytest.approx(again.prediction.power_w * 0.9)


def test_a_parametric_workload_parses_plans_and_its_slo_binds():
    w = parse_spec("llm:params=47,active=13,in=2048,out=512,precision=fp8")
    assert (w.total_params_b, w.active_params_b, w.mean_input_tokens, w.mean_output_tokens, w.precision) == \
        (47.0, 13.0, 2048.0, 512.0, "fp8")
    assert parse_spec("llm:70b").total_params_b == 70 and parse_spec("llm:70b,fp8").precision == "fp8"
    loose = job_choice("llm:70b", "MI300X", 1, None, None, None)
    tight = job_choice("llm:70b", "MI300X", 1, None, 60.0, None)
    assert isinstance(loose, Choice) and isinstance(tight, Choice)
    assert tight.tpot_p95_ms <= 60.0 and tight.point.max_batch < loose.point.max_batch
    assert fits(job("llm:70b"), "H100", 80.0, BOOK) == "memory"
    assert fits(job("llm:70b,fp8"), "H100", 80.0, BOOK) is None  # 70 GB of FP8 weights fit
    assert fits(job("llm:70b", tpot_slo_ms=0.1), "MI300X", 192.0, BOOK) == "slo"
    _, p = plan([job("llm:70b", tpot_slo_ms=60.0)], fleet("MI300X"))
    (a,) = p.assignments
    assert a.estimate.max_batch == tight.point.max_batch and "TPOT p95" in a.explanation


@pytest.mark.parametrize("spec, why", [
    ("llm:", "empty"), ("llm:big", "cannot read"), ("llm:params=x", "not a number"),
    ("llm:70b,precision=fp3", "precision"), ("llm:params=7,active=70", "exceed"), ("llm:in=100", "no model size"),
    ("llm:70b,color=red", "unknown key")])
def test_a_bad_parametric_spec_says_what_is_wrong(spec, why):
    with pytest.raises(WorkloadSpecError, match=why):
        parse_spec(spec)
    assert not has_latency_model(spec)


# -- never unconstrained, never NaN ------------------------------------------------------------

def test_an_slo_on_a_workload_without_a_latency_model_excludes_every_model():
    for j in (job("train", latency_slo_ms=5000.0), job("finetune", tpot_slo_ms=50.0),
              QueuedJob(1, 1, 0.0, NOW, est_runtime_s=600.0, latency_slo_ms=100.0),
              job("someones-class", ttft_slo_ms=100.0)):
        for model in ("H100", "B200", "MI300X"):
            assert fits(j, model, 1000.0, BOOK) == "slo", (j.workload, model)
    # without an SLO the training preset plans, nominal, with no serving point
    assert fits(job("train"), "H100", 80.0, BOOK) is None
    s = job_shape(job("train"), "H100", BOOK, 3600.0)
    assert s.operating_point is None and s.latency_p95_ms is None and "nominal" in s.point_note


def test_a_learned_only_profile_without_latency_cannot_meet_an_slo():
    """A class the model does not know, learned here with a NaN latency: any SLO excludes it
    (the old planner compared NaN > SLO, which is False, and placed it unconstrained)."""
    mine = Profile("my-class", "H100", prompts_per_s=5.0, power_w=500.0, latency_p50_ms=math.nan,
                   latency_p95_ms=math.nan, source="measured here (n=3)", samples=3)
    book = ProfileBook(seed_profiles() + (mine,))
    j = job("my-class", latency_slo_ms=10_000.0)
    assert fits(j, "H100", 80.0, book) == "slo"
    arrays = shape_arrays([j, job("my-class")], ["H100"], book, 3600.0)
    assert arrays.why.tolist() == [[2], [0]]


def test_no_nan_reaches_a_comparison():
    """Every figure a choice compares is finite, for every preset, GPU model, GPU count and
    SLO; numpy is told to raise on any invalid comparison while the planner compiles."""
    for name in presets():
        for model in parts():
            for k in (1, 2, 8):
                for slos in (Slos(), Slos(2000.0, 40.0, 30_000.0), Slos(None, 1.0, None)):
                    c = choose(name, model, k, slos)
                    if isinstance(c, Choice):
                        figures = (c.prompts_per_s, c.power_w, c.ttft_p95_ms, c.tpot_p95_ms, c.latency_p95_ms)
                        assert all(math.isfinite(x) and x > 0 for x in figures), (name, model, k)
                    else:
                        assert c is None or isinstance(c, Refusal)
    jobs = [job(w, gpus=k, latency_slo_ms=s) for w in ("llm-chat-8b", "llm-chat-70b", "train", "llm:13b", "nope")
            for k in (1, 4) for s in (None, 20_000.0)]
    jobs = [replace(j, id=i + 1) for i, j in enumerate(jobs)]
    gpus = fleet("H100", "MI300X", "B200", "A100", per_node=4)
    with np.errstate(invalid="raise"):
        snap, p = plan(jobs, gpus)
    assert len(p.assignments) + len(p.unplaced) == len(jobs)


# -- the point reaches the plan ----------------------------------------------------------------

def test_the_plan_carries_the_point_and_says_which_slo_bound():
    snap, p = plan([job("llm-chat-8b", tpot_slo_ms=20.0), replace(job(None), id=2, est_runtime_s=600.0)],
                   fleet("H100", per_node=2))
    by = p.by_job()
    a = by[1]
    c = job_choice("llm-chat-8b", "H100", 1, None, 20.0, None)
    assert (a.estimate.max_batch, a.estimate.precision, a.estimate.tp) == (c.point.max_batch, "bf16", 1)
    assert f"H100 at batch {c.point.max_batch} BF16 TP1: " in a.explanation
    assert "TPOT p95" in a.explanation and "<= 20 ms (binding)" in a.explanation
    assert a.estimate.binding is not None
    assert by[2].estimate.max_batch is None  # a generic job has no serving point
    # annotating again (kept and pinned plans come back with their point) changes nothing
    assert annotate(snap, p) == p


def test_seed_points_and_runtime_agree_with_the_prediction():
    c = job_choice("llm-chat-8b", "H100", 2, None, None, None)
    s = job_shape(job("llm-chat-8b", gpus=2, prompts=36_000), "H100", BOOK, 3600.0)
    assert s.runtime_s == pytest.approx(36_000 / c.prompts_per_s)
    assert s.power_w == pytest.approx(c.power_w)
    p = predict(presets()["llm-chat-8b"], "H100", c.point)
    assert c.prompts_per_s == pytest.approx(2 * p.prompts_per_s)
    assert timedelta(seconds=s.runtime_s) > timedelta(0)


def test_plan_rows_and_the_plan_table_show_the_point_and_why():
    from scheduler.cli.output import plan_table
    from scheduler.daemon.planner import plan_rows

    snap, p = plan([job("llm-chat-8b", tpot_slo_ms=20.0)], fleet("H100"))
    (row,) = plan_rows(snap, p)
    c = job_choice("llm-chat-8b", "H100", 1, None, 20.0, None)
    assert row["operating_point"] == {"max_batch": c.point.max_batch, "precision": "bf16", "tp": 1}
    assert c.describe() in row["reason"]
    assert f"H100 at batch {c.point.max_batch} BF16 TP1" in plan_table([row])


def test_a_run_exactly_as_predicted_at_its_own_point_teaches_nothing():
    """Learning compares runs with the seed (70B on H100: 2 GPUs), but a job on 4
    GPUs ran at TP4 and batch 512, faster per GPU. Restated at the seed's point, a run that
    went exactly as predicted leaves the profile at its seed; one 20 % slower, 20 % slower."""
    from policies.model.energy import seed_equivalent_run
    from policies.model.learning import Run, estimate

    j = job("llm-chat-70b", gpus=4)
    c = job_choice("llm-chat-70b", "H100", 4, None, None, None)
    seed = next(p for p in seed_profiles() if (p.workload, p.model) == ("llm-chat-70b", "H100"))
    assert c.prompts_per_s / 4 > 1.1 * seed.prompts_per_s  # the two points differ
    exact = Run(c.prompts_per_s / 4, c.power_w / 4)
    for point in (None, c.point):
        same = seed_equivalent_run(j, "H100", exact, point)
        assert same.prompts_per_s == pytest.approx(seed.prompts_per_s)
        assert same.power_w == pytest.approx(seed.power_w)
    slow = seed_equivalent_run(j, "H100", Run(exact.prompts_per_s * 0.8, exact.power_w))
    learned = estimate(seed, [slow, slow], workload="llm-chat-70b", model="H100")
    assert learned.prompts_per_s == pytest.approx(seed.prompts_per_s * 0.8)
    # a class the model does not know is learned as measured
    assert seed_equivalent_run(job("my-class"), "H100", exact) == exact


@pytest.mark.parametrize("policy", ["fifo", "greedy", "cpsat"])
def test_plans_with_latency_slos_pass_the_independent_checker(policy):
    """Every placed job with an SLO is on a model where some point meets it (the checker
    reads the performance model's frontier itself), and none breaks another constraint."""
    from policy_checker import violations

    jobs = [replace(job(w, gpus=k, latency_slo_ms=s), id=i + 1)
            for i, (w, k, s) in enumerate((w, k, s) for w in ("llm-chat-8b", "llm-chat-70b", "llm-code")
                                           for k in (1, 2) for s in (3_000.0, 15_000.0, 60_000.0))]
    gpus = fleet("H100", "MI300X", "B200", "A100", per_node=2)
    curve = CarbonCurve("Z", NOW, 3600.0, (100.0,) * 72)
    snap = Snapshot(now=NOW, jobs=tuple(jobs), gpus=gpus, carbon={"Z": curve}, profiles=seed_profiles())
    params = {"max_time_s": 2.0} if policy == "cpsat" else {}
    p = get_policy(policy, **params).plan(snap)
    assert p.assignments and violations(snap, p) == []
