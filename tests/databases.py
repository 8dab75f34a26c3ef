"""The test databases: SQLite files and fresh PostgreSQL databases, for the fixtures
(tests/conftest.py) and for tests and harnesses that make their own.

PostgreSQL tests use the server named by CARBONSCHED_TEST_PG_URL (default: the local
server at 127.0.0.1:5432, user postgres, database test). Each test gets a fresh database
of its own, dropped afterwards. Without a server they skip with the reason, unless
CARBONSCHED_REQUIRE_PG=1 (as in CI), where a missing server is a failure. A plain module,
not conftest.py: every test folder imports it by the same name.
"""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

import suite_hygiene

PG_ADMIN_URL = os.environ.get("CARBONSCHED_TEST_PG_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REQUIRE_PG = os.environ.get("CARBONSCHED_REQUIRE_PG") == "1"

_pg_problem: str | None = None
_pg_checked = False


def pg_problem() -> str | None:
    """None when PostgreSQL answers, else why not."""
    global _pg_checked, _pg_problem
    if not _pg_checked:
        _pg_checked = True
        from sqlalchemy import create_engine, text

        try:
            engine = create_engine(PG_ADMIN_URL, connect_args={"connect_timeout": 3})
            with engine.connect() as conn:
                conn.execute(text("select 1"))
            engine.dispose()
        except Exception as e:  # any failure to connect means "no server here"
            _pg_problem = f"PostgreSQL not reachable at {PG_ADMIN_URL}: {type(e).__name__}: {e}"
    return _pg_problem


def make_pg_database() -> tuple[str, callable]:
    """Create a fresh, empty PostgreSQL database; return its URL and a function that drops it."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"cs_test_{uuid.uuid4().hex[:12]}"
    suite_hygiene.record_database(name)
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return url, drop


def require_pg() -> None:
    """Skip the test without a PostgreSQL server (fail it where CARBONSCHED_REQUIRE_PG=1)."""
    problem = pg_problem()
    if problem:
        if REQUIRE_PG:
            pytest.fail(f"CARBONSCHED_REQUIRE_PG=1 but {problem}")
        pytest.skip(problem)


DB_KINDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@contextmanager
def database_for(kind: str, directory: Path):
    """An empty database of `kind`: a SQLite file under `directory/state`, or a fresh
    PostgreSQL database dropped afterwards (skipped without a server, unless required)."""
    if kind == "sqlite":
        yield f"sqlite:///{directory / 'state' / 'carbonsched.db'}"
        return
    require_pg()
    url, drop = make_pg_database()
    try:
        yield url
    finally:
        drop()
