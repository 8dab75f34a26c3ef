"""End to end (the real daemon, its socket, its local agent and an emulated fleet): the issue 24
reproductions at the command line.

* Jobs no GPU of the fleet can ever run are refused at submit with exit 2 and the reason per
  GPU model, so they can no longer sit in the queue (where they once failed every tick) while
  the README's 70B example behind them is planned and runs.
* A job only drained GPUs can run is accepted with a warning (stderr, and `warning` in
  `--json`), and `queue` shows why it waits in its REASON column (`reason` in `--json`).
* A derived time limit never undercuts the user's own estimate: `--est-runtime 6s -- sleep 5`
  once ended TIMEOUT on an MI355X at 4.88 s (6 s x 0.41, the catalog's speed ratio, x 2), and
  a 20 s estimate got 27.7 s on an MI300X.
"""

from __future__ import annotations

import json
import time

import pytest

from daemon_harness import DB_KINDS, DaemonProcess, database_for, world_dir

pytestmark = pytest.mark.slow

README_70B = ["--name", "llama70b-batch", "--workload", "llm-chat-70b", "--gpus", "2", "--prompts", "20000",
              "--deadline", "12h", "--tpot-slo", "200ms", "--", "true"]


@pytest.fixture(params=DB_KINDS)
def daemon(request):
    root = world_dir("cs-admit-")
    with database_for(request.param, root) as url:
        d = DaemonProcess(root, url, emulate="4xMI300X,2xH100,1xMI355X")
        d.start()
        try:
            yield d
        finally:
            d.cleanup()


def submit(daemon: DaemonProcess, *args: str) -> int:
    r = daemon.cli("submit", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["id"]


def test_jobs_no_gpu_can_run_are_refused_at_submit_and_the_readme_job_behind_them_runs(daemon):
    for args in (["--workload", "llm-chat-70b", "--tpot-slo", "1ms", "--gpus", "2"],
                 ["--workload", "llm-chat-8b", "--tpot-slo", "1ms"]):
        r = daemon.cli("submit", *args, "--", "true")
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        line, = r.stderr.splitlines()
        assert line.startswith("carbonsched: fits no GPU model: H100 (slo), MI300X (slo), MI355X (slo)"), line
        assert "TPOT p95 <= 1 ms" in line
    # 4 h on the reference H100 is ~1.6 h on the MI355X, the fastest here
    r = daemon.cli("submit", "--est-runtime", "4h", "--time-limit", "1h", "--", "true")
    assert r.returncode == 2, r.stdout
    assert r.stderr.startswith("carbonsched: fits no GPU model: H100 (time limit: ~4h), MI300X (time limit: ~2h45m), "
                               "MI355X (time limit: ~1h37m)") and "--time-limit 1h" in r.stderr, r.stderr
    assert daemon.client().jobs(include_done=True) == []
    job_id = submit(daemon, *README_70B)
    assert daemon.wait_states([job_id], timeout_s=60)[job_id]["state"] == "COMPLETED"


def test_a_job_only_drained_gpus_can_run_waits_with_a_warning_and_its_reason_in_the_queue(daemon):
    assert daemon.cli("drain", "vm").returncode == 0
    r = daemon.cli("submit", "--gpu-mem", "200", "--", "true")  # only the MI355X has 288 GiB
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == ("carbonsched: warning: job 1: only GPUs out of service can run this job now: "
                                "1xMI355X on vm (drained); it waits until one of them returns")
    r = daemon.cli("submit", "--json", "--gpu-mem", "200", "--", "true")
    assert json.loads(r.stdout)["warning"].endswith("1xMI355X on vm (drained); it waits until one of them returns")
    listed = planned_reasons(daemon)
    assert [j["reason"] for j in listed] == ["no usable GPUs"] * 2, listed
    header, *rows = daemon.cli("queue").stdout.splitlines()
    assert header.split()[-1] == "REASON"
    assert all(row.split()[3] == "PENDING" and row.endswith("  no usable GPUs") for row in rows), rows
    assert daemon.cli("resume", "vm").returncode == 0
    assert {j["state"] for j in daemon.wait_states([1, 2], timeout_s=60).values()} == {"COMPLETED"}


def planned_reasons(daemon: DaemonProcess, timeout_s: float = 30.0) -> list[dict]:
    """`queue --json` once the planner has looked at every job."""
    deadline = time.monotonic() + timeout_s
    while True:
        listed = json.loads(daemon.cli("queue", "--json").stdout)
        if all(j["reason"] != "waiting for the planner" for j in listed) or time.monotonic() > deadline:
            return listed
        time.sleep(0.2)


@pytest.mark.parametrize("db", ["sqlite"])
def test_a_derived_limit_never_kills_a_job_within_its_own_estimate_on_a_fast_gpu(db):
    root = world_dir("cs-limit-")
    with database_for(db, root) as url:
        d = DaemonProcess(root, url, emulate="4xMI300X,1xMI355X")
        d.start()
        try:
            on_mi355x = submit(d, "--gpu-mem", "200", "--est-runtime", "6s", "--max-delay", "1s", "--", "sleep", "5")
            # two GPUs: only the MI300X node has them; 8 s within 5 s x 2 (the limit was 2 x 0.69 x 5 s = 6.9 s)
            on_mi300x = submit(d, "--gpus", "2", "--est-runtime", "5s", "--max-delay", "1s", "--", "sleep", "8")
            overrun = submit(d, "--est-runtime", "1s", "--max-delay", "1s", "--", "sleep", "60")
            jobs = d.wait_states([on_mi355x, on_mi300x, overrun], timeout_s=90)
            for job_id, model, limit in ((on_mi355x, "MI355X", "12s"), (on_mi300x, "MI300X", "10s")):
                assert (jobs[job_id]["state"], jobs[job_id]["gpu_model"]) == ("COMPLETED", model), jobs[job_id]
                assert f"time limit: {limit} (2 x --est-runtime" in d.cli("show", str(job_id)).stdout
            # a job that does run past its limit is told so in a duration, not a float
            assert (jobs[overrun]["state"], jobs[overrun]["reason"]) == ("TIMEOUT", "exceeded its time limit of 2s")
        finally:
            d.cleanup()
