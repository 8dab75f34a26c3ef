"""Learning a workload's throughput and power per GPU model from completed runs
(policies.model.learning): a median over recent runs against the seed, shared across GPU models
until a model has runs of its own."""

from __future__ import annotations

import math
import random

import pytest

from policies.model.learning import WINDOW, Ratios, Run, estimate, shared_ratios
from policies.types import Profile

SEED = Profile("chat", "H100", prompts_per_s=10.0, power_w=600.0, latency_p50_ms=100.0, latency_p95_ms=200.0,
               source="ML.ENERGY")
A100 = Profile("chat", "A100", prompts_per_s=5.0, power_w=350.0, latency_p50_ms=180.0, latency_p95_ms=360.0)


def runs_of(pps: float, power_w: float, n: int, noise: float = 0.0, seed: int = 0) -> list[Run]:
    rng = random.Random(seed)
    return [Run(pps * math.exp(rng.gauss(0, noise)), power_w * math.exp(rng.gauss(0, noise / 2))) for _ in range(n)]


def test_a_run_is_measured_per_gpu():
    assert Run.of(gpus=2, runtime_s=100.0, energy_j=120_000.0, prompts=4000) == Run(20.0, 600.0)
    with pytest.raises(ValueError):
        Run.of(gpus=1, runtime_s=0.0, energy_j=1.0, prompts=1)


def test_two_agreeing_runs_are_the_estimate_and_latency_follows_throughput():
    # The truth: 40 % longer runtime (throughput / 1.4) at 30 % less power than the seed says.
    truth_pps, truth_w = 10.0 / 1.4, 600.0 * 0.7
    one = estimate(SEED, runs_of(truth_pps, truth_w, 1), workload="chat", model="H100")
    assert SEED.prompts_per_s > one.prompts_per_s > truth_pps  # halfway, from the seed
    two = estimate(SEED, runs_of(truth_pps, truth_w, 2), workload="chat", model="H100")
    assert (two.prompts_per_s, two.power_w) == (pytest.approx(truth_pps), pytest.approx(truth_w))
    assert two.latency_p95_ms == pytest.approx(200.0 * 1.4)
    assert two.samples == 2 and two.source == "measured here (n=2)"


def test_energy_per_prompt_is_within_10_percent_after_five_runs_with_5_percent_noise():
    truth_pps, truth_w = 10.0 / 1.4, 600.0 * 0.7
    for trial in range(50):
        p = estimate(SEED, runs_of(truth_pps, truth_w, 5, noise=0.05, seed=trial), workload="chat", model="H100")
        assert (p.power_w / p.prompts_per_s) / (truth_w / truth_pps) == pytest.approx(1.0, abs=0.10)


def test_a_stalled_run_does_not_move_the_estimate():
    runs = runs_of(8.0, 500.0, 4) + [Run(0.8, 300.0)]  # one run 10x slower (a stall)
    p = estimate(SEED, runs, workload="chat", model="H100")
    assert p.prompts_per_s == pytest.approx(8.0) and p.power_w == pytest.approx(500.0)


def test_only_the_recent_runs_count_so_a_drift_is_followed():
    old, new = runs_of(8.0, 500.0, WINDOW), runs_of(12.0, 650.0, WINDOW // 2 + 2)  # a majority of the window
    p = estimate(SEED, old + new, workload="chat", model="H100")
    assert p.prompts_per_s == pytest.approx(12.0) and p.power_w == pytest.approx(650.0)


def test_without_a_seed_the_runs_own_median_is_the_estimate():
    p = estimate(None, [Run(3.0, 400.0), Run(2.0, 420.0), Run(30.0, 100.0)], workload="x", model="H100")
    assert (p.prompts_per_s, p.power_w, p.samples) == (3.0, 400.0, 3)
    assert math.isnan(p.latency_p95_ms)
    with pytest.raises(ValueError):
        estimate(None, [], workload="x", model="H100")


def test_what_a_workload_taught_on_one_model_corrects_the_seed_of_another():
    # chat runs 30 % slower than its seed on H100, at the seed's power.
    shared = shared_ratios([(SEED, runs_of(7.0, 600.0, 3))])
    assert shared == Ratios(pytest.approx(math.log(0.7)), pytest.approx(0.0))
    before = estimate(A100, [], workload="chat", model="A100", shared=shared)
    assert before.prompts_per_s == pytest.approx(3.5) and before.samples == 0
    assert "corrected by this workload's runs on other GPU models" in before.source
    # Its own runs take over: A100 turns out exactly as its seed says.
    after = estimate(A100, runs_of(5.0, 350.0, 3), workload="chat", model="A100", shared=shared)
    assert after.prompts_per_s == pytest.approx(5.0)
    assert shared_ratios([]) is None


def test_the_uncertainty_is_unknown_below_two_runs_and_grows_with_the_spread():
    assert math.isnan(estimate(SEED, runs_of(8.0, 500.0, 1), workload="chat", model="H100").rel_uncertainty)
    tight = estimate(SEED, runs_of(8.0, 500.0, 8, noise=0.02, seed=3), workload="chat", model="H100")
    loose = estimate(SEED, runs_of(8.0, 500.0, 8, noise=0.3, seed=3), workload="chat", model="H100")
    assert 0 < tight.rel_uncertainty < 0.03 < loose.rel_uncertainty
