"""Engine construction, transactions with retry of transient errors, and schema checks.

Nothing is created at import time: a Store takes a URL or an engine. SQLite runs in WAL
mode with a busy timeout, and write transactions start with BEGIN IMMEDIATE so a writer
waits for the lock up front instead of failing when it upgrades a read lock.
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterator
import threading
from contextlib import contextmanager, nullcontext
from functools import cache
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.pool import QueuePool

log = logging.getLogger(__name__)

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_MS = 10_000


class SchemaError(RuntimeError):
    """The database schema is not the one this version of carbonsched expects."""


def default_db_url(state_dir: Path) -> str:
    """The embedded default: a SQLite file under the state directory."""
    return f"sqlite:///{Path(state_dir) / 'carbonsched.db'}"


def normalize_url(url: str) -> str:
    """Accept plain postgresql:// URLs and route them to psycopg 3."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


#: How long a thread waits for a pooled connection before sqlalchemy's TimeoutError (the
#: API answers it 503; its own requests are bounded below the pool by `ApiServer`).
POOL_TIMEOUT_S = 30.0


def make_engine(url: str, *, pool_timeout_s: float = POOL_TIMEOUT_S) -> Engine:
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:" and not db.startswith("file:"):
            Path(db).parent.mkdir(parents=True, exist_ok=True)
            secure_sqlite_files(Path(db))
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
                                                  "check_same_thread": False},
                               # a file gets a QueuePool; memory a pool that takes no timeout
                               **({"pool_timeout": pool_timeout_s}
                                  if db and db != ":memory:" and parsed.query.get("mode") != "memory" else {}))
        _configure_sqlite(engine)
        return engine
    # No pool_pre_ping: a dropped connection surfaces as an invalidated-connection error,
    # which Store.transact retries; pinging would cost a round trip on every transaction.
    # Sessions run in UTC so timestamps come back as UTC whatever the server's setting.
    return create_engine(url, pool_size=10, max_overflow=20, pool_recycle=1800, pool_timeout=pool_timeout_s,
                         connect_args={"options": "-c timezone=UTC"})


