"""Energy over a window: the counter when it can be trusted, integrated power otherwise."""

from __future__ import annotations

import pytest

from telemetry.energy import (
    Sample,
    combine_methods,
    counter_delta,
    integrate_power,
    window_energy,
)


def steady(power_w: float, seconds: int, counter_start: float = 1e6, hz: int = 1, counter=True):
    return [Sample(t / hz, power_w, counter_start + power_w * t / hz if counter else None)
            for t in range(seconds * hz + 1)]


def test_trapezoid_integral_of_a_ramp_is_exact():
    samples = [Sample(float(t), 100.0 + 10 * t, None) for t in range(11)]  # 100 W -> 200 W over 10 s
    assert integrate_power(samples) == pytest.approx(1500.0)


def test_integral_needs_two_power_readings():
    assert integrate_power([Sample(0.0, 300.0, None)]) is None
    assert integrate_power([Sample(0.0, None, 5.0), Sample(1.0, None, 9.0)]) is None


def test_a_healthy_counter_that_agrees_with_power_is_preferred():
    est = window_energy(steady(700.0, 60))
    assert est.method == "counter"
    assert est.energy_j == pytest.approx(42_000.0)
    assert est.integral_j == pytest.approx(42_000.0)


def test_a_counter_going_backwards_falls_back_to_integrated_power():
    samples = steady(500.0, 30)
    samples[15] = Sample(samples[15].t_s, 500.0, 0.0)  # wrapped / reset mid-window
    est = window_energy(samples)
    assert est.method == "integral"
    assert est.energy_j == pytest.approx(15_000.0)
    assert "backwards" in est.note


def test_a_stuck_counter_falls_back_to_integrated_power():
    samples = [Sample(float(t), 400.0, 123.0) for t in range(31)]
    est = window_energy(samples)
    assert est.method == "integral" and est.energy_j == pytest.approx(12_000.0)
    assert "stuck" in est.note


def test_a_counter_reading_zero_like_an_mi250_odd_die_is_not_trusted():
    samples = [Sample(float(t), 300.0, 0.0) for t in range(21)]
    assert window_energy(samples).method == "integral"


def test_a_counter_that_disagrees_with_power_beyond_tolerance_is_rejected():
    samples = [Sample(float(t), 600.0, 2 * 600.0 * t) for t in range(61)]  # counts double
    est = window_energy(samples, tolerance=0.10)
    assert est.method == "integral"
    assert est.energy_j == pytest.approx(36_000.0)
    assert est.counter_j == pytest.approx(72_000.0)


def starved_start(counter_scale: float, busy_until_s: float) -> list[Sample]:
    """A GPU idle at 70 W that goes busy at 600 W at t=0.05 s, read at t=0 and next only at
    t=0.9 s (the sampler starved of CPU as a job starts), then every 0.5 s; its counter is
    the exact integral times `counter_scale`."""
    def exact_j(t: float) -> float:
        return 70.0 * min(t, 0.05) + 600.0 * max(0.0, t - 0.05)
    times = [0.0, 0.9] + [0.9 + 0.5 * k for k in range(1, int((busy_until_s - 0.9) / 0.5) + 1)]
    return [Sample(t, 70.0 if t < 0.05 else 600.0, counter_scale * exact_j(t)) for t in times]


def test_a_power_step_between_sparse_readings_does_not_outvote_a_healthy_counter():
    # The trapezoid over the first 0.9 s misses ~212 J of a 3.4 s job (11 %): the integral's
    # own known error there, not the counter's.
    samples = starved_start(1.0, 3.4)
    est = window_energy(samples)
    assert est.method == "counter"
    assert est.energy_j == pytest.approx(70.0 * 0.05 + 600.0 * (samples[-1].t_s - 0.05))
    assert est.integral_j < 0.9 * est.energy_j


def test_a_wrong_counter_is_still_rejected_where_power_was_read_densely_enough_to_tell():
    est = window_energy(starved_start(1.2, 60.0))  # counts 20 % high over a minute
    assert est.method == "integral"
    assert "counter disagrees" in est.note


