"""The "if run now" counterfactual (issue 16, defect 1): one rule, stated in
`policies.pricing.counterfactual` and the README, that names never decide.

What a carbon-blind scheduler would have done with the job at submission: alone, on the
earliest free fitting GPUs, the fastest of them, and the mean over (zone, model) pairs still
tied. Renaming zones, nodes and GPU models (a permutation that keeps every GPU physically what
it is) never changes any estimate or saving; the figure is fixed when the job is first planned.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from policies import GpuSlot, QueuedJob, Snapshot, get_policy
from policies.pricing.counterfactual import choose
from policies.types import CarbonCurve, Profile
from policy_checker import violations

NOW = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)
MODELS = ("H100", "A100", "MI300X")


def curve(zone: str, values) -> CarbonCurve:
    return CarbonCurve(zone=zone, start=NOW, step_s=3600, values_g_per_kwh=tuple(values))


def plan(policy: str, snapshot: Snapshot):
    params = {"max_time_s": 1.0, "workers": 1} if policy == "cpsat" else {}
    p = get_policy(policy, **params).plan(snapshot)
    assert violations(snapshot, p) == []
    return p


def saving(a) -> float:
    return a.estimate.gco2_if_now - a.estimate.gco2


# -- the example -----------------------------------------------------------------------

def two_h100s(dirty: str, clean: str) -> Snapshot:
    """Two free H100s, one in a 500 g zone and one in a 50 g zone, and one hour-long job."""
    gpus = (GpuSlot(1, "n-" + dirty, dirty, 0, "H100", 80.0), GpuSlot(2, "n-" + clean, clean, 0, "H100", 80.0))
    return Snapshot(now=NOW, jobs=(QueuedJob(1, 1, 0.0, NOW, est_runtime_s=3600.0),), gpus=gpus,
                    carbon={dirty: curve(dirty, [500.0] * 60), clean: curve(clean, [50.0] * 60)})


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_swapping_two_zone_names_leaves_the_saving_unchanged(policy):
    a = plan(policy, two_h100s(dirty="A", clean="B")).by_job()[1]
    b = plan(policy, two_h100s(dirty="B", clean="A")).by_job()[1]
    assert a.estimate.gco2_if_now == pytest.approx(b.estimate.gco2_if_now)
    assert saving(a) == pytest.approx(saving(b)) and saving(a) > 0
    # equally early and equally fast in both zones: a carbon-blind scheduler has no reason to
    # prefer one, so the counterfactual is the mean of the two
    energy_kwh = a.estimate.energy_j / 3.6e6
    assert a.estimate.gco2_if_now == pytest.approx(energy_kwh * (500.0 + 50.0) / 2)


def test_fifo_compares_its_own_carbon_blind_pick_with_the_same_counterfactual():
    """fifo is the carbon-blind scheduler: which of two equally good GPUs it takes is arbitrary
    (node order), so its own grams depend on names, but the figure it is compared with does not."""
    a = plan("fifo", two_h100s(dirty="A", clean="B")).by_job()[1]
    b = plan("fifo", two_h100s(dirty="B", clean="A")).by_job()[1]
    assert a.estimate.gco2_if_now == pytest.approx(b.estimate.gco2_if_now)
    assert a.estimate.gco2_if_now == pytest.approx(a.estimate.energy_j / 3.6e6 * 275.0)


@pytest.mark.parametrize("policy", ["fifo", "greedy", "cpsat"])
@pytest.mark.parametrize("runtime_s", [300.0, 3600.0], ids=["short", "long"])
def test_each_job_is_compared_with_running_it_alone_whatever_the_queue_does(policy, runtime_s):
    """Three equal jobs on two H100s (500 g and 50 g zones): each job's counterfactual is the
    same, the job alone on the free GPUs, however the plan shares the GPUs among them."""
    s = two_h100s(dirty="A", clean="B")
    from dataclasses import replace

    s = replace(s, jobs=tuple(QueuedJob(i, 1, 0.0, NOW, est_runtime_s=runtime_s) for i in (1, 2, 3)))
    placed = plan(policy, s).by_job()
    assert len(placed) == 3
    per_kwh = {round(a.estimate.gco2_if_now / (a.estimate.energy_j / 3.6e6), 6) for a in placed.values()}
    assert per_kwh == {275.0}


def test_the_tie_rule_earliest_then_fastest_then_the_mean_over_zone_model_pairs():
    kinds = [("A", "H100"), ("B", "H100"), ("C", "A100"), ("D", "H100")]
    start = [0.0, 0.0, 0.0, 900.0]
    runtime = [3600.0, 3600.0, 8200.0, 3600.0]
    grams = [100.0, 300.0, 10.0, 1.0]
    cf = choose(kinds, start, runtime, grams)
    assert cf.gco2 == pytest.approx(200.0)  # D starts later, C is slower: A and B averaged
    assert cf.kinds == (("A", "H100"), ("B", "H100"))
    assert cf.where() == "H100 in A/B (mean of 2)"
    # the same candidates in another order give the same answer
    order = [3, 1, 2, 0]
    again = choose([kinds[i] for i in order], [start[i] for i in order], [runtime[i] for i in order],
                   [grams[i] for i in order])
    assert again == cf


# -- renaming never changes a saving -------------------------------------------------------------

def renamed_instance(seed: int, zone_names: dict[str, str], model_names: dict[str, str]) -> Snapshot:
    """A random instance (long and short jobs, busy GPUs, several zones and models) whose zones,
    nodes and models are renamed by the given permutations. Each GPU keeps its speed, power
    and memory: the profiles and memory sizes move with the model's name."""
    rng = random.Random(seed)
    zones = ["Z1", "Z2", "Z3"]
    speed = {"H100": (40.0, 700.0, 80.0), "A100": (18.0, 400.0, 80.0), "MI300X": (40.0, 750.0, 192.0)}
    profiles = tuple(Profile("w", model_names[m], pps, watts, 50.0, 80.0) for m, (pps, watts, _) in speed.items())
    gpus = []
    gid = 0
    for n in range(6):
        zone, model = zones[n % 3], MODELS[(n // 3 + n) % 3]
        for i in range(2):
            gid += 1
            busy = NOW + timedelta(minutes=rng.choice([0, 0, 20, 70])) if rng.random() < 0.3 else None
            gpus.append(GpuSlot(gid, f"node-{zone_names[zone]}-{n}", zone_names[zone], i, model_names[model],
                                speed[model][2], busy_until=busy))
    jobs = []
    for j in range(14):
        prompts = rng.choice([2_000, 20_000, 150_000, 400_000])  # ~1 min to ~6 h
        deadline = NOW + timedelta(hours=rng.choice([8, 24, 40])) if rng.random() < 0.5 else None
        jobs.append(QueuedJob(j + 1, rng.choice([1, 1, 2]), 0.0, NOW + timedelta(minutes=rng.choice([0, 0, 5])),
                              deadline=deadline, workload="w", prompts=prompts))
    carbon = {}
    for z in zones:
        base = rng.uniform(80, 500)
        carbon[zone_names[z]] = curve(zone_names[z], [base * (1 + 0.6 * ((h + 7 * zones.index(z)) % 24 < 6))
                                                      + rng.uniform(0, 30) for h in range(60)])
    return Snapshot(now=NOW, jobs=tuple(jobs), gpus=tuple(gpus), carbon=carbon, profiles=profiles)


PERMUTATIONS = [
    ({"Z1": "Z1", "Z2": "Z2", "Z3": "Z3"}, {m: m for m in MODELS}),
    ({"Z1": "Z3", "Z2": "Z1", "Z3": "Z2"}, {"H100": "MI300X", "A100": "H100", "MI300X": "A100"}),
    ({"Z1": "Z2", "Z2": "Z1", "Z3": "Z3"}, {"H100": "A100", "A100": "H100", "MI300X": "MI300X"}),
]


@pytest.mark.parametrize("policy", ["fifo", "greedy"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_renaming_zones_and_models_never_changes_any_estimate_or_saving(policy, seed):
    plans = [plan(policy, renamed_instance(seed, zones, models)).by_job() for zones, models in PERMUTATIONS]
    base = plans[0]
    assert len(base) >= 10  # the instance places (nearly) every job
    for other in plans[1:]:
        assert set(other) == set(base)
        for job_id, a in base.items():
            b = other[job_id]
            assert b.estimate.gco2_if_now == pytest.approx(a.estimate.gco2_if_now, rel=1e-9), job_id
            if policy != "fifo":  # fifo's own pick among equals is by node order (see above)
                assert b.estimate.gco2 == pytest.approx(a.estimate.gco2, rel=1e-9), job_id
                assert saving(b) == pytest.approx(saving(a), rel=1e-9, abs=1e-9), job_id


@pytest.mark.parametrize("policy", ["fifo", "greedy"])
def test_a_counterfactual_fixed_at_first_planning_is_kept(policy):
    """Planned again later (the forecast moved, time passed), the job is still compared with
    what running it at submission would have cost, not with running it at this later tick."""
    s = two_h100s(dirty="A", clean="B")
    first = plan(policy, s).by_job()[1].estimate.gco2_if_now
    from dataclasses import replace

    later = replace(s, jobs=(replace(s.jobs[0], gco2_if_now=first),),
                    carbon={"A": curve("A", [900.0] * 60), "B": curve("B", [50.0] * 60)})
    a = plan(policy, later).by_job()[1]
    assert a.estimate.gco2_if_now == first
    assert "if run at submission" in a.explanation or policy == "fifo"


# -- the daemon: the figure plan, show, receipts and reports compare with (SQLite and PostgreSQL) --

def test_the_stored_counterfactual_is_the_one_of_the_first_plan_in_every_later_plan_and_preview(store, tmp_path):
    """A job planned in DE is moved when a cleaner GB node joins an hour later; it is still
    compared with running it at submission (DE only), in the store and in `plan`'s preview."""
    from scheduler.daemon.access import ServiceConfig
    from scheduler.daemon.planner import preview_rows
    from scheduler.daemon.service import JobService
    from tests.daemon.test_planner_carbon import DE, GB, T, add_node, import_carbon, job_row, planner_for, submit

    import_carbon(store, DE, GB)
    add_node(store, "de1", "DE")
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs", clock=lambda: T)
    job_id = submit(service, est_runtime_s=3600, deadline=(T + timedelta(hours=30)).isoformat())
    planner_for(store).tick()
    first = job_row(store, job_id)
    assert first.planned_node == "de1" and first.est_gco2_if_now is not None

    add_node(store, "gb1", "GB")
    from sqlalchemy import update

    from scheduler.store.models import nodes
    with store.write() as conn:  # an hour on, both nodes alive
        conn.execute(update(nodes).values(last_heartbeat=T + timedelta(hours=1)))
    later = planner_for(store, clock=lambda: T + timedelta(hours=1))
    later.tick()
    moved = job_row(store, job_id)
    assert moved.planned_node == "gb1"
    assert moved.est_gco2_if_now == first.est_gco2_if_now
    assert "if run at submission" in moved.explanation
    assert preview_rows(later)[0]["gco2_if_now"] == first.est_gco2_if_now


@pytest.mark.parametrize("policy", ["fifo", "greedy", "cpsat"])
def test_two_sites_of_one_zone_and_model_count_at_their_mean_in_every_policy(policy):
    """Issue 25, 9c: two H100 sites in one zone, PUE 1.0 and 2.0, are one (zone, model) kind
    equally early and fast: the counterfactual is the mean of their grams (x1.5), the rule
    `policies.pricing.counterfactual.choose` states, never the dearer site's (x2.0)."""
    gpus = (GpuSlot(1, "n-lean", "DE", 0, "H100", 80.0, pue=1.0), GpuSlot(2, "n-old", "DE", 0, "H100", 80.0, pue=2.0),
            GpuSlot(3, "n-clean", "FR", 0, "H100", 80.0, pue=1.0))
    s = Snapshot(now=NOW, jobs=(QueuedJob(1, 1, 0.0, NOW, est_runtime_s=3600.0),), gpus=gpus,
                 carbon={"DE": curve("DE", [400.0] * 60), "FR": curve("FR", [40.0] * 60)})
    a = plan(policy, s).by_job()[1]
    kwh = a.estimate.energy_j / 3.6e6
    # kinds (DE, H100): mean of 400 x 1.0 and 400 x 2.0 = 600; (FR, H100): 40; their mean 320
    assert a.estimate.gco2_if_now == pytest.approx(kwh * (600.0 + 40.0) / 2, rel=1e-6)
