"""Shared fixtures: database URLs for SQLite and PostgreSQL, and a migrated Store.

PostgreSQL tests use the server named by CARBONSCHED_TEST_PG_URL (default: the local
server at 127.0.0.1:5432, user postgres, database test). Each test gets a fresh database
of its own, dropped afterwards. Without a server they skip with the reason, unless
CARBONSCHED_REQUIRE_PG=1 (as in CI), where a missing server is a failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

import suite_hygiene

PG_ADMIN_URL = os.environ.get("CARBONSCHED_TEST_PG_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REQUIRE_PG = os.environ.get("CARBONSCHED_REQUIRE_PG") == "1"
DATA_DIR = Path(__file__).parent / "data"

_pg_problem: str | None = None
_pg_checked = False


def _pg_available() -> str | None:
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
    problem = _pg_available()
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


@pytest.fixture(params=DB_KINDS)
def db_url(request, tmp_path):
    """An empty database of each kind: SQLite file and a fresh PostgreSQL database."""
    with database_for(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def store(db_url):
    """A Store on an empty database migrated to head."""
    from scheduler.store import Store

    s = Store(db_url)
    s.upgrade()
    try:
        yield s
    finally:
        s.dispose()


REQUIRE_SLURM = os.environ.get("CARBONSCHED_REQUIRE_SLURM") == "1"


def slurm_test_port() -> int:
    """slurmctld's port for this pytest process (the slurmds take the next ones): each
    pytest-xdist worker (gw0, gw1, ...) runs a cluster of its own, 10 ports apart."""
    base = int(os.environ.get("CARBONSCHED_TEST_SLURM_PORT", "16817"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return base + 10 * int(worker[2:] or 0)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real Slurm cluster on loopback for the whole session (tests/slurm_cluster.py): two
    nodes in two zones, sn-de (zone DE: 2 H100 + 2 MI300X) and sn-fr (zone FR: 2 H100), one
    partition `carbon`. Skipped with the reason where Slurm cannot run, unless
    CARBONSCHED_REQUIRE_SLURM=1 (as in CI), where that is a failure."""
    from tests.slurm_cluster import SlurmCluster, SlurmNode, missing_reason

    problem = missing_reason()
    if problem:
        if REQUIRE_SLURM:
            pytest.fail(f"CARBONSCHED_REQUIRE_SLURM=1 but {problem}")
        pytest.skip(problem)
    # Readable by all: users' sbatch reads slurm.conf, slurmd writes their output as them.
    root = Path(tempfile.mkdtemp(prefix="cs-slurm-"))
    root.chmod(0o755)
    cluster = SlurmCluster(root, [SlurmNode("sn-de", "DE", [("h100", 2), ("mi300x", 2)]),
                                  SlurmNode("sn-fr", "FR", [("h100", 2)])],
                           ctld_port=slurm_test_port())
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


# -- the longest first, one block each -------------------------------------------------------

# What takes longest (minutes of waiting on daemons, power windows and kills), longest first
# as measured on a quiet 2-core run: a module name, or "module::" to keep a module's tests
# together (a module-scoped fixture).
LONGEST = ("test_power_governor_e2e", "test_convergence::", "test_slurm_acceptance", "test_cluster_faults",
           "test_crash", "test_power_crash", "test_planner_process")


def _controller_dist(config) -> str:
    """pytest-xdist's `--dist` mode. A worker's own option reads "no" whatever the mode; the
    controller's command line (`workerinput["mainargv"]`) says which it is."""
    argv = list(getattr(config, "workerinput", {}).get("mainargv", []))
    for i, arg in enumerate(argv):
        if arg == "--dist" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--dist="):
            return arg.split("=", 1)[1]
    return config.getoption("dist", "no")


def pytest_collection_modifyitems(config, items):
    """Order the tests for pytest-xdist's work stealing (`make test`: `--dist worksteal`).

    worksteal gives each of its W workers one contiguous block of the collection (the i-th of
    W near-equal blocks), and an idle worker steals from the end of the busiest one's. So each
    block starts with its share of the longest tests (dealt round-robin, longest first), then
    of the other slow tests, then the quick ones: the long tests run side by side from the
    start and what is stolen at the end is quick. Every worker computes the same order.
    """
    workers = int(getattr(config, "workerinput", {}).get("workercount", 0))
    if workers < 2 or _controller_dist(config) != "worksteal":
        return
    rank = {name: i for i, name in enumerate(LONGEST)}
    groups: dict[str, tuple[int, list]] = {}  # by module (kept together) or by test
    slow, quick = [], []
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        if module + "::" in rank:
            groups.setdefault(module, (rank[module + "::"], []))[1].append(item)
        elif module in rank:
            groups[item.nodeid] = (rank[module], [item])
        elif item.get_closest_marker("slow"):
            slow.append(item)
        else:
            quick.append(item)
    longest = [group for _, group in sorted(groups.values(), key=lambda g: g[0])]  # stable
    blocks: list[list] = [[] for _ in range(workers)]
    for i, group in enumerate(longest):
        blocks[i % workers].extend(group)
    for i, item in enumerate(slow):
        blocks[i % workers].append(item)
    remaining = len(items)  # worksteal's split: len(pending) // nodes_remaining, in turn
    for i, block in enumerate(blocks):
        size = remaining // (workers - i)
        remaining -= size
        take = max(0, size - len(block))
        block.extend(quick[:take])
        del quick[:take]
    blocks[-1].extend(quick)
    items[:] = [item for block in blocks for item in block]


# -- nothing left behind (tests/suite_hygiene.py) --------------------------------------------

def _drop_left_databases(names: list[str]) -> list[str]:
    """Drop those of `names` that still exist on the test server; returns the ones dropped."""
    if not names or _pg_available():
        return []
    from sqlalchemy import create_engine, text

    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            left = [n for n in names if conn.execute(
                text("select 1 from pg_database where datname = :n"), {"n": n}).first()]
            for name in left:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
    return left


_RUN: suite_hygiene.Run | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """On the controller (not in a pytest-xdist worker, which inherits it): the run's own
    temporary directory and tag, before pytest picks its temporary directory."""
    global _RUN
    from scheduler.policy_tables import warm_policy_tables

    if hasattr(config, "workerinput") or suite_hygiene.run_dir() is not None:
        warm_policy_tables()  # a worker loads what the controller computed
        return
    _RUN = suite_hygiene.start_run()
    if not config.option.basetemp:  # short: Unix socket paths under tmp_path stay under 108 bytes
        config.option.basetemp = str(_RUN.directory / "t")
    # The policies' derived tables, computed once for the whole run: every worker, daemon,
    # agent and planner process of the run loads them (scheduler/policy_tables.py).
    os.environ["CARBONSCHED_CACHE_DIR"] = str(_RUN.directory / "cache")
    warm_policy_tables()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """After the last test (and pytest-xdist's workers): clean up what the run left, and fail
    the run when that was anything."""
    global _RUN
    if _RUN is None:
        return
    run, _RUN = _RUN, None
    problems = suite_hygiene.end_run(run, drop_databases=_drop_left_databases)
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", "the suite left things behind (cleaned up now)", red=True)
            for line in problems:
                reporter.write_line(line)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
