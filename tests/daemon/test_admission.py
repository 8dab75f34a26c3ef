"""Admission at submit (issue 24, item 2): what no GPU of the cluster can ever run is refused
at once (422, exit 2 at the CLI), with the reason per GPU model, and nothing is stored; what
only GPUs now out of service (drained, or on a node that is down) can run is accepted with a
warning. The JobService is called directly against the `store` fixture (SQLite and PostgreSQL).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select, update

from scheduler.daemon.access import Caller, RequestError, ServiceConfig
from scheduler.daemon.planner import Planner
from scheduler.daemon.policy_factory import make_policy
from scheduler.daemon.service import JobService
from scheduler.store.models import gpus, job_events, jobs

import fleet

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
ALICE = Caller(uid=40001, gid=40001)
ROOT = Caller(uid=0, gid=0)


def add_node(store, name: str, model: str, n: int, memory_gib: float, *, healthy: bool = True,
             heartbeat: datetime = NOW) -> None:
    fleet.add_node(store, name, at=NOW, heartbeat=heartbeat, model=model, n=n, memory_gib=memory_gib,
                   healthy=healthy)


def make_service(store, tmp_path) -> JobService:
    return JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs", clock=lambda: NOW)


@pytest.fixture
def issue_fleet(store):
    """The issue's `--emulate 4xMI300X,2xH100`, on two nodes."""
    add_node(store, "amd-1", "MI300X", 4, 192.0)
    add_node(store, "nv-1", "H100", 2, 80.0)


@pytest.fixture
def service(store, issue_fleet, tmp_path) -> JobService:
    return make_service(store, tmp_path)


def body(**fields) -> dict:
    return {"argv": ["true"], "cwd": "/tmp", **fields}


def counts(store) -> tuple[int, int]:
    with store.read() as conn:
        return (conn.execute(select(func.count()).select_from(jobs)).scalar_one(),
                conn.execute(select(func.count()).select_from(job_events)).scalar_one())


def refused(service: JobService, **fields) -> str:
    """Submit `fields`; assert a 422 that stored nothing; return the message."""
    before = counts(service.store)
    with pytest.raises(RequestError) as e:
        service.submit(ALICE, body(**fields))
    assert e.value.status == 422, e.value.message
    assert counts(service.store) == before
    assert "\n" not in e.value.message
    return e.value.message


def test_a_latency_slo_no_gpu_model_of_the_fleet_meets_is_refused_with_the_reason_per_model(service):
    for fields in ({"workload": "llm-chat-70b", "tpot_slo_ms": 1.0, "gpus": 2},
                   {"workload": "llm-chat-8b", "tpot_slo_ms": 1.0}):
        message = refused(service, **fields)
        assert message.startswith("fits no GPU model: H100 (slo), MI300X (slo)"), message
        assert "no operating point meets TPOT p95 <= 1 ms" in message


def test_an_explicit_time_limit_below_the_estimated_runtime_on_every_model_is_refused(service):
    message = refused(service, est_runtime_s=7200.0, time_limit_s=3600.0)
    # the H100 is the reference GPU (2 h as given); the MI300X is estimated 0.69 x faster
    assert message.startswith("fits no GPU model: H100 (time limit: ~2h), MI300X (time limit: ~1h22m)"), message
    assert "exceeds --time-limit 1h" in message


def test_a_time_limit_that_the_fastest_model_meets_is_accepted_and_planned_there(store, service):
    job_id = service.submit(ROOT, body(est_runtime_s=5400.0, time_limit_s=4200.0))["id"]
    planner = Planner(store, make_policy("greedy"), clock=lambda: NOW)
    planner.tick()
    with store.read() as conn:
        row = conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
    assert row.state == "PLANNED" and row.planned_node == "amd-1", row.reason
    assert row.est_runtime_planned_s <= 4200.0


def test_what_the_fleet_can_run_is_accepted_without_a_warning(service):
    for fields in ({}, {"workload": "llm-chat-70b"}, {"workload": "llm-chat-8b", "tpot_slo_ms": 60.0},
                   {"gpus": 4, "gpu_mem_gib": 100.0}, {"est_runtime_s": 60.0, "time_limit_s": 90.0}):
        out = service.submit(ROOT, body(**fields))
        assert "warning" not in out, (fields, out)


def test_the_gpu_count_and_memory_refusals_keep_their_words(service):
    assert refused(service, gpus=16) == "--gpus 16: no node has that many GPUs of one model (the most is 4)"
    assert refused(service, gpu_mem_gib=500.0) == "--gpu-mem 500 GiB is more than any registered GPU has (192 GiB)"
    assert "warning" not in service.submit(ROOT, body(gpus=3, gpu_mem_gib=100.0))  # amd-1's MI300X


