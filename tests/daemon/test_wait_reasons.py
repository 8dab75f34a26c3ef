"""Why a queued job waits, from a snapshot and its plan (`scheduler.daemon.wait_reasons`):

- behind a plan of a higher priority on the GPUs free for it: `Priority`;
- behind running jobs, or plans of its own priority: `Resources`;
- planned later with GPUs free for it (a wait for carbon), or starting now: no word;
- its own plan is not work it waits behind; the clause is added once, however many ticks
  hand a stored plan back, and taken off a job that no longer waits.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from policies.types import Assignment, Estimate, GpuSlot, Plan, QueuedJob, Snapshot
from scheduler.daemon.wait_reasons import wait_reasons, with_wait_reasons
from scheduler.job_specs import wait_word

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc)
H = timedelta(hours=1)


def gpu(i: int = 1, busy_until: datetime | None = None) -> GpuSlot:
    return GpuSlot(id=i, node="n1", zone="DE", index=i - 1, model="H100", memory_gib=80.0, busy_until=busy_until)


def job(i: int, priority: float = 0.0, runtime_s: float = 3600.0, pinned: bool = False) -> QueuedJob:
    return QueuedJob(i, 1, 0, NOW, est_runtime_s=runtime_s, priority=priority, pinned=pinned)


def plan(j: QueuedJob, start: datetime, gpu_id: int = 1, text: str = "greedy: planned") -> Assignment:
    return Assignment(j.id, "n1", (gpu_id,), start, Estimate(finish_at=start + timedelta(seconds=j.est_runtime_s)),
                      explanation=text)


def words(snapshot: Snapshot, p: Plan) -> dict[int, str | None]:
    found = wait_reasons(snapshot, p)
    return {j.id: wait_word(found.get(j.id)) for j in snapshot.jobs}


def test_behind_a_higher_priority_plan_it_is_priority_and_behind_its_own_priority_resources():
    hi, lo = job(1, priority=2.0), job(2, priority=1.0)
    snap = Snapshot(now=NOW, jobs=(hi, lo), gpus=(gpu(),))
    assert words(snap, Plan((plan(hi, NOW), plan(lo, NOW + H)))) == {1: None, 2: "Priority"}
    assert words(snap, Plan((plan(hi, NOW),), unplaced={2: "no GPUs free within the planning horizon"}))[2] == "Priority"
    peers = Snapshot(now=NOW, jobs=(job(1), job(2)), gpus=(gpu(),))
    assert words(peers, Plan((plan(job(1), NOW), plan(job(2), NOW + H)))) == {1: None, 2: "Resources"}


def test_behind_running_work_it_is_resources_with_when_the_gpus_free():
    snap = Snapshot(now=NOW, jobs=(job(1),), gpus=(gpu(busy_until=NOW + 2 * H),))
    found = wait_reasons(snap, Plan((plan(job(1), NOW + 2 * H),)))
    assert found[1] == "waits: the GPUs that fit it are busy with running jobs until 12:00 (Resources)"


def test_a_wait_for_carbon_with_a_gpu_free_and_a_start_now_say_nothing():
    """The job's own later plan overlaps the hour it could run now: it is not counted."""
    lo = job(2, priority=1.0)
    snap = Snapshot(now=NOW, jobs=(job(1, priority=2.0), lo), gpus=(gpu(1), gpu(2)))
    carbon_wait = Plan((plan(job(1, priority=2.0), NOW, gpu_id=1), plan(lo, NOW + 0.5 * H, gpu_id=2)))
    assert words(snap, carbon_wait) == {1: None, 2: None}


def test_the_clause_is_added_once_and_taken_off_a_job_that_no_longer_waits():
    hi, lo = job(1, priority=2.0), job(2, priority=1.0)
    snap = Snapshot(now=NOW, jobs=(hi, lo), gpus=(gpu(),))
    once = with_wait_reasons(snap, Plan((plan(hi, NOW), plan(lo, NOW + H))))
    twice = with_wait_reasons(snap, once)
    assert once == twice
    text = once.by_job()[2].explanation
    assert text.startswith("greedy: planned; waits: ") and text.count("waits:") == 1
    # an hour on, the higher job has run: the stored plan comes back pinned, without the clause
    later = Snapshot(now=NOW + H, jobs=(job(2, priority=1.0, pinned=True),), gpus=(gpu(),))
    kept = Assignment(2, "n1", (1,), NOW + H, Estimate(finish_at=NOW + 2 * H), explanation=text)
    assert with_wait_reasons(later, Plan((kept,))).by_job()[2].explanation == "greedy: planned"
