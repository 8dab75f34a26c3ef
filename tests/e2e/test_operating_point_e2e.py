"""End to end (the real daemon, its socket, its local agent and an emulated fleet): latency SLOs
at the API edge and the planned operating point reaching the job (issue 18, items 5-6)."""

from __future__ import annotations

import json

import pytest

from daemon_harness import DB_KINDS, DaemonProcess, database_for, world_dir
from scheduler.cli.client import ApiError

pytestmark = pytest.mark.slow

# The job writes the operating point it was handed where the test can read it.
JOB = 'echo "$CARBONSCHED_MAX_BATCH $CARBONSCHED_PRECISION $CARBONSCHED_TP $CUDA_VISIBLE_DEVICES" > "$1"'


@pytest.fixture(params=DB_KINDS)
def daemon(request):
    root = world_dir("cs-point-")
    with database_for(request.param, root) as url:
        d = DaemonProcess(root, url, emulate="1xH100,1xMI300X")
        (root / "job.sh").write_text(JOB)
        d.start()
        try:
            yield d
        finally:
            d.cleanup()


def test_an_slo_without_a_latency_model_is_refused_at_submit_and_nothing_is_stored(daemon):
    before = daemon.client().jobs(include_done=True)
    for args, needle in (
            (["--workload", "finetune", "--tpot-slo", "40ms"], "--tpot-slo: workload 'finetune' has no latency model"),
            (["--workload", "train", "--latency-slo", "500"], "--latency-slo: workload 'train'"),
            (["--ttft-slo", "2s"], "--ttft-slo: a job without --workload has no latency model"),
            (["--workload", "my-own-class", "--tpot-slo", "100"], "no latency model"),
            (["--workload", "llm:70b,fp3", "--", "true"], "bad workload")):
        r = daemon.cli("submit", *args, "--", "true")
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        if "latency model" in needle:
            assert "llm-chat-70b" in r.stderr and "llm-inference" in r.stderr and "llm:" in r.stderr
    with pytest.raises(ApiError) as e:
        daemon.client().submit(argv=["true"], workload="eval-custom", tpot_slo_ms=40.0)
    assert 400 <= e.value.status < 500
    assert daemon.client().jobs(include_done=True) == before
    # the same SLOs on workloads with a latency model are taken
    r = daemon.cli("submit", "--json", "--workload", "llm:8b", "--tpot-slo", "40ms", "--ttft-slo", "2s",
                   "--est-runtime", "1s", "--", "true")
    assert r.returncode == 0, r.stderr
    shown = json.loads(daemon.cli("show", r.stdout and str(json.loads(r.stdout)["id"]), "--json").stdout)
    assert (shown["tpot_slo_ms"], shown["ttft_slo_ms"], shown["workload"]) == (40.0, 2000.0, "llm:8b")


def test_the_planned_operating_point_reaches_the_jobs_environment_and_show_says_why(daemon):
    """A 70B BF16 job on one GPU: only the MI300X holds it; its point under a 60 ms TPOT
    limit is in the plan, in `show` (text and JSON), in the receipt and in the job's env."""
    out = daemon.root / "point.txt"
    r = daemon.cli("submit", "--json", "--workload", "llm-chat-70b", "--tpot-slo", "60ms", "--prompts", "50",
                   "--", "sh", str(daemon.root / "job.sh"), str(out))
    assert r.returncode == 0, r.stderr
    job_id = json.loads(r.stdout)["id"]
    job = daemon.wait_states([job_id], timeout_s=90)[job_id]
    assert job["state"] == "COMPLETED", job
    shown = json.loads(daemon.cli("show", str(job_id), "--json").stdout)
    point = shown["operating_point"]
    assert shown["gpu_model"] == "MI300X" and point["tp"] == 1 and point["precision"] == "bf16"
    assert out.read_text().split()[:3] == [str(point["max_batch"]), "bf16", "1"]
    assert f"MI300X at batch {point['max_batch']} BF16 TP1: " in shown["explanation"]
    assert "TPOT p95" in shown["explanation"] and "<= 60 ms (binding)" in shown["explanation"]
    text = daemon.cli("show", str(job_id)).stdout
    assert f"operating point: batch {point['max_batch']} BF16 TP1" in text and "TPOT p95 <= 60 ms" in text
    assert shown["receipt"]["operating_point"]["max_batch"] == point["max_batch"]
    assert f"operating point: batch {point['max_batch']} BF16 TP1 (MI300X at batch" in text  # the receipt's line
