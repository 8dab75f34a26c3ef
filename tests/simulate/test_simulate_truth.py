"""The simulator's truth (`--truth`): jobs run and draw power by a truth the planner cannot
see; a job that overruns holds its GPUs; with learning the planner's estimates converge."""

from __future__ import annotations

import inspect
from collections import defaultdict

import pytest

from policies import get_policy
from policies.model.energy import seed_profiles
from scheduler.simulate.forecasts import parse_forecast
from scheduler.simulate.gpus import GpuLedger
from scheduler.simulate.model import Simulation
from scheduler.simulate.planning import TickPlanner
from scheduler.simulate.settings import SimSettings
from scheduler.simulate.truth import NoisyTruth, ProfilesTruth, Truth, TruthError, parse_truth

from tests.simulate.test_simulate import scenario

SEED = seed_profiles()[0]  # a (workload, model) the seeds cover


def simulate(sc, policy="greedy", **settings):
    return Simulation(cluster=sc.cluster, jobs=sc.jobs, carbon=sc.carbon, policy=policy,
                      forecast=parse_forecast("perfect", sc.carbon), settings=SimSettings(**settings)).run()


def test_truth_specs_parse_and_bad_ones_say_why(tmp_path):
    assert type(parse_truth(None)) is Truth and parse_truth("perfect").name == "perfect"
    noisy = parse_truth("noisy:0.3", seed=4)
    assert isinstance(noisy, NoisyTruth) and (noisy.sigma, noisy.seed) == (0.3, 4)
    f = tmp_path / "truth.toml"
    f.write_text(f'[[profile]]\nworkload = "{SEED.workload}"\nmodel = "{SEED.model}"\n'
                 f'prompts_per_s = {SEED.prompts_per_s / 1.4}\npower_w = {SEED.power_w * 0.7}\n')
    assert isinstance(parse_truth(f"profiles:{f}"), ProfilesTruth)
    for bad, why in (("noisy:x", "needs a number"), ("noisy:5", "between 0 and 2"), ("oracle", "unknown --truth"),
                     (f"profiles:{tmp_path / 'none.toml'}", "not found")):
        with pytest.raises(TruthError, match=why):
            parse_truth(bad)
    f.write_text('[[profile]]\nworkload = "w"\nmodel = "H100"\nprompts_per_s = -1\npower_w = 5\n')
    with pytest.raises(TruthError, match="number 1: prompts_per_s and power_w must be positive"):
        parse_truth(f"profiles:{f}")


def test_a_noisy_truth_is_systematic_per_workload_and_model_and_stable_across_runs():
    a, b = NoisyTruth("noisy:0.3", sigma=0.3, seed=1), NoisyTruth("noisy:0.3", sigma=0.3, seed=1)
    assert a.bias("w", "H100") == b.bias("w", "H100") != a.bias("w", "A100")
    assert NoisyTruth("noisy:0", sigma=0.0).bias("w", "H100") == (1.0, 1.0)


def test_with_the_perfect_truth_every_job_runs_as_planned(tmp_path):
    run = simulate(scenario(30, tmp_path))
    done = [r for r in run.records if r.state == "done"]
    assert done and all(r.runtime_s == r.planned_runtime_s and r.power_w == r.planned_power_w for r in done)


def test_a_noisy_truth_changes_what_runs_but_every_job_runs_once_and_no_gpu_holds_two(tmp_path):
    sc = scenario(60, tmp_path)
    run = simulate(sc, truth="noisy:0.3", learn=False)
    done = [r for r in run.records if r.state == "done"]
    assert len(done) == len(run.records)
    assert sum(abs(r.runtime_s / r.planned_runtime_s - 1) > 0.05 for r in done) > len(done) // 2
    assert all(r.end_s - r.start_s == pytest.approx(r.runtime_s) for r in done)
    busy = defaultdict(list)
    for r in done:
        for g in r.gpu_ids:
            busy[g].append((r.start_s, r.end_s))
    for spans in busy.values():  # an overrunning job holds its GPUs: the next one waits
        spans.sort()
        assert all(s2 >= e1 - 1e-6 for (_, e1), (s2, _) in zip(spans, spans[1:]))
    energy = sum(r.energy_j for r in done)
    assert sum(m.energy_j for m in run.meters.values()) == pytest.approx(energy, rel=1e-9)


def test_the_planner_never_sees_the_truth(tmp_path):
    """Only the simulator's commit reads the truth; the policy's snapshots before any job has
    finished are the same whatever the truth is."""
    callers = []

    class Watching(Truth):
        def actual(self, job, model, planned, default_runtime_s):
            callers.append(inspect.stack()[1].function)
            return planned.runtime_s * 2.0, planned.power_w * 0.5

    seen: dict[str, list] = {}

    class Spy:
        name = "greedy"

        def __init__(self, label):
            self.label = label
            self.inner = get_policy("greedy")

        def plan(self, snapshot):
            seen.setdefault(self.label, []).append(snapshot)
            return self.inner.plan(snapshot)

    sc = scenario(20, tmp_path)
    ends = []
    for label, truth in (("perfect", Truth()), ("watching", Watching("watching"))):
        sim = Simulation(cluster=sc.cluster, jobs=sc.jobs, carbon=sc.carbon, policy=Spy(label),
                         forecast=parse_forecast("perfect", sc.carbon), settings=SimSettings(learn=False))
        sim.dispatch.truth = truth
        sim.run()
        ends += [r.end_s for r in sim.records if r.end_s]
    assert callers and set(callers) == {"commit"}
    first_end = min(ends)  # until a job ends somewhere, nothing measured can differ
    before = [(a, b) for a, b in zip(seen["perfect"], seen["watching"]) if b.now.timestamp() < first_end]
    assert before and all(a == b for a, b in before)
    assert all("truth" not in inspect.getsource(f) for f in (TickPlanner.snapshot, GpuLedger.view))


