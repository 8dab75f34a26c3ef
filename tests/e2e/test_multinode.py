"""A head-node daemon and a separate `carbonsched agent` process sharing only the store:
the agent registers its emulated GPUs, runs the jobs planned for them, and its live power
shows in `carbonsched nodes` and on its Prometheus endpoint."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from daemon_harness import DB_KINDS, REPO, DaemonProcess, database_for, world_dir

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=DB_KINDS)
def head_and_agent(request):
    root = world_dir("cs-multi-")
    with database_for(request.param, root) as url:
        yield from _head_and_agent(root, url)


def _head_and_agent(root, url):
    # The head plans on a thread here (--no-planner-process); other end-to-end tests use the
    # default child process, so both planner paths run for real.
    head = DaemonProcess(root, url, emulate=None, local_agent=False, extra=["--no-planner-process"])
    head.start()
    port = free_port()
    agent_log = open(root / "agent.log", "w")
    agent = subprocess.Popen(
        [sys.executable, "-m", "scheduler", "--config", str(head.config), "agent", "--db", url,
         "--node", "gpu-node-1", "--zone", "DE", "--state-dir", str(root / "agent-state"),
         "--emulate", "8xMI300X", "--sample-hz", "5", "--dispatch-interval", "0.2s",
         "--metrics-port", str(port)],
        stdout=agent_log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        yield head, agent, port, root
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(20)
        except subprocess.TimeoutExpired:
            agent.kill()
        agent_log.close()
        head.cleanup()


def test_agent_runs_jobs_and_reports_live_power(head_and_agent):
    head, agent, port, root = head_and_agent
    deadline = time.monotonic() + 30
    nodes = []
    while time.monotonic() < deadline:
        nodes = json.loads(head.cli("nodes", "--json").stdout or "[]")
        if nodes and all(g["power_w"] for g in nodes[0]["gpus"]):
            break
        time.sleep(0.2)
    assert [n["name"] for n in nodes] == ["gpu-node-1"], (root / "agent.log").read_text()
    node = nodes[0]
    assert node["zone"] == "DE" and node["up"] and node["emulated"]
    assert len(node["gpus"]) == 8
    assert {g["model"] for g in node["gpus"]} == {"MI300X"}
    idle = [g["power_w"] for g in node["gpus"]]
    assert all(120 < p < 170 for p in idle), idle  # an idle MI300X draws ~140 W

    r = head.cli("submit", "--json", "--gpus", "4", "--est-runtime", "10s", "--", "sh", "-c",
                 'echo "$ROCR_VISIBLE_DEVICES"; sleep 4')
    job = json.loads(r.stdout)["id"]
    head.wait_states([job], states={"RUNNING"}, timeout_s=30)
    time.sleep(2.5)  # a heartbeat or two
    node = json.loads(head.cli("nodes", "--json").stdout)[0]
    busy = [g for g in node["gpus"] if g["job"] == job]
    assert len(busy) == 4
    assert all(g["power_w"] > 500 for g in busy), busy  # 70-95% of a 750 W TDP
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    lines = [ln for ln in metrics.splitlines() if ln.startswith("carbonsched_gpu_power_watts{")]
    assert len(lines) == 8
    assert sum(float(ln.rsplit(" ", 1)[1]) > 500 for ln in lines) == 4

    jobs = head.wait_states([job], timeout_s=30)
    assert jobs[job]["state"] == "COMPLETED"
    assert jobs[job]["node"] == "gpu-node-1"
    assert jobs[job]["energy_j"] > 4 * 500 * 3.5
    # The job's log lives on the agent's node, not the head node.
    log = root / "agent-state" / "logs" / f"{job}.out"
    assert log.read_text().strip() == ",".join(map(str, sorted(jobs[job]["gpus"])))


def test_logs_of_a_job_run_by_another_nodes_agent_are_read_on_the_head_and_followed(head_and_agent):
    """Issue 28: `logs` said "no stdout log for job 14 on this host" for a job another node
    ran; its agent now copies the output into the store, and `logs --follow` streams it."""
    head, agent, port, root = head_and_agent
    r = head.cli("submit", "--json", "--est-runtime", "10s", "--", "sh", "-c",
                 "echo first; sleep 3; echo second; echo oops >&2")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)["id"]
    head.wait_states([job], states={"RUNNING", "COMPLETED"}, timeout_s=60)
    follow = subprocess.run([sys.executable, "-m", "scheduler", "--socket", str(head.socket), "logs", "--follow",
                             str(job)], capture_output=True, text=True, timeout=60, cwd=REPO,
                            env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert follow.returncode == 0, follow.stderr
    assert follow.stdout == "first\nsecond\n"   # all of it, once, then it stopped with the job
    assert head.client().job(job)["state"] == "COMPLETED"
    assert not (head.state_dir / "logs" / f"{job}.out").exists()  # the head has no file of it
    out = head.cli("logs", str(job))
    assert out.returncode == 0 and out.stdout == "first\nsecond\n", out.stderr
    err = head.cli("logs", "--stderr", str(job))
    assert err.returncode == 0 and err.stdout == "oops\n"
    tail = head.cli("logs", "--tail-bytes", "7", str(job))
    assert tail.stdout == "second\n"
