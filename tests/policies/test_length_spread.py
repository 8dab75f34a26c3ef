"""A job of uncertain length is priced by its expected grams (issue 31, `policies.model.length_spread`).

The spread is what the runs of the job's estimate class taught (`policies.model.runtime_correction`);
every policy prices the job the same way (greedy, cpsat and fifo), so plans still compare.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from policies import get_policy
from policies.model.length_spread import MIN_RUNS, POINTS, multipliers, spread_of
from policies.types import CarbonCurve, GpuSlot, QueuedJob, Snapshot
from policies.problem.instance import compile_problem
from policies.model.runtime_correction import correction

NOW = datetime(2022, 6, 1, tzinfo=timezone.utc)
# hours 2-3 very clean, then dirty; hours 10-17 fairly clean all along
INTENSITY = (300.0, 300.0, 10.0, 10.0) + (500.0,) * 6 + (50.0,) * 8 + (300.0,) * 46
SPREAD = (0.5, 1.0, 2.0, 4.0)  # a 2 h estimate that runs 1, 2, 4 or 8 h


def _snapshot(spread: tuple[float, ...] = (), interruptible: str | None = None) -> Snapshot:
    job = QueuedJob(id=1, gpus=1, gpu_mem_gib=0, submitted_at=NOW, est_runtime_s=2 * 3600.0,
                    length_spread=spread, interruptible=interruptible,
                    max_segments=4 if interruptible else 4)
    return Snapshot(now=NOW, jobs=(job,),
                    gpus=(GpuSlot(id=0, node="n", zone="Z", index=0, model="H100", memory_gib=80.0),),
                    carbon={"Z": CarbonCurve("Z", NOW, 3600.0, INTENSITY)})


def _start_h(plan) -> float:
    (a,) = plan.assignments
    return (a.start_at - NOW).total_seconds() / 3600.0


def _hours_sum(start_h: int, length_h: int) -> float:
    return sum(INTENSITY[start_h:start_h + length_h])


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_a_job_of_uncertain_length_goes_where_it_is_likely_to_run_clean(policy):
    # told 2 h, the cleanest two hours are 02:00-04:00; a job that may run 8 h is better at 10:00
    assert _start_h(get_policy(policy).plan(_snapshot())) == 2.0
    assert _start_h(get_policy(policy).plan(_snapshot(SPREAD))) == 10.0


def test_the_planned_grams_are_the_mean_over_the_lengths_for_every_policy():
    point = get_policy("greedy").plan(_snapshot()).assignments[0].estimate.gco2
    expected = get_policy("greedy").plan(_snapshot(SPREAD)).assignments[0].estimate.gco2
    per_kwh_h = point / _hours_sum(2, 2)  # the job's kW (x PUE): grams per g/kWh-hour
    mean_at_10 = np.mean([_hours_sum(10, h) for h in (1, 2, 4, 8)])
    assert expected == pytest.approx(per_kwh_h * mean_at_10, rel=1e-6)
    # fifo runs it at once and prices it the same way, so the plans still compare fairly
    fifo = get_policy("fifo").plan(_snapshot(SPREAD)).assignments[0]
    assert fifo.start_at == NOW
    assert fifo.estimate.gco2 == pytest.approx(per_kwh_h * np.mean([_hours_sum(0, h) for h in (1, 2, 4, 8)]),
                                               rel=1e-6)
    # and the problem's own scoring (re-integrating a plan) agrees
    problem = compile_problem(_snapshot(SPREAD))
    shape_w = point / (_hours_sum(2, 2) * 3600.0) * 3.6e6  # W x PUE
    again = problem.gco2_at("Z", NOW, 2 * 3600.0, shape_w, 1.0, multipliers(problem.jobs[0]))
    assert again == pytest.approx(fifo.estimate.gco2, rel=1e-6)


def test_a_job_that_may_be_cut_into_segments_is_priced_at_its_estimate():
    job = _snapshot(SPREAD, interruptible="checkpoint").jobs[0]
    assert multipliers(job) is None
    assert multipliers(_snapshot(SPREAD).jobs[0]).tolist() == list(SPREAD)


def test_the_spread_is_the_quantiles_of_the_class_ratios_around_the_corrected_estimate():
    assert spread_of([0.0] * (MIN_RUNS - 1), 0.0) == ()  # too few runs: priced at the estimate
    rng = np.random.default_rng(1)
    logs = rng.normal(math.log(0.5), 0.8, 200).tolist()  # jobs run about half their estimate
    c = correction(logs)
    assert len(c.length_spread) == POINTS and list(c.length_spread) == sorted(c.length_spread)
    # the corrected estimate x each multiplier: the real lengths' quantiles (per unit estimate)
    real = np.exp(np.quantile(logs, (np.arange(POINTS) + 0.5) / POINTS))
    assert np.allclose(c.factor * np.array(c.length_spread), real, rtol=1e-9)
    # about half the runs are longer than the corrected estimate, half shorter
    below = sum(m < 1.0 for m in c.length_spread)
    assert POINTS // 2 - 2 <= below <= POINTS // 2 + 2


def test_a_crashed_run_moves_one_tail_point_not_the_price_of_the_middle():
    logs = [math.log(0.5)] * 30
    calm = correction(logs).length_spread
    crashed = correction(logs[:-1] + [math.log(0.001)]).length_spread
    assert calm == (1.0,) * POINTS
    assert crashed[1:] == calm[1:] and crashed[0] <= 1.0
