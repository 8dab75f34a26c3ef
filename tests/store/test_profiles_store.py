"""Learned workload profiles in the store (SQLite and PostgreSQL): a completed job's measured
runtime and energy are folded into its (workload, GPU model) profile, jobs that measured
nothing useful teach nothing, and learning never fails a job's completion."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, select, text, update

from policies.model.energy import ProfileBook, seed_profiles
from policies.model.learning import Run, estimate
from scheduler.lifecycle import State
from scheduler.profiles import completed_run, learn_from_job, learned_profiles
from scheduler.store.models import gpus, jobs, nodes, workload_profiles

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=timezone.utc)


def seeded_pair() -> tuple[str, str]:
    """A (workload, model) pair the packaged seed profiles cover."""
    p = seed_profiles()[0]
    return p.workload, p.model


def learned_for(conn, workload: str, model: str):
    """The learned profile of (workload, model); others of the workload may be listed too."""
    return {(p.workload, p.model): p for p in learned_profiles(conn)}[(workload, model)]


def add_gpus(store, node: str, model: str, n: int, memory_gib: float = 80.0) -> list[int]:
    with store.write() as conn:
        if conn.execute(select(nodes.c.name).where(nodes.c.name == node)).first() is None:
            conn.execute(insert(nodes).values(name=node, zone="DE", backend="emulated", emulated=True,
                                              registered_at=T0, last_heartbeat=T0))
        start = len(list(conn.execute(select(gpus.c.id).where(gpus.c.node_name == node))))
        ids = []
        for i in range(start, start + n):
            ids.append(conn.execute(insert(gpus).values(
                node_name=node, index=i, uuid=f"{node}-{model}-{i}", model=model, vendor="nvidia",
                memory_gib=memory_gib, healthy=True).returning(gpus.c.id)).scalar_one())
    return ids


def add_finished_job(store, *, gpu_ids: list[int], runtime_s: float, energy_j: float | None,
                     prompts: int | None, workload: str | None, state: str = "COMPLETED") -> int:
    started = T0
    with store.write() as conn:
        return conn.execute(insert(jobs).values(
            name="job", state=state, owner_uid=0, owner_gid=0, owner_groups=[0], owner_name="root",
            argv=["true"], cwd="/", env={}, gpus=len(gpu_ids), gpu_mem_gib=0.0, workload=workload,
            prompts=prompts, submitted_at=started, node="n1", gpu_ids=gpu_ids, started_at=started,
            ended_at=started + timedelta(seconds=runtime_s), exit_code=0, energy_j=energy_j,
        ).returning(jobs.c.id)).scalar_one()


def test_no_profile_is_learned_before_any_job_completes(store):
    with store.read() as conn:
        assert learned_profiles(conn) == ()


def test_a_completed_job_is_folded_into_the_seed_profile_of_its_workload_and_model(store):
    workload, model = seeded_pair()
    seed = ProfileBook(seed_profiles()).get(workload, model)
    ids = add_gpus(store, "n1", model, 2)
    # Measured: twice the seed's throughput per GPU, at 300 W per GPU.
    runtime_s = 1000.0
    prompts = int(2 * seed.prompts_per_s * 2 * runtime_s)
    job = add_finished_job(store, gpu_ids=ids, runtime_s=runtime_s, energy_j=2 * 300.0 * runtime_s,
                           prompts=prompts, workload=workload)

    learned = learn_from_job(store, job, clock=lambda: T0)

    expected = estimate(seed, [Run.of(gpus=2, runtime_s=runtime_s, energy_j=2 * 300.0 * runtime_s,
                                      prompts=prompts)], workload=workload, model=model)
    assert learned == expected
    with store.read() as conn:
        stored = learned_for(conn, workload, model)
        row = conn.execute(select(workload_profiles)).one()
    assert (stored.workload, stored.model, stored.samples) == (workload, model, 1)
    assert stored.prompts_per_s == pytest.approx(expected.prompts_per_s)
    assert stored.power_w == pytest.approx(expected.power_w)
    assert stored.latency_p95_ms == pytest.approx(expected.latency_p95_ms)
    assert seed.prompts_per_s < stored.prompts_per_s <= 2 * seed.prompts_per_s
    assert "measured here" in stored.source
    assert row.updated_at == T0


def test_each_completed_job_counts_once_more_and_the_estimate_converges_to_the_measurement(store):
    workload, model = seeded_pair()
    seed = ProfileBook(seed_profiles()).get(workload, model)
    ids = add_gpus(store, "n1", model, 1)
    measured_pps = 3 * seed.prompts_per_s
    for n in range(1, 16):
        job = add_finished_job(store, gpu_ids=ids, runtime_s=600.0, energy_j=400.0 * 600.0,
                               prompts=int(measured_pps * 600.0), workload=workload)
        assert learn_from_job(store, job).samples == n
    with store.read() as conn:
        p = learned_for(conn, workload, model)
    assert p.samples == 15
    assert p.prompts_per_s == pytest.approx(measured_pps, rel=0.02)
    assert p.power_w == pytest.approx(400.0, rel=0.02)


def test_a_workload_without_a_seed_profile_is_learned_from_the_measurement_alone(store):
    ids = add_gpus(store, "n1", "H100", 1)
    job = add_finished_job(store, gpu_ids=ids, runtime_s=100.0, energy_j=50_000.0, prompts=1000,
                           workload="site-specific-eval")
    p = learn_from_job(store, job)
    assert (p.workload, p.samples) == ("site-specific-eval", 1)
    assert p.prompts_per_s == pytest.approx(10.0)
    assert p.power_w == pytest.approx(500.0)
    with store.read() as conn:
        (stored,) = learned_profiles(conn)
    assert stored.prompts_per_s == pytest.approx(10.0)


@pytest.mark.parametrize("change", [
    dict(workload=None), dict(prompts=None), dict(energy_j=None), dict(energy_j=0.0),
    dict(state="FAILED"), dict(runtime_s=0.2),
])
def test_jobs_that_measured_nothing_useful_teach_nothing(store, change):
    ids = add_gpus(store, "n1", "H100", 1)
    args = dict(gpu_ids=ids, runtime_s=600.0, energy_j=1e5, prompts=1000, workload="site-eval")
    args.update(change)
    job = add_finished_job(store, **args)
    assert learn_from_job(store, job) is None
    with store.read() as conn:
        assert learned_profiles(conn) == ()


def test_a_job_spread_over_two_gpu_models_teaches_nothing(store):
    ids = add_gpus(store, "n1", "H100", 1) + add_gpus(store, "n1", "A100", 1)
    job = add_finished_job(store, gpu_ids=ids, runtime_s=600.0, energy_j=1e5, prompts=1000,
                           workload="site-eval")
    with store.read() as conn:
        assert completed_run(conn, job) is None


def test_the_gpu_energy_given_by_the_agent_replaces_the_stored_figure_with_static_power(store):
    ids = add_gpus(store, "n1", "H100", 1)
    job = add_finished_job(store, gpu_ids=ids, runtime_s=100.0, energy_j=90_000.0, prompts=1000,
                           workload="site-eval")
    p = learn_from_job(store, job, gpu_energy_j=60_000.0)
    assert p.power_w == pytest.approx(600.0)


def test_a_database_error_while_learning_is_logged_and_never_raised(store, caplog):
    ids = add_gpus(store, "n1", "H100", 1)
    job = add_finished_job(store, gpu_ids=ids, runtime_s=100.0, energy_j=90_000.0, prompts=1000,
                           workload="site-eval")
    with store.write() as conn:
        conn.execute(text("DROP TABLE workload_profiles"))
    with caplog.at_level(logging.ERROR, logger="scheduler.profiles"):
        assert learn_from_job(store, job) is None
    assert any("workload profile" in r.getMessage() for r in caplog.records)
    with store.read() as conn:
        assert conn.execute(select(jobs.c.state).where(jobs.c.id == job)).scalar_one() == "COMPLETED"


def test_the_agent_learns_from_a_job_it_ran_to_completion(store, tmp_path):
    from policies import get_policy
    from policies.model.catalog import parse_fleet
    from scheduler.daemon.access import Caller, ServiceConfig
    from scheduler.daemon.planner import Planner
    from scheduler.daemon.service import JobService
    from scheduler.node.agent import Agent
    from scheduler.node.config import AgentConfig
    from telemetry.gpu import EmulatedBackend, EmulatedModel

    backend = EmulatedBackend([EmulatedModel(m.name, m.vendor, m.memory_gib, m.idle_w, m.tdp_w)
                               for m in parse_fleet("1xH100")], node="n1", seed=3)
    agent = Agent(store, backend, AgentConfig(node="n1", zone="DE", state_dir=tmp_path / "state",
                                              grace_s=1.0, sample_hz=5.0, heartbeat_s=0.2))
    agent.register()
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "state" / "logs")
    planner = Planner(store, get_policy("fifo"))
    try:
        agent.start_sampling()
        job = service.submit(Caller(0, 0), {"argv": ["sleep", "1.2"], "gpus": 1,
                                            "workload": "custom:site-eval", "prompts": 240})["id"]
        deadline = time.monotonic() + 30
        state = None
        while time.monotonic() < deadline:
            planner.tick()
            agent.tick()
            with store.read() as conn:
                state = conn.execute(select(jobs.c.state).where(jobs.c.id == job)).scalar_one()
            if state == State.COMPLETED.value:
                break
            time.sleep(0.05)
        assert state == State.COMPLETED.value
        with store.read() as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job)).one()
            (p,) = learned_profiles(conn)
        runtime_s = (row.ended_at - row.started_at).total_seconds()
        assert (p.workload, p.model, p.samples) == ("custom:site-eval", "H100", 1)
        assert p.prompts_per_s == pytest.approx(240 / runtime_s, rel=1e-6)
        assert p.power_w == pytest.approx(row.energy_j / runtime_s, rel=1e-6)
    finally:
        agent.stop()


def test_a_workload_learned_on_one_model_corrects_its_seeds_on_the_others(store):
    seeds = seed_profiles()
    workload = seeds[0].workload
    models = [p.model for p in seeds if p.workload == workload]
    assert len(models) >= 2
    first, other = models[0], models[1]
    seed_first = ProfileBook(seeds).get(workload, first)
    seed_other = ProfileBook(seeds).get(workload, other)
    ids = add_gpus(store, "n1", first, 1)
    for _ in range(3):  # this workload runs at half its seed's throughput on `first`
        job = add_finished_job(store, gpu_ids=ids, runtime_s=1000.0, energy_j=seed_first.power_w * 1000.0,
                               prompts=int(seed_first.prompts_per_s * 0.5 * 1000.0), workload=workload)
        learn_from_job(store, job)
    with store.read() as conn:
        learned = {p.model: p for p in learned_profiles(conn)}
    assert learned[first].samples == 3
    assert learned[first].prompts_per_s == pytest.approx(seed_first.prompts_per_s * 0.5, rel=0.01)
    assert learned[other].samples == 0 and "other GPU models" in learned[other].source
    assert learned[other].prompts_per_s == pytest.approx(seed_other.prompts_per_s * 0.5, rel=0.01)


def test_a_profile_learned_before_runs_were_kept_counts_as_one_run(store):
    workload, model = seeded_pair()
    seed = ProfileBook(seed_profiles()).get(workload, model)
    with store.write() as conn:
        conn.execute(insert(workload_profiles).values(
            workload=workload, model=model, prompts_per_s=2 * seed.prompts_per_s, power_w=seed.power_w,
            samples=7, source="measured here (n=7)", updated_at=T0, runs=None))
    ids = add_gpus(store, "n1", model, 1)
    job = add_finished_job(store, gpu_ids=ids, runtime_s=1000.0, energy_j=seed.power_w * 1000.0,
                           prompts=int(2 * seed.prompts_per_s * 1000.0), workload=workload)
    p = learn_from_job(store, job)
    assert p.samples == 8 and p.prompts_per_s == pytest.approx(2 * seed.prompts_per_s, rel=0.01)
    with store.read() as conn:
        assert len(conn.execute(select(workload_profiles.c.runs)).scalar_one()) == 2


def test_the_prompts_a_job_reported_are_what_it_teaches(store):
    ids = add_gpus(store, "n1", "H100", 1)
    job = add_finished_job(store, gpu_ids=ids, runtime_s=100.0, energy_j=50_000.0, prompts=1000,
                           workload="site-specific-eval")
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job).values(reported_prompts=2500))
    assert learn_from_job(store, job).prompts_per_s == pytest.approx(25.0)
