"""scheduler.daemon.service.JobService, called directly (no socket) against the `store` fixture.

The service is the API edge: it validates every request, decides who may see and change
which job, and a rejected request changes nothing. Callers are built by hand, the way the
API builds them from SO_PEERCRED; no real users are needed.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, insert, select, update

from scheduler.daemon.access import Caller, RequestError, ServiceConfig
from scheduler.daemon.service import JobService
from scheduler.lifecycle import TERMINAL, State
from scheduler.store.models import gpus, job_events, jobs, nodes

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
ALICE = Caller(uid=40001, gid=40001)
BOB = Caller(uid=40002, gid=40002)
ROOT = Caller(uid=0, gid=0)

# The registered fleet: the most GPUs of one model on one node is 4, the most memory 288 GiB.
FLEET = {
    "amd-1": [("MI300X", "amd", 192.0, True)] * 4,
    "nv-1": [("H100", "nvidia", 80.0, True)] * 2 + [("H100", "nvidia", 80.0, False)] * 3,
    "big-1": [("MI355X", "amd", 288.0, True), ("MI355X", "amd", 288.0, False)],
}


class Calls:
    def __init__(self) -> None:
        self.submit = 0
        self.cancel = 0


@pytest.fixture
def fleet(store):
    with store.write() as conn:
        for node, cards in FLEET.items():
            conn.execute(insert(nodes).values(name=node, zone="DE", backend="emulated",
                                              emulated=True, registered_at=NOW,
                                              last_heartbeat=NOW))
            for index, (model, vendor, mem, healthy) in enumerate(cards):
                conn.execute(insert(gpus).values(node_name=node, index=index,
                                                 uuid=f"{node}-{index}", model=model,
                                                 vendor=vendor, memory_gib=mem, healthy=healthy))
    return FLEET


@pytest.fixture
def calls():
    return Calls()


def make_service(store, tmp_path, calls, **config) -> JobService:
    def on_submit():
        calls.submit += 1

    def on_cancel():
        calls.cancel += 1

    return JobService(store, ServiceConfig(**{"daemon_uid": 0, **config}),
                      log_dir=tmp_path / "logs", on_submit=on_submit, on_cancel=on_cancel,
                      clock=lambda: NOW)


@pytest.fixture
def service(store, fleet, tmp_path, calls) -> JobService:
    """A service of a root daemon (it may run jobs as anyone)."""
    (tmp_path / "logs").mkdir()
    return make_service(store, tmp_path, calls)


def body(**fields) -> dict:
    return {"argv": ["python", "infer.py", "--batch", "64"], "cwd": "/tmp", **fields}


def at(delta: timedelta) -> str:
    return (NOW + delta).isoformat()


def db_counts(store) -> tuple[int, int]:
    with store.read() as conn:
        return (conn.execute(select(func.count()).select_from(jobs)).scalar_one(),
                conn.execute(select(func.count()).select_from(job_events)).scalar_one())


def job_row(store, job_id: int):
    with store.read() as conn:
        return conn.execute(select(jobs).where(jobs.c.id == job_id)).one()


def events(store, job_id: int) -> list:
    with store.read() as conn:
        return list(conn.execute(select(job_events).where(job_events.c.job_id == job_id)
                                 .order_by(job_events.c.id)))


def set_state(store, job_id: int, state: State, **values) -> None:
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(state=state.value, **values))


def assert_rejected(service: JobService, calls: Calls, request: object, status: int,
                    fragment: str, caller: Caller = ALICE) -> None:
    """The request fails with `status`, a message containing `fragment`, and changes nothing."""
    before = db_counts(service.store)
    submits = calls.submit
    with pytest.raises(RequestError) as err:
        service.submit(caller, request)
    assert err.value.status == status, (request, err.value.message)
    assert fragment in err.value.message, (request, err.value.message)
    assert db_counts(service.store) == before, f"{request!r} changed the store"
    assert calls.submit == submits, f"{request!r} woke the planner"


# -- submit: accepted requests --------------------------------------------------------------

def test_submit_queues_a_pending_job_owned_by_the_caller(service, calls):
    result = service.submit(ALICE, body(gpus=2, gpu_mem_gib=100, est_runtime_s=3600,
                                        workload="llm-inference", prompts=5000,
                                        deadline=at(timedelta(hours=6)),
                                        env={"HF_HOME": "/data/hf"}))
    assert result == {"id": result["id"], "state": "PENDING"}
    row = job_row(service.store, result["id"])
    assert (row.state, row.owner_uid, row.owner_gid) == ("PENDING", ALICE.uid, ALICE.gid)
    assert (row.gpus, row.gpu_mem_gib, row.workload, row.prompts) == (2, 100.0, "llm-inference", 5000)
    assert row.argv == ["python", "infer.py", "--batch", "64"]
    assert row.env == {"HF_HOME": "/data/hf"}
    assert row.deadline == NOW + timedelta(hours=6)
    assert row.submitted_at == NOW
    assert calls.submit == 1
    (event,) = events(service.store, result["id"])
    assert (event.from_state, event.to_state, event.actor_uid, event.reason, event.at) == (
        None, "PENDING", ALICE.uid, "submitted", NOW)


def test_submit_fills_in_sensible_defaults(service):
    job_id = service.submit(ALICE, {"argv": ["/usr/bin/python3", "x.py"], "est_runtime_s": 600})["id"]
    row = job_row(service.store, job_id)
    assert row.name == "python3"  # the program name
    assert row.gpus == 1 and row.gpu_mem_gib == 0.0
    assert row.cwd == "/"
    assert row.time_limit_s == 1200  # est-runtime x time_limit_factor (2)
    assert row.max_retries == 0


def test_a_deadline_that_can_just_be_met_is_accepted_and_stored_in_utc(service):
    service.submit(ALICE, body(est_runtime_s=3600, deadline=at(timedelta(hours=1))))
    job_id = service.submit(ALICE, body(deadline="2026-12-01T20:00:00+05:00"))["id"]
    assert job_row(service.store, job_id).deadline == datetime(2026, 12, 1, 15, 0, tzinfo=timezone.utc)


def test_a_multi_gpu_request_that_one_node_can_hold_is_accepted(service):
    service.submit(ALICE, body(gpus=4, gpu_mem_gib=192))
    service.submit(ALICE, body(gpus=1, gpu_mem_gib=288))


def test_with_no_registered_gpus_limits_come_from_the_catalog(store, tmp_path, calls):
    service = make_service(store, tmp_path, calls)
    service.submit(ALICE, body(gpus=64, gpu_mem_gib=288))
    assert_rejected(service, calls, body(gpu_mem_gib=300), 422, "any known GPU model has (288 GiB)")


# -- submit: rejected requests change nothing -----------------------------------------------

def test_a_body_that_is_not_an_object_is_rejected(service, calls):
    for request_body in ([], "python x.py", None, 42, ["python"]):
        assert_rejected(service, calls, request_body, 400, "must be a JSON object")


def test_unknown_fields_are_rejected_by_name_including_an_identity_in_the_body(service, calls):
    assert_rejected(service, calls, body(owner_uid=0), 400, "owner_uid")
    assert_rejected(service, calls, body(uid=0, gid=0), 400, "gid, uid")
    assert_rejected(service, calls, body(gpu=2), 400, "unknown field(s) in submit request: gpu")


def test_an_empty_or_malformed_command_is_rejected(service, calls):
    assert_rejected(service, calls, {"cwd": "/tmp"}, 400, "empty command")
    assert_rejected(service, calls, body(argv=[]), 400, "empty command")
    assert_rejected(service, calls, body(argv="python infer.py"), 400, "empty command")
    assert_rejected(service, calls, body(argv=[""]), 400, "non-empty program")
    assert_rejected(service, calls, body(argv=["  "]), 400, "non-empty program")
    assert_rejected(service, calls, body(argv=["python", 3]), 400, "list of strings")
    assert_rejected(service, calls, body(argv=["python", "a\x00b"]), 400, "NUL")
    assert_rejected(service, calls, body(argv=["x"] * 5000), 413, "command too long")


def test_a_gpu_count_must_be_an_integer_from_1_to_1024(service, calls):
    for count in (0, -1, -8, 1025, 10**9):
        assert_rejected(service, calls, body(gpus=count), 400,
                        f"--gpus must be between 1 and 1024 (got {count})")
    for count in ("2", 2.0, True, [2]):
        assert_rejected(service, calls, body(gpus=count), 400, "gpus must be an integer")


def test_a_request_no_registered_node_could_ever_satisfy_is_422(service, calls):
    # nv-1 has five H100s but only two healthy ones; amd-1's four MI300X are the most.
    assert_rejected(service, calls, body(gpus=5), 422, "the most is 4")
    assert_rejected(service, calls, body(gpu_mem_gib=289), 422,
                    "more than any registered GPU has (288 GiB)")
    # The only healthy GPU with 200 GiB or more is alone on its node.
    assert_rejected(service, calls, body(gpus=2, gpu_mem_gib=200), 422,
                    "no node has 2 GPUs of one model with >= 200 GiB")
    service.submit(ALICE, body(gpus=3, gpu_mem_gib=80))  # amd-1 holds that


def test_bad_gpu_memory_values_are_rejected(service, calls):
    for mem, fragment in ((-1, "must not be negative"), (float("nan"), "finite number"),
                          (float("inf"), "finite number"), ("80", "finite number")):
        assert_rejected(service, calls, body(gpu_mem_gib=mem), 400, fragment)


def test_a_deadline_in_the_past_or_sooner_than_the_estimated_runtime_is_rejected(service, calls):
    assert_rejected(service, calls, body(deadline=at(-timedelta(minutes=1))), 400, "is in the past")
    assert_rejected(service, calls, body(deadline=at(timedelta(0))), 400, "is in the past")
    assert_rejected(service, calls, body(est_runtime_s=7200, deadline=at(timedelta(hours=1))),
                    400, "cannot be met")


def test_a_deadline_must_be_an_iso_time_with_a_zone(service, calls):
    for deadline, fragment in (("2026-12-02T02:00:00", "no time zone"),
                               ("tomorrow", "not an ISO 8601 time"),
                               ("6h", "not an ISO 8601 time"),
                               (1796000000, "must be an ISO 8601 time")):
        assert_rejected(service, calls, body(deadline=deadline), 400, fragment)


def test_out_of_range_numbers_and_bad_paths_are_rejected(service, calls):
    for field, value, fragment in (
        ("est_runtime_s", 0, "--est-runtime must be between"),
        ("est_runtime_s", -60, "--est-runtime must be between"),
        ("est_runtime_s", 31 * 86400, "--est-runtime must be between"),
        ("time_limit_s", 0, "--time-limit must be between"),
        ("latency_slo_ms", 0, "--latency-slo"),
        ("latency_slo_ms", -5, "--latency-slo"),
        ("prompts", 0, "--prompts must be between"),
        ("prompts", 1.5, "prompts must be an integer"),
        ("max_retries", 11, "--retries must be between 0 and 10"),
        ("max_retries", -1, "--retries must be between 0 and 10"),
        ("cwd", "relative/dir", "absolute path"),
    ):
        assert_rejected(service, calls, body(**{field: value}), 400, fragment)


def test_a_workload_class_is_a_lower_case_identifier(service, calls):
    for workload in ("LLM-Inference", "llm inference", "", "-eval", "9b", "llm\n", "x" * 65, 7):
        assert_rejected(service, calls, body(workload=workload), 400, "bad workload class")
    for workload in ("llm-inference", "finetune", "eval", "custom:llm.inference_v2"):
        service.submit(ALICE, body(workload=workload))


def test_a_job_name_with_control_characters_or_too_long_is_rejected(service, calls):
    for name in ("line\nbreak", "trailing-newline\n", "tab\there", "x" * 256, "semi;colon"):
        assert_rejected(service, calls, body(name=name), 400, "job name")


def test_environment_variables_carbonsched_sets_cannot_be_overridden(service, calls):
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                "LD_PRELOAD", "CARBONSCHED_JOB_ID", "HOME", "USER"):
        assert_rejected(service, calls, body(env={"OK": "1", var: "0"}), 400,
                        f"environment variable {var} is set by carbonsched")


def test_env_must_be_a_small_object_of_well_formed_variables(service, calls):
    for env in ({"BAD-NAME": "x"}, {"1ABC": "x"}, {"FOO": 1}, {"FOO": "a\x00b"},
                {"FOO\n": "x"}, {"CUDA_VISIBLE_DEVICES\n": "0"}, {"": "x"}):
        assert_rejected(service, calls, body(env=env), 400, "bad environment variable")
    assert_rejected(service, calls, body(env=["FOO=1"]), 400, "env must be an object")
    assert_rejected(service, calls, body(env={f"V{i}": "x" for i in range(257)}), 400,
                    "at most 256")


def test_a_non_root_daemon_only_runs_jobs_for_its_own_user(store, fleet, tmp_path, calls):
    service = make_service(store, tmp_path, calls, daemon_uid=ALICE.uid)
    assert_rejected(service, calls, body(), 403, "run it as root", caller=BOB)
    service.submit(ALICE, body())


# -- who sees what --------------------------------------------------------------------------

@pytest.fixture
def two_jobs(service) -> tuple[int, int]:
    """One PENDING job of Alice's and one of Bob's."""
    return service.submit(ALICE, body(name="alice-job"))["id"], service.submit(BOB, body(name="bob-job"))["id"]


def test_a_user_lists_only_their_own_jobs_and_root_lists_everyones(service, two_jobs):
    alice_job, bob_job = two_jobs
    assert [j["id"] for j in service.list_jobs(ALICE)] == [alice_job]
    assert [j["id"] for j in service.list_jobs(BOB)] == [bob_job]
    assert [j["id"] for j in service.list_jobs(ROOT)] == sorted(two_jobs)


def test_a_member_of_an_admin_group_sees_everyones_jobs(store, fleet, tmp_path, calls, two_jobs):
    service = make_service(store, tmp_path, calls, admin_gids=frozenset({4242}))
    operator = Caller(uid=40003, gid=4242)
    assert [j["id"] for j in service.list_jobs(operator)] == sorted(two_jobs)
    assert service.get_job(operator, two_jobs[0])["id"] == two_jobs[0]
    assert service.list_jobs(Caller(uid=40004, gid=4243)) == []


def test_a_user_cannot_see_another_users_job(service, two_jobs):
    alice_job, _ = two_jobs
    with pytest.raises(RequestError) as err:
        service.get_job(BOB, alice_job)
    assert err.value.status == 403
    assert "another user" in err.value.message
    assert "alice-job" not in err.value.message


def test_a_user_cannot_cancel_another_users_job_not_even_alongside_their_own(service, calls,
                                                                           two_jobs):
    alice_job, bob_job = two_jobs
    before = db_counts(service.store)
    with pytest.raises(RequestError) as err:
        service.cancel(BOB, [alice_job])
    assert err.value.status == 403
    assert db_counts(service.store) == before
    # alongside their own: theirs is cancelled, hers refused and untouched
    assert service.cancel(BOB, [bob_job, alice_job]) == [
        {"id": bob_job, "state": "CANCELLED"},
        {"id": alice_job, "status": 403, "error": f"job {alice_job} belongs to another user"}]
    assert job_row(service.store, alice_job).state == "PENDING"
    assert job_row(service.store, bob_job).state == "CANCELLED"


def test_a_user_cannot_read_another_users_logs(service, tmp_path, two_jobs):
    alice_job, _ = two_jobs
    set_state(service.store, alice_job, State.RUNNING, node="amd-1")
    (tmp_path / "logs" / f"{alice_job}.out").write_text("alice's secrets\n")
    with pytest.raises(RequestError) as err:
        service.logs(BOB, alice_job)
    assert err.value.status == 403
    assert "secrets" not in err.value.message
    assert service.logs(ALICE, alice_job)["text"] == "alice's secrets\n"
    assert service.logs(ROOT, alice_job)["text"] == "alice's secrets\n"


def test_root_sees_and_cancels_any_job(service, two_jobs):
    alice_job, _ = two_jobs
    assert service.get_job(ROOT, alice_job)["owner_uid"] == ALICE.uid
    assert service.cancel(ROOT, [alice_job]) == [{"id": alice_job, "state": "CANCELLED"}]
    assert events(service.store, alice_job)[-1].actor_uid == 0


def test_a_job_that_does_not_exist_is_404_for_users_and_root(service):
    for caller in (ALICE, ROOT):
        for call in (lambda: service.get_job(caller, 999_999),
                     lambda: service.cancel(caller, [999_999]),
                     lambda: service.logs(caller, 999_999)):
            with pytest.raises(RequestError) as err:
                call()
            assert err.value.status == 404
            assert "no job 999999" in err.value.message


def test_show_returns_the_documented_keys_and_the_history(service):
    job_id = service.submit(ALICE, body(name="infer"))["id"]
    job = service.get_job(ALICE, job_id)
    for key in ("id", "name", "state", "owner", "gpus", "node", "submitted_at", "planned_start",
                "started_at", "ended_at", "exit_code", "energy_j", "gco2", "explanation"):
        assert key in job, key
    assert (job["state"], job["name"], job["submitted_at"]) == ("PENDING", "infer",
                                                                "2026-12-01T12:00:00Z")
    assert job["events"] == [{"at": "2026-12-01T12:00:00Z", "from": None, "to": "PENDING",
                              "actor_uid": ALICE.uid, "reason": "submitted"}]


def test_finished_jobs_are_listed_only_when_asked(service):
    job_id = service.submit(ALICE, body())["id"]
    set_state(service.store, job_id, State.COMPLETED)
    assert service.list_jobs(ALICE) == []
    assert [j["id"] for j in service.list_jobs(ALICE, include_done=True)] == [job_id]
    assert [j["id"] for j in service.list_jobs(ALICE, states=["COMPLETED"])] == [job_id]
    with pytest.raises(RequestError) as err:
        service.list_jobs(ALICE, states=["DONE"])
    assert err.value.status == 400 and "DONE" in err.value.message


# -- cancel ---------------------------------------------------------------------------------

def test_cancelling_a_job_that_has_not_started_cancels_it_with_an_event(service, calls):
    for state in (State.PENDING, State.PLANNED):
        job_id = service.submit(ALICE, body())["id"]
        set_state(service.store, job_id, state)
        assert service.cancel(ALICE, [job_id]) == [{"id": job_id, "state": "CANCELLED"}]
        row = job_row(service.store, job_id)
        assert row.state == "CANCELLED"
        assert row.ended_at == NOW
        last = events(service.store, job_id)[-1]
        assert (last.from_state, last.to_state, last.actor_uid) == (
            state.value, "CANCELLED", ALICE.uid)
        assert str(ALICE.uid) in last.reason
    assert calls.cancel == 2


def test_cancelling_a_running_job_requests_a_stop_and_leaves_it_running(service, calls):
    job_id = service.submit(ALICE, body())["id"]
    set_state(service.store, job_id, State.RUNNING, node="amd-1", started_at=NOW)
    n_events = len(events(service.store, job_id))
    assert service.cancel(ALICE, [job_id]) == [{"id": job_id, "state": "CANCELLING"}]
    row = job_row(service.store, job_id)
    assert row.state == "RUNNING"  # the agent stops the process and records the outcome
    assert (row.cancel_requested_at, row.cancel_requested_by) == (NOW, ALICE.uid)
    assert service.get_job(ALICE, job_id)["cancel_requested"] is True
    assert len(events(service.store, job_id)) == n_events
    assert calls.cancel == 1


def test_cancelling_a_finished_job_is_a_conflict_and_changes_nothing(service, calls):
    ended = NOW - timedelta(minutes=5)
    for state in sorted(TERMINAL):
        job_id = service.submit(ALICE, body())["id"]
        set_state(service.store, job_id, state, reason="done", ended_at=ended)
        before = db_counts(service.store)
        with pytest.raises(RequestError) as err:
            service.cancel(ALICE, [job_id])
        assert err.value.status == 409, state
        assert f"already ended ({state.value})" in err.value.message
        row = job_row(service.store, job_id)
        assert (row.state, row.reason, row.ended_at, row.cancel_requested_at) == (
            state.value, "done", ended, None)
        assert db_counts(service.store) == before
    assert calls.cancel == 0


def test_cancel_needs_at_least_one_job(service):
    with pytest.raises(RequestError) as err:
        service.cancel(ALICE, [])
    assert err.value.status == 400


# -- logs -----------------------------------------------------------------------------------

def test_logs_of_a_job_that_has_not_started_are_a_conflict(service):
    job_id = service.submit(ALICE, body())["id"]
    with pytest.raises(RequestError) as err:
        service.logs(ALICE, job_id)
    assert err.value.status == 409 and "has not started yet" in err.value.message


def test_missing_logs_of_a_finished_job_name_the_node_it_ran_on(service):
    job_id = service.submit(ALICE, body())["id"]
    set_state(service.store, job_id, State.COMPLETED, node="nv-1")
    with pytest.raises(RequestError) as err:
        service.logs(ALICE, job_id)
    assert err.value.status == 404 and "nv-1" in err.value.message


def _read_whole(service, job_id: int) -> tuple[list[dict], str]:
    """Every reply of reading a job's stdout from its tail start on, as `carbonsched logs` does."""
    replies = [service.logs(ALICE, job_id)]
    while replies[-1]["next_offset"] < replies[-1]["size"]:
        replies.append(service.logs(ALICE, job_id, offset=replies[-1]["next_offset"]))
    return replies, "".join(r["text"] for r in replies)


