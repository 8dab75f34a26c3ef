"""Each planning constraint of the carbon-aware policies, one test per constraint, for greedy
and cpsat alike. Every scenario puts the cheapest (cleanest) choice exactly where the
constraint forbids it, so a policy that ignored the constraint would take it and fail.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from policies import GpuSlot, QueuedJob, Snapshot, get_policy, policy_names
from policies.model.catalog import catalog
from policies.types import Assignment, CarbonCurve, Estimate, Plan, PowerCap, Profile, grams
from policy_checker import violations

NOW = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
POLICIES = ["greedy", "cpsat"]


def curve(zone: str, values: list[float]) -> CarbonCurve:
    return CarbonCurve(zone=zone, start=NOW, step_s=3600, values_g_per_kwh=tuple(values))


FLAT_DIRTY = [500.0] * 48
FLAT_CLEAN = [50.0] * 48
VALLEY_AT_10H = [400.0] * 10 + [20.0] * 4 + [400.0] * 34  # cheap from +10 h to +14 h


def gpu(id: int, node: str, zone: str, model: str = "H100", **kw) -> GpuSlot:
    return GpuSlot(id=id, node=node, zone=zone, index=kw.pop("index", id), model=model,
                   memory_gib=catalog()[model].memory_gib, **kw)


def job(id: int, **kw) -> QueuedJob:
    kw.setdefault("gpus", 1)
    kw.setdefault("gpu_mem_gib", 0.0)
    kw.setdefault("submitted_at", NOW)
    kw.setdefault("est_runtime_s", 3600.0)
    return QueuedJob(id=id, **kw)


def snap(jobs, gpus, carbon, **kw) -> Snapshot:
    return Snapshot(now=NOW, jobs=tuple(jobs), gpus=tuple(gpus), carbon=carbon, **kw)


def run(policy: str, snapshot: Snapshot):
    params = {"max_time_s": 1.0} if policy == "cpsat" else {}
    plan = get_policy(policy, **params).plan(snapshot)
    assert violations(snapshot, plan) == []
    return plan


TWO_ZONES = {"CLEAN": curve("CLEAN", FLAT_CLEAN), "DIRTY": curve("DIRTY", FLAT_DIRTY)}


def test_all_four_policies_are_registered_and_take_parameters():
    assert {"fifo", "greedy", "cpsat", "oracle"} <= set(policy_names())
    assert get_policy("cpsat", max_time_s=3.0, workers=2).max_time_s == 3.0
    with pytest.raises(ValueError):
        get_policy("greedy", no_such_knob=1)


@pytest.mark.parametrize("policy", POLICIES)
def test_without_constraints_the_cleanest_zone_and_time_win(policy):
    """The baseline for the tests below: unconstrained, the job goes to the valley."""
    s = snap([job(1)], [gpu(1, "a", "Z")], {"Z": curve("Z", VALLEY_AT_10H)})
    a = run(policy, s).by_job()[1]
    assert NOW + 10 * HOUR <= a.start_at <= NOW + 13 * HOUR
    assert a.estimate.gco2 < a.estimate.gco2_if_now


@pytest.mark.parametrize("policy", POLICIES)
def test_deadline_keeps_the_job_out_of_a_valley_it_cannot_finish_before(policy):
    s = snap([job(1, deadline=NOW + 4 * HOUR)], [gpu(1, "a", "Z")], {"Z": curve("Z", VALLEY_AT_10H)})
    a = run(policy, s).by_job()[1]
    assert a.estimate.finish_at <= NOW + 4 * HOUR
    assert not a.estimate.deadline_miss
    assert a.estimate.binding == "deadline"


@pytest.mark.parametrize("policy", POLICIES)
def test_max_delay_caps_how_long_a_job_may_wait(policy):
    s = snap([job(1, max_delay_s=2 * 3600)], [gpu(1, "a", "Z")], {"Z": curve("Z", VALLEY_AT_10H)})
    a = run(policy, s).by_job()[1]
    assert a.start_at <= NOW + 2 * HOUR


@pytest.mark.parametrize("policy", POLICIES)
def test_latency_slo_excludes_models_whose_p95_is_too_slow(policy):
    profiles = (Profile("chat", "A100", prompts_per_s=10, power_w=300, latency_p50_ms=300, latency_p95_ms=900),
                Profile("chat", "H100", prompts_per_s=20, power_w=600, latency_p50_ms=50, latency_p95_ms=100))
    gpus = [gpu(1, "slow", "CLEAN", "A100"), gpu(2, "fast", "DIRTY", "H100")]
    s = snap([job(1, workload="chat", prompts=36000, latency_slo_ms=200)], gpus, TWO_ZONES, profiles=profiles)
    a = run(policy, s).by_job()[1]
    assert a.gpu_ids == (2,)


@pytest.mark.parametrize("policy", POLICIES)
def test_gpu_memory_excludes_gpus_too_small(policy):
    gpus = [gpu(1, "small", "CLEAN", "H100"), gpu(2, "big", "DIRTY", "MI300X")]
    a = run(policy, snap([job(1, gpu_mem_gib=100)], gpus, TWO_ZONES)).by_job()[1]
    assert a.gpu_ids == (2,)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_runs_on_one_node(policy):
    gpus = [gpu(1, "c1", "CLEAN"), gpu(2, "c2", "CLEAN"), gpu(3, "d", "DIRTY", index=0),
            gpu(4, "d", "DIRTY", index=1)]
    a = run(policy, snap([job(1, gpus=2)], gpus, TWO_ZONES)).by_job()[1]
    assert set(a.gpu_ids) == {3, 4} and a.node == "d"


@pytest.mark.parametrize("policy", POLICIES)
def test_busy_gpus_are_not_used_before_they_free(policy):
    gpus = [gpu(1, "c", "CLEAN", busy_until=NOW + 30 * HOUR), gpu(2, "d", "DIRTY")]
    a = run(policy, snap([job(1, deadline=NOW + 3 * HOUR)], gpus, TWO_ZONES)).by_job()[1]
    assert a.gpu_ids == (2,)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("flag", [{"healthy": False}, {"drained": True}], ids=["unhealthy", "drained"])
def test_unhealthy_and_drained_gpus_are_never_used(policy, flag):
    gpus = [gpu(1, "c", "CLEAN", **flag), gpu(2, "d", "DIRTY")]
    a = run(policy, snap([job(1)], gpus, TWO_ZONES)).by_job()[1]
    assert a.gpu_ids == (2,)


@pytest.mark.parametrize("policy", POLICIES)
def test_site_power_cap_limits_concurrent_jobs_in_a_zone(policy):
    """Two 1-GPU jobs fit the clean zone's GPUs but not its 800 W cap at the same time."""
    gpus = [gpu(1, "c", "CLEAN", index=0), gpu(2, "c", "CLEAN", index=1), gpu(3, "d", "DIRTY")]
    caps = (PowerCap(zone="CLEAN", cap_w=800.0),)
    jobs = [job(1, deadline=NOW + 2 * HOUR), job(2, deadline=NOW + 2 * HOUR)]
    p = run(policy, snap(jobs, gpus, TWO_ZONES, power_caps=caps))
    zones = {a.job_id: ("CLEAN" if a.gpu_ids[0] in (1, 2) else "DIRTY") for a in p.assignments}
    overlapping = p.by_job()[1].start_at == p.by_job()[2].start_at
    assert not (overlapping and set(zones.values()) == {"CLEAN"})


