"""Incremental planning (`Snapshot.keep`): between full re-plans a tick keeps the earlier
plans that still fit, node and start as they were, and plans only the other jobs around them.
A kept plan that no longer fits is planned again; GPU ids on the kept node may change.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from policies import GpuSlot, QueuedJob, Snapshot, get_policy
from policies.model.catalog import catalog
from policies.types import Assignment, CarbonCurve, Estimate
from policy_checker import violations

NOW = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
VALLEY_AT_10H = [400.0] * 10 + [20.0] * 4 + [400.0] * 34  # cheap from +10 h to +14 h
CARBON = {"Z": CarbonCurve(zone="Z", start=NOW, step_s=3600, values_g_per_kwh=tuple(VALLEY_AT_10H))}
POLICIES = ["fifo", "greedy", "cpsat"]


def gpu(id: int, node: str = "a", **kw) -> GpuSlot:
    return GpuSlot(id=id, node=node, zone="Z", index=id, model="H100", memory_gib=catalog()["H100"].memory_gib, **kw)


def job(id: int, **kw) -> QueuedJob:
    kw.setdefault("gpus", 1)
    return QueuedJob(id=id, gpu_mem_gib=0.0, submitted_at=NOW - HOUR, est_runtime_s=4 * 3600.0, **kw)


def kept(job_id: int, start: datetime, gpu_ids=(1,), node: str = "a") -> Assignment:
    return Assignment(job_id=job_id, node=node, gpu_ids=tuple(gpu_ids), start_at=start,
                      estimate=Estimate(finish_at=start + 4 * HOUR, runtime_s=4 * 3600.0, energy_j=4 * 3600.0 * 700,
                                        gco2=1.0),
                      explanation="kept from an earlier tick")


def plan(policy: str, snapshot: Snapshot):
    params = {"max_time_s": 1.0} if policy == "cpsat" else {}
    p = get_policy(policy, **params).plan(snapshot)
    assert violations(snapshot, p) == []
    return p.by_job()


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_a_kept_plan_keeps_its_node_and_start_and_new_jobs_plan_around_it(policy):
    """Job 1 was planned (under an older forecast) for +8 h, across the valley's start; a
    fresh plan would move it. Kept, it stays, and job 2 gets what is left of the valley."""
    previous = kept(1, NOW + 8 * HOUR)
    s = Snapshot(now=NOW, jobs=(job(1), job(2)), gpus=(gpu(1),), carbon=CARBON, keep={1: previous})
    p = plan(policy, s)
    assert p[1].start_at == previous.start_at and p[1].node == "a"
    assert p[1].explanation == previous.explanation  # the earlier estimate and reasons stay
    assert p[2].start_at >= NOW + 12 * HOUR  # after the kept run, not over it


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_without_keep_the_same_jobs_are_planned_afresh(policy):
    """The control for the test above: with no kept plan the policy may move job 1."""
    s = Snapshot(now=NOW, jobs=(job(1), job(2)), gpus=(gpu(1),), carbon=CARBON)
    starts = {a.start_at for a in plan(policy, s).values()}
    assert len(starts) == 2


@pytest.mark.parametrize("policy", POLICIES)
def test_a_kept_plan_whose_start_has_passed_is_planned_again(policy):
    previous = kept(1, NOW - 2 * HOUR)
    s = Snapshot(now=NOW, jobs=(job(1),), gpus=(gpu(1),), carbon=CARBON, keep={1: previous})
    assert plan(policy, s)[1].start_at >= NOW


@pytest.mark.parametrize("policy", POLICIES)
def test_a_kept_plan_on_a_gpu_that_went_down_moves_to_a_usable_one(policy):
    previous = kept(1, NOW + 10 * HOUR, gpu_ids=(1,), node="a")
    s = Snapshot(now=NOW, jobs=(job(1),), gpus=(gpu(1, "a", healthy=False), gpu(2, "b")), carbon=CARBON,
                 keep={1: previous})
    assert plan(policy, s)[1].gpu_ids == (2,)


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_a_kept_plan_whose_gpus_are_still_busy_is_planned_again(policy):
    """A running job overran its estimate into the kept start: the kept plan no longer fits."""
    previous = kept(1, NOW + 2 * HOUR)
    s = Snapshot(now=NOW, jobs=(job(1),), gpus=(gpu(1, busy_until=NOW + 3 * HOUR),), carbon=CARBON,
                 keep={1: previous})
    assert plan(policy, s)[1].start_at >= NOW + 3 * HOUR


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_kept_plans_may_get_other_gpus_of_their_node(policy):
    """Two kept 1-GPU plans and a new 2-GPU job on a 2-GPU node: the sweep gives each its own
    GPUs; node and starts of the kept plans do not change."""
    a = kept(1, NOW + 10 * HOUR, gpu_ids=(2,))
    b = kept(2, NOW + 10 * HOUR, gpu_ids=(2,))  # an earlier tick's ids may collide after a move
    s = Snapshot(now=NOW, jobs=(job(1), job(2), job(3, gpus=2)), gpus=(gpu(1), gpu(2)), carbon=CARBON,
                 keep={1: a, 2: b})
    p = plan(policy, s)
    assert p[1].start_at == p[2].start_at == NOW + 10 * HOUR
    assert {p[1].gpu_ids, p[2].gpu_ids} == {(1,), (2,)}
    assert p[3].start_at >= NOW + 14 * HOUR or p[3].start_at + 4 * HOUR <= NOW + 10 * HOUR


def test_fifo_holds_kept_plans_and_queues_new_jobs_behind_them():
    previous = kept(1, NOW + 2 * HOUR)
    s = Snapshot(now=NOW, jobs=(job(1), job(2)), gpus=(gpu(1),), carbon=CARBON, keep={1: previous})
    p = plan("fifo", s)
    assert p[1] == previous
    assert p[2].start_at >= NOW + 6 * HOUR
