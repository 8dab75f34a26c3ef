"""Store contract suite: the same tests against SQLite and PostgreSQL (the `db_url` fixture).

Covers the schema (migrations == models, refusal to run on a wrong revision), timestamps
(always timezone-aware UTC) and transactions (transient errors retried, others not).
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import func, insert, inspect, select, text
from sqlalchemy.exc import IntegrityError, OperationalError, StatementError

from scheduler.store import Base, SchemaError, Store
from scheduler.store.engine import alembic_config, head_revision, is_transient, normalize_url
from scheduler.store.models import job_events, jobs, nodes

REPO = Path(__file__).resolve().parents[2]

UPGRADE_HINT = "carbonsched db upgrade"
TABLES = {"nodes", "gpus", "jobs", "job_events"}


def add_node(conn, name: str, registered_at: datetime, **extra) -> None:
    conn.execute(insert(nodes).values(name=name, zone="DE", backend="emulated", emulated=True,
                                      registered_at=registered_at, **extra))


def node_count(store: Store) -> int:
    with store.read() as conn:
        return conn.execute(select(func.count()).select_from(nodes)).scalar_one()


# -- schema ---------------------------------------------------------------------------------

def test_migrated_schema_matches_the_models(store):
    """`alembic upgrade head` on an empty database, then an `alembic check`-style compare."""
    assert store.check() == []


def test_migrations_create_every_model_table(store):
    with store.engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
    assert set(Base.metadata.tables) | {"alembic_version"} <= tables
    assert TABLES <= set(Base.metadata.tables)


def test_constructing_a_store_creates_nothing(db_url):
    s = Store(db_url)
    try:
        assert s.is_empty()
        assert s.schema_revision() is None
        assert s.is_empty()
    finally:
        s.dispose()


def test_upgrade_on_an_empty_database_reaches_head_and_matches_the_models(db_url):
    s = Store(db_url)
    try:
        problems = s.check()
        assert len(problems) == 1 and "none (empty)" in problems[0]
        s.upgrade()
        assert s.check() == []
        assert s.schema_revision() is not None
    finally:
        s.dispose()


def test_upgrade_is_idempotent(store):
    rev = store.schema_revision()
    store.upgrade()
    assert store.schema_revision() == rev
    assert store.check() == []


def test_migrations_downgrade_to_an_empty_database_and_back(store):
    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    with store.engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
    assert store.schema_revision() is None
    store.upgrade()
    assert store.check() == []


def test_check_reports_a_schema_that_drifted_from_the_models(store):
    with store.engine.begin() as conn:
        conn.execute(text("ALTER TABLE jobs ADD COLUMN rogue INTEGER"))
    problems = store.check()
    assert problems and all("schema differs from the models" in p for p in problems)
    assert any("rogue" in p for p in problems)


def test_require_current_accepts_a_database_at_head(store):
    store.require_current(UPGRADE_HINT)


def test_require_current_refuses_an_empty_database_and_says_how_to_fix_it(db_url):
    s = Store(db_url)
    try:
        with pytest.raises(SchemaError) as err:
            s.require_current(f"{UPGRADE_HINT} --db {s.url}")
    finally:
        s.dispose()
    message = str(err.value)
    assert f"`{UPGRADE_HINT} --db" in message
    assert "revision none" in message


def test_require_current_refuses_an_out_of_date_database_naming_both_revisions(store):
    head = store.schema_revision()
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0123456789ab'"))
    with pytest.raises(SchemaError) as err:
        store.require_current(UPGRADE_HINT)
    message = str(err.value)
    assert "0123456789ab" in message and head in message and UPGRADE_HINT in message
    assert store.check() == [f"database is at revision 0123456789ab, this carbonsched needs {head}"]


def test_the_head_read_from_the_migration_files_is_alembics():
    from alembic.script import ScriptDirectory

    assert head_revision() == ScriptDirectory.from_config(alembic_config()).get_current_head()


def test_checking_a_database_at_head_does_not_import_alembic(store):
    """Every daemon and agent start checks the schema: one query and the migration files'
    head, not Alembic's import and script parsing (a fifth of a second of CPU)."""
    url = store.engine.url.render_as_string(hide_password=False)
    check = ("import sys\n"
             "from scheduler.store import Store\n"
             "s = Store(sys.argv[1])\n"
             "s.require_current('carbonsched db upgrade')\n"
             "s.dispose()\n"
             "print(sorted(m for m in sys.modules if m == 'alembic' or m.startswith('alembic.')))\n")
    done = subprocess.run([sys.executable, "-c", check, url], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_plain_postgresql_urls_are_routed_to_psycopg_3():
    assert normalize_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalize_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalize_url("sqlite:///x.db") == "sqlite:///x.db"


# -- timestamps -----------------------------------------------------------------------------

def test_timezone_aware_datetimes_round_trip_as_the_same_instant_in_utc(store):
    for i, offset_h in enumerate((0, 2, -7, 5.5)):
        t = datetime(2026, 3, 29, 1, 30, 15, 123456, tzinfo=timezone(timedelta(hours=offset_h)))
        with store.write() as conn:
            add_node(conn, f"n{i}", t, last_heartbeat=t + timedelta(seconds=1))
        with store.read() as conn:
            row = conn.execute(select(nodes).where(nodes.c.name == f"n{i}")).one()
        assert row.registered_at == t, offset_h
        assert row.registered_at.tzinfo is not None
        assert row.registered_at.utcoffset() == timedelta(0)
        assert row.last_heartbeat - row.registered_at == timedelta(seconds=1)


def test_null_datetimes_stay_null(store):
    with store.write() as conn:
        add_node(conn, "n1", datetime(2026, 1, 1, tzinfo=timezone.utc), last_heartbeat=None)
    with store.read() as conn:
        assert conn.execute(select(nodes.c.last_heartbeat)).scalar_one() is None


def test_naive_datetimes_are_rejected_and_nothing_is_written(store):
    with pytest.raises(StatementError) as err:
        with store.write() as conn:
            add_node(conn, "n1", datetime(2026, 1, 1, 12, 0))
    assert isinstance(err.value.orig, ValueError)
    assert "naive datetime" in str(err.value)
    assert node_count(store) == 0


def test_naive_datetimes_are_rejected_in_queries_too(store):
    with pytest.raises(StatementError):
        with store.read() as conn:
            conn.execute(select(nodes).where(nodes.c.registered_at <= datetime(2026, 1, 1)))


def test_datetime_comparisons_in_sql_compare_instants_not_wall_clocks(store):
    """12:00+05:00 is 07:00Z: earlier than 09:00Z although its wall clock reads later."""
    early = datetime(2026, 6, 1, 12, 0, tzinfo=timezone(timedelta(hours=5)))  # 07:00Z
    late = datetime(2026, 6, 1, 9, 0, tzinfo=timezone.utc)
    with store.write() as conn:
        add_node(conn, "early", early)
        add_node(conn, "late", late)
    cutoff = datetime(2026, 6, 1, 4, 0, tzinfo=timezone(timedelta(hours=-4)))  # 08:00Z
    with store.read() as conn:
        before = conn.execute(select(nodes.c.name).where(nodes.c.registered_at <= cutoff)).scalars()
        assert list(before) == ["early"]
        ordered = conn.execute(select(nodes.c.name).order_by(nodes.c.registered_at)).scalars()
        assert list(ordered) == ["early", "late"]


# -- transactions ---------------------------------------------------------------------------

def locked() -> OperationalError:
    return OperationalError("UPDATE jobs ...", {}, Exception("database is locked"))


def test_write_commits_on_success_and_rolls_back_on_error(store):
    t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with store.write() as conn:
        add_node(conn, "kept", t)
    with pytest.raises(RuntimeError):
        with store.write() as conn:
            add_node(conn, "dropped", t)
            raise RuntimeError("boom")
    with store.read() as conn:
        assert list(conn.execute(select(nodes.c.name)).scalars()) == ["kept"]


def test_transact_retries_a_transient_error_and_keeps_only_the_successful_attempt(store):
    calls = []
    t = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def fn(conn):
        calls.append(1)
        add_node(conn, f"n{len(calls)}", t)
        if len(calls) == 1:
            raise locked()
        return "done"

    assert store.transact(fn) == "done"
    assert len(calls) == 2
    with store.read() as conn:
        assert list(conn.execute(select(nodes.c.name)).scalars()) == ["n2"]


def test_transact_does_not_retry_a_non_transient_database_error(store):
    calls = []

    def fn(conn):
        calls.append(1)
        raise OperationalError("SELECT ...", {}, Exception("no such table: jobz"))

    with pytest.raises(OperationalError):
        store.transact(fn)
    assert len(calls) == 1


def test_transact_does_not_retry_an_integrity_error(store):
    t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with store.write() as conn:
        add_node(conn, "n1", t)
    calls = []

    def fn(conn):
        calls.append(1)
        add_node(conn, "n1", t)  # duplicate primary key

    with pytest.raises(IntegrityError):
        store.transact(fn)
    assert len(calls) == 1


def test_transact_does_not_retry_errors_that_are_not_from_the_database(store):
    calls = []

    def fn(conn):
        calls.append(1)
        raise KeyError("bug")

    with pytest.raises(KeyError):
        store.transact(fn)
    assert len(calls) == 1


def test_transact_gives_up_after_its_attempts_and_raises_the_last_error(store):
    calls = []

    def fn(conn):
        calls.append(1)
        raise locked()

    with pytest.raises(OperationalError) as err:
        store.transact(fn, attempts=3)
    assert "database is locked" in str(err.value)
    assert len(calls) == 3


class _PgError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


@pytest.mark.parametrize(("error", "transient"), [
    (OperationalError("x", {}, Exception("database is locked")), True),
    (OperationalError("x", {}, Exception("database is busy")), True),
    (OperationalError("x", {}, _PgError("40001")), True),  # serialization failure
    (OperationalError("x", {}, _PgError("40P01")), True),  # deadlock detected
    (OperationalError("x", {}, _PgError("57P01")), True),  # admin shutdown (failover)
    (OperationalError("x", {}, Exception("disk I/O error")), False),
    (OperationalError("x", {}, Exception("no such table: jobs")), False),
    (IntegrityError("x", {}, Exception("UNIQUE constraint failed")), False),
    (IntegrityError("x", {}, _PgError("23505")), False),  # unique violation
    (OperationalError("x", {}, Exception("server closed the connection"),
                      connection_invalidated=True), True),
])
def test_only_transient_database_errors_are_classified_as_transient(error, transient):
    assert is_transient(error) is transient


def test_job_events_cascade_with_their_job(store):
    t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with store.write() as conn:
        job_id = conn.execute(insert(jobs).values(
            name="j", state="PENDING", owner_uid=1, owner_gid=1, owner_groups=[1],
            owner_name="u", argv=["true"], cwd="/", env={}, gpus=1, submitted_at=t,
        ).returning(jobs.c.id)).scalar_one()
        conn.execute(insert(job_events).values(job_id=job_id, to_state="PENDING", at=t))
    with store.write() as conn:
        conn.execute(jobs.delete().where(jobs.c.id == job_id))
    with store.read() as conn:
        assert conn.execute(select(func.count()).select_from(job_events)).scalar_one() == 0


def test_a_job_event_must_belong_to_an_existing_job(store):
    with pytest.raises(IntegrityError):
        with store.write() as conn:
            conn.execute(insert(job_events).values(job_id=424242, to_state="PENDING",
                                                   at=datetime(2026, 1, 1, tzinfo=timezone.utc)))
