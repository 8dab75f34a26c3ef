"""Submitting interruptible jobs (issue 30): the flags are validated at the API edge with one
clear line each, stored, and shown by `show` / `queue`; the progress rule and the
checkpoint directory's safety."""

from __future__ import annotations

import json
import os
import stat
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select

from scheduler import interruptible
from scheduler.cli.output import interruptible_fields
from scheduler.daemon.access import Caller, RequestError, ServiceConfig
from scheduler.daemon.service import JobService
from scheduler.node import checkpoint
from scheduler.node.segment_clock import SegmentClock
from scheduler.store.models import jobs

from daemon_harness import DB_KINDS, DaemonProcess, database_for, world_dir

ME = Caller(uid=os.getuid(), gid=os.getgid())


@pytest.fixture
def service(store, tmp_path):
    return JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=tmp_path / "logs")


def body(**extra):
    return {"argv": ["true"], "gpus": 1, "est_runtime_s": 3600, **extra}


def stored(store, job_id):
    with store.read() as conn:
        return conn.execute(select(jobs).where(jobs.c.id == job_id)).one()


def test_a_checkpoint_job_is_stored_with_its_knobs_and_defaults(service, store):
    job = service.submit(ME, body(interruptible="checkpoint", min_run_s=600, resume_cost_s=60,
                                  max_segments=3, checkpoint_signal="usr2", checkpoint_grace_s=30))["id"]
    r = stored(store, job)
    assert (r.interruptible, r.checkpoint_signal, r.checkpoint_grace_s, r.min_run_s, r.resume_cost_s,
            r.max_segments) == ("checkpoint", "SIGUSR2", 30.0, 600.0, 60.0, 3)
    assert (r.done_fraction, r.resume_count) == (0.0, 0)
    plain = stored(store, service.submit(ME, body(interruptible="checkpoint"))["id"])
    assert (plain.checkpoint_signal, plain.checkpoint_grace_s, plain.resume_cost_s) == (
        "SIGUSR1", interruptible.DEFAULT_GRACE_S, 0.0)
    pause = stored(store, service.submit(ME, body(interruptible="pause", min_run_s=60))["id"])
    assert (pause.interruptible, pause.checkpoint_signal) == ("pause", None)
    view = service.get_job(ME, job)
    assert view["interruptible"] == "checkpoint" and view["max_segments"] == 3 and view["segments"] == []


@pytest.mark.parametrize("extra, fragment", [
    ({"interruptible": "suspend"}, "--interruptible must be one of checkpoint, pause"),
    ({"interruptible": "checkpoint", "checkpoint_signal": "SIGKILL"}, "--checkpoint-signal 'SIGKILL': use one"),
    ({"interruptible": "checkpoint", "checkpoint_signal": "SIGNOPE"}, "--checkpoint-signal 'SIGNOPE'"),
    ({"interruptible": "checkpoint", "checkpoint_signal": "SIGTERM"}, "use one a job can catch"),
    ({"interruptible": "checkpoint", "min_run_s": 7200}, "--min-run 7200s is longer than the job's --est-runtime"),
    ({"interruptible": "checkpoint", "resume_cost_s": 3600}, "--resume-cost 3600s is not shorter"),
    ({"interruptible": "checkpoint", "resume_cost_s": -1}, "--resume-cost must be between 0s and 30d"),
    ({"interruptible": "checkpoint", "checkpoint_grace_s": 0.1}, "--checkpoint-grace must be between 1s and 1h"),
    ({"interruptible": "checkpoint", "max_segments": 0}, "--max-segments must be between 1 and 32"),
    ({"interruptible": "pause", "checkpoint_signal": "SIGUSR1"}, "--checkpoint-signal is for --interruptible checkpoint"),
    ({"min_run_s": 60}, "--min-run need --interruptible checkpoint|pause"),
    ({"env": {"CARBONSCHED_RESUME_COUNT": "3"}}, "CARBONSCHED_RESUME_COUNT is set by carbonsched"),
])
def test_bad_interruptible_requests_are_refused_with_one_line_and_store_nothing(service, store, extra, fragment):
    with pytest.raises(RequestError) as err:
        service.submit(ME, body(**extra))
    assert err.value.status == 400
    assert fragment in str(err.value) and "\n" not in str(err.value)
    with store.read() as conn:
        assert conn.execute(select(jobs.c.id)).first() is None


def test_min_run_is_checked_against_an_explicit_time_limit_without_an_estimate(service):
    with pytest.raises(RequestError, match="longer than the job's --time-limit of 600s"):
        service.submit(ME, {"argv": ["true"], "interruptible": "pause", "time_limit_s": 600, "min_run_s": 900})