@pytest.mark.parametrize("policy", POLICIES)
def test_pinned_jobs_keep_their_gpus_and_start_and_others_plan_around_them(policy):
    pinned = Assignment(job_id=1, node="c", gpu_ids=(1,), start_at=NOW,
                        estimate=Estimate(finish_at=NOW + 2 * HOUR, runtime_s=7200.0,
                                          energy_j=7200.0 * 574.0))
    gpus = [gpu(1, "c", "CLEAN"), gpu(2, "d", "DIRTY")]
    jobs = [job(1, pinned=True, est_runtime_s=7200.0), job(2, deadline=NOW + HOUR)]
    p = run(policy, snap(jobs, gpus, TWO_ZONES, pinned={1: pinned})).by_job()
    assert p[1] == pinned
    assert p[2].gpu_ids == (2,)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_that_cannot_meet_its_deadline_runs_asap_and_is_flagged(policy):
    j = job(1, est_runtime_s=4 * 3600.0, deadline=NOW + HOUR)
    a = run(policy, snap([j], [gpu(1, "c", "Z")], {"Z": curve("Z", VALLEY_AT_10H)})).by_job()[1]
    assert a.start_at == NOW
    assert a.estimate.deadline_miss
    assert "deadline" in a.explanation


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_no_gpu_can_take_is_reported_with_the_reason(policy):
    p = run(policy, snap([job(1, gpu_mem_gib=300), job(2)], [gpu(1, "c", "Z")], {"Z": curve("Z", FLAT_CLEAN)}))
    assert p.by_job().keys() == {2}
    assert "memory" in p.unplaced[1]


@pytest.mark.parametrize("policy", POLICIES)
def test_explanation_names_model_zone_start_and_the_run_now_alternative(policy):
    s = snap([job(1, workload="llm-chat-8b", prompts=50000)], [gpu(1, "a", "Z", "H200")],
             {"Z": curve("Z", VALLEY_AT_10H)})
    a = run(policy, s).by_job()[1]
    e = a.explanation
    assert "H200 in Z at " in e and any(f"at {h}:" in e for h in (10, 11, 12, 13))
    assert f": {grams(a.estimate.gco2)}" in e and f"{grams(a.estimate.gco2_if_now)} now" in e
    assert "g/prompt" in e and a.estimate.gco2_per_prompt == pytest.approx(a.estimate.gco2 / 50000)


def test_a_power_cap_is_judged_from_now_and_where_the_plan_draws_power():
    """Running jobs alone above a zone's cap (until 02:00) are not the plan's violation; a
    planned job is, while they still draw, and is not once they have ended."""
    from policies.solvers.placement import plan_violations
    from policies.problem.instance import compile_problem

    busy = gpu(1, "a", "Z", model="B200", busy_until=NOW + 2 * HOUR)  # ~824 W
    s = snap([job(2)], [busy, gpu(2, "b", "Z")], {"Z": curve("Z", FLAT_CLEAN)},  # job 2: ~574 W on H100
             power_caps=(PowerCap(zone="Z", cap_w=700.0),))
    problem = compile_problem(s)

    def plan_at(start):
        return Plan(assignments=(Assignment(job_id=2, node="b", gpu_ids=(2,), start_at=start),))

    assert plan_violations(problem, plan_at(NOW + 3 * HOUR)) == []
    assert any("cap" in v for v in plan_violations(problem, plan_at(NOW)))
