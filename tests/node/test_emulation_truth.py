"""An emulated fleet with a hidden truth (`--emulate FLEET --truth SPEC`, issue 19): the GPUs
draw the truth's power, the job is told the truth's pace, and the planner's code never reaches
the truth (scheduler.node.emulation)."""

from __future__ import annotations

import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from policies.model.catalog import catalog
from policies.model.energy import ProfileBook, seed_profiles
from scheduler.node.emulation import (ENV_RUNTIME_S, ENV_S_PER_PROMPT, EmulationError, JobEmulation,
                                      make_emulation)
from scheduler.simulate.truth import parse_truth
from telemetry.gpu import EmulatedBackend, EmulatedModel
from tests.project.test_layout import MODULES, within

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
H100 = catalog()["H100"]
SEED = ProfileBook(seed_profiles()).get("llm-chat-8b", "H100")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def h100_backend(clock: Clock) -> EmulatedBackend:
    m = EmulatedModel(model="H100", vendor="nvidia", memory_gib=H100.memory_gib, idle_w=H100.idle_w, tdp_w=H100.tdp_w)
    return EmulatedBackend([m, m], node="n", seed=1, clock=clock)


def job_row(prompts: int | None = 1000, workload: str | None = "llm-chat-8b", est_runtime_s=None):
    return SimpleNamespace(id=7, gpu_mem_gib=0.0, submitted_at=NOW, est_runtime_s=est_runtime_s,
                           workload=workload, prompts=prompts)


def truth_file(tmp_path: Path, pps: float, power_w: float) -> str:
    f = tmp_path / "truth.toml"
    f.write_text(f'[[profile]]\nworkload = "llm-chat-8b"\nmodel = "H100"\nprompts_per_s = {pps}\npower_w = {power_w}\n')
    return f"profiles:{f}"


def mean_power_w(backend: EmulatedBackend, uuid: str, clock: Clock, n: int = 50) -> float:
    readings = []
    for _ in range(n):
        clock.t += 1.0
        readings.append(backend.read(uuid).power_w)
    return statistics.fmean(readings)


def test_a_busy_gpu_draws_the_power_it_is_told_until_it_goes_idle():
    clock = Clock()
    backend = h100_backend(clock)
    uuid = backend.devices()[0].uuid
    backend.set_busy_power_w(uuid, 420.0)
    backend.set_busy(uuid, True)
    assert mean_power_w(backend, uuid, clock) == pytest.approx(420.0, rel=0.01)
    backend.set_busy(uuid, False)
    backend.set_busy(uuid, True)  # the next job, told nothing: the load model's 70-95 % of TDP
    assert 0.68 * H100.tdp_w < mean_power_w(backend, uuid, clock) < 0.97 * H100.tdp_w
    backend.set_busy(uuid, False)
    backend.set_busy_power_w(uuid, 10 * H100.tdp_w)  # never above TDP
    backend.set_busy(uuid, True)
    assert mean_power_w(backend, uuid, clock) == pytest.approx(H100.tdp_w, rel=0.02)


def test_a_job_runs_by_the_truth_not_by_the_seed(tmp_path):
    clock = Clock()
    backend = h100_backend(clock)
    emulation = make_emulation(truth_file(tmp_path, SEED.prompts_per_s / 1.2, 0.7 * SEED.power_w), backend)
    uuids = [d.uuid for d in backend.devices()]
    env = emulation.begin(job_row(prompts=1000), "H100", uuids)
    runtime_s = 1000 / (2 * SEED.prompts_per_s / 1.2)  # two GPUs, data-parallel (slow enough to matter, not so slow that the default TPOT SLO moves the point)
    assert float(env[ENV_RUNTIME_S]) == pytest.approx(runtime_s, rel=1e-5)
    assert float(env[ENV_S_PER_PROMPT]) == pytest.approx(runtime_s / 1000, rel=1e-5)
    for uuid in uuids:
        backend.set_busy(uuid, True)
        assert mean_power_w(backend, uuid, clock) == pytest.approx(0.7 * SEED.power_w, rel=0.01)


