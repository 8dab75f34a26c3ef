"""Operator holds (issue 48, finding 8), on SQLite and PostgreSQL: a hold placed by root or an
admin group on another user's job is an operator hold, as Slurm's admin hold (JobHeldAdmin):
only an operator releases it; the owner's `release` is refused with one line, and `queue` /
`show` say it is an operator hold. A user's own hold stays a user hold (JobHeldUser) that
the user releases. The end-to-end check with a real daemon and a throwaway user is in
tests/e2e/test_operator_powers_e2e.py.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import select

from scheduler.daemon.access import Caller, RequestError, ServiceConfig
from scheduler.daemon.planner import Planner
from scheduler.daemon.policy_factory import make_policy
from scheduler.daemon.service import JobService
from scheduler.store.models import jobs

import fleet

ROOT = Caller(uid=0, gid=0)
ALICE = Caller(uid=4242, gid=4242)
T = datetime(2022, 1, 10, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def world(store, tmp_path):
    fleet.add_node(store, "n1", at=T, n=2)
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs", clock=lambda: T)
    planner = Planner(store, make_policy("greedy", plan_interval_s=15), clock=lambda: T, plan_interval_s=15)
    return store, service, planner


def _submit(service, caller=ALICE, **body) -> int:
    return service.submit(caller, {"argv": ["true"], "gpus": 1, "est_runtime_s": 60, **body})["id"]


def _state(store, job_id: int) -> str:
    with store.read() as conn:
        return conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar_one()


def test_the_owner_cannot_release_an_operators_hold(world):
    store, service, planner = world
    job = _submit(service)
    planner.tick()
    assert service.hold(ROOT, [job], held=True)[0]["held"] is True
    with pytest.raises(RequestError) as e:
        service.hold(ALICE, [job], held=False)
    assert e.value.status == 403
    assert "\n" not in e.value.message and f"job {job}" in e.value.message and "operator" in e.value.message
    planner.tick()
    assert _state(store, job) == "PENDING"
    shown = service.get_job(ALICE, job)
    assert shown["held"] is True and shown["hold"] == "operator"
    assert "JobHeldAdmin" in shown["reason"] and "operator" in shown["reason"]
    listed = {j["id"]: j for j in service.list_jobs(ALICE)}
    assert "JobHeldAdmin" in listed[job]["reason"] and listed[job]["hold"] == "operator"
    # the owner holding it again changes nothing: it stays an operator hold
    service.hold(ALICE, [job], held=True)
    assert service.get_job(ALICE, job)["hold"] == "operator"
    # an operator releases it, and it is planned
    assert service.hold(ROOT, [job], held=False) == [{"id": job, "held": False, "changed": True}]
    planner.tick()
    assert _state(store, job) == "PLANNED" and service.get_job(ALICE, job)["hold"] is None


def test_a_release_of_several_jobs_with_one_operator_hold_releases_none(world):
    store, service, _ = world
    mine = _submit(service, hold=True)
    theirs = _submit(service)
    service.hold(ROOT, [theirs], held=True)
    with pytest.raises(RequestError) as e:
        service.hold(ALICE, [mine, theirs], held=False)
    assert e.value.status == 403 and f"job {theirs}" in e.value.message
    assert service.get_job(ALICE, mine)["held"] is True


def test_a_users_own_hold_is_a_user_hold_they_release(world):
    store, service, planner = world
    job = _submit(service, hold=True)
    shown = service.get_job(ALICE, job)
    assert shown["hold"] == "user" and "JobHeldUser" in shown["reason"]
    service.hold(ALICE, [job], held=False)
    planner.tick()
    assert _state(store, job) == "PLANNED"
    # an operator's hold on top of the user's own hold makes it an operator hold
    later = _submit(service, hold=True)
    service.hold(ROOT, [later], held=True)
    assert service.get_job(ALICE, later)["hold"] == "operator"
    with pytest.raises(RequestError):
        service.hold(ALICE, [later], held=False)


def test_root_holding_its_own_job_is_a_user_hold(world):
    _, service, _ = world
    job = _submit(service, caller=ROOT)
    service.hold(ROOT, [job], held=True)
    assert service.get_job(ROOT, job)["hold"] == "user"
