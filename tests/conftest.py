"""Shared fixtures: a database of each kind (SQLite and PostgreSQL, tests/databases.py) and
a migrated Store; the suite's schedule under pytest-xdist; nothing left behind.

The test files live in one folder per area (policies/, telemetry/, store/, node/, daemon/,
cli/, core/, simulate/, benchmarks/, slurm/, e2e/, project/). The helper modules here
(databases, fleet, cli_process, daemon_harness, suite_hygiene, once_per_run, policy_checker,
slurm_cluster, fakes) are imported by their plain names from every folder: this folder is on
sys.path because this conftest.py is (pytest's default "prepend" import mode). Test files
import each other by their folder (`from tests.simulate.test_simulate import ...`). A
fixture only one area uses lives in that area's conftest.py (slurm/, cli/); nothing imports
`conftest` by its bare name (with several conftest.py files it is ambiguous).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import suite_hygiene
from databases import DB_KINDS, PG_ADMIN_URL, pg_problem, database_for

DATA_DIR = Path(__file__).parent / "data"


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
    if not names or pg_problem():
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
