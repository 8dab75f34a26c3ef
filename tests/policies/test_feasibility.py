"""policies.pricing.feasibility: which GPU models of a fleet can ever take a job, and why not (issue 24).

The API refuses at submit what no GPU of the cluster can ever run, so its answer must be
the planner's: for any job and fleet, the models `exclusions` names, and why, are exactly
those the planner's compiled problem excludes (`Problem.job_options(j).excluded`).
"""

from __future__ import annotations

from datetime import datetime, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import GpuSlot, QueuedJob, Snapshot
from policies.model.catalog import catalog
from policies.model.energy import ProfileBook, seed_profiles
from policies.pricing.feasibility import GpuKind, exclusions, planning_runtime_s, unfit_text
from policies.problem.instance import compile_problem

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
BOOK = ProfileBook(seed_profiles())
MODELS = ["H100", "MI300X", "A100", "MI355X", "H200", "B200"]


def fleet_of(nodes: list[tuple[str, int]]) -> tuple[GpuSlot, ...]:
    slots, gid = [], 0
    for n, (model, count) in enumerate(nodes):
        for i in range(count):
            gid += 1
            slots.append(GpuSlot(gid, f"node-{n}", "DE", i, model, catalog()[model].memory_gib))
    return tuple(slots)


def kinds_of(slots: tuple[GpuSlot, ...]) -> list[GpuKind]:
    counts: dict[tuple, int] = {}
    for s in slots:
        counts[(s.node, s.model, s.memory_gib)] = counts.get((s.node, s.model, s.memory_gib), 0) + 1
    return [GpuKind(model, mem, n) for (_, model, mem), n in counts.items()]


jobs = st.builds(
    lambda workload, gpus, mem, tpot, est, limit: QueuedJob(
        1, gpus, mem, NOW, planning_runtime_s(est, limit, 3600.0), workload=workload, time_limit_s=limit,
        tpot_slo_ms=tpot if workload is None or workload.startswith("llm") else None),
    workload=st.sampled_from([None, "llm-chat-8b", "llm-chat-70b", "llm:405b", "finetune", "eval"]),
    gpus=st.sampled_from([1, 2, 4, 8]),
    mem=st.sampled_from([0.0, 40.0, 100.0, 200.0]),
    tpot=st.sampled_from([None, 1.0, 20.0, 60.0, 200.0]),
    est=st.sampled_from([None, 60.0, 3600.0, 7200.0]),
    limit=st.sampled_from([None, 600.0, 3600.0, 5400.0]))
fleets = st.lists(st.tuples(st.sampled_from(MODELS), st.integers(1, 8)), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=jobs, nodes=fleets)
def test_the_models_excluded_and_why_are_exactly_the_planners(job, nodes):
    slots = fleet_of(nodes)
    problem = compile_problem(Snapshot(now=NOW, jobs=(job,), gpus=slots, carbon={}))
    assert exclusions(job, kinds_of(slots), BOOK, 3600.0) == problem.job_options(0).excluded


def test_a_model_is_excluded_only_when_none_of_its_nodes_can_take_the_job():
    """Four GPUs are asked: the 2-GPU H100 node cannot, the 4-GPU one can."""
    job = QueuedJob(1, 4, 0.0, NOW)
    assert exclusions(job, [GpuKind("H100", 80.0, 2)], BOOK, 3600.0) == {"H100": "gang"}
    assert exclusions(job, [GpuKind("H100", 80.0, 2), GpuKind("H100", 80.0, 4)], BOOK, 3600.0) == {}


def test_the_reasons_follow_the_planners_order_memory_slo_time_limit_gang():
    kinds = [GpuKind("H100", 80.0, 2), GpuKind("MI300X", 192.0, 8)]
    assert exclusions(QueuedJob(1, 1, 100.0, NOW), kinds, BOOK, 3600.0) == {"H100": "memory"}
    slo = QueuedJob(1, 2, 0.0, NOW, workload="llm-chat-70b", tpot_slo_ms=1.0)
    assert exclusions(slo, kinds, BOOK, 3600.0) == {"H100": "slo", "MI300X": "slo"}
    late = QueuedJob(1, 1, 0.0, NOW, est_runtime_s=7200.0, time_limit_s=3600.0)
    assert exclusions(late, kinds, BOOK, 3600.0) == {"H100": "time limit", "MI300X": "time limit"}
    wide = QueuedJob(1, 4, 100.0, NOW)  # memory before gang on the H100; gang alone nowhere else
    assert exclusions(wide, kinds, BOOK, 3600.0) == {"H100": "memory"}


def test_the_wording_is_greedys():
    assert unfit_text({"MI300X": "slo", "H100": "slo"}) == "fits no GPU model: H100 (slo), MI300X (slo)"


def test_a_job_without_an_estimate_is_planned_for_a_shorter_time_limit_else_the_default():
    assert planning_runtime_s(90.0, 60.0, 3600.0) == 90.0
    assert planning_runtime_s(None, 60.0, 3600.0) == 60.0
    assert planning_runtime_s(None, 7200.0, 3600.0) is None
    assert planning_runtime_s(None, None, 3600.0) is None