SQLITE_FILE_MODE = 0o600
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def secure_sqlite_files(db: Path) -> None:
    """Create the SQLite file owner-only (0600) if it is missing, and take group and world
    access away from it and its -wal, -shm and -journal files if they have any.

    The store holds every job's argv, environment (where `--env` secrets go), cwd and owner,
    so no other local user may read it, whatever the umask the daemon was started with
    (SQLite gives the -wal and -shm files the database file's own mode, so a 0600 database
    keeps its side files 0600 too). Files already there from an older version are fixed here.
    """
    try:
        fd = os.open(db, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, SQLITE_FILE_MODE)
    except OSError as e:
        # Read-only media or a symlink: SQLite will say what is wrong when it opens the file.
        log.debug("cannot pre-create %s: %s", db, e)
        fd = None
    if fd is not None:
        try:
            if os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, SQLITE_FILE_MODE)
        finally:
            os.close(fd)
    for suffix in SQLITE_SIDE_FILES:
        side = db.with_name(db.name + suffix)
        try:
            if side.lstat().st_mode & 0o077 and not side.is_symlink():
                side.chmod(SQLITE_FILE_MODE)
        except FileNotFoundError:
            pass


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        immediate = conn.get_execution_options().get("carbonsched_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def is_transient(exc: BaseException) -> bool:
    """Whether a database error is worth retrying: lock contention, serialization, dropped link."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    orig = getattr(exc, "orig", None)
    if orig is None:
        return False
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate in {"40001", "40P01", "55P03", "57P01", "08000", "08003", "08006"}:
        return True
    if isinstance(exc, OperationalError):
        text = str(orig).lower()
        return "database is locked" in text or "database is busy" in text
    return False


class Store:
    """A handle on the database: read and write transactions, retried when transient."""

    def __init__(self, url_or_engine: str | Engine) -> None:
        self.engine = (
            url_or_engine if isinstance(url_or_engine, Engine) else make_engine(url_or_engine)
        )
        self._write_engine = self.engine.execution_options(carbonsched_write=True)
        self._autocommit_engine = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self.dialect = self.engine.dialect.name
        # SQLite has one writer at a time and its busy handler polls with back-off, so
        # threads of one process queue here, in order, instead of sleeping in SQLite.
        self._write_lock = threading.Lock() if self.dialect == "sqlite" else nullcontext()

    def pool_connections(self) -> int | None:
        """How many connections the engine's pool may hold at once (its size plus overflow);
        None for a pool without such a bound (SQLite in memory, NullPool)."""
        pool = self.engine.pool
        if not isinstance(pool, QueuePool):
            return None
        overflow = pool._max_overflow  # no public accessor; -1 means unbounded
        return None if overflow < 0 else pool.size() + overflow

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction (a consistent snapshot on both databases)."""
        with self.engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction; commits on success, rolls back on any exception."""
        with self._write_lock, self._write_engine.connect() as conn, conn.begin():
            yield conn

    def transact(self, fn: Callable[[Connection], T], *, attempts: int = 8, _engine: Engine | None = None) -> T:
        """Run fn in a write transaction, retrying transient database errors with backoff."""
        delay = 0.01
        for attempt in range(1, attempts + 1):
            try:
                with self._write_lock, (_engine or self._write_engine).connect() as conn, conn.begin():
                    return fn(conn)
            except DBAPIError as e:
                if attempt == attempts or not is_transient(e):
                    raise
                log.debug("transient database error (attempt %d): %s", attempt, e.orig)
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    def execute_once(self, statement, params: dict, *, attempts: int = 8):
        """Run one self-contained statement in autocommit mode (one round trip on PostgreSQL),
        retrying transient errors; the rows it returns are buffered before the connection
        goes back to the pool."""
        return self.transact(lambda conn: conn.execute(statement, params).freeze()(), attempts=attempts,
                             _engine=self._autocommit_engine)

    def dispose(self) -> None:
        self.engine.dispose()

    # -- schema -------------------------------------------------------------------------

    def schema_revision(self) -> str | None:
        """The Alembic revision stamped in the database, None for an empty database."""
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def _stamped_revision(self) -> str | None:
        """`schema_revision` in one query when the database has one stamp (or none); Alembic's
        own reading otherwise (several heads: it says what is wrong)."""
        with self.engine.connect() as conn:
            if not inspect(conn).has_table(ALEMBIC_VERSION_TABLE):
                return None
            rows = conn.execute(text(f"SELECT version_num FROM {ALEMBIC_VERSION_TABLE}")).scalars().all()
        if len(rows) <= 1:
            return rows[0] if rows else None
        return self.schema_revision()

    def is_empty(self) -> bool:
        with self.engine.connect() as conn:
            return not inspect(conn).get_table_names()

    def upgrade(self, revision: str = "head") -> None:
        """Apply migrations up to `revision` (the `carbonsched db upgrade` command)."""
        from alembic import command

        with self.engine.begin() as conn:
            cfg = alembic_config(conn)
            command.upgrade(cfg, revision)

    def check(self) -> list[str]:
        """Problems with the schema; empty when the database is at head and matches the models."""
        from alembic.autogenerate import compare_metadata
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        import scheduler.store.models  # noqa: F401  (every table on Base.metadata)
        from scheduler.store.base import Base

        head = ScriptDirectory.from_config(alembic_config()).get_current_head()
        current = self.schema_revision()
        if current != head:
            return [f"database is at revision {current or 'none (empty)'}, this carbonsched needs {head}"]
        with self.engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        return [f"schema differs from the models: {d!r}" for d in diffs]

    def require_current(self, fix_hint: str) -> None:
        """Refuse to run on a database whose revision is not this version's head. Every start
        of the daemon, an agent and most verbs asks, so it reads the stamp with one query and
        the head from the migration files (`head_revision`), without importing Alembic (a
        fifth of a second of CPU) unless the answer is not a plain one."""
        head = head_revision()
        current = self._stamped_revision()
        if current != head:
            raise SchemaError(
                f"database schema is at revision {current or 'none'} but this carbonsched needs "
                f"{head}; run `{fix_hint}` to upgrade it"
            )


ALEMBIC_VERSION_TABLE = "alembic_version"  # Alembic's default: migrations/env.py names no other
_REVISION_LINE = re.compile(r"^(revision|down_revision)\s*(?::[^=]*)?=\s*(.*?)\s*$", re.MULTILINE)


@cache
def head_revision() -> str:
    """This version's newest migration: the one revision that no other follows, read from the
    `revision` and `down_revision` lines of the migration files. Where that reading is not
    plain (a merge migration, several heads, a line it cannot parse), Alembic's
    `ScriptDirectory` answers, as it always did."""
    revisions, followed = set(), set()
    for path in sorted((migrations_dir() / "versions").glob("*.py")):
        found = dict(_REVISION_LINE.findall(path.read_text()))
        rev, down = found.get("revision", ""), found.get("down_revision", "")
        if not (_quoted(rev) and (down == "None" or _quoted(down))):
            return _alembic_head()
        revisions.add(rev[1:-1])
        if down != "None":
            followed.add(down[1:-1])
    heads = revisions - followed
    return heads.pop() if len(heads) == 1 and followed <= revisions else _alembic_head()


def _quoted(value: str) -> bool:
    return len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" and value[1:-1].isalnum()


def _alembic_head() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def migrations_dir() -> Path:
    import migrations

    return Path(migrations.__file__).parent


def alembic_config(connection: Connection | None = None):
    """An Alembic Config pointing at the packaged migrations; bound to `connection` if given."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option(
        "file_template", "%%(year)d%%(month).2d%%(day).2d_%%(rev)s_%%(slug)s"
    )
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg
