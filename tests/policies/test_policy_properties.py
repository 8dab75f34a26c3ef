"""Properties of the carbon-aware policies on random small instances (hypothesis):

* every plan of fifo, greedy and cpsat is feasible (checked by an independent checker);
* on the model's own estimate, cpsat is never worse than greedy, and greedy never worse than
  fifo whenever fifo's plan is itself feasible (fifo ignores SLOs of nothing, but it does
  ignore power caps and deadlines, so its plan is not always a valid competitor).

Plans are compared in the policies' strict order (issue 24, `policies.solvers.placement.Score`):
fewer unplaced jobs, then fewer deadline misses, then fewer grams plus the strict tie-break
price of lateness (`STRICT_LATENESS_G_PER_GPU_H`, 10 kg per GPU-hour late). (Before lateness
was priced, a job that must miss could be placed wherever its grams were lowest, hours later
than it could finish.) The price, not a lexicographic rank: hypothesis found a plan 2
GPU-minutes later on a job that must miss for 333 g less, a tie at that price.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import GpuSlot, QueuedJob, Snapshot, get_policy
from policies.model.catalog import catalog
from policies.pricing.lateness import STRICT_LATENESS_G_PER_GPU_H
from policies.types import CarbonCurve, PowerCap
from policy_checker import strict_score, violations

NOW = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)
MODELS = ["A100", "H100", "MI300X", "B200"]
ZONES = ["Z1", "Z2", "Z3"]


@st.composite
def instances(draw) -> Snapshot:
    carbon = {z: CarbonCurve(z, NOW - timedelta(minutes=draw(st.integers(0, 59))), 3600.0,
                             tuple(draw(st.lists(st.floats(10, 800), min_size=50, max_size=50))))
              for z in ZONES}
    gpus: list[GpuSlot] = []
    for n in range(draw(st.integers(1, 4))):
        zone, model = draw(st.sampled_from(ZONES)), draw(st.sampled_from(MODELS))
        for i in range(draw(st.integers(1, 4))):
            busy = draw(st.sampled_from([None, None, NOW + timedelta(minutes=draw(st.integers(1, 600)))]))
            gpus.append(GpuSlot(id=len(gpus) + 1, node=f"n{n}", zone=zone, index=i, model=model,
                                memory_gib=catalog()[model].memory_gib, busy_until=busy,
                                healthy=draw(st.booleans()) or i > 0))
    jobs = []
    for j in range(draw(st.integers(1, 7))):
        runtime = draw(st.sampled_from([900.0, 3600.0, 3 * 3600.0, 8 * 3600.0]))
        deadline = draw(st.one_of(st.none(), st.integers(1, 40).map(lambda h: NOW + timedelta(hours=h))))
        workload = draw(st.sampled_from([None, None, "llm-chat-8b"]))
        jobs.append(QueuedJob(
            id=j + 1, gpus=draw(st.sampled_from([1, 1, 2, 4])), gpu_mem_gib=draw(st.sampled_from([0, 40, 100])),
            submitted_at=NOW - timedelta(minutes=draw(st.integers(0, 120))), est_runtime_s=runtime,
            deadline=deadline, workload=workload, prompts=draw(st.integers(1000, 200000)) if workload else None,
            latency_slo_ms=draw(st.sampled_from([None, None, 30000.0])) if workload else None,
            max_delay_s=draw(st.sampled_from([None, None, 6 * 3600.0]))))
    caps = tuple(PowerCap(zone="Z1", cap_w=draw(st.sampled_from([800.0, 2000.0]))) for _ in range(draw(st.integers(0, 1))))
    return Snapshot(now=NOW, jobs=tuple(jobs), gpus=tuple(gpus), carbon=carbon,
                    pue={"Z1": 1.1, "Z2": 1.3}, power_caps=caps)


def _better_or_equal(a: tuple[int, int, float, float], b: tuple[int, int, float, float]) -> bool:
    if a[:2] != b[:2]:
        return a[:2] < b[:2]
    objective_a, objective_b = (x[3] + STRICT_LATENESS_G_PER_GPU_H * x[2] for x in (a, b))
    return objective_a <= objective_b * (1 + 1e-6) + 1e-3


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_plans_are_feasible_and_cpsat_beats_greedy_beats_fifo(snapshot):
    fifo = get_policy("fifo").plan(snapshot)
    greedy = get_policy("greedy").plan(snapshot)
    cpsat = get_policy("cpsat", max_time_s=0.5).plan(snapshot)
    assert violations(snapshot, greedy) == []
    assert violations(snapshot, cpsat) == []
    c, g, f = (strict_score(snapshot, p) for p in (cpsat, greedy, fifo))
    assert _better_or_equal(c, g), (c, g)
    if violations(snapshot, fifo) == []:
        assert _better_or_equal(g, f), (g, f)


@settings(max_examples=15, deadline=None)
@given(instances())
def test_fifo_plans_respect_everything_but_deadlines_and_power_caps(snapshot):
    plain = Snapshot(now=snapshot.now, jobs=snapshot.jobs, gpus=snapshot.gpus, carbon=snapshot.carbon)
    assert violations(plain, get_policy("fifo").plan(plain)) == [] or any(
        j.deadline or j.max_delay_s for j in plain.jobs)


def test_a_job_that_must_miss_runs_first_even_where_fifo_spends_fewer_grams():
    """Hypothesis's example: a 2-GPU job cannot meet its 1 h deadline on the two healthy A100s
    (~2.3 h there); fifo runs the short job first and the late one after it (fewer grams: the
    first hour is the dirtier one), greedy and cpsat run the late one now, so it is late by
    ~2.3 fewer GPU-hours. Under the strict order that is the better plan."""
    curve = {"Z1": CarbonCurve("Z1", NOW, 3600.0, (11.0,) + (10.0,) * 49)}
    gpus = tuple(GpuSlot(id=i + 1, node=f"n{i // 3}", zone="Z1", index=i % 3, model="A100",
                         memory_gib=80, healthy=i in (1, 2)) for i in range(4))
    jobs = (QueuedJob(id=1, gpus=1, gpu_mem_gib=0, submitted_at=NOW, est_runtime_s=900.0),
            QueuedJob(id=2, gpus=2, gpu_mem_gib=0, submitted_at=NOW, est_runtime_s=3600.0,
                      deadline=NOW + timedelta(hours=1)))
    snapshot = Snapshot(now=NOW, jobs=jobs, gpus=gpus, carbon=curve, pue={"Z1": 1.1})
    fifo, greedy, cpsat = (get_policy(n, **kw).plan(snapshot)
                           for n, kw in (("fifo", {}), ("greedy", {}), ("cpsat", {"max_time_s": 0.5})))
    f, g, c = (strict_score(snapshot, p) for p in (fifo, greedy, cpsat))
    assert f[1] == g[1] == c[1] == 1  # the miss itself cannot be helped
    assert g[2] < f[2] - 1.0 and c[2] <= g[2] + 1e-3  # hours late: greedy and cpsat finish it sooner
    assert f[3] < g[3]  # ... for grams fifo would have saved
    assert _better_or_equal(g, f) and _better_or_equal(c, g)