def test_the_done_fraction_rule_prefers_reported_prompts_and_else_counts_useful_time():
    by_prompts = interruptible.next_done_fraction(0.2, run_s=10, resume_count=1, resume_cost_s=5,
                                                  plan_runtime_s=100, plan_segments=2, prompts=1000,
                                                  reported_prompts=450)
    assert by_prompts == pytest.approx(0.45)
    # By time: a first segment of 30 s of a plan of 100 s in two segments with a resume cost
    # of 10 s (the second pays it): 30 / 90 of the work.
    first = interruptible.next_done_fraction(0.0, run_s=30, resume_count=0, resume_cost_s=10,
                                             plan_runtime_s=100, plan_segments=2, prompts=None,
                                             reported_prompts=None)
    assert first == pytest.approx(30 / 90)
    # A resume pays its cost first: 40 s run, 10 s of it lost, of the 60 s left of 2/3 of the job.
    then = interruptible.next_done_fraction(first, run_s=40, resume_count=1, resume_cost_s=10,
                                            plan_runtime_s=80, plan_segments=2, prompts=None,
                                            reported_prompts=None)
    assert then == pytest.approx(first + (1 - first) * 30 / 60)
    assert interruptible.next_done_fraction(0.5, run_s=1e6, resume_count=0, resume_cost_s=0, plan_runtime_s=10,
                                            plan_segments=1, prompts=None, reported_prompts=None) == 0.99
    assert interruptible.next_done_fraction(0.6, run_s=1, resume_count=0, resume_cost_s=0, plan_runtime_s=10,
                                            plan_segments=1, prompts=100, reported_prompts=10) == 0.6


def test_the_checkpoint_dir_is_the_jobs_own_0700_and_never_followed_through_a_symlink(tmp_path):
    root = tmp_path / "ck"
    d = checkpoint.ensure_job_dir(root, 7, os.getuid(), os.getgid())
    st = os.lstat(d)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o711
    (d / "state.json").write_text("{}")
    assert checkpoint.ensure_job_dir(root, 7, os.getuid(), os.getgid()) == d
    assert (d / "state.json").exists()  # kept across segments
    # A symlink planted where a job's directory goes is removed, its target left alone.
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    os.symlink(victim, root / "8")
    d8 = checkpoint.ensure_job_dir(root, 8, os.getuid(), os.getgid())
    assert not os.path.islink(d8) and os.path.isdir(d8) and (victim / "keep").exists()
    checkpoint.remove_job_dir(root, 7)
    checkpoint.remove_job_dir(root, 7)  # again: nothing to do
    assert not d.exists()


def test_the_segment_clock_asks_once_kills_after_the_grace_and_stops_and_continues_by_the_plan(tmp_path):
    wall = [1000.0]
    sent: list[tuple[str, int]] = []
    clock = SegmentClock(kind="checkpoint", run_dir=tmp_path, checkpoint_at_s=1010.0, checkpoint_signal=10,
                         checkpoint_grace_s=5.0, checkpoint_file=str(tmp_path / "req"), wall=lambda: wall[0])
    all_, group = (lambda s: sent.append(("all", s))), (lambda s: sent.append(("group", s)))
    clock.tick(0.0, all_, group)
    assert sent == [] and not (tmp_path / "req").exists()
    wall[0] = 1010.0
    clock.tick(10.0, all_, group)
    clock.tick(11.0, all_, group)
    assert sent == [("group", 10)] and (tmp_path / "req").exists()
    clock.tick(15.0, all_, group)
    assert sent[-1] == ("all", 9) and clock.result(15.0)["checkpoint_killed"]

    sent.clear()
    wall[0] = 2000.0
    pause = SegmentClock(kind="pause", run_dir=tmp_path, pauses=[(2010.0, 2020.0)], wall=lambda: wall[0])
    pause.tick(0.0, all_, group)
    wall[0] = 2011.0
    pause.tick(11.0, all_, group)
    assert sent == [("all", 19)] and json.loads((tmp_path / "phase.json").read_text())["paused"]
    assert pause.paused_s(14.0) == pytest.approx(3.0)
    wall[0] = 2020.0
    pause.tick(20.0, all_, group)
    assert sent[-1] == ("all", 18) and not pause.paused
    assert pause.result(30.0)["paused_s"] == pytest.approx(9.0)


def test_show_says_paused_until_and_lists_the_segments():
    at = datetime.now().astimezone().replace(second=0, microsecond=0)  # today, whatever the hour
    job = {"interruptible": "pause", "state": "RUNNING", "done_fraction": 0.0, "resume_count": 0,
           "min_run_s": 600.0, "resume_cost_s": 0.0, "max_segments": None,
           "planned_segments": [["2026-12-02T01:00:00Z", "2026-12-02T02:00:00Z"]],
           "paused_until": at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z"),
           "segments": [{"seq": 1, "kind": "run", "outcome": "paused", "start": "2026-12-02T01:00:00Z",
                         "end": "2026-12-02T02:00:00Z", "energy_j": 3.6e6, "gco2": 120.0, "lost_s": 0.0}]}
    lines = dict(interruptible_fields(job))
    assert lines["paused"] == f"paused until {at:%H:%M}"
    assert lines["interruptible"] == "pause, min run 10m"
    assert "paused: 1.00 kWh" in lines["segment 1"] or "paused:" in lines["segment 1"]
    assert "120.0 g" in lines["segment 1"]


