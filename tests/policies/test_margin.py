"""The deadline margin (policies.model.margin): a job whose runtime is uncertain is planned to end
early enough that a run somewhat longer than estimated still meets its deadline; what the
cluster has learned narrows the margin; the margin never turns a job that fits into a miss."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from policies import CarbonCurve, GpuSlot, QueuedJob, Snapshot, get_policy
from policies.model.catalog import catalog
from policies.model.energy import ProfileBook, seed_profiles
from policies.model.learning import Run, estimate
from policies.model.margin import PRIOR_REL_UNCERTAINTY, Z, run_rel_uncertainty, runtime_margin
from policy_checker import violations

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
WORKLOAD = "llm-chat-8b"
SEED = ProfileBook(seed_profiles()).get(WORKLOAD, "H100")
VALLEY_AT_10H = (400.0,) * 10 + (20.0,) * 4 + (400.0,) * 58  # clean from +10 h to +14 h


def chat_job(runtime_s: float, deadline: datetime, **kw) -> QueuedJob:
    """An llm-chat-8b batch that runs `runtime_s` on one H100 by the seed profile."""
    return QueuedJob(id=kw.pop("id", 1), gpus=1, gpu_mem_gib=0.0, submitted_at=NOW, workload=WORKLOAD,
                     prompts=round(runtime_s * SEED.prompts_per_s), deadline=deadline, **kw)


def snapshot(job: QueuedJob, profiles=()) -> Snapshot:
    h100 = GpuSlot(id=1, node="n1", zone="Z", index=0, model="H100", memory_gib=catalog()["H100"].memory_gib)
    return Snapshot(now=NOW, jobs=(job,), gpus=(h100,), profiles=tuple(profiles),
                    carbon={"Z": CarbonCurve("Z", NOW, 3600.0, VALLEY_AT_10H)})


def plan_one(policy: str, snap: Snapshot):
    plan = get_policy(policy, **({"max_time_s": 1.0} if policy == "cpsat" else {})).plan(snap)
    assert violations(snap, plan) == []
    return plan.by_job()[snap.jobs[0].id]


def learned(n: int, spread: float) -> object:
    """The H100 profile learned from `n` runs that scatter by about `spread` around the seed."""
    runs = [Run(SEED.prompts_per_s * math.exp(spread * ((i % 3) - 1)), SEED.power_w) for i in range(n)]
    return estimate(SEED, runs, workload=WORKLOAD, model="H100")


def test_seed_figures_carry_the_prior_and_jobs_without_a_profile_none():
    assert run_rel_uncertainty(SEED) == PRIOR_REL_UNCERTAINTY
    assert runtime_margin(SEED) == pytest.approx(1 + Z * PRIOR_REL_UNCERTAINTY)
    assert runtime_margin(None) == 1.0
    assert run_rel_uncertainty(learned(1, 0.0)) == PRIOR_REL_UNCERTAINTY  # one run says nothing of spread


def test_runs_that_agree_narrow_the_margin_and_runs_that_scatter_widen_it():
    tight, loose = learned(15, 0.01), learned(15, 0.4)
    assert run_rel_uncertainty(tight) < PRIOR_REL_UNCERTAINTY / 2
    assert run_rel_uncertainty(loose) > PRIOR_REL_UNCERTAINTY
    # the prior keeps a floor under a handful of agreeing runs
    assert run_rel_uncertainty(learned(3, 0.0)) > run_rel_uncertainty(learned(15, 0.0)) > 0


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_a_job_is_planned_to_end_before_its_deadline_by_the_margin(policy):
    """2 h by the seed, deadline at +12 h: the point estimate would start it at +10 h, in the
    valley, and a run 10 % longer would miss. With the margin it ends by deadline - 1 h."""
    job = chat_job(2 * 3600.0, NOW + 12 * HOUR)
    a = plan_one(policy, snapshot(job))
    end_by_margin = a.start_at + timedelta(seconds=2 * 3600.0 * runtime_margin(SEED))
    assert end_by_margin <= job.deadline
    assert a.start_at <= NOW + 9 * HOUR and not a.estimate.deadline_miss


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_what_the_cluster_learned_lets_the_job_wait_longer(policy):
    job = chat_job(2 * 3600.0, NOW + 12 * HOUR)
    tight = replace(learned(15, 0.01), prompts_per_s=SEED.prompts_per_s)  # same runtime, known spread
    a = plan_one(policy, snapshot(job, profiles=[tight]))
    assert a.start_at + timedelta(seconds=2 * 3600.0 * runtime_margin(tight)) <= job.deadline
    assert a.start_at > NOW + 9 * HOUR  # later than the seed's margin allowed, into the valley


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_a_job_that_fits_only_without_the_margin_starts_at_once_and_is_not_flagged(policy):
    job = chat_job(2 * 3600.0, NOW + 2.5 * HOUR)
    a = plan_one(policy, snapshot(job))
    assert a.start_at == NOW and not a.estimate.deadline_miss


def test_a_short_job_keeps_the_margin_too():
    """A 10-minute job (packed by policies.solvers.short_jobs) due at +10 h 11 min: the point estimate
    would start it at +10 h, in the valley; with the margin it cannot end by then and runs
    before the valley."""
    job = chat_job(600.0, NOW + 10 * HOUR + timedelta(minutes=11))
    a = plan_one("greedy", snapshot(job))
    assert "short job" in a.explanation
    assert a.start_at + timedelta(seconds=600.0 * runtime_margin(SEED)) <= job.deadline
    assert a.start_at < NOW + 10 * HOUR


def test_a_running_jobs_gpus_are_expected_busy_for_its_margin_too():
    """The daemon's planner sees a running workload job's GPUs busy until start + planned
    runtime x margin, so jobs planned after it keep their deadlines when it runs long."""
    from types import SimpleNamespace

    from scheduler.daemon.planner import Planner

    planner = SimpleNamespace(default_runtime_s=3600.0)
    running = SimpleNamespace(started_at=NOW, est_runtime_planned_s=3600.0, est_runtime_s=None,
                              time_limit_s=None, workload=WORKLOAD)
    book = ProfileBook(seed_profiles())
    end = Planner._expected_end(planner, running, NOW, book, "H100")
    assert end == NOW + timedelta(seconds=3600.0 * runtime_margin(SEED))
    generic = SimpleNamespace(**{**vars(running), "workload": None})
    assert Planner._expected_end(planner, generic, NOW, book, "H100") == NOW + HOUR
