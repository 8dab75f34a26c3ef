"""The Slurm habits users bring (issue 28), at the API edge and in the planner, on SQLite and
PostgreSQL: hold/release, --begin, --dependency=afterok|afterany|afternotok, job arrays with
a %N throttle and one shared deadline, --output/--error, and queue's --user/--name/--since/
--until. The planner treats a held, not-yet-begun, dependent or throttled job as not yet
plannable (scheduler.jobs.store._waits), and `queue` says why."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, update

from scheduler.daemon.access import Caller, RequestError, ServiceConfig
from scheduler.daemon.planner import Planner
from scheduler.daemon.policy_factory import make_policy
from scheduler.daemon.service import JobService
from scheduler.job_specs import expand_log_pattern, parse_array, parse_dependency
from scheduler.node.launch import redirected_argv
from scheduler.store.models import jobs, nodes

import fleet

ROOT = Caller(uid=0, gid=0)
T = datetime(2022, 1, 10, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def world(store, tmp_path):
    """A node with 4 healthy H100s, a service and a greedy planner on one clock (T)."""
    fleet.add_node(store, "n1", at=T, n=4)
    clock = {"now": T}
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs", clock=lambda: clock["now"])
    planner = Planner(store, make_policy("greedy", plan_interval_s=15), clock=lambda: clock["now"],
                      plan_interval_s=15)
    return store, service, planner, clock


def submit(service, **body) -> dict:
    return service.submit(ROOT, {"argv": ["true"], "gpus": 1, "est_runtime_s": 60, **body})


def states(store, *ids) -> list[str]:
    with store.read() as conn:
        got = dict(conn.execute(select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(ids))).all())
    return [got[i] for i in ids]


def finish(store, job_id: int, state: str) -> None:
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(state=state, ended_at=T))


# -- hold / release ----------------------------------------------------------------------------

def test_a_job_submitted_held_is_not_planned_until_released(world):
    store, service, planner, _ = world
    held = submit(service, hold=True)["id"]
    free = submit(service)["id"]
    planner.tick()
    assert states(store, held, free) == ["PENDING", "PLANNED"]
    assert service.get_job(ROOT, held)["held"] is True
    assert service.hold(ROOT, [held], held=False) == [{"id": held, "held": False, "changed": True}]
    planner.tick()
    assert states(store, held) == ["PLANNED"] and service.get_job(ROOT, held)["held"] is False


def test_holding_a_planned_job_withdraws_its_plan_and_a_running_one_cannot_be_held(world):
    store, service, planner, _ = world
    job = submit(service)["id"]
    planner.tick()
    assert states(store, job) == ["PLANNED"]
    assert service.hold(ROOT, [job], held=True)[0]["held"] is True
    row = service.get_job(ROOT, job)
    assert (row["state"], row["node"], row["planned_start"]) == ("PENDING", None, None)
    planner.tick()
    assert states(store, job) == ["PENDING"]
    assert any(e["reason"].startswith("held by uid 0") for e in row["events"])
    other = submit(service)["id"]
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == other).values(state="RUNNING"))
    with pytest.raises(RequestError) as e:
        service.hold(ROOT, [other, 999_999], held=True)
    assert e.value.status == 409 and f"job {other} is RUNNING" in e.value.message and "no job 999999" in e.value.message


def test_a_user_cannot_hold_or_release_another_users_job(world):
    store, service, _, _ = world
    job = submit(service)["id"]
    with pytest.raises(RequestError) as e:
        service.hold(Caller(uid=4242, gid=4242), [job], held=True)
    assert e.value.status == 403
    assert service.get_job(ROOT, job)["held"] is False


# -- --begin -----------------------------------------------------------------------------------

def test_a_job_is_not_planned_before_its_begin_time(world):
    store, service, planner, clock = world
    job = submit(service, begin=(T + timedelta(hours=2)).isoformat())["id"]
    planner.tick()
    assert states(store, job) == ["PENDING"]
    assert service.get_job(ROOT, job)["begin_at"] == "2022-01-10T14:00:00Z"
    clock["now"] = T + timedelta(hours=2, seconds=1)
    with store.write() as conn:  # the node is still alive then
        conn.execute(update(nodes).values(last_heartbeat=clock["now"]))
    planner.tick()
    assert states(store, job) == ["PLANNED"]
    with pytest.raises(RequestError, match="not before the deadline"):
        submit(service, begin=(T + timedelta(hours=5)).isoformat(), deadline=(T + timedelta(hours=4)).isoformat())


# -- --dependency ------------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "ends", "plannable"), [
    ("afterok", "COMPLETED", True), ("afterok", "FAILED", False),
    ("afterany", "FAILED", True), ("afterany", "CANCELLED", True),
    ("afternotok", "FAILED", True), ("afternotok", "COMPLETED", False),
])
def test_a_dependent_job_waits_until_its_dependency_holds(world, kind, ends, plannable):
    store, service, planner, _ = world
    first = submit(service)["id"]
    then = submit(service, dependency=f"{kind}:{first}")["id"]
    planner.tick()
    assert states(store, then) == ["PENDING"]  # the first job has not ended
    assert service.get_job(ROOT, then)["dependency"] == f"{kind}:{first}"
    finish(store, first, ends)
    planner.tick()
    assert states(store, then) == ["PLANNED" if plannable else "PENDING"]


@pytest.mark.parametrize(("kind", "ends"), [("afterok", "FAILED"), ("afterok", "CANCELLED"),
                                           ("afternotok", "COMPLETED")])
def test_a_dependency_that_can_never_hold_says_so_at_once_as_slurm_does(world, kind, ends):
    store, service, planner, _ = world
    first = submit(service)["id"]
    then = submit(service, dependency=f"{kind}:{first}")["id"]
    finish(store, first, ends)
    planner.tick()
    assert states(store, then) == ["PENDING"]
    assert service.get_job(ROOT, then)["reason"] == (
        f"its dependency {kind}:{first} can never be satisfied (DependencyNeverSatisfied): it can only be cancelled")


@pytest.mark.parametrize(("kind", "ends"), [("afterok", "FAILED"), ("afternotok", "COMPLETED")])
def test_a_dependency_that_already_can_never_hold_is_refused_at_submit(world, kind, ends):
    store, service, _, _ = world
    first = submit(service)["id"]
    finish(store, first, ends)
    with pytest.raises(RequestError) as e:
        submit(service, dependency=f"afterany:{first},{kind}:{first}")
    assert e.value.status == 400
    assert e.value.message == (f"--dependency {kind}:{first}: job {first} ended {ends}, so it can never be "
                               "satisfied (DependencyNeverSatisfied)")
    assert submit(service, dependency=f"afterany:{first}")["id"]  # that one holds already


def test_every_condition_of_a_dependency_must_hold(world):
    store, service, planner, _ = world
    a, b = submit(service)["id"], submit(service)["id"]
    then = submit(service, dependency=f"afterok:{a},afterany:{b}")["id"]
    finish(store, a, "COMPLETED")
    planner.tick()
    assert states(store, then) == ["PENDING"]
    finish(store, b, "FAILED")
    planner.tick()
    assert states(store, then) == ["PLANNED"]


def test_a_dependency_on_an_unknown_or_unseen_job_is_refused(world):
    store, service, _, _ = world
    with pytest.raises(RequestError) as e:
        submit(service, dependency="afterok:999999")
    assert e.value.status == 404
    theirs = service.submit(Caller(0, 0), {"argv": ["true"]})["id"]
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == theirs).values(owner_uid=4243))
    with pytest.raises(RequestError) as e:
        service.submit(Caller(uid=4242, gid=4242), {"argv": ["true"], "dependency": f"afterok:{theirs}"})
    assert e.value.status in (403, 422) or "another user" in e.value.message


@pytest.mark.parametrize("text", ["after:1", "afterok", "afterok:x", "afterok:1?afterany:2", ""])
def test_a_malformed_dependency_is_refused(text):
    with pytest.raises(ValueError):
        parse_dependency(text)


# -- arrays ------------------------------------------------------------------------------------

def test_an_array_is_one_job_per_index_with_one_deadline_and_its_index_in_the_environment(world):
    store, service, _, _ = world
    deadline = (T + timedelta(hours=6)).isoformat()
    r = submit(service, array="0-9%3", deadline=deadline)
    assert len(r["ids"]) == 10 and r["array_job_id"] == r["ids"][0] and r["array"] == "0-9%3"
    tasks = service.list_jobs(ROOT, array_job_id=r["id"])
    assert [t["array_task_id"] for t in tasks] == list(range(10))
    assert {t["deadline"] for t in tasks} == {"2022-01-10T18:00:00Z"}
    with store.read() as conn:
        envs = [row.env for row in conn.execute(select(jobs.c.env).where(jobs.c.id.in_(r["ids"]))
                                                .order_by(jobs.c.id))]
    assert [e["CARBONSCHED_ARRAY_TASK_ID"] for e in envs] == [str(i) for i in range(10)]
    assert {e["CARBONSCHED_ARRAY_JOB_ID"] for e in envs} == {str(r["id"])}


def test_an_array_throttle_lets_only_that_many_tasks_be_active(world):
    store, service, planner, _ = world
    ids = submit(service, array="0-9%3")["ids"]
    planner.tick()
    assert states(store, *ids).count("PLANNED") == 3 and states(store, *ids[:3]) == ["PLANNED"] * 3
    finish(store, ids[1], "COMPLETED")
    planner.tick()
    assert states(store, *ids).count("PLANNED") == 3 and states(store, ids[3]) == ["PLANNED"]


def test_the_reason_of_a_job_left_alone_says_why_as_squeue_does(world):
    """queue's REASON for a held, not-yet-begun, dependent or throttled job names the wait
    (JobHeldUser, BeginTime, Dependency, JobArrayTaskLimit), and goes once it is plannable."""
    store, service, planner, clock = world
    first = submit(service)["id"]
    held = submit(service, hold=True)["id"]
    later = submit(service, begin=(T + timedelta(hours=2)).isoformat())["id"]
    dependent = submit(service, dependency=f"afterok:{first}")["id"]
    tasks = submit(service, array="0-3%2")["ids"]

    def reason(job_id):
        return service.get_job(ROOT, job_id)["reason"]

    assert "JobHeldUser" in reason(held) and "BeginTime" in reason(later)  # said at submit
    planner.tick()

    assert "JobHeldUser" in reason(held)
    assert "BeginTime" in reason(later)
    assert reason(dependent) == f"waiting on its dependency afterok:{first} (Dependency)"
    assert [("JobArrayTaskLimit" in (reason(t) or "")) for t in tasks] == [False, False, True, True]
    assert "at most 2 tasks at once" in reason(tasks[2])
    listed = {j["id"]: j["reason"] for j in service.list_jobs(ROOT)}
    assert "JobHeldUser" in listed[held]  # the listing queue's table reads

    service.hold(ROOT, [held], held=False)
    assert "JobHeldUser" not in reason(held)
    finish(store, first, "COMPLETED")
    clock["now"] = T + timedelta(hours=3)
    with store.write() as conn:  # the node is still there
        conn.execute(update(nodes).values(last_heartbeat=clock["now"]))
    planner.tick()
    assert states(store, held, later, dependent) == ["PLANNED"] * 3


@pytest.mark.parametrize(("text", "indices", "limit"), [("0-99%8", tuple(range(100)), 8), ("1,3,5", (1, 3, 5), None),
                                                        ("0-20:5", (0, 5, 10, 15, 20), None)])
def test_array_specs_as_sbatch_takes_them(text, indices, limit):
    spec = parse_array(text)
    assert (spec.indices, spec.max_running) == (indices, limit)


@pytest.mark.parametrize("text", ["", "5-1", "0-9%0", "a-b", "0-5000"])
def test_a_malformed_or_too_large_array_is_refused(text):
    with pytest.raises(ValueError):
        parse_array(text)


# -- --output / --error ------------------------------------------------------------------------

def test_output_and_error_patterns_are_expanded_and_opened_by_a_shell_run_as_the_owner(world):
    store, service, _, _ = world
    job = submit(service, stdout_path="/home/a/%x.out".replace("%x", "%A_%a"), stderr_path="/home/a/%j.err",
                 array="4-5")["ids"][1]
    with store.read() as conn:
        row = conn.execute(select(jobs).where(jobs.c.id == job)).one()
    argv = redirected_argv(row)
    assert argv[:2] == ["/bin/sh", "-c"] and argv[-1] == "true"
    assert argv[4:6] == [f"/home/a/{row.array_job_id}_5.out", f"/home/a/{job}.err"]
    with pytest.raises(RequestError, match="unknown %x"):
        submit(service, stdout_path="/tmp/%x.out")
    with pytest.raises(RequestError, match="absolute path"):
        submit(service, stdout_path="relative.out")
    with pytest.raises(RequestError) as e:
        service.logs(ROOT, job)
    assert (e.value.status, e.value.message) == (
        409, f"job {job} has not started yet (PENDING); its stdout will go to /home/a/{row.array_job_id}_5.out "
             "(--output) on the node it runs on")
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job).values(state="COMPLETED", node="n1"))
    with pytest.raises(RequestError) as e:
        service.logs(ROOT, job, stream="stderr")
    assert (e.value.status, e.value.message) == (
        404, f"job {job}'s stderr went to /home/a/{job}.err on node n1 (--error); read it there")


def test_logs_of_a_job_that_never_ran_say_so(world):
    store, service, _, _ = world
    job = submit(service)["id"]
    service.cancel(ROOT, [job])
    with pytest.raises(RequestError) as e:
        service.logs(ROOT, job)
    assert (e.value.status, e.value.message) == (404, f"job {job} never ran (CANCELLED): it has no stdout")


def test_expand_log_pattern_like_sbatch():
    assert expand_log_pattern("/o/%u-%j-%A-%a-100%%.log", job_id=7, user="ann", array_job_id=5,
                              array_task_id=2) == "/o/ann-7-5-2-100%.log"


def test_a_redirect_runs_the_command_unchanged(tmp_path):
    import subprocess

    class Row:
        id, owner_name, array_job_id, array_task_id = 3, "me", None, None
        argv = ["sh", "-c", "echo out; echo err >&2", "x y"]
        stdout_path, stderr_path = str(tmp_path / "%j.out"), None

    subprocess.run(redirected_argv(Row()), check=True)
    assert (tmp_path / "3.out").read_text() == "out\nerr\n"  # --error defaults to --output's file


# -- queue filters -----------------------------------------------------------------------------

def test_queue_filters_by_user_name_and_submission_window(world):
    store, service, _, clock = world
    a = submit(service, name="train-a")["id"]
    clock["now"] = T + timedelta(hours=1)
    b = submit(service, name="train-b")["id"]
    c = submit(service, name="eval")["id"]
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == c).values(owner_name="bob", owner_uid=1001))
    ids = lambda **kw: [j["id"] for j in service.list_jobs(ROOT, **kw)]  # noqa: E731
    assert ids(names=["train-*"]) == [a, b]
    assert ids(names=["eval"]) == [c]
    assert ids(users=["bob"]) == [c] and ids(users=["1001"]) == [c] and ids(users=["root"]) == [a, b]
    assert ids(since=T + timedelta(minutes=30)) == [b, c]
    assert ids(until=T + timedelta(minutes=30)) == [a]
    finish(store, a, "COMPLETED")
    assert ids(since=T - timedelta(hours=1)) == [a, b, c]  # a window includes finished jobs
    assert ids(names=["tr?in-a"]) == []  # ? is one character: "train-a" has none there
    assert ids(names=["tra?n-a"], include_done=True) == [a]


def test_queue_of_a_user_that_is_nobody_is_an_error_not_an_empty_queue(world):
    """As squeue: a name neither on this system nor owning any job is a mistake (400); a
    name that owns jobs but has no account here (removed, or seen through Slurm) is not."""
    store, service, _, _ = world
    with pytest.raises(RequestError) as e:
        service.list_jobs(ROOT, users=["root", "nosuchuser"])
    assert (e.value.status, e.value.message) == (400, "--user: no user 'nosuchuser' on this system or in the queue")
    job = submit(service)["id"]
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job).values(owner_name="gone"))
    assert [j["id"] for j in service.list_jobs(ROOT, users=["gone"])] == [job]
    assert service.list_jobs(ROOT, users=["nobody"]) == []  # a user with no jobs: an empty queue