def test_a_workload_that_fits_in_no_gpus_memory_is_refused(service):
    message = refused(service, workload="llm:405b", gpus=4)
    assert message.startswith("fits no GPU model: H100 (memory), MI300X (memory)"), message
    assert "does not fit in the memory of 4 GPU(s)" in message


def drain(service: JobService, target: str, drained: bool = True) -> None:
    service.drain(ROOT, {"target": target}, drained=drained)


def test_a_job_only_drained_gpus_can_run_is_accepted_with_a_warning_and_without_once_resumed(store, service):
    drain(service, "amd-1")
    # only an MI300X holds a 70B model on one GPU
    out = service.submit(ROOT, body(workload="llm-chat-70b"))
    assert out["warning"] == ("only GPUs out of service can run this job now: 4xMI300X on amd-1 (drained); "
                              "it waits until one of them returns")
    with store.read() as conn:
        assert conn.execute(select(jobs.c.state).where(jobs.c.id == out["id"])).scalar_one() == "PENDING"
    assert "warning" not in service.submit(ROOT, body())  # the H100s can run a generic job
    drain(service, "amd-1", drained=False)
    assert "warning" not in service.submit(ROOT, body(workload="llm-chat-70b"))


def test_a_job_only_gpus_of_a_down_node_can_run_is_accepted_with_a_warning(store, tmp_path):
    add_node(store, "amd-1", "MI300X", 4, 192.0, heartbeat=NOW - timedelta(minutes=10))
    add_node(store, "nv-1", "H100", 2, 80.0)
    out = make_service(store, tmp_path).submit(ROOT, body(workload="llm-chat-70b"))
    assert "4xMI300X on amd-1 (node down)" in out["warning"]


def test_unhealthy_gpus_count_for_nothing(store, tmp_path):
    add_node(store, "amd-1", "MI300X", 4, 192.0, healthy=False)
    add_node(store, "nv-1", "H100", 2, 80.0)
    message = refused(make_service(store, tmp_path), workload="llm-chat-70b")
    assert message.startswith("fits no GPU model: H100 (memory)"), message


def test_an_slo_still_out_of_reach_on_drained_gpus_is_refused(service):
    drain(service, "nv-1")
    assert refused(service, workload="llm-chat-8b", tpot_slo_ms=1.0).startswith(
        "fits no GPU model: H100 (slo), MI300X (slo)")


def test_with_no_gpu_registered_the_catalog_stands_in_for_the_fleet(store, tmp_path):
    service = make_service(store, tmp_path)
    message = refused(service, workload="llm-chat-8b", tpot_slo_ms=1.0)
    assert message.startswith("fits no GPU model: ") and "MI300X (slo)" in message and "H100 (slo)" in message
    out = service.submit(ROOT, body())
    assert out["warning"].startswith("no GPU is registered yet")


def test_drain_and_resume_are_seen_by_the_next_submit_at_once(store, service):
    """The inventory is cached for a few seconds, but a drain or resume clears it."""
    service.submit(ROOT, body(workload="llm-chat-70b"))
    drain(service, "amd-1")
    assert "warning" in service.submit(ROOT, body(workload="llm-chat-70b"))
    with store.write() as conn:  # as an agent would on its next heartbeat
        conn.execute(update(gpus).where(gpus.c.node_name == "amd-1").values(drained=False))
    drain(service, "nv-1", drained=False)
    assert "warning" not in service.submit(ROOT, body(workload="llm-chat-70b"))


def test_a_time_limit_alone_is_judged_by_the_planners_stand_in_runtime_and_the_refusal_says_so(store, tmp_path):
    """Without --est-runtime the planner takes a --time-limit shorter than its default runtime
    as the job's runtime on the reference H100; on a fleet of slower A100s no plan fits it, so
    the job would wait for ever: it is refused, and told what would help."""
    add_node(store, "a100-1", "A100", 4, 80.0)
    service = make_service(store, tmp_path)
    message = refused(service, time_limit_s=600.0)
    assert message.startswith("fits no GPU model: A100 (time limit: ~22m49s)"), message
    assert message.endswith("without --est-runtime the job is planned as running 10m on an H100: give --est-runtime")
    assert "give --est-runtime" not in refused(service, est_runtime_s=600.0, time_limit_s=600.0)
    assert "warning" not in service.submit(ROOT, body(est_runtime_s=240.0, time_limit_s=600.0))
