"""How the carbon-aware policies search, beyond the per-constraint tests: the batched cost
tables agree with the per-job ones, the cheap plan score agrees with the full one, and cpsat
gives scarce clean capacity to the jobs that save the most, where EDF greedy does not.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from policies import GpuSlot, QueuedJob, Snapshot, get_policy
from policies.model.catalog import catalog
from policies.solvers.greedy import GreedyState, greedy_picks, priced_tables
from policies.types import CarbonCurve
from policies.solvers.placement import estimate_score, plan_score
from policies.problem.instance import compile_problem
from policy_checker import score, violations

NOW = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
MODELS = ["A100", "H100", "MI300X", "B200", "H200"]


def random_snapshot(seed: int, n_jobs: int, n_nodes: int) -> Snapshot:
    """A mixed fleet over three zones with hourly curves, queued jobs with deadlines."""
    rng = np.random.default_rng(seed)
    zones = ["Z1", "Z2", "Z3"]
    carbon = {z: CarbonCurve(z, NOW - timedelta(minutes=int(rng.integers(0, 60))), 3600.0,
                             tuple(float(v) for v in rng.uniform(20, 700, 60))) for z in zones}
    gpus: list[GpuSlot] = []
    for n in range(n_nodes):
        zone, model = zones[n % 3], MODELS[n % len(MODELS)]
        for i in range(4):
            busy = NOW + timedelta(minutes=int(rng.integers(1, 600))) if rng.random() < 0.2 else None
            gpus.append(GpuSlot(id=len(gpus) + 1, node=f"n{n}", zone=zone, index=i, model=model,
                                memory_gib=catalog()[model].memory_gib, busy_until=busy))
    jobs = []
    for j in range(n_jobs):
        runtime = float(rng.choice([900.0, 3600.0, 3 * 3600.0, 8 * 3600.0]))
        workload = rng.choice(["llm-chat-8b", "none"])
        jobs.append(QueuedJob(
            id=j + 1, gpus=int(rng.choice([1, 1, 2, 4])), gpu_mem_gib=float(rng.choice([0, 40, 100])),
            submitted_at=NOW - timedelta(minutes=int(rng.integers(0, 120))), est_runtime_s=runtime,
            deadline=NOW + timedelta(seconds=runtime) + timedelta(hours=int(rng.integers(0, 30))),
            workload=None if workload == "none" else str(workload),
            prompts=int(rng.integers(1000, 200000)) if workload != "none" else None))
    return Snapshot(now=NOW, jobs=tuple(jobs), gpus=tuple(gpus), carbon=carbon, pue={"Z1": 1.1, "Z2": 1.3})


def test_batched_cost_tables_equal_the_per_job_tables_and_options():
    problem = compile_problem(random_snapshot(1, 40, 10))
    tables = problem.cost_tables(np.arange(len(problem.jobs)))
    for j in range(len(problem.jobs)):
        jo = problem.job_options(j)
        assert np.array_equal(tables[j][jo.groups], problem.cost_table(j))
        unfit = np.setdiff1d(np.arange(len(problem.groups)), jo.groups)
        assert np.isinf(tables[j][unfit]).all()
        assert np.array_equal(problem.job_duration[j, jo.groups], jo.duration[jo.first])
        assert np.array_equal(problem.job_latest[j, jo.groups], jo.latest[jo.first])
        for g in jo.groups.tolist():
            assert problem.job_runtime_s[j, g] == jo.shapes[problem.groups[g].model].runtime_s


def _expected_pools(snap: Snapshot, n_slots: int, slot_s: float) -> dict[tuple[str, str], dict[int, int]]:
    """(node, model) -> {usable GPU id: the slot it is free from}, straight from the GPUs."""
    out: dict[tuple[str, str], dict[int, int]] = {}
    for g in snap.gpus:
        if not g.healthy or g.drained:
            continue
        free = 0
        if g.busy_until is not None and g.busy_until > snap.now:
            free = min(n_slots, int(np.ceil((g.busy_until - snap.now).total_seconds() / slot_s - 1e-9)))
        out.setdefault((g.node, g.model), {})[g.id] = free
    return out


def test_pools_follow_each_snapshots_gpus_when_the_fleet_layout_repeats():
    """Pools and groups are shared between snapshots of the same fleet state; when a GPU is
    drained, fails or frees up, the next compile must see it."""
    base = random_snapshot(3, 5, 6)
    gpus = list(base.gpus)
    gpus[0] = replace(gpus[0], drained=True)
    gpus[5] = replace(gpus[5], healthy=False)
    gpus[9] = replace(gpus[9], busy_until=NOW + 7 * HOUR)
    gpus[10] = replace(gpus[10], busy_until=None)
    for snap in (base, replace(base, gpus=tuple(gpus)), base):
        problem = compile_problem(snap)
        want = _expected_pools(snap, problem.n_slots, problem.slot_s)
        got = {(p.node, p.model): dict(zip(p.gpu_ids, p.free_slot)) for p in problem.pools}
        assert got == want
        for i, p in enumerate(problem.pools):
            free = np.array(p.free_slot)
            expect_cap = (free[:, None] <= np.arange(problem.n_slots)[None, :]).sum(axis=0)
            assert np.array_equal(problem.capacity(i), expect_cap)
            assert list(problem.kth_free_slot[i, :len(free)]) == sorted(p.free_slot)
        for gi, group in enumerate(problem.groups):
            assert all(problem.pools[p].group == gi for p in group.pools)
            assert np.array_equal(problem.group_kth_free_slot[gi],
                                  problem.kth_free_slot[list(group.pools)].min(axis=0))


@pytest.mark.parametrize("policy", ["fifo", "greedy", "cpsat"])
def test_the_estimate_score_agrees_with_the_full_plan_score(policy):
    snapshot = random_snapshot(2, 30, 8)
    problem = compile_problem(snapshot)
    params = {"max_time_s": 1.0} if policy == "cpsat" else {}
    plan = get_policy(policy, **params).plan(snapshot)
    fast, full = estimate_score(problem, plan), plan_score(problem, plan)
    assert fast[:2] == full[:2] and fast.gco2 == pytest.approx(full.gco2, rel=1e-9)


def test_cpsat_gives_the_one_clean_gpu_to_the_job_that_saves_most():
    """Both jobs must start now; one clean GPU. EDF gives it to the job due first (1 h), which
    saves 450 g/kWh x 1 h; the 2 h job saves twice as much there. cpsat must swap them."""
    flat = lambda z, v: CarbonCurve(z, NOW, 3600.0, (v,) * 48)  # noqa: E731
    gpus = (GpuSlot(1, "clean", "CLEAN", 0, "H100", 80.0), GpuSlot(2, "dirty", "DIRTY", 0, "H100", 80.0))
    jobs = (QueuedJob(1, 1, 0.0, NOW, est_runtime_s=3600.0, deadline=NOW + HOUR),
            QueuedJob(2, 1, 0.0, NOW, est_runtime_s=7200.0, deadline=NOW + 2 * HOUR))
    s = Snapshot(now=NOW, jobs=jobs, gpus=gpus, carbon={"CLEAN": flat("CLEAN", 50.0), "DIRTY": flat("DIRTY", 500.0)})
    # greedy's own EDF plan (not fifo's, which takes one of two equally early GPUs at random)
    greedy = get_policy("greedy", compare_fifo=False).plan(s)
    cpsat = get_policy("cpsat", max_time_s=2.0).plan(s)
    assert greedy.by_job()[1].gpu_ids == (1,)  # EDF: the first-due job takes the clean GPU
    assert cpsat.by_job()[2].gpu_ids == (1,) and cpsat.by_job()[1].gpu_ids == (2,)
    assert violations(s, cpsat) == []
    # 1 kW-ish H100: (2 h x 50 + 1 h x 500) vs (1 h x 50 + 2 h x 500): 600 vs 1,050 units
    assert score(cpsat)[2] == pytest.approx(score(greedy)[2] * 600 / 1050, rel=1e-6)


def test_cpsat_beats_edf_greedy_on_a_contended_fleet_within_its_time_limit():
    """80 jobs on 40 GPUs with deadlines: the search (other greedy orders, then CP-SAT
    neighbourhoods) finds a clearly cheaper feasible plan, no later than its limit allows."""
    s = random_snapshot(3, 80, 10)
    greedy = get_policy("greedy").plan(s)
    t0 = time.monotonic()
    cpsat = get_policy("cpsat", max_time_s=3.0).plan(s)
    wall_s = time.monotonic() - t0
    assert violations(s, cpsat) == []
    assert score(cpsat)[:2] <= score(greedy)[:2]
    assert score(cpsat)[2] < 0.97 * score(greedy)[2], (score(cpsat), score(greedy))
    assert wall_s < 3.0 + 2.0  # the limit, plus a busy shared CI host's slack


def test_cpsat_lp_guidance_offers_only_in_window_starts_and_keeps_the_plan_feasible(caplog):
    """With a budget of 10 s or more and a small queue, cpsat solves the LP relaxation and
    steers its search by it: every (group, start) the LP uses lies in the job's window on a
    group it fits, and the plan stays feasible and no worse than greedy's."""
    from policies.solvers.cpsat import CpsatPolicy
    from policies.solvers.lp_relaxation import cannot_meet_deadline

    snapshot = random_snapshot(4, 40, 6)
    problem = compile_problem(snapshot)
    policy = CpsatPolicy(max_time_s=10.0)
    t0 = time.monotonic()
    support, price = policy._lp_support(problem, t0, t0 + 10.0)
    assert price.shape == (len(problem.groups), problem.n_slots) and (price >= 0).all()
    assert set(support) <= set(range(len(problem.jobs))) and len(support) >= len(problem.jobs) - 1
    for j, pairs in support.items():
        for g, s in pairs:
            assert problem.job_fit[j, g]
            assert problem.job_earliest[j] <= s
            assert s <= problem.job_latest[j, g] or cannot_meet_deadline(problem, j)  # a forced miss: any start
    assert CpsatPolicy(max_time_s=2.0)._lp_support(problem, t0, t0 + 2.0) == ({}, None)  # a first plan: no LP
    with caplog.at_level("INFO", logger="policies.solvers.cpsat"):
        plan = policy.plan(snapshot)
    assert "LP guidance" in caplog.text
    assert not violations(snapshot, plan)
    assert score(plan) <= score(get_policy("greedy").plan(snapshot))


