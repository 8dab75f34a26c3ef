"""What a node writes to the jobs table, without a real Slurm: a run back in the queue (resumed
or never launched), a running job as its agent reads it, and a Slurm node's adopted jobs
(adopted once whatever the sweeps, kept in step with Slurm both ways) and real starts. The
real-Slurm behaviour is tests/slurm/test_slurm.py's."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

from sqlalchemy import select

from scheduler.jobs.job import RunningJob
from scheduler.jobs.store import (insert_job, read_job, record_slurm_start, resumed_values, running_jobs,
                                  unlaunched_values)
from scheduler.lifecycle import State, end_run, transition
from scheduler.slurm.adopt import adopt_held, follow_adopted, job_row
from scheduler.slurm.config import SlurmConfig
from scheduler.slurm.jobs import SlurmJob
from scheduler.store.models import job_events

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def held(slurm_id: int, comment: str = "carbonsched deadline=6h est-runtime=20m") -> SlurmJob:
    """A user's own sbatch job, submitted held into the carbon partition."""
    return SlurmJob(job_id=slurm_id, state="PENDING", reason="JobHeldUser", comment=comment, user_id=os.getuid(),
                    group_id=os.getgid(), user_name="someone", partition="carbon", name=f"mine-{slurm_id}",
                    nodes="", cwd="/tmp", tres_per_node="gres/gpu=1", time_limit_min=30, submit_time=NOW,
                    start_time=None, end_time=None, exit_status=0)


