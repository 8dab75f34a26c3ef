"""One home owns the SQL on the `jobs` table: `scheduler.jobs` (the daemon's and the claims'
statements in `store`, the read and report side's in `views`, `history`, `sums` and
`pricing`), beside `scheduler.lifecycle` (state changes) and `scheduler.store` (the schema).
Other modules ask those functions, so a reader finds every question asked of the table in
one package, and an index or a statement is tuned in one place.

The home sits low: it imports none of the modules that call it (accounting, the simulator,
the process packages), so any of them may use it.
"""

from __future__ import annotations

from tests.project.test_layout import MODULES, within

HOME = ("scheduler.jobs", "scheduler.lifecycle", "scheduler.store")
CALLERS = ("scheduler.accounting", "scheduler.simulate", "scheduler.cli", "scheduler.daemon", "scheduler.node",
           "scheduler.metrics", "scheduler.profiles", "scheduler.job_view")


def importers_of_the_jobs_table() -> set[str]:
    return {mod for mod, imps in MODULES.items() if "scheduler.store.models.jobs" in imps}


def test_the_check_sees_the_homes_own_imports():
    assert {"scheduler.jobs.store", "scheduler.jobs.sums", "scheduler.lifecycle"} <= importers_of_the_jobs_table()


def test_only_the_home_imports_the_jobs_table():
    strays = {m for m in importers_of_the_jobs_table() if not any(within(m, h) for h in HOME)}
    assert sorted(strays) == []


def test_the_home_imports_none_of_its_callers():
    found = sorted(f"{mod} imports {imp}" for mod, imps in MODULES.items() if within(mod, "scheduler.jobs")
                   for imp in imps if any(within(imp, c) for c in CALLERS))
    assert found == []
