"""`carbonsched cancel` as scancel: the jobs that can be cancelled are, each id that cannot
is named on stderr with why, and the exit status says something was refused. During a
running job's stop (its grace period) `queue` shows it CANCELLING, as squeue shows CG."""

from __future__ import annotations

import json
import shutil

import pytest

from cli_process import run
from daemon_harness import world_dir
from scheduler.clock import utcnow
from scheduler.daemon.access import Caller, ServiceConfig
from scheduler.daemon.api import ApiServer
from scheduler.daemon.service import JobService
from scheduler.lifecycle import State, transition
from scheduler.store import Store

ROOT = Caller(uid=0, gid=0)


@pytest.fixture
def world(cli_env):
    root = world_dir("cs-cancel-cli-")
    store = Store(f"sqlite:///{root / 'db.sqlite'}")
    store.upgrade()
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=root / "logs")
    api = ApiServer(root / "s.sock", service)
    api.start()
    try:
        yield service, lambda *args: run(cli_env, "--socket", str(root / "s.sock"), *args)
    finally:
        api.stop()
        store.dispose()
        shutil.rmtree(root, ignore_errors=True)


def _submit(service) -> int:
    return service.submit(ROOT, {"argv": ["true"], "gpus": 1, "est_runtime_s": 60})["id"]


def test_cancel_cancels_the_valid_ids_and_names_the_rest(world):
    service, cs = world
    a, b = _submit(service), _submit(service)
    proc = cs("cancel", str(a), "999", str(b))
    assert proc.stdout.splitlines() == [f"job {a}: cancelled", f"job {b}: cancelled"]
    assert proc.stderr.splitlines() == ["job 999: no job 999"]
    assert proc.returncode == 4  # not found, as for a single missing job
    assert [service.get_job(ROOT, j)["state"] for j in (a, b)] == ["CANCELLED", "CANCELLED"]


def test_cancel_json_lists_each_id_with_its_state_or_its_error(world):
    service, cs = world
    a = _submit(service)
    proc = cs("cancel", str(a), "999", "--json")
    assert json.loads(proc.stdout) == [{"id": a, "state": "CANCELLED"},
                                       {"id": 999, "status": 404, "error": "no job 999"}]
    assert proc.returncode == 4


def test_cancel_of_only_unknown_ids_is_one_line(world):
    _, cs = world
    proc = cs("cancel", "998", "999")
    assert proc.stderr.splitlines() == ["carbonsched: no job 998; no job 999"]
    assert proc.returncode == 4


def test_a_running_job_being_stopped_shows_cancelling_in_the_queue(world):
    service, cs = world
    job = _submit(service)
    def start(conn):
        assert transition(conn, job, State.PLANNED, actor_uid=None, reason="test", expect=State.PENDING)
        assert transition(conn, job, State.RUNNING, actor_uid=None, reason="test", expect=State.PLANNED,
                          values=dict(node="n1", started_at=utcnow()))

    service.store.transact(start)
    assert cs("cancel", str(job)).stdout.strip() == f"job {job}: cancelling (stopping the process)"
    row = next(line for line in cs("queue").stdout.splitlines() if line.split()[:1] == [str(job)])
    assert "CANCELLING" in row.split()
