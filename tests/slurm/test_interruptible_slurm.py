"""Checkpoint jobs through the Slurm backend, against the real Slurm (issue 30): at the end
of each planned segment the agent sends the job's checkpoint signal to its batch process
(`scancel --signal --batch`) and creates its request file; the job exits 75 and its next
segment is a new Slurm job. One that ignores the request is `scancel`led after its grace
period and resumed from its last checkpoint."""

from __future__ import annotations

import os
import sys

import pytest

from scheduler.daemon.planner import Planner

from tests.node.test_interruptible_run import EXAMPLE, SegmentingPolicy, segs, steps_run, uninterrupted_output
from test_slurm import ROOT, drive, slurm_jobs, world  # noqa: F401  (world: the fixture)


def _submit(service, root, steps, *extra, grace_s: float = 3):
    """A checkpoint job of `steps` 0.05 s steps, with `grace_s` to act on a request."""
    out, trace = root / "out.txt", root / "trace.txt"
    argv = [sys.executable, str(EXAMPLE), "--steps", str(steps), "--step-s", "0.05", "--out", str(out),
            "--trace", str(trace), *extra]
    job = service.submit(ROOT, {"argv": argv, "gpus": 1, "est_runtime_s": steps * 0.05, "prompts": steps,
                                "interruptible": "checkpoint", "checkpoint_grace_s": grace_s, "min_run_s": 3,
                                "cwd": str(root)})["id"]
    return job, out, trace


def _drive(store, planner, agents, job):
    try:
        return drive(store, planner, agents, [job], timeout_s=60)
    except TimeoutError:
        from sqlalchemy import select

        from scheduler.store.models import job_events
        with store.read() as conn:
            events = [(e.from_state, e.to_state, e.reason) for e in conn.execute(
                select(job_events).where(job_events.c.job_id == job).order_by(job_events.c.id))]
        raise AssertionError(events) from None


def test_a_checkpoint_job_runs_as_three_slurm_jobs_and_gives_an_uninterrupted_runs_output(world, slurm_cluster):
    store, service, _fifo, agents, root = world
    planner = Planner(store, SegmentingPolicy(first_s=4.0, gap_s=0.5))
    # a grace period a loaded host cannot exhaust before the job's own Python is up and
    # reading its request (a CI run with 4 workers on 2 cores once took more than 3 s)
    job, out, trace = _submit(service, root, 160, grace_s=15)
    rows = _drive(store, planner, agents, job)
    assert rows[job].state == "COMPLETED", rows[job].reason
    assert out.read_text() == uninterrupted_output(root, 160)
    assert [s.outcome for s in segs(store, job)] == ["checkpointed", "checkpointed", "completed"]
    assert sorted(steps_run(trace)) == list(range(1, 161))
    mine = [j for j in slurm_jobs(slurm_cluster, "carbonsched:") if j.carbonsched_id == job]
    assert sorted(j.state for j in mine) == ["COMPLETED", "FAILED", "FAILED"]  # exit 75 twice, then done


def test_a_slurm_job_that_ignores_its_checkpoint_request_is_cancelled_and_resumed(world, slurm_cluster):
    store, service, _fifo, agents, root = world
    planner = Planner(store, SegmentingPolicy(first_s=4.0, gap_s=0.5))
    # 16 s of steps: asked at 4 s, signalled SIGNAL_AFTER_FILE_S later, killed 3 s after that
    job, out, trace = _submit(service, root, 320, "--ignore", "--checkpoint-every", "10")
    rows = _drive(store, planner, agents, job)
    assert rows[job].state == "COMPLETED", rows[job].reason
    assert out.read_text() == uninterrupted_output(root, 320)
    assert [s.outcome for s in segs(store, job)] == ["killed", "completed"]
    assert rows[job].checkpoints_ignored == 1
    ran = steps_run(trace)
    assert sorted(set(ran)) == list(range(1, 321)) and len(ran) - 320 <= 10