@pytest.mark.parametrize("kept", ["file", "store"])
def test_a_large_log_is_served_in_bounded_chunks_that_decode_whole(service, tmp_path, kept):
    """Issue 48: one reply held a 4 MiB log of control bytes, 25 MB of JSON; 32 of them at
    once took the daemon from 576 to 970 MB. A reply now carries at most 256 KiB; the rest is
    read on from next_offset, and a character cut at a chunk's end starts the next chunk."""
    from scheduler.store.models import job_log_chunks

    chunk_limit = 256 * 1024
    job_id = service.submit(ALICE, body())["id"]
    set_state(service.store, job_id, State.COMPLETED, node="amd-1")
    data = b"\x01" * (chunk_limit - 1) + "é".encode() + b"\x01" * (2 * 1024 * 1024)  # é cut at 256 KiB
    if kept == "file":
        (tmp_path / "logs" / f"{job_id}.out").write_bytes(data)
    else:  # the agent's copy of a job that ran on another node, in 64 KiB rows
        with service.store.write() as conn:
            for at in range(0, len(data), 65536):
                conn.execute(insert(job_log_chunks).values(job_id=job_id, stream="stdout", offset=at,
                                                           data=data[at:at + 65536]))
    replies, text = _read_whole(service, job_id)
    assert all(r["next_offset"] - r["offset"] <= chunk_limit for r in replies)
    assert len(replies) >= len(data) // chunk_limit and replies[0]["size"] == len(data)
    assert text == data.decode() and "\ufffd" not in text


