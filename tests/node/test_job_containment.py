"""Nothing a job starts outlives it (issue 25, item 5): a process that leaves the job's process
group and session (`setsid ... &`) is still the job's, and is stopped when the job ends, is
cancelled or times out. Contained by a cgroup v2 of its own where the host allows it, else by
the run token in its environment (`scheduler.node.job_cgroup`); both are tested here, through
the real supervisor, running the job as an unprivileged user."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from scheduler.node import job_cgroup
from scheduler.node.executor import Executor, LaunchSpec, RunState

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs jobs as another user")

NOBODY = 65534
# The escapee: a new session, detached from everything, printing its pid first.
ESCAPE = 'setsid sh -c "exec sleep 120" </dev/null >/dev/null 2>&1 & echo $!; '


def cgroup_possible() -> bool:
    cg = job_cgroup.JobCgroup.create(f"probe-{os.getpid()}")
    if cg is None:
        return False
    cg.remove()
    return True


CONTAINMENTS = ["proc"] + (["auto"] if cgroup_possible() else [])


def run(tmp_path: Path, script: str, contain: str, *, job_id: int = 1, cancel_after_s: float | None = None,
        time_limit_s: float | None = None) -> tuple[dict, str]:
    tmp_path.chmod(0o755)
    ex = Executor(tmp_path / "state", grace_s=0.5)
    out, err = ex.log_paths(job_id)
    ex.launch(LaunchSpec(job_id=job_id, argv=["sh", "-c", script], cwd="/", env={"PATH": "/usr/bin:/bin"},
                         uid=NOBODY, gid=NOBODY, groups=[], time_limit_s=time_limit_s, grace_s=0.5,
                         stdout=str(out), stderr=str(err), extra={"contain": contain}))
    started = time.monotonic()
    cancelled = False
    while time.monotonic() - started < 30:
        st = ex.status(job_id)
        if st.state is RunState.FINISHED:
            ex.reap()
            return st.result, out.read_text()
        if cancel_after_s is not None and not cancelled and time.monotonic() - started > cancel_after_s:
            cancelled = ex.signal_cancel(job_id)
        time.sleep(0.05)
    raise TimeoutError(st)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("contain", CONTAINMENTS)
def test_a_process_that_left_the_jobs_session_ends_with_the_job(tmp_path, contain):
    result, out = run(tmp_path, ESCAPE + "exit 0", contain)
    escaped = int(out.split()[0])
    assert result["exit_code"] == 0
    assert not alive(escaped), f"pid {escaped} outlived its job"


@pytest.mark.parametrize("contain", CONTAINMENTS)
def test_cancel_and_time_limit_reach_processes_outside_the_jobs_group(tmp_path, contain):
    result, out = run(tmp_path, ESCAPE + "sleep 60", contain, cancel_after_s=1.0)
    assert result["cancelled"] and not alive(int(out.split()[0]))
    result, out = run(tmp_path, ESCAPE + "sleep 60", contain, job_id=2, time_limit_s=1.0)
    assert result["timed_out"] and not alive(int(out.split()[0]))


@pytest.mark.skipif("auto" not in CONTAINMENTS, reason="no writable cgroup v2 here")
def test_the_job_runs_in_a_cgroup_of_its_own_that_it_cannot_leave_and_that_is_removed(tmp_path):
    root = job_cgroup.cgroup2_root()
    home = job_cgroup.own_cgroup(root)
    script = (f'grep "^0::" /proc/self/cgroup; (echo $$ > {home}/cgroup.procs) 2>/dev/null && echo moved '
              f'|| echo stayed; grep "^0::" /proc/self/cgroup')
    result, out = run(tmp_path, script, "auto")
    before, verdict, after = out.split("\n")[:3]
    assert "/job-1-" in before and verdict == "stayed" and after == before
    assert not (root / before[3:].lstrip("/")).exists()  # removed once empty