def test_priced_tables_charge_k_times_the_price_of_each_gpu_slot_a_run_covers():
    problem = compile_problem(random_snapshot(5, 20, 6))
    js = np.arange(len(problem.jobs))
    tables = problem.cost_tables(js)
    price = np.zeros((len(problem.groups), problem.n_slots))
    assert np.array_equal(priced_tables(problem, js, tables, price), tables)
    g, t = 1, 10
    price[g, t] = 7.0
    priced = priced_tables(problem, js, tables, price)
    for i, j in enumerate(js.tolist()):
        s = problem.slot_index
        covers = (s <= t) & (t < s + problem.job_duration[j, g])
        extra = np.where(covers, 7.0 * problem.job_k[j], 0.0)
        finite = np.isfinite(tables[i, g])
        assert np.allclose(priced[i, g][finite], tables[i, g][finite] + extra[finite])
        others = np.arange(len(problem.groups)) != g
        assert np.array_equal(priced[i, others], tables[i, others])


def test_greedy_charged_a_price_avoids_the_priced_gpu_slots_and_counts_plain_gco2():
    problem = compile_problem(random_snapshot(6, 10, 6))
    j = 0
    (plain,), _ = greedy_picks(problem, GreedyState(problem), [j])
    g0 = int(problem.pool_group[plain.pool])
    price = np.zeros((len(problem.groups), problem.n_slots))
    price[g0, plain.slot] = 1e9  # the start greedy took, made prohibitive
    costs: dict[int, float] = {}
    (priced,), _ = greedy_picks(problem, GreedyState(problem), [j], costs=costs, price=price)
    g1 = int(problem.pool_group[priced.pool])
    assert not (g1 == g0 and priced.slot <= plain.slot < priced.slot + problem.job_duration[j, g1])
    assert costs[j] == problem.cost_tables([j])[0][g1, priced.slot]  # gCO2, not the priced cost
    assert costs[j] >= problem.cost_tables([j])[0][g0, plain.slot]  # the price made it give up its cheapest


