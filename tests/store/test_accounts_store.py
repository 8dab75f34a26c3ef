"""Accounts and their users in the store (scheduler.accounts), on SQLite and PostgreSQL: the
built-in `default` account, the tree, one default account per user, what an account delete
refuses, which account a job is charged to, and the migration both ways.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from alembic import command
from sqlalchemy import inspect, select, update

from scheduler import accounts as core
from scheduler.accounts import AccountError, charge_account, read_associations
from scheduler.store.engine import alembic_config
from scheduler.store.models import jobs

T = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)
REVISION = "7c2e4a9f1b36"
BEFORE = "d48a2b7c1e05"


def do(store, fn, *args, **kwargs):
    return store.transact(lambda conn: fn(conn, *args, **kwargs))


def refused(store, kind: str, fn, *args, **kwargs) -> str:
    with pytest.raises(AccountError) as e:
        do(store, fn, *args, **kwargs)
    assert e.value.kind == kind
    assert "\n" not in e.value.message
    return e.value.message


def add_job(store, account: str | None = None, state: str = "PENDING") -> int:
    from scheduler.jobs.store import insert_job

    row = dict(name="j", state=state, owner_uid=1000, owner_gid=1000, owner_groups=[1000], owner_name="alice",
               argv=["true"], cwd="/", env={}, gpus=1, gpu_mem_gib=0.0, max_retries=0, attempts=0,
               submitted_at=T, plan_rev=0)
    if account is not None:
        row["account"] = account
    return store.transact(lambda conn: insert_job(conn, row, 1000, T))


def test_a_new_store_has_the_default_account_and_nothing_else(store):
    rows = do(store, core.list_accounts)
    assert [(r["name"], r["parent"], r["shares"], r["users"]) for r in rows] == [("default", None, 1, [])]


def test_a_job_stored_without_an_account_or_qos_is_charged_to_default_under_normal(store):
    job_id = add_job(store)
    with store.read() as conn:
        assert conn.execute(select(jobs.c.account, jobs.c.qos).where(jobs.c.id == job_id)).one() == \
            ("default", "normal")


def test_accounts_form_a_tree_named_by_their_path(store):
    do(store, core.add_account, "research", shares=3, description="the lab", now=T)
    nlp = do(store, core.add_account, "research/nlp", shares=2, now=T)
    do(store, core.add_account, "teaching", now=T)
    assert nlp["parent"] == "research"
    tree = [(r["name"], r["depth"], r["shares"]) for r in do(store, core.list_accounts)]
    assert tree == [("default", 0, 1), ("research", 0, 3), ("research/nlp", 1, 2), ("teaching", 0, 1)]


@pytest.mark.parametrize("name", ["", "Research", "a b", "/x", "x/", "x//y", "a/b/c/d/e", 7, None, "-x"])
def test_a_bad_account_name_is_refused_in_one_line(store, name):
    assert "account name" in refused(store, "invalid", core.add_account, name, now=T)


def test_an_account_needs_an_existing_parent_and_a_name_of_its_own(store):
    assert "no account 'research'" in refused(store, "missing", core.add_account, "research/nlp", now=T)
    do(store, core.add_account, "research", now=T)
    assert "exists already" in refused(store, "conflict", core.add_account, "research", now=T)


@pytest.mark.parametrize("shares", [0, -1, 10**7, 1.5, True, "3"])
def test_shares_are_a_positive_whole_number(store, shares):
    assert "shares" in refused(store, "invalid", core.add_account, "x", shares=shares, now=T)


def test_modify_changes_shares_and_description_and_refuses_a_cycle(store):
    do(store, core.add_account, "research", now=T)
    do(store, core.add_account, "research/nlp", now=T)
    out = do(store, core.modify_account, "research", shares=5, description="more")
    assert (out["shares"], out["description"]) == (5, "more")
    assert "cycle" in refused(store, "conflict", core.modify_account, "research", parent="research/nlp")
    assert "nothing to change" in refused(store, "invalid", core.modify_account, "research")


def test_delete_refuses_default_a_parent_and_an_account_with_active_jobs(store):
    assert "built in" in refused(store, "conflict", core.delete_account, "default")
    do(store, core.add_account, "research", now=T)
    do(store, core.add_account, "research/nlp", now=T)
    assert "sub-accounts (research/nlp)" in refused(store, "conflict", core.delete_account, "research")
    job_id = add_job(store, "research/nlp", "RUNNING")
    assert "1 job(s) waiting or running" in refused(store, "conflict", core.delete_account, "research/nlp")
    store.transact(lambda conn: conn.execute(update(jobs).where(jobs.c.id == job_id).values(state="COMPLETED")))
    do(store, core.add_user, "alice", "research/nlp", now=T)
    out = do(store, core.delete_account, "research/nlp")
    assert out["deleted"] and out["users"] == ["alice"]
    assert do(store, core.list_users, "alice") == []
    with store.read() as conn:  # the finished job keeps its account's name
        assert conn.execute(select(jobs.c.account).where(jobs.c.id == job_id)).scalar_one() == "research/nlp"


def test_a_users_first_account_is_their_default_and_one_default_is_kept(store):
    for name in ("research", "teaching"):
        do(store, core.add_account, name, now=T)
    assert do(store, core.add_user, "alice", "research", now=T)["default"] is True
    assert do(store, core.add_user, "alice", "teaching", now=T)["default"] is False
    do(store, core.add_user, "bob", "teaching", now=T)
    do(store, core.modify_user, "alice", default_account="teaching")
    assert do(store, core.list_users, "alice") == [
        {"user": "alice", "account": "research", "default": False},
        {"user": "alice", "account": "teaching", "default": True}]
    assert do(store, core.list_users, "bob") == [{"user": "bob", "account": "teaching", "default": True}]
    do(store, core.add_user, "bob", "research", default=True, now=T)
    assert [r["account"] for r in do(store, core.list_users, "bob") if r["default"]] == ["research"]


def test_user_mistakes_are_one_line_each(store):
    do(store, core.add_account, "research", now=T)
    assert "no account 'nope'" in refused(store, "missing", core.add_user, "alice", "nope", now=T)
    do(store, core.add_user, "alice", "research", now=T)
    assert "already in account" in refused(store, "conflict", core.add_user, "alice", "research", now=T)
    assert "not in account 'default'" in refused(store, "missing", core.modify_user, "alice",
                                                 default_account="default")
    assert "in no account" in refused(store, "missing", core.delete_user, "bob")


def test_a_users_default_goes_last(store):
    for name in ("research", "teaching"):
        do(store, core.add_account, name, now=T)
        do(store, core.add_user, "alice", name, now=T)
    assert "default first" in refused(store, "conflict", core.delete_user, "alice", "research")
    assert [r["account"] for r in do(store, core.delete_user, "alice", "teaching")] == ["teaching"]
    assert [r["account"] for r in do(store, core.delete_user, "alice")] == ["research"]


def test_a_job_is_charged_to_the_asked_account_else_the_default_else_default(store):
    for name in ("research", "teaching"):
        do(store, core.add_account, name, now=T)
    do(store, core.add_user, "alice", "research", now=T)
    do(store, core.add_user, "alice", "teaching", default=True, now=T)
    with store.read() as conn:
        snap = read_associations(conn)
    assert charge_account(snap, "alice", None) == "teaching"
    assert charge_account(snap, "alice", "research") == "research"
    assert charge_account(snap, "carol", None) == "default"  # no associations: no set-up needed
    assert charge_account(snap, "carol", "default") == "default"
    for user, asked, words in (("alice", "default", "not in account 'default'"),
                               ("carol", "research", "in no account"),
                               ("alice", "nope", "no account 'nope'"),
                               ("alice", "Bad Name", "bad account name")):
        with pytest.raises(AccountError, match=words):
            charge_account(snap, user, asked)


def test_the_migration_goes_down_and_up_keeping_jobs_and_making_default_again(store):
    job_id = add_job(store)
    do(store, core.add_account, "research", now=T)
    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), BEFORE)
    with store.engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        assert not tables & {"accounts", "account_users"}
        assert not {"account", "qos"} & {c["name"] for c in inspect(conn).get_columns("jobs")}
    assert store.schema_revision() == BEFORE
    store.upgrade()
    assert store.check() == []          # at head again (later revisions may follow this one)
    assert [r["name"] for r in do(store, core.list_accounts)] == ["default"]
    with store.read() as conn:
        assert conn.execute(select(jobs.c.account, jobs.c.qos).where(jobs.c.id == job_id)).one() == \
            ("default", "normal")
