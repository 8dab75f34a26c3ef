"""The Slurm habits through the real daemon and CLI (issue 28), on SQLite and PostgreSQL:
hold/release, a dependency chain, an array whose tasks see their index, --output/--chdir,
and queue's filters and --format, each with --json."""

from __future__ import annotations

import json

import pytest

from daemon_harness import DB_KINDS, DaemonProcess, database_for, world_dir

pytestmark = pytest.mark.slow


@pytest.fixture(params=DB_KINDS)
def daemon(request):
    root = world_dir("cs-habits-")
    with database_for(request.param, root) as url:
        d = DaemonProcess(root, url, extra=["--zone", "DE"])
        d.start(timeout_s=120)  # a busy shared host takes long to import OR-Tools
        try:
            yield d
        finally:
            d.cleanup()


def submit(d, *args: str) -> dict:
    r = d.cli("submit", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_hold_release_and_a_dependency_chain(daemon):
    held = submit(daemon, "--hold", "--name", "first", "--", "sh", "-c", "echo one")["id"]
    after = submit(daemon, f"--dependency=afterok:{held}", "--name", "second", "--", "sh", "-c", "echo two")["id"]
    queue = json.loads(daemon.cli("queue", "--json").stdout)
    assert {j["id"]: (j["state"], j["held"], j["dependency"]) for j in queue} == {
        held: ("PENDING", True, None), after: ("PENDING", False, f"afterok:{held}")}
    r = daemon.cli("queue", "--format", "id,name,held,dependency", "--noheader")
    assert r.stdout.splitlines() == [f"{held}  first  yes  -", f"{after}  second  no  afterok:{held}"]
    r = daemon.cli("queue", "--format", "id,nosuchfield")
    assert r.returncode == 2 and "unknown field(s) nosuchfield" in r.stderr
    r = daemon.cli("release", str(held), "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == [{"id": held, "held": False, "changed": True}]
    jobs = daemon.wait_states([held, after], timeout_s=60)
    assert jobs[held]["state"] == jobs[after]["state"] == "COMPLETED"
    assert jobs[after]["started_at"] >= jobs[held]["ended_at"]
    r = daemon.cli("hold", str(held))
    assert r.returncode == 6 and "COMPLETED" in r.stderr


def test_an_array_runs_each_index_once_with_its_task_id(daemon, tmp_path):
    r = submit(daemon, "--array", "0-5%2", "--deadline", "2h", "--name", "sweep", "--",
               "sh", "-c", 'echo "task $CARBONSCHED_ARRAY_TASK_ID of $CARBONSCHED_ARRAY_JOB_ID"')
    ids = r["ids"]
    assert r["array_job_id"] == ids[0] and len(ids) == 6
    jobs = daemon.wait_states(ids, timeout_s=90)
    assert all(jobs[i]["state"] == "COMPLETED" for i in ids)
    logs = [daemon.cli("logs", str(i)).stdout for i in ids]
    assert logs == [f"task {k} of {ids[0]}\n" for k in range(6)]
    assert len({jobs[i]["deadline"] for i in ids}) == 1
    tasks = json.loads(daemon.cli("queue", "--all", "--array", str(ids[0]), "--json").stdout)
    assert [t["array_task_id"] for t in tasks] == list(range(6))


def test_output_and_chdir(daemon):
    work = daemon.root / "work"
    work.mkdir(mode=0o777)
    job = submit(daemon, "--chdir", str(work), "--output", "res-%j.txt", "--", "sh", "-c", "pwd; echo done >&2")["id"]
    jobs = daemon.wait_states([job], timeout_s=60)
    assert jobs[job]["state"] == "COMPLETED"
    assert (work / f"res-{job}.txt").read_text() == f"{work}\ndone\n"
    r = daemon.cli("logs", str(job))
    assert r.returncode == 4 and f"went to {work}/res-{job}.txt" in r.stderr
    assert jobs[job]["stdout_path"] == f"{work}/res-%j.txt" and jobs[job]["cwd"] == str(work)


def test_queue_filters_by_name_and_since(daemon):
    a = submit(daemon, "--hold", "--name", "prep-a", "--", "true")["id"]
    b = submit(daemon, "--hold", "--name", "train", "--", "true")["id"]
    ids = lambda *args: [j["id"] for j in json.loads(daemon.cli("queue", "--json", *args).stdout)]  # noqa: E731
    assert ids("--name", "prep-*") == [a]
    assert ids("--name", "train", "--name", "prep-a") == [a, b]
    assert ids("--user", "root") == [a, b] and ids("--user", "nobody") == []
    assert ids("--since", "1h") == [a, b] and ids("--until", "1h") == []
    r = daemon.cli("queue", "--since", "yesterday-ish")
    assert r.returncode == 2 and r.stderr.startswith("carbonsched: --since")
