"""Power limits (issue 17): read from the driver, stored per GPU, shown, and obeyed by the
energy model: a GPU capped at 500 W is never estimated above 500 W, whatever its profile or
TDP say, and runs as much longer (the same energy: the performance model's rule at the TDP,
issue 27), so deadline and time-limit checks see the stretched runtime; an unknown part is
planned from the limit its driver reports."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from policies import GpuSlot, QueuedJob, Snapshot, get_policy
from policies.model.energy import ProfileBook, generic_power_w, job_shape, seed_profiles, shape_arrays
from policies.types import CarbonCurve

NOW = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)


def h100s(n: int, power_limit_w: float | None, model: str = "H100") -> list[GpuSlot]:
    return [GpuSlot(id=i + 1, node="n1", zone="Z", index=i, model=model, memory_gib=80,
                    power_limit_w=power_limit_w) for i in range(n)]


def jobs() -> list[QueuedJob]:
    return [QueuedJob(id=1, gpus=2, gpu_mem_gib=0, submitted_at=NOW, est_runtime_s=3600),  # generic
            QueuedJob(id=2, gpus=1, gpu_mem_gib=0, submitted_at=NOW, workload="llm-chat-8b", est_runtime_s=3600),
            QueuedJob(id=3, gpus=1, gpu_mem_gib=0, submitted_at=NOW, workload="llm-chat-8b", prompts=50_000)]


def test_job_shape_never_draws_more_than_the_power_limit():
    book = ProfileBook(seed_profiles())
    for job in jobs():
        free = job_shape(job, "H100", book, 3600.0)
        capped = job_shape(job, "H100", book, 3600.0, power_limit_w=500.0)
        assert free.power_w > 500.0 * job.gpus  # the uncapped estimate would exceed the cap
        assert capped.power_w == pytest.approx(500.0 * job.gpus)
        # the cap stretches runtime by uncapped / capped power: the same joules, later
        assert capped.runtime_s == pytest.approx(free.runtime_s * free.power_w / capped.power_w, rel=1e-9)
        assert capped.energy_j == pytest.approx(free.energy_j, rel=1e-9)
        assert capped.runtime_s > free.runtime_s


def test_a_power_cap_does_not_make_the_same_work_cheaper():
    """The issue's example: an H100 capped at 350 W looked 39 % cheaper for the same work."""
    book = ProfileBook(seed_profiles())
    job = QueuedJob(id=9, gpus=1, gpu_mem_gib=0, submitted_at=NOW, workload="llm-chat-8b", prompts=10_000)
    free = job_shape(job, "H100", book, 3600.0)
    capped = job_shape(job, "H100", book, 3600.0, power_limit_w=350.0)
    assert capped.energy_j == pytest.approx(free.energy_j, rel=1e-9)
    assert capped.runtime_s == pytest.approx(free.runtime_s * free.power_w / 350.0, rel=1e-9)


def test_time_limit_checks_use_the_stretched_runtime_on_a_capped_gpu():
    from policies.model.energy import within_time_limit

    book = ProfileBook(seed_profiles())
    probe = QueuedJob(id=7, gpus=1, gpu_mem_gib=0, submitted_at=NOW, workload="llm-chat-8b", prompts=20_000)
    free_s = job_shape(probe, "H100", book, 3600.0).runtime_s
    capped_s = job_shape(probe, "H100", book, 3600.0, power_limit_w=350.0).runtime_s
    assert capped_s > 1.3 * free_s
    job = QueuedJob(id=7, gpus=1, gpu_mem_gib=0, submitted_at=NOW, workload="llm-chat-8b", prompts=20_000,
                    time_limit_s=(free_s + capped_s) / 2)
    assert within_time_limit(job, "H100", book, 3600.0)
    assert not within_time_limit(job, "H100", book, 3600.0, power_limit_w=350.0)
    arrays = shape_arrays([job], ["H100", "H100"], book, 3600.0, [None, 350.0])
    assert arrays.runtime_s[0, 1] == job_shape(job, "H100", book, 3600.0, 350.0).runtime_s
    for policy in ("fifo", "greedy"):  # the planners refuse the capped GPUs for it, take the free ones
        curve = CarbonCurve(zone="Z", start=NOW, step_s=3600, values_g_per_kwh=(300.0,) * 48)
        gpus = (GpuSlot(id=1, node="capped", zone="Z", index=0, model="H100", memory_gib=80, power_limit_w=350.0),
                GpuSlot(id=2, node="free", zone="Z", index=0, model="H100", memory_gib=80))
        plan = get_policy(policy).plan(Snapshot(now=NOW, jobs=(job,), gpus=gpus, carbon={"Z": curve}))
        assert [a.gpu_ids for a in plan.assignments] == [(2,)], policy


def test_shape_arrays_apply_the_same_cap_as_job_shape():
    book = ProfileBook(seed_profiles())
    arrays = shape_arrays(jobs(), ["H100", "H100"], book, 3600.0, [None, 500.0])
    for i, job in enumerate(jobs()):
        assert arrays.power_w[i, 0] == job_shape(job, "H100", book, 3600.0).power_w
        assert arrays.power_w[i, 1] == job_shape(job, "H100", book, 3600.0, 500.0).power_w


def test_an_unknown_part_is_planned_from_its_own_power_limit_not_as_the_reference_gpu():
    assert generic_power_w("NVIDIA H800", 350.0) < 350.0
    assert generic_power_w("NVIDIA H800", 350.0) != generic_power_w("H100")
    assert generic_power_w("NVIDIA H800", 350.0) > 0.5 * 350.0