def test_a_slurm_checkpoint_job_starts_with_its_checkpoint_signal_ignored(world, slurm_cluster):
    """As under the local supervisor: the batch script ignores the signal and execs the job,
    whose own handler replaces that; a request while the batch step starts cannot kill it."""
    store, service, _fifo, agents, root = world
    planner = Planner(store, SegmentingPolicy(first_s=600.0, gap_s=0.5))
    out = root / "disposition.txt"
    probe = (f"import signal; open({str(out)!r}, 'w').write('ignored' if signal.getsignal(signal.SIGUSR2) "
             "== signal.SIG_IGN else 'default')")
    job = service.submit(ROOT, {"argv": [sys.executable, "-c", probe], "gpus": 1, "est_runtime_s": 5,
                                "interruptible": "checkpoint", "checkpoint_signal": "SIGUSR2",
                                "cwd": str(root)})["id"]
    rows = _drive(store, planner, agents, job)
    assert rows[job].state == "COMPLETED", rows[job].reason
    assert out.read_text() == "ignored"


def test_a_checkpoint_signal_slurm_cannot_deliver_yet_is_sent_again_only_after_a_pause(tmp_path, monkeypatch):
    """Slurm says RUNNING before its batch shell runs; `scancel --signal --batch` then fails
    (no batch step). Asked again at the next tick, the signal would reach the shell as it
    starts, before its `trap ''`, and end the job unsaved: the request file is created at
    once, the signal SIGNAL_AFTER_FILE_S later and, undelivered, again only SIGNAL_RETRY_S
    after that, and the grace period counts
    from the signal that was delivered."""
    import json
    from datetime import datetime, timedelta, timezone

    from scheduler.node import slurm_executor as se
    from scheduler.slurm.commands import SlurmError
    from scheduler.slurm.jobs import SlurmJob

    class StubSlurm:
        def __init__(self):
            self.calls, self.fail_next = [], True

        def run(self, argv, **kw):
            self.calls.append(argv)
            if argv[0] == "scancel" and self.fail_next:
                self.fail_next = False
                raise SlurmError("scancel: error: no batch step (exit 229)")

    slurm = StubSlurm()
    ex = se.SlurmExecutor(tmp_path, slurm)
    started = datetime.now(timezone.utc) - timedelta(seconds=30)
    running = SlurmJob(job_id=7, state="RUNNING", reason="None", comment="carbonsched:1", user_id=0, group_id=0,
                       user_name="root", partition="p", name="j", nodes="n", cwd="/", tres_per_node="",
                       time_limit_min=None, submit_time=started, start_time=started, end_time=None, exit_status=0)
    monkeypatch.setattr(ex, "jobs", lambda *a, **k: {7: running})
    run_dir = ex.run_dir(1)
    run_dir.mkdir(parents=True, exist_ok=True)
    request = tmp_path / "1.checkpoint"
    extra = {"interruptible": "checkpoint", "checkpoint_at": started.isoformat(), "min_run_s": 1,
             "checkpoint_grace_s": 60, "checkpoint_file": str(request)}
    (run_dir / "spec.json").write_text(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "extra": extra}))
    (run_dir / "slurm.json").write_text(json.dumps({"job_id": 7}))
    clock = [started.timestamp() + 30.0]
    monkeypatch.setattr(se.time, "time", lambda: clock[0])

    signals = lambda: [c for c in slurm.calls if c[0] == "scancel"]  # noqa: E731
    ex.keep_timetable(1)
    assert request.exists() and signals() == []  # the request file at once, the signal later
    clock[0] += se.SIGNAL_AFTER_FILE_S / 2
    ex.keep_timetable(1)
    assert signals() == []
    clock[0] += se.SIGNAL_AFTER_FILE_S / 2
    with pytest.raises(SlurmError):
        ex.keep_timetable(1)  # the first signal cannot be delivered
    assert len(signals()) == 1
    clock[0] += se.SIGNAL_RETRY_S / 2
    ex.keep_timetable(1)  # too soon: not asked again
    assert len(signals()) == 1
    clock[0] += se.SIGNAL_RETRY_S
    ex.keep_timetable(1)
    assert len(signals()) == 2 and signals()[-1][1] == "--signal=USR1"
    assert json.loads((run_dir / "checkpoint.json").read_text())["requested_at"] == clock[0]
