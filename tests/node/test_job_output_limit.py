"""Issue 48, finding 1: one job's output must not fill the disk the store lives on.

The supervisor copies a job's stdout and stderr into its log files and stops at the job's
output limit (`job_output_limit_mib`; a small limit here): the rest is discarded, a marker
says so, the job runs on, and `show` and the receipt say its output was truncated. Job logs
may live apart from the state directory (`log_dir`), and a (nearly) full log or state disk
keeps new jobs waiting with a REASON that says so. The agent runs in-process with the
emulated backend, on SQLite and PostgreSQL (the `store` fixture)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from policies import get_policy
from scheduler.accounting.accountant import Accountant
from scheduler.daemon.access import Caller, ServiceConfig
from scheduler.daemon.planner import Planner
from scheduler.daemon.service import JobService

import fleet

ROOT = Caller(uid=0, gid=0)
LIMIT_BYTES = 64 * 1024
MARKER = b"carbonsched: output truncated"


@pytest.fixture
def cluster(store, tmp_path):
    """An agent whose job logs live in `tmp_path/joblogs`, apart from its state directory."""
    log_dir = tmp_path / "joblogs"
    agent = fleet.emulated_agent(store, "2xH100", state_dir=tmp_path / "state", log_dir=log_dir, grace_s=1.0,
                                 heartbeat_s=0.2, ship_logs=False, output_limit_bytes=LIMIT_BYTES)
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=log_dir)
    planner = Planner(store, get_policy("fifo"))
    yield agent, service, planner, log_dir
    agent.stop()


def run_until_ended(agent, planner, store, job_ids, timeout_s: float = 60.0) -> dict[int, str]:
    """Tick the planner and the agent until every job has ended (bounded, generous)."""
    return fleet.tick_until(store, job_ids, fleet.TERMINAL, planner, agent, timeout_s=timeout_s)


def test_a_jobs_output_is_cut_at_its_limit_with_a_marker_and_show_says_so(cluster, store, tmp_path):
    agent, service, planner, log_dir = cluster
    loud = service.submit(ROOT, {"argv": ["sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' x; echo after"],
                                 "gpus": 1, "est_runtime_s": 5})["id"]
    quiet = service.submit(ROOT, {"argv": ["sh", "-c", "echo hello; echo oops >&2"], "gpus": 1,
                                  "est_runtime_s": 5})["id"]
    assert run_until_ended(agent, planner, store, [loud, quiet]) == {loud: "COMPLETED", quiet: "COMPLETED"}

    out = (log_dir / f"{loud}.out").read_bytes()
    assert len(out) <= LIMIT_BYTES + 512, len(out)  # the limit, and one marker line
    assert out.startswith(b"x" * 1000) and out.rstrip().splitlines()[-1].startswith(MARKER)
    assert b"after" not in out  # what came after the limit was discarded
    assert not (tmp_path / "state" / "logs" / f"{loud}.out").exists()  # logs live in log_dir

    shown = service.get_job(ROOT, loud)
    assert shown["output_truncated"] == ["stdout"] and "output truncated" in shown["reason"]
    receipt = Accountant(store).receipt(loud)
    assert receipt["output_truncated"] == ["stdout"]

    assert (log_dir / f"{quiet}.out").read_bytes() == b"hello\n"  # under the limit: untouched
    assert (log_dir / f"{quiet}.err").read_bytes() == b"oops\n"
    assert service.get_job(ROOT, quiet)["output_truncated"] is None
    assert service.logs(ROOT, quiet)["text"] == "hello\n"  # the daemon reads log_dir


def test_a_full_log_disk_keeps_jobs_waiting_with_a_reason(cluster, store, tmp_path, monkeypatch):
    import scheduler.node.disk as disk_module

    agent, service, planner, log_dir = cluster
    free = {"log": 10 * 2**20}
    checked: set[Path] = set()

    def disk_free_bytes(path) -> int:
        checked.add(Path(path))
        return free["log"] if Path(path) == log_dir else 10 * 2**30

    monkeypatch.setattr(disk_module, "disk_free_bytes", disk_free_bytes)
    job = service.submit(ROOT, {"argv": ["true"], "gpus": 1})["id"]
    deadline = time.monotonic() + 30
    reason = None
    while time.monotonic() < deadline:
        agent.tick()
        planner.tick()
        reason = service.get_job(ROOT, job)["reason"] or ""
        if "disk full" in reason:
            break
        time.sleep(0.05)
    assert fleet.job_states(store, [job])[job] in ("PENDING", "PLANNED")
    assert "disk full" in reason and str(log_dir) in reason, reason
    assert {log_dir, tmp_path / "state"} <= checked  # both the log and the state disk are watched

    free["log"] = 10 * 2**30
    assert run_until_ended(agent, planner, store, [job]) == {job: "COMPLETED"}


def test_a_separate_log_dir_never_hands_another_stores_logs_to_this_one(tmp_path):
    from scheduler.state_dir import bind_log_dir

    log_dir = tmp_path / "joblogs"
    assert bind_log_dir(log_dir, "store-a") is None  # first use: bound, nothing moved
    (log_dir / "1.out").write_text("store a's job 1")
    assert bind_log_dir(log_dir, "store-a") is None  # the same store again: kept
    assert (log_dir / "1.out").exists()
    moved = bind_log_dir(log_dir, "store-b")  # another store: its job 1 must not get those files
    assert moved is not None and moved.parent == log_dir and (moved / "1.out").read_text() == "store a's job 1"
    assert not (log_dir / "1.out").exists() and moved.stat().st_mode & 0o777 == 0o700