def test_cpsat_charges_lagrangian_gpu_slot_prices_when_the_lp_is_skipped(caplog):
    """A queue above `lp_max_jobs` with a budget of 5 s or more: cpsat prices the GPU-slots
    by a Lagrangian ascent and restarts greedy charged those prices; the plan stays
    feasible and no worse than greedy's."""
    snapshot = random_snapshot(3, 80, 10)
    with caplog.at_level("INFO", logger="policies.solvers.cpsat"):
        plan = get_policy("cpsat", max_time_s=6.0, lp_max_jobs=0).plan(snapshot)
    assert "GPU-slot prices from a Lagrangian bound" in caplog.text and "LP guidance" not in caplog.text
    assert violations(snapshot, plan) == []
    assert score(plan) <= score(get_policy("greedy").plan(snapshot))


def test_previous_picks_map_the_last_plan_to_pools_and_slots_and_drop_what_no_longer_fits():
    snapshot = random_snapshot(7, 30, 8)
    plan = get_policy("greedy").plan(snapshot)
    by_job = plan.by_job()
    late = next(a for a in plan.assignments if a.start_at > NOW + 2 * HOUR)
    moved = replace(late, start_at=NOW + 60 * HOUR)  # past its deadline window
    wrong = next(a for a in plan.assignments if a.job_id != late.job_id and len(a.gpu_ids) == 1)
    short = replace(wrong, gpu_ids=())
    previous = {**by_job, late.job_id: moved, wrong.job_id: short, 999: late}  # 999: not queued
    problem = compile_problem(replace(snapshot, previous=previous))
    picks = {j: (pool, slot) for j, pool, slot in problem.previous_picks()}
    ids = {problem.jobs[j].id for j in picks}
    assert ids == set(by_job) - {late.job_id, wrong.job_id}
    for j, (pool, slot) in picks.items():
        a = by_job[problem.jobs[j].id]
        assert a.gpu_ids[0] in problem.pools[pool].gpu_ids
        assert abs((problem.slot_time(slot) - a.start_at).total_seconds()) <= problem.slot_s / 2


