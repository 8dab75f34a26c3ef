"""The suite's own schedule (tests/conftest.py): under `make test` (pytest-xdist work stealing)
each worker's block starts with its share of the longest tests, so that they run side by side
from the start instead of being stolen, one after another, at the end."""

from __future__ import annotations

from types import SimpleNamespace

from tests import conftest


class Item:
    def __init__(self, module: str, name: str, slow: bool = False) -> None:
        self.module = SimpleNamespace(__name__=module)
        self.nodeid = f"tests/area/{module}.py::{name}"
        self._slow = slow

    def get_closest_marker(self, name: str):
        return object() if name == "slow" and self._slow else None


def worker_config(argv: list[str], workers: int = 2):
    return SimpleNamespace(workerinput={"workercount": workers, "mainargv": argv},
                           getoption=lambda name, default=None: "no")  # as a worker's own option reads


def test_a_worker_reads_the_dist_mode_from_the_controllers_command_line():
    assert conftest._controller_dist(worker_config(["pytest", "-n", "4", "--dist", "worksteal"])) == "worksteal"
    assert conftest._controller_dist(worker_config(["pytest", "-n", "4", "--dist=load"])) == "load"
    assert conftest._controller_dist(worker_config(["pytest", "-n", "4"])) == "no"


def test_under_work_stealing_each_block_starts_with_its_share_of_the_longest_tests():
    quick = [Item("test_quick", f"q{i}") for i in range(10)]
    slow = [Item("test_slowish", f"s{i}", slow=True) for i in range(2)]
    governor = [Item("test_power_governor_e2e", f"g[{db}]", slow=True) for db in ("sqlite", "postgresql")]
    items = quick[:5] + governor[:1] + slow + quick[5:] + governor[1:]
    conftest.pytest_collection_modifyitems(worker_config(["pytest", "-n", "2", "--dist", "worksteal"]), items)
    assert len(items) == 14
    first_block, second_block = items[:7], items[7:]  # worksteal's first split: 14 // 2, in turn
    assert first_block[0] is governor[0] and second_block[0] is governor[1]
    assert first_block[1] is slow[0] and second_block[1] is slow[1]


def test_other_modes_keep_the_collection_order():
    items = [Item("test_quick", "q"), Item("test_power_governor_e2e", "g", slow=True)]
    before = list(items)
    conftest.pytest_collection_modifyitems(worker_config(["pytest", "-n", "2", "--dist", "load"]), items)
    assert items == before