class Scancel:
    """A Slurm that only records the commands it is given."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def run(self, argv, **kw):
        self.calls.append(list(argv))


def running(store, slurm_id: int | None = None, **values) -> int:
    """A job RUNNING on node `sn` GPU 1 since NOW, attempt 1."""
    row = job_row(held(slurm_id or 1), NOW)
    row.update(slurm_job_id=slurm_id, **values)

    def tx(conn) -> int:
        job_id = insert_job(conn, row, row["owner_uid"], NOW)
        assert transition(conn, job_id, State.PLANNED, actor_uid=None, reason="planned", expect=State.PENDING,
                          values=dict(planned_node="sn", planned_gpu_ids=[1], planned_start=NOW))
        assert transition(conn, job_id, State.RUNNING, actor_uid=None, reason="claimed", expect=State.PLANNED,
                          values=dict(node="sn", gpu_ids=[1], gpu_indices=[0], started_at=NOW, attempts=1))
        return job_id

    return store.transact(tx)


def job(store, job_id: int):
    with store.read() as conn:
        return read_job(conn, job_id)


# -- a run back in the queue -------------------------------------------------------------------

def test_a_checkpointed_segment_resumes_without_using_an_attempt_and_its_done_share_moves_on(store):
    job_id = running(store, interruptible="checkpoint", resume_count=0, checkpoints_ignored=0, done_fraction=0.0)
    assert store.transact(lambda conn: end_run(conn, job_id, State.PENDING, actor_uid=None, reason="checkpointed",
                                               values=resumed_values(done_fraction=0.4)))
    j = job(store, job_id)
    assert (j.state, j.attempts, j.resume_count, j.done_fraction, j.checkpoints_ignored) == ("PENDING", 0, 1, 0.4, 0)
    assert (j.node, j.gpu_ids, j.planned_node, j.planned_start, j.power_limit_w) == (None, None, None, None, None)


def test_a_segment_killed_after_ignoring_its_request_counts_the_ignored_checkpoint(store):
    job_id = running(store, interruptible="checkpoint", resume_count=1, checkpoints_ignored=0, done_fraction=0.4)
    store.transact(lambda conn: end_run(conn, job_id, State.PENDING, actor_uid=None, reason="killed",
                                        values=resumed_values(done_fraction=0.4, ignored_checkpoint=True)))
    j = job(store, job_id)
    assert (j.attempts, j.resume_count, j.done_fraction, j.checkpoints_ignored) == (0, 2, 0.4, 1)


def test_a_vanished_run_resumes_with_its_done_share_kept(store):
    job_id = running(store, interruptible="checkpoint", resume_count=0, checkpoints_ignored=0, done_fraction=0.25)
    store.transact(lambda conn: end_run(conn, job_id, State.PENDING, actor_uid=None, reason="vanished",
                                        values=resumed_values()))
    j = job(store, job_id)
    assert (j.attempts, j.resume_count, j.done_fraction, j.checkpoints_ignored) == (0, 1, 0.25, 0)


def test_a_claimed_job_never_launched_goes_back_unstarted_its_attempt_not_counted(store):
    job_id = running(store)
    store.transact(lambda conn: end_run(conn, job_id, State.PENDING, actor_uid=None, reason="never launched",
                                        values=unlaunched_values()))
    j = job(store, job_id)
    assert (j.state, j.attempts, j.started_at, j.node, j.planned_gpu_ids) == ("PENDING", 0, None, None, None)


# -- a running job as its agent reads it -------------------------------------------------------

def test_the_agent_reads_its_running_jobs_typed_with_their_slurm_job(store):
    mine, observed = running(store), running(store, slurm_id=4242)
    jobs = {j.id: j for j in running_jobs(store, "sn")}
    assert set(jobs) == {mine, observed} and all(isinstance(j, RunningJob) for j in jobs.values())
    assert (jobs[mine].slurm_job_id, jobs[observed].slurm_job_id) == (None, 4242)
    assert (jobs[mine].attempts, jobs[mine].gpu_ids, jobs[mine].started_at) == (1, [1], NOW)
    assert running_jobs(store, "elsewhere") == []


def test_slurms_real_start_is_recorded_on_a_running_job_only(store):
    job_id = running(store, slurm_id=7)
    later = NOW + timedelta(minutes=3)
    store.transact(lambda conn: record_slurm_start(conn, job_id, later, [2], [1], "running as Slurm job 7"))
    j = job(store, job_id)
    assert (j.started_at, j.gpu_ids, j.gpu_indices, j.reason) == (later, [2], [1], "running as Slurm job 7")
    store.transact(lambda conn: end_run(conn, job_id, State.COMPLETED, actor_uid=None, reason="exit code 0"))
    store.transact(lambda conn: record_slurm_start(conn, job_id, NOW, [1], [0], "too late"))
    assert job(store, job_id).reason == "exit code 0"


# -- adopted Slurm jobs ------------------------------------------------------------------------

def test_a_held_commented_job_is_adopted_once_whatever_the_sweeps(store):
    config = SlurmConfig()
    jobs = [held(11), held(12, comment="no hints for us"), held(13, comment="carbonsched nonsense=1")]
    refused: set[int] = set()
    new = adopt_held(store, jobs, config, NOW, refused=refused)
    assert len(new) == 1 and refused == {13}
    j = job(store, new[0])
    assert (j.state, j.slurm_job_id, j.est_runtime_s, j.time_limit_s) == ("PENDING", 11, 1200.0, 1800.0)
    with store.read() as conn:
        events = conn.execute(select(job_events.c.to_state, job_events.c.reason)
                              .where(job_events.c.job_id == new[0])).all()
    assert [tuple(e) for e in events] == [("PENDING", "submitted")]
    assert adopt_held(store, jobs, config, NOW, refused=refused) == []  # known: never adopted twice


def test_an_adopted_job_whose_slurm_job_ended_or_vanished_before_placing_is_cancelled_here(store):
    gone, ended, waiting = (adopt_held(store, [held(i)], SlurmConfig(), NOW)[0] for i in (21, 22, 23))
    slurm = Scancel()
    still = [SlurmJob(**{**held(22).__dict__, "state": "CANCELLED", "reason": "None"}), held(23)]
    assert follow_adopted(store, slurm, still) == 2
    assert job(store, gone).reason == "Slurm no longer knows job 21"
    assert job(store, ended).reason == "Slurm job 22 ended CANCELLED before carbonsched placed it (scancel?)"
    assert [job(store, j).state for j in (gone, ended, waiting)] == ["CANCELLED", "CANCELLED", "PENDING"]
    assert slurm.calls == []


def test_an_adopted_job_cancelled_here_while_still_held_is_scancelled_in_slurm(store):
    job_id = adopt_held(store, [held(31)], SlurmConfig(), NOW)[0]
    store.transact(lambda conn: transition(conn, job_id, State.CANCELLED, actor_uid=0, reason="by its owner"))
    slurm = Scancel()
    assert follow_adopted(store, slurm, [held(31)]) == 1
    assert slurm.calls == [["scancel", "31"]]
    assert follow_adopted(store, Scancel(), []) == 0  # no held Slurm job left: nothing to ask of Slurm

