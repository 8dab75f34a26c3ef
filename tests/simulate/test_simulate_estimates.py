"""Job lengths as a real cluster knows them (`--estimate`): the planner plans with an estimate,
the job runs its real length; each estimate model draws what it says it draws; a job that
overruns its plan makes the jobs planned behind it be planned again."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest

from policies.model.energy import generic_runtime_scale
from policies.types import Assignment, Plan, QueuedJob
from policies.model.runtime_correction import MIN_RUNS, correction, correction_for, estimate_class
from scheduler.simulate.cluster import cluster_from_dict
from scheduler.simulate.estimates import (
    GAIA_SHORT_QUEUE_S, ROUND_VALUES_S, USER_SIGMA, EstimateError, EstimateModel, class_means, parse_estimate,
    round_up_request,
)
from scheduler.simulate.forecasts import parse_forecast
from scheduler.simulate.intensity import load_zone_files
from scheduler.simulate.model import Simulation
from scheduler.simulate.settings import SimSettings

from tests.simulate.test_simulate import DEMO, START, scenario

IDS = list(range(1, 20001))
# real runtimes spread like a batch trace: 5 min to 3 days, log-uniform
RUNTIMES = [300.0 * math.exp(i / len(IDS) * math.log(864.0)) for i in range(len(IDS))]


def _logs(model: EstimateModel) -> list[float]:
    return [math.log(e / r) for e, r in zip(model.estimates(IDS, RUNTIMES), RUNTIMES)]


# -- specs --------------------------------------------------------------------------------------

def test_estimate_specs_parse_and_bad_ones_say_why():
    assert parse_estimate(None).kind == "exact" and parse_estimate("class-mean").kind == "class-mean"
    m = parse_estimate("lognormal:0.5", seed=3)
    assert (m.kind, m.sigma, m.seed, m.spec) == ("lognormal", 0.5, 3, "lognormal:0.5")
    assert parse_estimate("user:3").k == 3.0
    for bad, why in (("lognormal:x", "needs a number"), ("lognormal:9", "between 0 and 3"),
                     ("user:0.5", "between 1 and 100"), ("user:", "needs a number"),
                     ("perfect", "unknown --estimate"), ("exact:1", "unknown --estimate")):
        with pytest.raises(EstimateError, match=why):
            parse_estimate(bad)


# -- each model's distribution ------------------------------------------------------------------

def test_exact_is_the_real_runtime():
    assert EstimateModel().estimates(IDS[:5], RUNTIMES[:5]) == RUNTIMES[:5]


def test_class_mean_is_the_mean_of_the_jobs_queue_as_gaia_defines_the_queues():
    """GAIA's two queues split at 2 h; each job is told its queue's mean over the trace."""
    runtimes = [600.0, 1800.0, 7200.0, 3 * 3600.0, 9 * 3600.0]
    est = parse_estimate("class-mean").estimates(range(5), runtimes)
    short, long = (600 + 1800 + 7200) / 3, (7200 + 3 * 3600 + 9 * 3600) / 3  # 2 h counts in both means
    assert est == pytest.approx([short, short, long, long, long])  # and is in the long queue
    assert class_means([600.0])["long"] == 600.0  # an empty queue takes the other's mean
    # over a wide trace the error per job is large: the "a median 65 % off"
    errors = sorted(abs(e / r - 1) for e, r in zip(parse_estimate("class-mean").estimates(IDS, RUNTIMES), RUNTIMES))
    assert errors[len(errors) // 2] > 0.3
    assert GAIA_SHORT_QUEUE_S == 7200.0


@pytest.mark.parametrize("sigma", [0.2, 0.5, 1.0])
def test_lognormal_is_an_unbiased_error_in_log_space_with_the_given_spread(sigma):
    logs = _logs(parse_estimate(f"lognormal:{sigma}", seed=1))
    assert abs(statistics.fmean(logs)) < 4 * sigma / math.sqrt(len(logs))  # mean 0 within 4 standard errors
    assert statistics.stdev(logs) == pytest.approx(sigma, rel=0.03)
    assert abs(statistics.median(logs)) < 0.02 * sigma + 0.01


def test_draws_are_seeded_per_job_the_same_whatever_else_is_in_the_trace():
    a = parse_estimate("lognormal:0.5", seed=1)
    full = a.estimates(IDS[:100], RUNTIMES[:100])
    assert a.estimates(IDS[50:100], RUNTIMES[50:100]) == full[50:]
    assert parse_estimate("lognormal:0.5", seed=1).estimates(IDS[:100], RUNTIMES[:100]) == full
    assert parse_estimate("lognormal:0.5", seed=2).estimates(IDS[:100], RUNTIMES[:100]) != full


def test_user_requests_are_round_values_never_below_the_runtime_and_about_k_times_it():
    k = 3.0
    model = parse_estimate(f"user:{k}", seed=0)
    est = model.estimates(IDS, RUNTIMES)
    factors = [model.user_factor(i) for i in IDS]
    assert min(factors) >= 1.0
    assert statistics.median(factors) == pytest.approx(k, rel=0.03)  # drawn around K
    logs = [math.log(f) for f in factors if f > 1.0]
    assert statistics.stdev(logs) == pytest.approx(USER_SIGMA, rel=0.1)
    for e, r, f in zip(est, RUNTIMES, factors):
        assert e >= r  # a request below the real runtime would have been killed
        assert e in ROUND_VALUES_S or (e > 86400 and e % 86400 == 0)  # what people type
        assert e == round_up_request(r * f)  # the smallest round value over runtime x factor
    ratio = sorted(e / r for e, r in zip(est, RUNTIMES))
    assert k < ratio[len(ratio) // 2] < 2 * k  # rounding up only adds


def test_rounding_up_to_the_values_people_type():
    assert [round_up_request(s) for s in (1, 1800, 1801, 3600, 5000, 7201, 20000, 43201, 86400, 86401, 200000)] == \
        [1800, 1800, 3600, 3600, 7200, 14400, 43200, 86400, 86400, 172800, 259200]


def test_only_jobs_whose_length_is_a_runtime_get_an_estimate():
    t = datetime(2022, 1, 1, tzinfo=timezone.utc)
    jobs = [QueuedJob(id=1, gpus=1, gpu_mem_gib=0, submitted_at=t, est_runtime_s=3600.0),
            QueuedJob(id=2, gpus=1, gpu_mem_gib=0, submitted_at=t, workload="llm-chat-8b", prompts=500),
            QueuedJob(id=3, gpus=1, gpu_mem_gib=0, submitted_at=t)]
    seen = parse_estimate("user:3").apply(jobs)
    assert seen[0].est_runtime_s in ROUND_VALUES_S and seen[0].est_runtime_s > 3600
    assert seen[1:] == jobs[1:]
    assert parse_estimate("exact").apply(jobs) == jobs


# -- the learned correction ---------------------------------------------------------------------

def test_the_correction_is_the_median_ratio_of_its_class_and_borrows_below_min_runs():
    c = correction([math.log(0.25)] * 4 + [math.log(0.01)])  # a crashed run does not move it
    assert c.factor == pytest.approx(0.25) and c.samples == 5 and c.rel_spread == pytest.approx(0.0)
    four_h = estimate_class(None, 4 * 3600.0)
    runs = {four_h: [math.log(0.2)] * MIN_RUNS, estimate_class(None, 1800.0): [math.log(0.5)]}
    assert correction_for(four_h, runs).factor == pytest.approx(0.2)
    # the 30-min class has one run: it borrows the pooled runs of its workload
    assert correction_for(estimate_class(None, 1800.0), runs).samples == MIN_RUNS + 1
    assert correction_for(estimate_class("w", 60.0), {}).factor == 1.0


# -- in the simulator ---------------------------------------------------------------------------

class Watching:
    """Greedy, recording every job length it was handed."""

    name = "watching"

    def __init__(self):
        from policies import get_policy

        self.inner = get_policy("greedy")
        self.seen: dict[int, set[float]] = {}

    def plan(self, snapshot):
        for j in snapshot.jobs:
            self.seen.setdefault(j.id, set()).add(j.est_runtime_s)
        return self.inner.plan(snapshot)


def _simulate(sc, policy, **settings):
    return Simulation(cluster=sc.cluster, jobs=sc.jobs, carbon=sc.carbon, policy=policy,
                      forecast=parse_forecast("perfect", sc.carbon), settings=SimSettings(**settings)).run()


@pytest.mark.parametrize("correct", [False, True])
def test_the_planner_never_sees_the_real_length_and_the_job_runs_it(tmp_path, correct):
    sc = scenario(40, tmp_path)
    model = parse_estimate("lognormal:0.5", seed=0)
    told = dict(zip((j.id for j in sc.jobs), model.estimates([j.id for j in sc.jobs],
                                                               [j.est_runtime_s for j in sc.jobs])))
    real = {j.id: j.est_runtime_s for j in sc.jobs}
    policy = Watching()
    run = _simulate(sc, policy, estimate="lognormal:0.5", correct_estimates=correct)
    assert set(policy.seen) == set(real)
    for job_id, lengths in policy.seen.items():
        assert real[job_id] not in lengths
        if not correct:
            assert lengths == {told[job_id]}  # only ever the estimate
    done = [r for r in run.records if r.state == "done"]
    assert len(done) == len(sc.jobs)
    for r in done:  # each ran its real length on its GPUs
        assert r.end_s - r.start_s == pytest.approx(real[r.job.id] * generic_runtime_scale(r.model), rel=1e-9)
    s = run.estimate, run.truth
    assert s == ("lognormal:0.5", "perfect")


def test_the_estimate_is_reported_beside_forecast_and_truth(tmp_path, capsys):
    import json

    from scheduler.cli.main import main
    from tests.simulate.test_simulate import carbon_args, pai_slice

    args = ["simulate", "--cluster", str(DEMO / "demo-cluster.toml"), "--jobs", str(pai_slice(tmp_path, 20)),
            *carbon_args(), "--start", "2022-10-19T16:00Z", "--policy", "fifo,greedy", "--no-plots",
            "--out", str(tmp_path / "r")]
    with pytest.raises(SystemExit) as e:
        main([*args, "--estimate", "user:x"])
    assert e.value.code == 2 and "needs a number" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([*args, "--estimate", "user:3", "--json"])
    assert e.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scenario"]["estimate"] == "user:3" and doc["scenario"]["correct_estimates"] is None
    for s in doc["policies"].values():
        assert (s["estimate"], s["truth"], s["forecast"]) == ("user:3", "perfect", "perfect")
        assert s["estimated_jobs"] == 20 and s["runtime_estimate_error_pct"] > 100  # users ask for ~3x
    with pytest.raises(SystemExit) as e:
        main(args)
    out = capsys.readouterr().out
    assert "runtime estimate" in out and "exact" in out


@dataclass(frozen=True)
class Fixed(EstimateModel):
    """The planner is told `told[id]` seconds for each job."""

    told: dict[int, float] = field(default_factory=dict)

    def apply(self, jobs):
        from dataclasses import replace

        return [replace(j, est_runtime_s=self.told.get(j.id, j.est_runtime_s)) for j in jobs]


class GpuZeroFirst:
    """Each job on GPU 0 if it is free within 5 minutes, else on the GPU free first."""

    name = "gpu-zero-first"

    def __init__(self):
        self.calls = 0

    def plan(self, snapshot):
        self.calls += 1
        now = snapshot.now
        free = {g.id: max(now, g.busy_until or now) for g in snapshot.gpus}
        out = []
        for j in snapshot.jobs:
            g = 0 if free[0] <= now + timedelta(minutes=5) else min(free, key=lambda i: (free[i], i))
            out.append(Assignment(job_id=j.id, node="n", gpu_ids=(g,), start_at=free[g]))
            free[g] = free[g] + timedelta(seconds=j.est_runtime_s)
        return Plan(assignments=tuple(out))


def test_a_job_that_overruns_its_plan_makes_the_jobs_behind_it_be_planned_again():
    """A is told 1 h and runs 4 h on GPU 0; B is committed behind it there. When B's start
    comes and GPU 0 is still busy, B is planned again and runs on the free GPU 1 long before A
    ends, instead of waiting for A; no GPU ever runs two jobs."""
    cluster = cluster_from_dict({"node": [{"name": "n", "zone": "GB", "gpus": "2xH100"}]})
    carbon = {"GB": load_zone_files("GB", [DEMO / "GB.csv"])}
    t0 = START
    jobs = [QueuedJob(id=1, gpus=1, gpu_mem_gib=0, submitted_at=t0, est_runtime_s=4 * 3600.0),
            QueuedJob(id=2, gpus=1, gpu_mem_gib=0, submitted_at=t0 + timedelta(minutes=57), est_runtime_s=3600.0)]
    policy = GpuZeroFirst()
    run = Simulation(cluster=cluster, jobs=jobs, carbon=carbon, policy=policy,
                     forecast=parse_forecast("perfect", carbon),
                     settings=SimSettings(plan_interval_s=7200.0, correct_estimates=False),
                     estimate_model=Fixed("fixed", "fixed", told={1: 3600.0})).run()
    a, b = run.records
    assert (a.gpu_ids, a.end_s - a.start_s) == ((0,), 4 * 3600.0)  # A ran its real 4 h
    assert b.gpu_ids == (1,) and b.state == "done"
    assert b.start_s < t0.timestamp() + 1.5 * 3600  # not at A's end (t0 + 4 h)
    assert run.replanned_behind_overruns >= 1
    # told the real length, the planner puts B on GPU 1 at its arrival and nothing is re-planned
    run = Simulation(cluster=cluster, jobs=jobs, carbon=carbon, policy=GpuZeroFirst(),
                     forecast=parse_forecast("perfect", carbon),
                     settings=SimSettings(plan_interval_s=7200.0)).run()
    b = run.records[1]
    assert (b.gpu_ids, b.start_s, run.replanned_behind_overruns) == ((1,), b.arrival_s, 0)


# -- policies: a job of uncertain length ----------------------------------------------------------

def _uncertain_snapshot(u: float | None):
    from policies.types import CarbonCurve, GpuSlot, Snapshot

    now = datetime(2022, 6, 1, tzinfo=timezone.utc)
    job = QueuedJob(id=1, gpus=1, gpu_mem_gib=0, submitted_at=now, est_runtime_s=3 * 3600.0,
                    runtime_rel_uncertainty=u)
    return Snapshot(now=now, jobs=(job,), gpus=(GpuSlot(id=0, node="n", zone="Z", index=0, model="H100",
                                                         memory_gib=80.0),),
                    carbon={"Z": CarbonCurve("Z", now, 3600.0, (100.0,) * 64)})


def test_the_estimate_margin_can_be_left_out_of_the_deadline():
    from policies.model.margin import job_margin
    from policies.model.energy import ProfileBook, seed_profiles

    job = _uncertain_snapshot(0.5).jobs[0]
    book = ProfileBook(seed_profiles())
    assert job_margin(job, "H100", book) == pytest.approx(2.0)  # 1 + Z x u, no profile
    assert job_margin(job, "H100", book, estimates=False) == 1.0


class WatchingSpread(Watching):
    """Greedy, recording whether each job was handed a length spread."""

    def plan(self, snapshot):
        for j in snapshot.jobs:
            self.seen.setdefault(j.id, set()).add(bool(j.length_spread))
        return self.inner.plan(snapshot)


@pytest.mark.parametrize("price", [True, False])
def test_jobs_are_priced_over_their_class_spread_once_the_class_has_runs(tmp_path, price):
    sc = scenario(40, tmp_path)
    policy = WatchingSpread()
    _simulate(sc, policy, estimate="lognormal:0.5", correct_estimates=True, price_length_spread=price)
    with_spread = {job_id for job_id, seen in policy.seen.items() if True in seen}
    # the first jobs plan before any run has finished: no spread to price them by
    assert 1 in policy.seen and policy.seen[1] == {False}
    assert bool(with_spread) is price