def test_finish_first_places_each_job_where_it_finishes_soonest_and_carbon_only_breaks_ties():
    snapshot = random_snapshot(10, 60, 3)
    problem = compile_problem(snapshot)
    state = GreedyState(problem)
    picks, _ = greedy_picks(problem, state, finish_first=True)
    for p in picks:  # placed in EDF order, each at the soonest finish the jobs before it left
        g = int(problem.pool_group[p.pool])
        finish = p.slot * problem.slot_s + problem.job_runtime_s[p.j, g]
        k, dur, power_w = int(problem.job_k[p.j]), int(problem.job_duration[p.j, g]), float(problem.job_power_w[p.j, g])
        state.give_back(p.pool, p.slot, k, dur, power_w)  # free it again: which starts were open to it?
        for g2 in np.flatnonzero(problem.job_fit[p.j]).tolist():
            for s2 in range(int(problem.job_earliest[p.j]), problem.n_slots):
                f2 = s2 * problem.slot_s + problem.job_runtime_s[p.j, g2]
                if f2 >= finish - 1e-6:
                    break
                if not p.deadline_miss and s2 > problem.job_latest[p.j, g2]:
                    break
                assert state.free_pool(p.j, g2, s2) is None, (p, g2, s2)
        state.take(p.pool, p.slot, k, dur, power_w)
    # and in an overfull queue it misses fewer deadlines than the cheapest starts do
    cheapest, _ = greedy_picks(problem)
    assert sum(p.deadline_miss for p in picks) < sum(p.deadline_miss for p in cheapest)


def test_cpsat_searches_from_the_earliest_finish_plan_where_it_misses_fewer_deadlines():
    """An overfull queue: EDF's cheapest starts miss 8 deadlines, the earliest finishes 5.
    cpsat's own search (fifo's and edf's plans aside) starts from the better one, even with
    no budget left for anything else, so it never hands a tick a plan with more misses
    than the carbon-blind rule's."""
    from policies.solvers.cpsat import CpsatPolicy

    problem = compile_problem(random_snapshot(10, 60, 3))
    finish_first, _ = greedy_picks(problem, finish_first=True)
    cheapest, _ = greedy_picks(problem)
    fewest = sum(p.deadline_miss for p in finish_first)
    assert fewest < sum(p.deadline_miss for p in cheapest)
    for budget_s in (0.001, 1.0):
        plan = CpsatPolicy(max_time_s=budget_s).plan_problem(problem, compare_fifo=False)
        assert sum(a.estimate.deadline_miss for a in plan.assignments) <= fewest
        assert violations(problem.snapshot, plan) == []


def test_cpsat_goes_on_from_the_previous_plan_when_given_one():
    """A re-plan given a good earlier plan (`Snapshot.previous`) is at least as good as it,
    even with a budget too short to find it again."""
    snapshot = random_snapshot(3, 80, 10)
    good = get_policy("cpsat", max_time_s=3.0).plan(snapshot)
    again = get_policy("cpsat", max_time_s=0.3).plan(replace(snapshot, previous=good.by_job()))
    assert violations(snapshot, again) == []
    assert score(again) <= score(good)
    # with no budget left at all (a loaded host: the first greedy pass used it up), the
    # previous plan is still tried, and kept
    starved = get_policy("cpsat", max_time_s=0.001).plan(replace(snapshot, previous=good.by_job()))
    assert violations(snapshot, starved) == []
    assert score(starved) <= score(good)
