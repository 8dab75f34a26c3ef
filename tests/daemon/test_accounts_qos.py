"""Accounts, QOS and time limits at submit, and the account/user verbs, through the service
(the API's face) on SQLite and PostgreSQL.

A job is charged to the account asked for (which the user must be in), else the user's
default, else `default`; it runs under the QOS asked for, else `normal`; and every job has a
finite time limit: its own, one derived from --est-runtime, its QOS's default or the
site's. Only operators change accounts; everyone may list their own.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import select

from scheduler.daemon.access import Caller, RequestError, ServiceConfig
from scheduler.daemon.service import JobService
from scheduler.qos import Qos, QosTable, qos_table
from scheduler.store.models import jobs

T = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)
ROOT = Caller(uid=0, gid=0)
ALICE = Caller(uid=40001, gid=40001)  # no passwd entry: her jobs' owner name is "40001"
DAY = 86400.0


def make_service(store, tmp_path, **config) -> JobService:
    return JobService(store, ServiceConfig(daemon_uid=0, **config), log_dir=tmp_path / "logs", clock=lambda: T)


@pytest.fixture
def service(store, tmp_path):
    return make_service(store, tmp_path)


def submit(service, caller=ALICE, **body) -> int:
    return service.submit(caller, {"argv": ["true"], "gpus": 1, **body})["id"]


def refused(status: int, fn, *args, **kwargs) -> str:
    with pytest.raises(RequestError) as e:
        fn(*args, **kwargs)
    assert e.value.status == status, e.value.message
    assert "\n" not in e.value.message
    return e.value.message


def stored(store, job_id: int):
    with store.read() as conn:
        return conn.execute(select(jobs.c.account, jobs.c.qos, jobs.c.time_limit_s, jobs.c.time_limit_factor)
                            .where(jobs.c.id == job_id)).one()


def op(service, caller, path: str, body=None, method: str = "POST"):
    return service.accounts.route(method, path.split("/"), {}, body, caller)[1]


# -- accounts at submit ----------------------------------------------------------------------

def test_a_user_without_accounts_is_charged_to_default_under_normal(service, store):
    job_id = submit(service)
    assert stored(store, job_id)[:2] == ("default", "normal")
    shown = service.get_job(ALICE, job_id)
    assert (shown["account"], shown["qos"]) == ("default", "normal")


def test_a_job_goes_to_the_users_default_account_or_the_one_asked_for(service, store):
    op(service, ROOT, "accounts/add", {"name": "research"})
    op(service, ROOT, "accounts/add", {"name": "research/nlp", "shares": 4})
    op(service, ROOT, "users/add", {"user": "40001", "account": "research"})
    op(service, ROOT, "users/add", {"user": "40001", "account": "research/nlp", "default": True})
    assert stored(store, submit(service))[0] == "research/nlp"
    assert stored(store, submit(service, account="research"))[0] == "research"


@pytest.mark.parametrize("asked, words", [("nope", "no account 'nope'"), ("research", "is in no account"),
                                          ("Bad Name", "bad account name")])
def test_an_unknown_or_foreign_account_is_refused_in_one_line(service, asked, words):
    op(service, ROOT, "accounts/add", {"name": "research"})
    assert words in refused(400, submit, service, account=asked)


def test_an_account_the_user_is_not_in_is_refused_at_once_after_the_change(service):
    op(service, ROOT, "accounts/add", {"name": "research"})
    op(service, ROOT, "accounts/add", {"name": "teaching"})
    op(service, ROOT, "users/add", {"user": "40001", "account": "teaching"})
    assert "not in account 'research'" in refused(400, submit, service, account="research")
    assert "not in account 'default'" in refused(400, submit, service, account="default")


# -- QOS and time limits at submit -------------------------------------------------------------

def test_an_unknown_qos_is_refused_naming_the_known_ones(service):
    msg = refused(400, submit, service, qos="platinum")
    assert "unknown QOS 'platinum'" in msg and "flexible, normal, urgent" in msg


def test_the_qos_asked_for_is_stored(service, store):
    assert stored(store, submit(service, qos="flexible"))[1] == "flexible"
    assert stored(store, submit(service, qos="urgent"))[1] == "urgent"


def test_every_job_has_a_finite_time_limit(service, store):
    given = stored(store, submit(service, time_limit_s=5400.0))
    derived = stored(store, submit(service, est_runtime_s=600.0))
    nothing = stored(store, submit(service))
    assert given[2:] == (5400.0, None)
    assert derived[2:] == (1200.0, 2.0)  # time_limit_factor x --est-runtime, as before
    assert nothing[2:] == (DAY, None)    # the site's default_time_limit
    assert all(0 < row.time_limit_s < float("inf") for row in (given, derived, nothing))


def test_a_qos_default_then_the_site_default_capped_at_the_qos_maximum(store, tmp_path):
    table = qos_table({"qos": {"debug": {"default_time_limit": "30m", "max_time_limit": "2h"},
                               "short": {"max_time_limit": "4h"}}})
    service = make_service(store, tmp_path, qos=table, default_time_limit_s=12 * 3600.0)
    assert stored(store, submit(service, qos="debug"))[2] == 1800.0
    assert stored(store, submit(service, qos="short"))[2] == 4 * 3600.0
    assert stored(store, submit(service))[2] == 12 * 3600.0


def test_a_limit_over_the_qos_maximum_is_refused_with_the_maximum(store, tmp_path):
    service = make_service(store, tmp_path, qos=qos_table({"qos": {"debug": {"max_time_limit": "2h"}}}))
    assert "maximum time limit of 2h" in refused(400, submit, service, qos="debug", time_limit_s=3 * 3600.0)
    assert "maximum time limit of 2h" in refused(400, submit, service, qos="debug", est_runtime_s=3 * 3600.0)
    # a derived limit past the maximum is the maximum, binding: no job runs longer
    assert stored(store, submit(service, qos="debug", est_runtime_s=5400.0))[2:] == (7200.0, None)


def test_a_qos_queue_limit_refuses_beyond_it_in_one_line(store, tmp_path):
    table = QosTable({**QosTable().levels, "tiny": Qos("tiny", 5, "urgent", None, 1.0, 0.0, 0.0,
                                                       max_jobs_queued_per_user=2)})
    service = make_service(store, tmp_path, qos=table)
    submit(service, qos="tiny")
    submit(service, qos="tiny")
    submit(service)  # another QOS is not counted
    assert "2 jobs waiting in QOS 'tiny'" in refused(429, submit, service, qos="tiny")
    assert "this request adds 3" in refused(429, submit, service, qos="tiny", array="0-2")


# -- the verbs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("path, body", [("accounts/add", {"name": "mine"}),
                                        ("accounts/modify", {"name": "default", "shares": 9}),
                                        ("accounts/delete", {"name": "default"}),
                                        ("users/add", {"user": "40001", "account": "default"}),
                                        ("users/modify", {"user": "40001", "default_account": "default"}),
                                        ("users/delete", {"user": "40001"})])
def test_a_user_who_is_not_an_operator_cannot_change_accounts(service, path, body):
    assert "only an operator" in refused(403, op, service, ALICE, path, body)
    assert [a["name"] for a in op(service, ROOT, "accounts", method="GET")] == ["default"]


def test_a_user_lists_accounts_and_only_their_own_associations(service):
    op(service, ROOT, "accounts/add", {"name": "research"})
    op(service, ROOT, "users/add", {"user": "40001", "account": "research"})
    op(service, ROOT, "users/add", {"user": "bob", "account": "research"})
    assert op(service, ALICE, "users", method="GET") == [{"user": "40001", "account": "research", "default": True}]
    assert [a["users"] for a in op(service, ALICE, "accounts", method="GET")] == [[], ["40001"]]
    assert [a["users"] for a in op(service, ROOT, "accounts", method="GET")] == [[], ["40001", "bob"]]
    assert "only an operator" in refused(403, service.accounts.list_users, ALICE, "bob")


def test_verb_mistakes_are_answered_with_their_kind(service):
    assert "exists already" in refused(409, op, service, ROOT, "accounts/add", {"name": "default"})
    assert "no account 'x'" in refused(404, op, service, ROOT, "accounts/modify", {"name": "x", "shares": 2})
    assert "unknown field(s)" in refused(400, op, service, ROOT, "accounts/add", {"name": "x", "color": 1})
    assert "unknown API call" in refused(404, op, service, ROOT, "accounts/rename", {})


def test_an_account_with_waiting_jobs_cannot_be_deleted(service):
    op(service, ROOT, "accounts/add", {"name": "research"})
    op(service, ROOT, "users/add", {"user": "40001", "account": "research"})
    submit(service)
    assert "waiting or running" in refused(409, op, service, ROOT, "accounts/delete", {"name": "research"})


def test_the_qos_queue_count_is_read_again_after_its_refresh_and_errs_strict_before(store, tmp_path):
    table = QosTable({**QosTable().levels, "tiny": Qos("tiny", 5, "urgent", None, 1.0, 0.0, 0.0,
                                                       max_jobs_queued_per_user=1)})
    service = make_service(store, tmp_path, qos=table)
    now = [1000.0]
    service.submissions.tenancy._clock = lambda: now[0]
    first = submit(service, qos="tiny")
    service.cancel(ROOT, [first])
    assert "1 jobs waiting in QOS 'tiny'" in refused(429, submit, service, qos="tiny")  # not read yet
    now[0] += service.submissions.tenancy.QUEUED_REFRESH_S + 1
    submit(service, qos="tiny")  # read again: the cancelled job no longer counts