@pytest.fixture(params=DB_KINDS)
def daemon(request):
    root = world_dir("cs-intr-")
    with database_for(request.param, root) as url:
        d = DaemonProcess(root, url, emulate="2xH100")
        d.start()
        try:
            yield d
        finally:
            d.cleanup()


@pytest.mark.slow
def test_submit_flags_reach_the_store_show_and_queue_and_a_bad_one_is_one_line(daemon):
    r = daemon.cli("submit", "--interruptible", "checkpoint", "--checkpoint-signal", "KILL", "--est-runtime", "1h",
                   "--", "true")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "--checkpoint-signal 'KILL': use one a job can catch" in r.stderr
    r = daemon.cli("submit", "--interruptible", "checkpoint", "--min-run", "2h", "--est-runtime", "1h", "--", "true")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "--min-run 7200s is longer than the job's --est-runtime of 3600s" in r.stderr
    r = daemon.cli("submit", "--json", "--interruptible", "checkpoint", "--checkpoint-signal", "USR2",
                   "--checkpoint-grace", "30s", "--min-run", "1s", "--resume-cost", "1s", "--max-segments", "3",
                   "--est-runtime", "5s", "--", "sh", "-c", 'echo "resume=$CARBONSCHED_RESUME_COUNT dir=$CARBONSCHED_CHECKPOINT_DIR"')
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)["id"]
    done = daemon.wait_states([job])[job]
    assert done["state"] == "COMPLETED"
    queued = {j["id"]: j for j in json.loads(daemon.cli("queue", "--all", "--json", check=True).stdout)}
    assert queued[job]["interruptible"] == "checkpoint" and queued[job]["checkpoint_signal"] == "SIGUSR2"
    shown = json.loads(daemon.cli("show", str(job), "--json", check=True).stdout)
    assert (shown["min_run_s"], shown["resume_cost_s"], shown["max_segments"]) == (1.0, 1.0, 3)
    assert [s["outcome"] for s in shown["segments"]] == ["completed"]
    assert shown["receipt"]["segments"][0]["kind"] == "run"
    text = daemon.cli("show", str(job), check=True).stdout
    assert "interruptible: checkpoint, signal SIGUSR2, grace 30s" in text
    assert "segment 1: run" in text
    log = daemon.cli("logs", str(job), check=True).stdout
    assert "resume=0 dir=" in log and f"/checkpoints/{job}" in log


def _paused_job(until: datetime) -> dict:
    return {"id": 3, "name": "train", "owner": "alice", "state": "RUNNING", "gpus": [0], "gpus_requested": 1,
            "gpu_model": "H100", "submitted_at": None, "started_at": None, "planned_start": None, "ended_at": None,
            "exit_code": None, "energy_j": None, "gco2": None, "est_gco2": None, "reason": None,
            "paused_until": until.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")}


def test_queue_says_until_when_a_pause_job_is_stopped():
    from scheduler.cli.output import jobs_table

    today = datetime.now().astimezone().replace(second=0, microsecond=0)
    assert f"paused until {today:%H:%M}" in jobs_table([_paused_job(today)])


def test_a_pause_that_ends_on_another_day_is_shown_with_its_date():
    from scheduler.cli.output import jobs_table

    tomorrow = (datetime.now().astimezone() + timedelta(days=1)).replace(second=0, microsecond=0)
    assert f"paused until {tomorrow:%Y-%m-%d %H:%M}" in jobs_table([_paused_job(tomorrow)])


def test_a_replan_that_barely_moves_the_segments_keeps_the_stored_ones():
    from scheduler.daemon.planner import segments_moved

    t0 = datetime(2026, 12, 2, 1, 0, tzinfo=timezone.utc)
    h = timedelta(hours=1)
    plan = ((t0, t0 + h), (t0 + 3 * h, t0 + 4 * h))
    stored = interruptible.segments_to_json(plan)
    assert not segments_moved(stored, tuple((a + timedelta(seconds=20), b + timedelta(seconds=20)) for a, b in plan))
    assert segments_moved(stored, ((t0, t0 + h), (t0 + 2 * h, t0 + 3 * h)))
    assert segments_moved(stored, ())  # now one piece
    assert segments_moved(None, plan) and not segments_moved(None, ())