@pytest.mark.parametrize("policy", ["fifo", "greedy", "cpsat"])
def test_plans_on_capped_gpus_estimate_at_most_the_cap(policy):
    curve = CarbonCurve(zone="Z", start=NOW, step_s=3600, values_g_per_kwh=(300.0,) * 48)
    params = {"max_time_s": 1.0} if policy == "cpsat" else {}
    estimates = {}
    for limit in (None, 500.0):
        snap = Snapshot(now=NOW, jobs=tuple(jobs()), gpus=tuple(h100s(4, limit)), carbon={"Z": curve})
        plan = get_policy(policy, **params).plan(snap)
        assert {a.job_id for a in plan.assignments} == {1, 2, 3}
        estimates[limit] = {a.job_id: (a.estimate, len(a.gpu_ids)) for a in plan.assignments}
    for job_id, (est, k) in estimates[500.0].items():
        uncapped, _ = estimates[None][job_id]
        assert est.energy_j / est.runtime_s <= 500.0 * k + 1e-6, (policy, job_id)
        assert uncapped.energy_j / uncapped.runtime_s > 500.0 * k  # the cap changed the estimate
        # ... by stretching the runtime, not by making the work cheaper (a flat curve: same grams)
        assert est.runtime_s > uncapped.runtime_s
        assert est.energy_j == pytest.approx(uncapped.energy_j, rel=1e-6)
        assert est.gco2 == pytest.approx(uncapped.gco2, rel=1e-6)


def test_gpus_with_different_caps_are_estimated_each_at_its_own():
    """Two H100s on one node, one capped at 300 W: a 1-GPU job on it is estimated at 300 W."""
    curve = CarbonCurve(zone="Z", start=NOW, step_s=3600, values_g_per_kwh=(300.0,) * 48)
    gpus = (GpuSlot(id=1, node="n1", zone="Z", index=0, model="H100", memory_gib=80, power_limit_w=300.0,
                    busy_until=None),
            GpuSlot(id=2, node="n1", zone="Z", index=1, model="H100", memory_gib=80, power_limit_w=700.0,
                    busy_until=NOW + timedelta(hours=30)))
    job = QueuedJob(id=1, gpus=1, gpu_mem_gib=0, submitted_at=NOW, est_runtime_s=3600)
    plan = get_policy("greedy").plan(Snapshot(now=NOW, jobs=(job,), gpus=gpus, carbon={"Z": curve}))
    (a,) = plan.assignments
    assert a.gpu_ids == (1,)
    assert a.estimate.energy_j / a.estimate.runtime_s == pytest.approx(300.0)


def test_a_plan_is_scored_and_checked_at_its_gpus_cap_as_it_was_estimated():
    """Plans are compared (greedy vs cpsat vs fifo) by `plan_score`: it must price capped GPUs
    as the estimates do, or a policy is judged by grams its plan will not emit."""
    from policies.solvers.placement import plan_score, plan_violations
    from policies.problem.instance import compile_problem

    curve = CarbonCurve(zone="Z", start=NOW, step_s=3600, values_g_per_kwh=(300.0,) * 48)
    snap = Snapshot(now=NOW, jobs=tuple(jobs()), gpus=tuple(h100s(4, 500.0)), carbon={"Z": curve})
    plan = get_policy("greedy").plan(snap)
    problem = compile_problem(snap)
    assert plan_score(problem, plan).gco2 == pytest.approx(sum(a.estimate.gco2 for a in plan.assignments))
    assert plan_violations(problem, plan) == []


@pytest.mark.parametrize("policy", ["fifo", "greedy", "cpsat"])
@pytest.mark.parametrize("runtime_s", [3600.0, 300.0])  # a slot-planned job and a short, packed one
def test_the_if_now_counterfactual_is_priced_at_the_cap_too(policy, runtime_s):
    """One job, one capped GPU, a flat grid: running now is the plan itself, so the
    counterfactual must cost exactly the plan's grams, both at 500 W."""
    curve = CarbonCurve(zone="Z", start=NOW, step_s=3600, values_g_per_kwh=(300.0,) * 48)
    job = QueuedJob(id=1, gpus=1, gpu_mem_gib=0, submitted_at=NOW, est_runtime_s=runtime_s, workload="llm-chat-8b")
    params = {"max_time_s": 1.0} if policy == "cpsat" else {}
    snap = Snapshot(now=NOW, jobs=(job,), gpus=tuple(h100s(1, 500.0)), carbon={"Z": curve})
    (a,) = get_policy(policy, **params).plan(snap).assignments
    assert a.estimate.energy_j / a.estimate.runtime_s == pytest.approx(500.0)
    assert a.estimate.gco2_if_now == pytest.approx(a.estimate.gco2)


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_a_short_job_packed_into_a_valley_is_estimated_at_the_cap(policy):
    """A 5-minute job (short-job packing) waits for the valley two hours out on a capped H100:
    its estimate, and the grams it is compared with, draw 500 W, not the profile's 700."""
    curve = CarbonCurve(zone="Z", start=NOW, step_s=3600, values_g_per_kwh=(500.0, 500.0) + (100.0,) * 46)
    job = QueuedJob(id=1, gpus=1, gpu_mem_gib=0, submitted_at=NOW, est_runtime_s=300, workload="llm-chat-8b")
    params = {"max_time_s": 1.0} if policy == "cpsat" else {}
    snap = Snapshot(now=NOW, jobs=(job,), gpus=tuple(h100s(1, 500.0)), carbon={"Z": curve})
    (a,) = get_policy(policy, **params).plan(snap).assignments
    assert a.start_at >= NOW + timedelta(hours=2)
    assert a.estimate.energy_j / a.estimate.runtime_s == pytest.approx(500.0)
    assert a.estimate.gco2_if_now == pytest.approx(a.estimate.gco2 * 5.0)
