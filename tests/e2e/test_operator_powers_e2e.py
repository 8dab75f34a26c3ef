"""Issue 48, findings 3 and 8, end to end: the real daemon as root, its socket, and a
throwaway local user.

- root's `hold` of the user's job is an operator hold: the user's `release` exits non-zero
  with one line that says so, and the user's `queue` and `show` say it is an operator hold;
- `profiles reset` is for operators: the user gets a one-line refusal, root resets.
"""

from __future__ import annotations

import json
import os

import pytest

from daemon_harness import DaemonProcess, database_for, world_dir
from suite_hygiene import make_user, remove_user

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="creating users and running jobs as them needs root"),
]


@pytest.fixture
def user():
    name = make_user()
    yield name
    remove_user(name)


@pytest.fixture
def daemon():
    root = world_dir("cs-operator-")
    with database_for("sqlite", root) as url:
        d = DaemonProcess(root, url)
        d.start()
        try:
            yield d
        finally:
            d.cleanup()


def _one_line_error(done) -> str:
    assert done.returncode != 0, done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_an_operator_hold_is_released_only_by_an_operator_and_says_so(daemon, user):
    done = daemon.cli("submit", "--hold", "--json", "--est-runtime", "1m", "--", "true", user=user, cwd=daemon.root)
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)["id"]
    assert daemon.cli("hold", str(job)).returncode == 0  # root: an operator hold on top of hers

    line = _one_line_error(daemon.cli("release", str(job), user=user))
    assert f"job {job}" in line and "operator" in line
    queue = daemon.cli("queue", user=user)
    assert queue.returncode == 0 and "JobHeldAdmin" in queue.stdout, queue.stdout
    show = daemon.cli("show", str(job), user=user)
    assert show.returncode == 0 and "operator" in show.stdout, show.stdout

    done = daemon.cli("release", str(job))
    assert done.returncode == 0 and "released" in done.stdout, done.stderr
    states = daemon.wait_states([job], {"PLANNED", "RUNNING", "COMPLETED"}, timeout_s=120.0)
    assert states[job]["state"] in {"PLANNED", "RUNNING", "COMPLETED"}


def test_profiles_reset_is_for_operators(daemon, user):
    line = _one_line_error(daemon.cli("profiles", "reset", user=user))
    assert "operator" in line
    done = daemon.cli("profiles", "reset")
    assert done.returncode == 0 and "reset 0 learned profile" in done.stdout, done.stderr