def test_small_windows_are_not_judged_by_a_noisy_averaged_power_reading():
    # 2 s at 100 W: 200 J; NVML's 1 s averaged power lags, so a 30% gap here proves nothing.
    samples = [Sample(0.0, 70.0, 0.0), Sample(1.0, 70.0, 100.0), Sample(2.0, 70.0, 200.0)]
    assert window_energy(samples).method == "counter"


def test_without_a_counter_the_integral_is_used_and_said_so():
    est = window_energy(steady(250.0, 10, counter=False))
    assert est.method == "integral" and est.energy_j == pytest.approx(2500.0)


def test_with_no_usable_readings_there_is_no_figure_rather_than_zero():
    est = window_energy([Sample(0.0, None, None)])
    assert est.energy_j is None and est.method == "none"


def test_counter_delta_reports_why_it_is_unusable():
    assert counter_delta([Sample(0.0, 1.0, None)]) == (None, "no energy counter")


def test_a_job_on_several_gpus_is_labelled_by_its_weakest_method():
    assert combine_methods(["counter", "integral", "counter"]) == "integral"
    assert combine_methods(["counter", "counter"]) == "counter"
    assert combine_methods([]) == "none"


def test_a_window_is_cut_exactly_at_its_edges_by_interpolation():
    from telemetry.energy import clip_window

    samples = [Sample(float(t), 100.0, 100.0 * t) for t in range(0, 11, 2)]  # every 2 s
    clipped = clip_window(samples, 3.0, 7.0)
    assert [s.t_s for s in clipped] == [3.0, 4.0, 6.0, 7.0]
    assert window_energy(clipped).energy_j == pytest.approx(400.0)


# -- invalid power readings are gaps (issue 17) ------------------------------------------


def load_step_with_a_power_gap(gap=(15, 55)):
    """70 W idle until t=20 s, 700 W after, for 100 s at 1 Hz; the counter is right all along,
    but the power reading is invalid (None: a sentinel the backend dropped) during `gap`."""
    samples, energy = [], 1e6
    for t in range(101):
        p = 70.0 if t < 20 else 700.0
        if t:
            energy += (70.0 if t <= 20 else 700.0)
        samples.append(Sample(float(t), None if gap[0] <= t < gap[1] else p, energy))
    return samples


def test_a_gap_in_power_readings_does_not_outvote_a_healthy_counter():
    est = window_energy(load_step_with_a_power_gap())
    assert est.method == "counter"
    assert est.energy_j == pytest.approx(20 * 70 + 80 * 700)


def test_power_readings_impossible_for_the_gpu_are_gaps_not_numbers():
    """A UINT32_MAX taken as microwatts (4294.97 W) slipped through on every 4th sample."""
    samples = steady(600.0, 120)
    samples = [Sample(s.t_s, 4294.967295 if i % 4 == 1 else s.power_w, s.energy_j)
               for i, s in enumerate(samples)]
    est = window_energy(samples, max_power_w=1.5 * 750)
    assert est.method == "counter" and est.energy_j == pytest.approx(72_000.0)
    assert est.integral_j == pytest.approx(72_000.0)
    assert integrate_power(samples, max_power_w=1.5 * 750) == pytest.approx(72_000.0)


def test_too_few_valid_power_readings_leave_the_counter_unverified_not_replaced():
    samples = [Sample(s.t_s, s.power_w if s.t_s < 10 else None, s.energy_j) for s in steady(500.0, 60)]
    est = window_energy(samples)
    assert est.method == "counter-unverified"
    assert est.energy_j == pytest.approx(30_000.0)
    assert "cover" in est.note


def test_negative_or_nan_power_is_a_gap():
    samples = [Sample(s.t_s, -1.0 if s.t_s == 5 else float("nan") if s.t_s == 6 else s.power_w, None)
               for s in steady(100.0, 10)]
    assert integrate_power(samples) == pytest.approx(1000.0)