def test_logs_return_the_tail_of_stdout_or_stderr(service, tmp_path):
    job_id = service.submit(ALICE, body())["id"]
    set_state(service.store, job_id, State.RUNNING, node="amd-1")
    (tmp_path / "logs" / f"{job_id}.out").write_text("0123456789")
    (tmp_path / "logs" / f"{job_id}.err").write_text("warning\n")
    out = service.logs(ALICE, job_id, tail_bytes=4)
    assert (out["text"], out["size"], out["truncated"]) == ("6789", 10, True)
    assert service.logs(ALICE, job_id, stream="stderr")["text"] == "warning\n"
    with pytest.raises(RequestError) as err:
        service.logs(ALICE, job_id, stream="stdin")
    assert err.value.status == 400


# -- carbon-aware planning fields ------------------------------------------------------------

def test_a_max_delay_must_be_a_positive_duration_of_at_most_30_days(service, calls):
    for value, fragment in ((0, "--max-delay must be positive"), (-60, "--max-delay must be positive"),
                            (31 * 86400, "at most 30d"), ("1h", "max_delay_s must be a finite number"),
                            (float("nan"), "max_delay_s must be a finite number")):
        assert_rejected(service, calls, body(max_delay_s=value), 400, fragment)
    job_id = service.submit(ALICE, body(max_delay_s=4 * 3600))["id"]
    assert job_row(service.store, job_id).max_delay_s == 4 * 3600
    assert service.get_job(ALICE, job_id)["max_delay_s"] == 4 * 3600
    assert job_row(service.store, service.submit(ALICE, body())["id"]).max_delay_s is None