def test_a_job_runs_at_the_operating_point_its_plan_chose_not_at_the_seed_shapes():
    # The seed shape of llm-chat-8b on one H100 is its unconstrained pick; a plan at a smaller
    # batch limit runs slower and draws less, by the performance model, on top of the truth.
    from policies.model.energy import point_change
    from policies.types import QueuedJob
    from policies.model.operating_point import job_choice, workload_model
    from policies.model.perf_model import OperatingPoint, predict

    backend = h100_backend(Clock())
    truth = JobEmulation(parse_truth("perfect"), backend)
    picked = job_choice("llm-chat-8b", "H100", 1, None, None, None)
    small = OperatingPoint(max(1, picked.point.max_batch // 4), picked.point.precision, 1)
    at_small = predict(workload_model("llm-chat-8b"), "H100", small)
    plain = truth.run_of(job_row(prompts=500), "H100", 1)
    row = SimpleNamespace(**vars(job_row(prompts=500)), planned_max_batch=small.max_batch,
                          planned_precision=small.precision, planned_tp=1)
    planned = truth.run_of(row, "H100", 1)
    assert planned.runtime_s == pytest.approx(plain.runtime_s * picked.prompts_per_s / at_small.prompts_per_s, rel=1e-6)
    assert planned.power_w_per_gpu == pytest.approx(plain.power_w_per_gpu * at_small.power_w / picked.power_w, rel=1e-6)
    assert planned.runtime_s > plain.runtime_s  # a quarter of the batch is slower
    same = SimpleNamespace(**vars(job_row(prompts=500)), planned_max_batch=picked.point.max_batch,
                           planned_precision=picked.point.precision, planned_tp=picked.point.tp)
    assert truth.run_of(same, "H100", 1).runtime_s == pytest.approx(plain.runtime_s, rel=1e-9)
    assert point_change(QueuedJob(1, 1, 0.0, NOW), "H100", small) == (1.0, 1.0)  # no workload: no figures


def test_the_perfect_truth_is_the_seed_and_a_job_without_prompts_has_no_pace_per_prompt():
    backend = h100_backend(Clock())
    run = JobEmulation(parse_truth("perfect"), backend).run_of(job_row(prompts=500), "H100", 1)
    assert run.runtime_s == pytest.approx(500 / SEED.prompts_per_s)
    assert run.power_w_per_gpu == pytest.approx(SEED.power_w)
    generic = JobEmulation(parse_truth("perfect"), backend).run_of(
        job_row(prompts=None, workload=None, est_runtime_s=120.0), "H100", 1)
    assert ENV_S_PER_PROMPT not in generic.env and float(generic.env[ENV_RUNTIME_S]) == pytest.approx(120.0)


def test_a_truth_needs_an_emulated_fleet_and_a_valid_spec():
    assert make_emulation(None, h100_backend(Clock())) is None  # no truth: the load model
    real = SimpleNamespace(name="nvml")
    with pytest.raises(EmulationError, match="--emulate"):
        make_emulation("perfect", real)
    with pytest.raises(EmulationError, match="noisy"):
        make_emulation("noisy:lots", h100_backend(Clock()))


def test_the_tiny_batch_example_paces_itself_by_the_truth(tmp_path):
    metrics = tmp_path / "metrics"
    env = {"PATH": "/usr/bin:/bin", ENV_S_PER_PROMPT: "0.002", "CARBONSCHED_METRICS_FILE": str(metrics)}
    t0 = datetime.now(timezone.utc)
    subprocess.run([sys.executable, str(REPO / "examples/jobs/tiny_batch.py"), "--prompts", "400",
                    "--seconds", "30"], env=env, check=True, timeout=30, capture_output=True)
    took_s = (datetime.now(timezone.utc) - t0).total_seconds()
    assert 0.8 <= took_s < 5.0  # 400 x 2 ms, not the 30 s asked for
    assert "prompts=400" in metrics.read_text()


def test_the_daemon_and_agent_take_truth_with_its_environment_variable(tmp_path):
    for verb in ("daemon", "agent"):
        out = subprocess.run([sys.executable, "-m", "scheduler", verb, "--help"], capture_output=True,
                             text=True, check=True, cwd=REPO).stdout
        assert "--truth SPEC" in out and "CARBONSCHED_TRUTH" in " ".join(out.split())
    (tmp_path / "empty.toml").write_text("")
    bad = subprocess.run([sys.executable, "-m", "scheduler", "config", "check", "--for", "daemon"],
                         capture_output=True, text=True, cwd=REPO,
                         env={"PATH": "/usr/bin:/bin", "CARBONSCHED_TRUTH": "noisy:x",
                              "CARBONSCHED_CONFIG": str(tmp_path / "empty.toml")})
    assert bad.returncode != 0 and "CARBONSCHED_TRUTH" in bad.stdout + bad.stderr, bad


def _closure(roots: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        mod = todo.pop()
        if mod in seen or mod not in MODULES:
            continue
        seen.add(mod)
        todo.extend(i for i in MODULES[mod] if i in MODULES)
    return seen


HIDDEN = ("scheduler.simulate.truth", "scheduler.node.emulation")


def test_the_planners_code_never_imports_the_truth():
    """Everything the daemon's planner (thread or child process) and every policy import, at
    any depth and wherever the import statement is, leaves the truth out."""
    planner = _closure(["scheduler.daemon.planner", "scheduler.daemon.planner_process", "scheduler.profiles",
                        *[m for m in MODULES if within(m, "policies")]])
    assert "scheduler.daemon.planner" in planner and "policies.solvers.cpsat" in planner
    assert not [m for m in planner if any(within(m, h) for h in HIDDEN)]
    # and the agent does hold it: the check is not vacuous
    assert "scheduler.simulate.truth" in _closure(["scheduler.node.agent", "scheduler.node.main"])
