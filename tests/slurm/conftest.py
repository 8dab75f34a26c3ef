"""The Slurm tests' cluster: one real Slurm on loopback for the whole session."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

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