def test_show_includes_the_plans_estimates_per_prompt_and_if_run_now(service):
    job_id = service.submit(ALICE, body(prompts=200))["id"]
    with service.store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(
            state="PLANNED", planned_node="nv-1", planned_gpu_ids=[], planned_start=NOW,
            est_energy_j=3.6e6, est_gco2=40.0, est_gco2_if_now=100.0, est_runtime_planned_s=1800.0,
            binding="deadline", deadline_miss=False, explanation="H100 in GB at 02:00: 40 g vs 100 g now"))
    job = service.get_job(ALICE, job_id)
    assert (job["est_gco2"], job["est_gco2_if_now"]) == (40.0, 100.0)
    assert job["est_gco2_per_prompt"] == pytest.approx(0.2)
    assert job["est_gco2_if_now_per_prompt"] == pytest.approx(0.5)
    assert (job["est_runtime_planned_s"], job["binding"], job["deadline_miss"]) == (1800.0, "deadline", False)
    assert job["explanation"].startswith("H100 in GB")
    listed = {j["id"]: j for j in service.list_jobs(ALICE)}
    assert listed[job_id]["est_gco2"] == 40.0


def test_a_cancel_cancels_what_it_can_and_names_each_id_it_could_not_as_scancel_does(service):
    """`cancel 6 999 7`: 6 is cancelled, 999 does not exist, 7 already ended: each says so."""
    pending = service.submit(ALICE, body())["id"]
    done = service.submit(ALICE, body())["id"]
    set_state(service.store, done, State.COMPLETED)
    assert service.cancel(ALICE, [pending, 999_999, done]) == [
        {"id": pending, "state": "CANCELLED"},
        {"id": 999_999, "status": 404, "error": "no job 999999"},
        {"id": done, "status": 409, "error": f"job {done} already ended (COMPLETED)"}]
    assert job_row(service.store, pending).state == "CANCELLED"


def test_a_cancel_of_nothing_cancellable_is_refused_naming_each_id(service):
    done = service.submit(ALICE, body())["id"]
    set_state(service.store, done, State.COMPLETED)
    with pytest.raises(RequestError) as err:
        service.cancel(ALICE, [999_999, done])
    assert err.value.status == 404
    assert err.value.message == f"no job 999999; job {done} already ended (COMPLETED)"