def test_with_learning_the_planners_estimates_converge_to_the_truth(tmp_path):
    """A workload that really runs 20 % longer at 30 % less power on every GPU model: with
    learning the planner's energy estimates of later jobs are far closer than without.
    (20 %, not 40 % as before issue 27: at 40 % slower the corrected model's H100 and H200
    points miss the preset's TPOT limit and the truth runs at a smaller batch, while the
    simulator restates each run at the seed's point (`_learn` passes no point), which biases
    what is learned by the two points' throughput ratio, ~10 %: a limit of the simulator's
    learning, reported in issue 27's note.)"""
    truth_file = tmp_path / "truth.toml"
    rows = [p for p in seed_profiles() if p.workload == "llm-chat-8b"]
    truth_file.write_text("".join(
        f'[[profile]]\nworkload = "{p.workload}"\nmodel = "{p.model}"\n'
        f'prompts_per_s = {p.prompts_per_s / 1.2}\npower_w = {p.power_w * 0.7}\n' for p in rows))
    sc = scenario(80, tmp_path, mix={"llm-chat-8b": 1.0})
    late_error = {}
    for learn in (False, True):
        run = simulate(sc, truth=f"profiles:{truth_file}", learn=learn)
        done = sorted((r for r in run.records if r.state == "done"), key=lambda r: r.start_s)
        assert len(done) == 80
        late = done[len(done) // 2:]  # the second half of the jobs, after the first have taught
        late_error[learn] = max(abs(r.runtime_s / r.planned_runtime_s - 1) for r in late)
        energy = [r.runtime_s * r.power_w / (r.planned_runtime_s * r.planned_power_w) for r in late]
        if learn:
            assert all(e == pytest.approx(1.0, abs=0.02) for e in energy)
        else:  # 1.2 x 0.7 at the same batch
            assert all(e >= 1.2 * 0.7 - 0.02 for e in energy)
    assert late_error[False] >= 0.2 - 1e-9
    assert late_error[True] < 0.02


def test_the_cli_takes_a_truth_and_refuses_a_bad_one(tmp_path, capsys):
    from scheduler.cli.main import main
    from tests.simulate.test_simulate import DEMO, carbon_args, pai_slice

    args = ["simulate", "--cluster", str(DEMO / "demo-cluster.toml"), "--jobs", str(pai_slice(tmp_path, 20)),
            *carbon_args(), "--start", "2022-10-19T16:00Z", "--policy", "fifo", "--no-plots"]
    with pytest.raises(SystemExit) as e:
        main([*args, "--truth", "noisy:lots"])
    assert e.value.code == 2 and "needs a number" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([*args, "--truth", "noisy:0.3", "--no-learn", "--json", "--out", str(tmp_path / "r")])
    assert e.value.code == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert (doc["scenario"]["truth"], doc["scenario"]["learn"]) == ("noisy:0.3", False)
    assert doc["policies"]["fifo"]["estimate_error_pct"] > 1.0


def test_a_noisy_truth_does_not_drift_with_what_the_planner_learns(tmp_path):
    """The truth is relative to the scenario's own profiles: learning brings the estimates to
    it (a job estimated after two runs of its workload on its GPU model finished is estimated
    within the per-job noise), and what the jobs really draw per prompt is the same with and
    without learning. Estimates made before that carry the other GPU models' shared
    correction, which this truth (independent per model) does not follow. (100 jobs: jobs
    that would wait behind an overrunning job are placed again, so enough of them reach a
    second GPU model after its first runs.)"""
    sc = scenario(100, tmp_path, mix={"llm-chat-8b": 1.0})
    late_error, j_per_prompt = {}, {}
    for learn in (False, True):
        run = simulate(sc, truth="noisy:0.3", learn=learn, seed=1)  # H100 x2.24, H200 x1.37 runtime
        done = sorted((r for r in run.records if r.state == "done"), key=lambda r: r.start_s)
        ends: dict[str, list[float]] = defaultdict(list)
        for r in done:
            ends[r.model].append(r.end_s)
        second_end = {m: sorted(e)[1] for m, e in ends.items() if len(e) >= 2}
        late = [r for r in done if r.model in second_end and r.committed_s >= second_end[r.model]]
        assert len(late) >= 20 and len({r.model for r in late}) >= 2
        late_error[learn] = sorted(abs(r.runtime_s / r.planned_runtime_s - 1) for r in late)[len(late) // 2]
        j_per_prompt[learn] = sum(r.energy_j for r in done) / sum(r.job.prompts for r in done)
    assert late_error[True] < 0.12 < late_error[False]  # per-job noise is lognormal(0, 0.075)
    assert j_per_prompt[True] == pytest.approx(j_per_prompt[False], rel=0.25)
