"""The planner chooses each job's GPU power limit (issue 29, item 1): a lower limit when the
deadline has slack and it cuts the grams, none when the deadline has no room for the slower
run, none where operators do not allow caps; the estimate is at the limit with the uncapped
one beside it, and the limit reaches the store (`plan`, `show`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from policies import GpuSlot, QueuedJob, Snapshot, get_policy
from policies.solvers.finish import finish_plan
from policies.types import CarbonCurve
from policies.pricing.power_cap import ALPHA, CapBounds, capped

NOW = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)
CURVE = CarbonCurve(zone="Z", start=NOW, step_s=3600, values_g_per_kwh=(300.0,) * 48)


def snapshot(job, caps=CapBounds(allow=True), model="H100") -> Snapshot:
    gpus = (GpuSlot(id=1, node="n1", zone="Z", index=0, model=model, memory_gib=80),)
    return Snapshot(now=NOW, jobs=(job,), gpus=gpus, carbon={"Z": CURVE}, caps=caps)


def planned(snap, policy="greedy"):
    plan = finish_plan(snap, get_policy(policy).plan(snap))
    (a,) = plan.assignments
    return a


def generic(deadline_s=None, **kw):
    return QueuedJob(id=1, gpus=1, gpu_mem_gib=0, submitted_at=NOW, est_runtime_s=3600,
                     deadline=NOW + timedelta(seconds=deadline_s) if deadline_s else None, **kw)


@pytest.mark.parametrize("policy", ["greedy", "fifo", "cpsat"])
def test_a_lower_cap_is_chosen_when_the_deadline_has_slack_and_none_when_it_has_not(policy):
    slack = planned(snapshot(generic(deadline_s=4 * 3600)), policy)
    free = planned(snapshot(generic(deadline_s=4 * 3600), caps=CapBounds(allow=False)), policy)
    e = slack.estimate
    assert e.power_limit_w is not None and e.power_limit_w < 700
    assert e.uncapped_gco2 == pytest.approx(free.estimate.gco2)
    assert e.uncapped_runtime_s == pytest.approx(free.estimate.runtime_s)
    assert e.gco2 < e.uncapped_gco2 and e.energy_j < e.uncapped_energy_j
    assert e.runtime_s > e.uncapped_runtime_s
    assert e.finish_at <= NOW + timedelta(hours=4)
    assert "power limit" in slack.explanation
    # the same job whose deadline leaves no room for a slower run: no cap
    tight = planned(snapshot(generic(deadline_s=free.estimate.runtime_s + 1.0
                                     + (free.start_at - NOW).total_seconds())), policy)
    assert tight.estimate.power_limit_w is None
    assert tight.estimate.gco2 == pytest.approx(free.estimate.gco2)


def test_the_cap_follows_the_cited_response_and_the_operators_floor():
    a = planned(snapshot(generic(deadline_s=4 * 3600), caps=CapBounds(allow=True, min_fraction=0.8)))
    e = a.estimate
    assert e.power_limit_w == pytest.approx(0.8 * 700)  # the floor: the greenest allowed
    per_gpu = e.uncapped_energy_j / e.uncapped_runtime_s
    factor, power = capped(per_gpu, e.power_limit_w, "nvidia")
    assert factor == pytest.approx((per_gpu / e.power_limit_w) ** ALPHA["nvidia"])
    assert e.runtime_s == pytest.approx(e.uncapped_runtime_s * factor)
    assert e.energy_j == pytest.approx(power * e.runtime_s)
    off = CapBounds(allow=True, models={"H100": (False, None)})
    assert planned(snapshot(generic(deadline_s=4 * 3600), caps=off)).estimate.power_limit_w is None
    on_for_one = CapBounds(allow=False, models={"H100": (True, 0.75)})
    assert planned(snapshot(generic(deadline_s=4 * 3600), caps=on_for_one)).estimate.power_limit_w == pytest.approx(525)


def test_an_explicit_time_limit_and_the_next_job_on_the_gpu_bound_the_slower_run():
    free = planned(snapshot(generic(), caps=CapBounds(allow=False)))
    limited = planned(snapshot(generic(time_limit_s=free.estimate.runtime_s * 1.001)))
    assert limited.estimate.power_limit_w is None
    two = (generic(deadline_s=None), replace(generic(), id=2, submitted_at=NOW + timedelta(seconds=1)))
    snap = replace(snapshot(two[0]), jobs=two)
    plan = finish_plan(snap, get_policy("fifo").plan(snap))
    first, second = sorted(plan.assignments, key=lambda a: a.start_at)
    assert first.estimate.finish_at <= second.start_at  # never runs into the next job's start


def test_caps_respect_the_latency_slos_of_an_llm_job():
    job = QueuedJob(id=1, gpus=1, gpu_mem_gib=0, submitted_at=NOW, workload="llm-chat-8b", prompts=200_000,
                    deadline=NOW + timedelta(days=1))
    a = planned(snapshot(job, model="H100"))
    from policies.model.energy import ProfileBook, model_choice, seed_profiles
    c = model_choice(job, "H100", ProfileBook(seed_profiles()))
    if a.estimate.power_limit_w is not None:
        factor = a.estimate.runtime_s / a.estimate.uncapped_runtime_s
        assert c.tpot_p95_ms * factor <= c.slos.tpot_ms and c.ttft_p95_ms * factor <= c.slos.ttft_ms
    tight = replace(job, tpot_slo_ms=c.tpot_p95_ms * 1.001)  # no room: any slowdown breaks it
    assert planned(snapshot(tight, model="H100")).estimate.power_limit_w is None


def test_cap_bounds_from_the_config_are_checked():
    b = CapBounds.from_config({"power": {"allow_caps": True, "min_cap_fraction": 0.75,
                                         "models": {"MI300X": {"allow_caps": False}}}})
    assert b.for_model("H100") == (True, 0.75) and b.for_model("MI300X") == (False, 0.75)
    assert CapBounds.from_config({}) == CapBounds()
    for bad in ({"allow_caps": "yes"}, {"min_cap_fraction": 0.1}, {"nope": 1},
                {"models": {"H100": {"min": 1}}}):
        with pytest.raises(ValueError):
            CapBounds.from_config({"power": bad})


def test_the_daemon_planner_writes_the_chosen_limit_and_the_uncapped_estimate(store, tmp_path):
    from sqlalchemy import select, update

    from scheduler.clock import utcnow
    from scheduler.daemon.access import Caller, ServiceConfig
    from scheduler.daemon.planner import Planner
    from scheduler.daemon.service import JobService
    from scheduler.site import SiteConfig
    from scheduler.store.models import gpus, jobs, nodes

    now = utcnow()
    with store.engine.begin() as conn:
        conn.execute(nodes.insert().values(name="n1", zone="Z", backend="emulated", emulated=True,
                                           registered_at=now, last_heartbeat=now))
        conn.execute(gpus.insert().values(node_name="n1", index=0, uuid="u0", model="H100", vendor="nvidia",
                                          memory_gib=80, healthy=True, power_limit_w=700, power_limit_default_w=700))
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path)
    root = Caller(uid=0, gid=0)
    slack = service.submit(root, {"argv": ["true"], "gpus": 1, "est_runtime_s": 3600, "deadline": (now + timedelta(hours=6)).isoformat()})["id"]
    planner = Planner(store, get_policy("greedy"),
                      site=SiteConfig.from_config({"power": {"allow_caps": True}}))
    planner.tick()
    with store.read() as conn:
        r = conn.execute(select(jobs).where(jobs.c.id == slack)).one()
    assert r.state == "PLANNED" and r.planned_power_limit_w is not None and r.planned_power_limit_w < 700
    assert r.est_uncapped_energy_j > r.est_energy_j and r.est_uncapped_runtime_s < r.est_runtime_planned_s
    # a second tick keeps the same limit (the stored estimate is the capped one: never capped twice)
    with store.engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == slack).values(planned_start=r.planned_start))
    planner.tick()
    with store.read() as conn:
        again = conn.execute(select(jobs).where(jobs.c.id == slack)).one()
    assert again.planned_power_limit_w == r.planned_power_limit_w
    assert again.est_uncapped_runtime_s == pytest.approx(r.est_uncapped_runtime_s)


def test_a_run_under_a_power_limit_is_kept_out_of_the_default_limit_profile(store):
    from sqlalchemy import update

    from scheduler.clock import utcnow
    from scheduler.profiles import completed_run
    from scheduler.store.models import gpus, jobs, nodes

    now = utcnow()
    with store.engine.begin() as conn:
        conn.execute(nodes.insert().values(name="n1", zone="Z", backend="emulated", emulated=True,
                                           registered_at=now, last_heartbeat=now))
        conn.execute(gpus.insert().values(node_name="n1", index=0, uuid="u0", model="H100", vendor="nvidia",
                                          memory_gib=80, healthy=True))
        gid = conn.execute(gpus.select()).first().id
        ids = []
        for limit in (None, 490.0):
            r = conn.execute(jobs.insert().values(
                name="j", state="COMPLETED", owner_uid=0, owner_gid=0, owner_name="root", owner_groups=[], env={}, argv=["true"],
                cwd="/", gpus=1, gpu_mem_gib=0, submitted_at=now - timedelta(hours=2), workload="llm-chat-8b",
                prompts=10_000, gpu_ids=[gid], started_at=now - timedelta(hours=1), ended_at=now,
                energy_j=1.0e6, power_limit_w=limit))
            ids.append(r.inserted_primary_key[0])
    with store.read() as conn:
        assert completed_run(conn, ids[0]) is not None
        assert completed_run(conn, ids[1]) is None


def test_the_simulator_with_caps_uses_less_energy_at_the_same_deadline_misses(tmp_path):
    """The gap scenario's mechanism on the bundled PAI slice: the planner's limits reach the
    simulated runs (runtime by the cap response, power at the limit)."""
    from tests.simulate.test_simulate import scenario

    from scheduler.simulate.runner import run_policies
    from scheduler.simulate.scenario import parse_mix
    from scheduler.simulate.settings import SimSettings

    sc = scenario(24, tmp_path, slack_s=12 * 3600, mix=parse_mix("llm-chat-8b=0.5,llm-chat-70b=0.5"))
    free = run_policies(sc, ["greedy"]).summaries["greedy"]
    capped_ = run_policies(sc, ["greedy"], settings=SimSettings(caps=CapBounds(allow=True))).summaries["greedy"]
    assert capped_["jobs"] == free["jobs"]
    assert capped_["deadline_misses"] <= free["deadline_misses"]
    assert capped_["energy_kwh"] < 0.97 * free["energy_kwh"], (free["energy_kwh"], capped_["energy_kwh"])
    assert capped_["kgco2"] < free["kgco2"]
