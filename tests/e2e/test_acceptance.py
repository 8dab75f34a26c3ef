"""End to end: the real daemon process, its real socket and real job processes, on SQLite and
PostgreSQL, with an emulated 4-GPU fleet."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time

import pytest

from daemon_harness import DB_KINDS, DaemonProcess, database_for, world_dir
from suite_hygiene import make_user, remove_user

pytestmark = pytest.mark.slow

# Each job holds a lock directory per GPU it was given: a second job on the same GPU at the
# same time would find the lock taken and record an overlap.
JOB_SCRIPT = r"""
set -u
work="$1"; code="$2"; secs="$3"
for g in $(echo "$CUDA_VISIBLE_DEVICES" | tr ',' ' '); do
  mkdir "$work/gpu$g.lock" 2>/dev/null || echo "overlap gpu$g job $CARBONSCHED_JOB_ID" >> "$work/overlaps"
done
echo "job $CARBONSCHED_JOB_ID uid $(id -u) gpus $CUDA_VISIBLE_DEVICES"
echo "to stderr" >&2
sleep "$secs"
for g in $(echo "$CUDA_VISIBLE_DEVICES" | tr ',' ' '); do rmdir "$work/gpu$g.lock"; done
exit "$code"
"""


@pytest.fixture(params=DB_KINDS)
def daemon(request):
    root = world_dir("cs-accept-")
    with database_for(request.param, root) as url:
        d = DaemonProcess(root, url)
        (root / "job.sh").write_text(JOB_SCRIPT)
        d.start()
        try:
            yield d
        finally:
            d.cleanup()


def submit(d: DaemonProcess, *args: str, user: str | None = None) -> int:
    r = d.cli("submit", "--json", *args, user=user)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["id"]


def test_twenty_jobs_complete_with_exit_codes_logs_and_no_gpu_shared(daemon):
    work = daemon.root
    ids = []
    for i in range(20):
        gpus = 2 if i % 5 == 0 else 1
        ids.append(submit(daemon, "--gpus", str(gpus), "--est-runtime", "2s", "--name", f"batch-{i}",
                          "--", "sh", str(work / "job.sh"), str(work), "0", "0.3"))
    failing = submit(daemon, "--est-runtime", "2s", "--", "sh", str(work / "job.sh"), str(work), "3", "0.1")
    jobs = daemon.wait_states(ids + [failing], timeout_s=90)

    for i in ids:
        j = jobs[i]
        assert j["state"] == "COMPLETED", j
        assert j["exit_code"] == 0
        assert len(j["gpus"]) == j["gpus_requested"]
        out = daemon.cli("logs", str(i))
        assert out.returncode == 0
        assert f"job {i} uid {os.getuid()} gpus {','.join(map(str, j['gpus']))}" in out.stdout
        err = daemon.cli("logs", str(i), "--stderr")
        assert err.stdout.strip() == "to stderr"
    assert jobs[failing]["state"] == "FAILED" and jobs[failing]["exit_code"] == 3
    assert not (work / "overlaps").exists(), (work / "overlaps").read_text()

    # The store agrees: per GPU, run intervals never overlap.
    by_gpu: dict[int, list] = {}
    for i in ids:
        j = jobs[i]
        for g in j["gpus"]:
            by_gpu.setdefault(g, []).append((j["started_at"], j["ended_at"]))
    for spans in by_gpu.values():
        spans.sort()
        for (_, e1), (s2, _) in zip(spans, spans[1:]):
            assert e1 <= s2 or e1[:19] == s2[:19], (spans)

    show = json.loads(daemon.cli("show", str(ids[0]), "--json").stdout)
    for key in ("id", "name", "state", "owner", "gpus", "node", "submitted_at", "planned_start",
                "started_at", "ended_at", "exit_code", "energy_j", "gco2", "explanation"):
        assert key in show
    assert [e["to"] for e in show["events"]] == ["PENDING", "PLANNED", "RUNNING", "COMPLETED"]
    assert show["energy_j"] > 0


def test_cancel_running_and_pending_jobs(daemon):
    running = submit(daemon, "--gpus", "4", "--", "sh", "-c", "echo started; sleep 60; echo never")
    daemon.wait_states([running], states={"RUNNING"}, timeout_s=30)
    waiting = submit(daemon, "--gpus", "4", "--", "true")  # cannot start: all 4 GPUs are busy
    r = daemon.cli("cancel", str(waiting))
    assert r.returncode == 0, r.stderr
    assert "cancelled" in r.stdout
    started = time.monotonic()
    r = daemon.cli("cancel", str(running))
    assert r.returncode == 0 and "cancelling" in r.stdout
    jobs = daemon.wait_states([running, waiting], timeout_s=30)
    assert time.monotonic() - started < 10
    assert jobs[running]["state"] == "CANCELLED"
    assert jobs[waiting]["state"] == "CANCELLED" and jobs[waiting]["started_at"] is None
    assert "never" not in daemon.cli("logs", str(running)).stdout
    again = daemon.cli("cancel", str(running))
    assert again.returncode == 6 and "already ended" in again.stderr
    missing = daemon.cli("cancel", "999999")
    assert missing.returncode == 4 and "no job 999999" in missing.stderr


def test_time_limit_gives_timeout(daemon):
    job = submit(daemon, "--time-limit", "1s", "--", "sleep", "30")
    jobs = daemon.wait_states([job], timeout_s=30)
    assert jobs[job]["state"] == "TIMEOUT"
    est = submit(daemon, "--est-runtime", "1s", "--", "sleep", "30")  # limit = 2 x estimate
    jobs = daemon.wait_states([est], timeout_s=30)
    assert jobs[est]["state"] == "TIMEOUT"
    assert jobs[est]["time_limit_s"] == 2.0


def test_sigusr2_writes_every_threads_stack_to_the_log_and_the_daemon_carries_on(daemon):
    dump = daemon.dump_stacks()
    assert "Thread MainThread" in dump and "apscheduler" in dump  # the scheduler's threads among them
    # ... and what the daemon can say of its periodic work and of what its agent would claim
    assert "daemon: job dispatch: next run in" in dump and "daemon: dispatch: running=" in dump
    assert "agent: GPU 1: job=None healthy=True drained=False" in dump
    job = submit(daemon, "--", "true")
    assert daemon.wait_states([job], timeout_s=30)[job]["state"] == "COMPLETED"


def test_bad_requests_get_clear_errors_and_change_nothing(daemon):
    before = daemon.client().jobs(include_done=True)
    cases = [
        (["--gpus", "-1", "--", "true"], "--gpus"),
        (["--gpus", "100000", "--", "true"], "--gpus"),
        (["--gpu-mem", "4096", "--", "true"], "more than"),
        (["--deadline", "2001-01-01T00:00:00Z", "--", "true"], "in the past"),
        (["--deadline", "1h", "--est-runtime", "2h", "--", "true"], "cannot be met"),
        (["--workload", "Bad Class!", "--", "true"], "workload"),
        (["--est-runtime", "ten minutes", "--", "true"], "malformed duration"),
        (["--"], "empty command"),
    ]
    for args, needle in cases:
        r = daemon.cli("submit", *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert needle in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
    assert daemon.client().jobs(include_done=True) == before

    # Raw socket abuse: not JSON, oversized.
    import socket as s

    def raw(req: bytes) -> bytes:
        """Send raw bytes; return the whole reply (headers and Content-Length bytes of body)."""
        with s.socket(s.AF_UNIX) as c:
            c.settimeout(10)
            c.connect(str(daemon.socket))
            c.sendall(req)
            data = b""
            while b"\r\n\r\n" not in data:
                data += c.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n")
                              if ln.lower().startswith(b"content-length")))
            while len(body) < length:
                body += c.recv(65536)
            return head + b"\r\n\r\n" + body

    bad_json = b"not json"
    reply = raw(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(bad_json) + bad_json)
    assert b" 400 " in reply.split(b"\r\n")[0] and b"not valid JSON" in reply
    reply = raw(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n\r\n")
    assert b" 413 " in reply.split(b"\r\n")[0]
    assert daemon.client().jobs(include_done=True) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="creating users and running jobs as them needs root")
def test_jobs_run_as_their_owner_and_other_users_cannot_touch_them(daemon):
    alice, bob = make_user(), make_user()
    try:
        job = submit(daemon, "--", "sh", "-c", "id -u; id -g; sleep 3", user=alice)
        jobs = daemon.wait_states([job], states={"RUNNING", "COMPLETED"}, timeout_s=30)
        assert jobs[job]["owner"] == alice
        r = daemon.cli("cancel", str(job), user=bob)
        assert r.returncode == 5 and "another user" in r.stderr
        r = daemon.cli("logs", str(job), user=bob)
        assert r.returncode == 5 and "another user" in r.stderr
        r = daemon.cli("queue", "--json", user=bob)
        assert r.returncode == 0 and json.loads(r.stdout) == []
        r = daemon.cli("show", str(job), user=bob)
        assert r.returncode == 5 and "another user" in r.stderr
        node = json.loads(daemon.cli("nodes", "--json").stdout)[0]["name"]
        r = daemon.cli("drain", node, user=bob)
        assert r.returncode == 5 and "only root or members of admin_groups" in r.stderr
        assert not any(g["drained"] for g in json.loads(daemon.cli("nodes", "--json").stdout)[0]["gpus"])
        jobs = daemon.wait_states([job], timeout_s=30)
        assert jobs[job]["state"] == "COMPLETED"
        out = daemon.cli("logs", str(job), user=alice)
        uid, gid = out.stdout.split()
        pw = pwd.getpwnam(alice)
        assert (int(uid), int(gid)) == (pw.pw_uid, pw.pw_gid)
        log_file = daemon.state_dir / "logs" / f"{job}.out"
        assert log_file.stat().st_uid == pw.pw_uid
        assert oct(log_file.stat().st_mode & 0o777) == "0o600"
    finally:
        for u in (alice, bob):
            remove_user(u)


def test_a_drained_node_takes_no_new_jobs_until_resumed(daemon):
    node = json.loads(daemon.cli("nodes", "--json").stdout)[0]["name"]
    r = daemon.cli("drain", node, "--reason", "firmware update", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["gpus"]) == 4
    job = submit(daemon, "--", "true")
    time.sleep(3)  # several planner and dispatch ticks
    assert daemon.client().job(job)["state"] in ("PENDING", "PLANNED")
    assert all(g["drained"] for g in json.loads(daemon.cli("nodes", "--json").stdout)[0]["gpus"])
    r = daemon.cli("resume", f"{node}:2")
    assert r.returncode == 0 and "resumed 1 GPU(s)" in r.stdout
    jobs = daemon.wait_states([job], timeout_s=30)
    assert jobs[job]["state"] == "COMPLETED"
    assert jobs[job]["gpus"] == [2]  # the one GPU resumed
    r = daemon.cli("drain", "no-such-node")
    assert r.returncode == 4 and "no node or GPU" in r.stderr
