"""`carbonsched simulate`: the SimPy replay, its accounting, its report and its CLI.

The acceptance test replays a small slice of real data (GAIA's PAI jobs, Electricity Maps
2022 carbon of four zones; see scheduler/simulate/data/SOURCE.md) end to end through the
CLI and checks the report against values computed here, independently of the simulator:
each job's energy from its power and run time, its emissions from the carbon files read
with the csv module, and the totals from the sums.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from policies.types import Assignment, Plan, Snapshot
from scheduler.cli.main import main
from scheduler.simulate.cluster import cluster_from_dict, load_cluster
from scheduler.simulate.forecasts import parse_forecast
from scheduler.simulate.intensity import load_zone_files
from scheduler.simulate.model import Simulation
from scheduler.simulate.runner import parse_policies, run_policies
from scheduler.simulate.scenario import build_scenario, demo_dir
from scheduler.simulate.settings import SimSettings
from scheduler.simulate.traces import read_jobs

DEMO = demo_dir()
ZONE_FILES = {"DE": "DE-LU.csv", "GB": "GB.csv", "US-CAL-CISO": "US-CAL-CISO.csv", "SG": "SG.csv"}
START = datetime(2022, 10, 19, 16, tzinfo=timezone.utc)
TIMING_KEYS = {"wall_s", "events_per_s", "planner_mean_s", "planner_p95_s", "planner_max_s", "planner_total_s",
               "planner_full_s", "simulator_s", "events_per_s_simulator"}


def pai_slice(tmp_path: Path, n: int) -> Path:
    """The first n jobs of the bundled real PAI slice."""
    lines = (DEMO / "pai_demo.csv").read_text().splitlines()[: n + 1]
    p = tmp_path / f"pai_{n}.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def carbon_args() -> list[str]:
    out = []
    for zone, name in ZONE_FILES.items():
        out += ["--carbon", f"{zone}={DEMO / name}"]
    return out


def hourly_intensity(path: Path) -> dict[datetime, float]:
    """The direct intensity per hour, read straight from an Electricity Maps CSV."""
    with open(path, encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader)
        col = next(i for i, h in enumerate(header) if h.startswith("Carbon Intensity") and "(direct)" in h)
        return {datetime.fromisoformat(r[0]).replace(tzinfo=timezone.utc): float(r[col]) for r in reader}


def integral_g_per_kwh_s(hours: dict[datetime, float], start: datetime, end: datetime) -> float:
    """Integral of the hourly step function over [start, end], hour by hour."""
    total = 0.0
    t = start
    while t < end:
        hour = t.replace(minute=0, second=0, microsecond=0)
        nxt = min(end, hour + timedelta(hours=1))
        total += hours[hour] * (nxt - t).total_seconds()
        t = nxt
    return total


def scenario(n_jobs: int, tmp_path: Path, **kw):
    cluster = load_cluster(DEMO / "demo-cluster.toml")
    carbon = {z: load_zone_files(z, [DEMO / f]) for z, f in ZONE_FILES.items()}
    return build_scenario(cluster, read_jobs(pai_slice(tmp_path, n_jobs)), carbon, start=START, **kw)


# -- acceptance ----------------------------------------------------------------------------------

def test_acceptance_real_slice_report_matches_independent_accounting(tmp_path, capsys):
    jobs = pai_slice(tmp_path, 60)
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--cluster", str(DEMO / "demo-cluster.toml"), "--jobs", str(jobs), *carbon_args(),
              "--start", "2022-10-19T16:00Z", "--slack", "12h", "--policy", "fifo,greedy", "--out", str(out),
              "--json"])
    assert e.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    cluster = load_cluster(DEMO / "demo-cluster.toml")
    hours = {zone: hourly_intensity(DEMO / name) for zone, name in ZONE_FILES.items()}
    with open(jobs) as f:
        trace = list(csv.DictReader(f))

    for policy in ("fifo", "greedy"):
        summary = doc["policies"][policy]
        for key in ("kgco2", "energy_kwh", "gco2_per_prompt", "deadline_misses", "mean_wait_s", "p95_wait_s",
                    "jobs"):
            assert key in summary
        with open(out / f"jobs-{policy}.csv") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == len(trace) == summary["jobs"] == summary["finished"]
        total_j = total_g = 0.0
        waits = []
        misses = 0
        busy: dict[int, list[tuple[datetime, datetime]]] = {}
        for row, src in zip(sorted(rows, key=lambda r: int(r["id"])), trace):
            submitted = datetime.fromisoformat(row["submitted_at"])
            start, end = datetime.fromisoformat(row["start"]), datetime.fromisoformat(row["end"])
            # the trace's own arrival offsets and widths
            assert submitted == START + timedelta(seconds=float(src["arrival_time"]))
            assert int(row["gpus"]) == int(src["cpus"]) == len(row["gpu_ids"].split())
            assert start >= submitted
            power_w, pue = float(row["power_w"]), float(row["pue"])
            assert pue == cluster.pue[row["zone"]]
            energy_j = power_w * (end - start).total_seconds()  # energy = power x time
            assert float(row["energy_j"]) == pytest.approx(energy_j, rel=1e-7)  # ISO times: 1 us
            gco2 = energy_j / (end - start).total_seconds() * pue * \
                integral_g_per_kwh_s(hours[row["zone"]], start, end) / 3.6e6  # x actual intensity x PUE
            assert float(row["gco2"]) == pytest.approx(gco2, rel=1e-6)
            total_j += energy_j
            total_g += gco2
            waits.append((start - submitted).total_seconds())
            if end > datetime.fromisoformat(row["deadline"]) + timedelta(microseconds=1):
                misses += 1
            for g in row["gpu_ids"].split():
                busy.setdefault(int(g), []).append((start, end))
        # energy conservation: the sum of job energies is the integral of simulated site power
        assert summary["energy_kwh"] * 3.6e6 == pytest.approx(total_j, rel=1e-7)
        # emissions: energy x actual intensity x PUE, summed
        assert summary["kgco2"] * 1000 == pytest.approx(total_g, rel=1e-6)
        assert summary["mean_wait_s"] == pytest.approx(sum(waits) / len(waits), abs=1e-3)
        assert summary["deadline_misses"] == misses
        for spans in busy.values():  # no GPU runs two jobs at once
            spans.sort()
            for (_, a_end), (b_start, _) in zip(spans, spans[1:]):
                assert b_start >= a_end - timedelta(microseconds=1)
    # carbon-aware planning with a perfect forecast emits less than FIFO here
    assert doc["policies"]["greedy"]["kgco2"] < doc["policies"]["fifo"]["kgco2"]
    assert doc["comparison"]["greedy"]["vs_first_pct"] > 0
    for name in ("emissions.png", "gpu_usage.png", "waits.png", "report.json"):
        assert (out / name).stat().st_size > 0
    assert json.loads((out / "report.json").read_text())["policies"] == doc["policies"]


# -- the model -----------------------------------------------------------------------------------

@dataclass
class LaterPolicy:
    """Places every job on GPU 0.. of the first node, `delay_s` after now (for tick semantics)."""

    delay_s: float
    name: str = "later"
    calls: int = 0

    def plan(self, snapshot: Snapshot) -> Plan:
        self.calls += 1
        free = [g for g in snapshot.gpus if g.busy_until is None and g.healthy]
        out = []
        for job in snapshot.jobs:
            take = free[: job.gpus]
            if len(take) < job.gpus:
                break
            free = free[job.gpus:]
            out.append(Assignment(job_id=job.id, node=take[0].node, gpu_ids=tuple(g.id for g in take),
                                  start_at=snapshot.now + timedelta(seconds=self.delay_s)))
        return Plan(assignments=tuple(out))


def _one_node_scenario(tmp_path):
    cluster = cluster_from_dict({"node": [{"name": "n", "zone": "GB", "gpus": "64xH100"}]})
    carbon = {"GB": load_zone_files("GB", [DEMO / "GB.csv"])}
    return build_scenario(cluster, read_jobs(pai_slice(tmp_path, 5)), carbon, start=START)


def test_assignments_before_the_next_tick_start_at_their_time_the_rest_are_planned_again(tmp_path):
    sc = _one_node_scenario(tmp_path)
    settings = SimSettings(plan_interval_s=900, wake_on_submit=False)
    forecast = parse_forecast("perfect", sc.carbon)
    # planned 10 min ahead: inside the tick, so it starts exactly then
    run = Simulation(cluster=sc.cluster, jobs=sc.jobs, carbon=sc.carbon, policy=LaterPolicy(600),
                     forecast=forecast, settings=settings).run()
    first = run.records[0]
    assert first.start_s == START.timestamp() + 600
    # planned 20 min ahead: beyond the next tick, so never committed; each tick re-plans it
    policy = LaterPolicy(1200)
    run = Simulation(cluster=sc.cluster, jobs=sc.jobs, carbon=sc.carbon, policy=policy, forecast=forecast,
                     settings=SimSettings(plan_interval_s=900, wake_on_submit=False,
                                          max_overrun_s=3 * 3600)).run()
    assert all(r.state == "queued" for r in run.records)
    assert policy.calls >= 12


def test_a_full_replan_is_handed_the_last_plan_of_each_queued_job_as_the_daemon_does(tmp_path):
    """The daemon's full re-plan starts from the stored plans (`Snapshot.previous`: cpsat
    tries them first and goes on from there); the simulator's must too, or cpsat's
    continuation across ticks is never exercised in a replay."""
    sc = _one_node_scenario(tmp_path)
    calls: list[tuple[dict, dict, dict]] = []  # (previous handed in, keep handed in, plan out)

    class Recording(LaterPolicy):
        def plan(self, snapshot: Snapshot) -> Plan:
            plan = super().plan(snapshot)
            calls.append((dict(snapshot.previous), dict(snapshot.keep), {a.job_id: a for a in plan.assignments}))
            return plan

    def run(**kw):
        calls.clear()
        # planned 20 min ahead, beyond the next tick: never committed, planned again each tick
        Simulation(cluster=sc.cluster, jobs=sc.jobs, carbon=sc.carbon, policy=Recording(1200),
                   forecast=parse_forecast("perfect", sc.carbon),
                   settings=SimSettings(plan_interval_s=900, wake_on_submit=False, max_overrun_s=3 * 3600,
                                        **kw)).run()
        return list(calls)

    full = run()
    assert len(full) >= 12 and full[0][0] == {}
    for (_, _, out), (previous, keep, _) in zip(full, full[1:]):
        assert previous == out and keep == {}
    # between incremental full re-plans the plans are kept instead, and nothing is "previous"
    inc = run(full_replan_s=6 * 3600)
    assert any(keep for _, keep, _ in inc[1:]) and not any(previous for previous, keep, _ in inc if keep)


def test_invalid_assignments_are_rejected_like_an_agent_claim(tmp_path):
    sc = _one_node_scenario(tmp_path)

    @dataclass
    class Overbook:
        name: str = "overbook"

        def plan(self, snapshot):  # every job on GPU 0, now
            return Plan(assignments=tuple(Assignment(job_id=j.id, node="n", gpu_ids=tuple(range(j.gpus)),
                                                     start_at=snapshot.now) for j in snapshot.jobs))

    run = Simulation(cluster=sc.cluster, jobs=sc.jobs, carbon=sc.carbon, policy=Overbook(),
                     forecast=parse_forecast("perfect", sc.carbon), settings=SimSettings()).run()
    assert run.rejected_assignments > 0
    assert all(r.state == "done" for r in run.records)
    spans = sorted((r.start_s, r.start_s + r.runtime_s) for r in run.records)
    for (_, a_end), (b_start, _) in zip(spans, spans[1:]):
        assert b_start >= a_end - 1e-6  # they all share GPU 0, one after another


def test_same_seed_same_numbers_and_another_seed_differs(tmp_path):
    sc = scenario(40, tmp_path, slack_s=12 * 3600)
    settings = SimSettings(gpu_mtbf_s=20 * 3600, gpu_repair_s=3600, seed=3)
    specs = parse_policies("fifo,greedy,cpsat:max_time_s=0.3")  # cpsat's budget is work, not wall time

    def numbers(seed):
        res = run_policies(sc, specs, forecast="noisy:0.3", settings=SimSettings(**{**settings.__dict__,
                                                                                  "seed": seed}))
        return {p: {k: v for k, v in s.items() if k not in TIMING_KEYS} for p, s in res.summaries.items()}

    a, b, c = numbers(3), numbers(3), numbers(4)
    assert a == b
    assert a != c
    assert a["fifo"]["gpu_failures"] > 0


def test_failures_requeue_jobs_and_energy_is_still_conserved(tmp_path):
    sc = scenario(40, tmp_path, slack_s=12 * 3600)
    sim = Simulation(cluster=sc.cluster, jobs=sc.jobs, carbon=sc.carbon, policy="fifo",
                     forecast=parse_forecast("perfect", sc.carbon),
                     settings=SimSettings(gpu_mtbf_s=40 * 3600, gpu_repair_s=2 * 3600, seed=1))
    run = sim.run()
    assert run.gpu_failures > 0
    assert any(r.attempts > 1 for r in run.records)
    assert all(r.state == "done" for r in run.records)
    metered = sum(m.energy_j for m in run.meters.values())
    assert metered == pytest.approx(sum(r.energy_j + r.lost_energy_j for r in run.records), rel=1e-9)
    gco2 = sum(m.gco2 for m in run.meters.values())
    assert gco2 == pytest.approx(sum(r.gco2 + r.lost_gco2 for r in run.records), rel=1e-9)


def test_decisions_use_the_forecast_and_emissions_the_actual_intensity(tmp_path):
    sc = scenario(30, tmp_path, slack_s=12 * 3600)
    perfect = run_policies(sc, ["greedy"], forecast="perfect").summaries["greedy"]
    noisy = run_policies(sc, ["greedy"], forecast="noisy:1.0", settings=SimSettings(seed=5)).summaries["greedy"]
    # a very noisy forecast misleads the planner: it cannot do better than perfect knowledge
    assert noisy["kgco2"] > perfect["kgco2"]


def test_oracle_plans_every_job_in_one_look_at_the_future(tmp_path):
    sc = scenario(25, tmp_path, slack_s=12 * 3600)
    res = run_policies(sc, parse_policies("fifo,greedy,oracle:max_time_s=5"), forecast="persistence")
    oracle = res.runs["oracle:max_time_s=5"]
    assert oracle.ticks[0].queued == len(sc.jobs)  # future arrivals included
    assert oracle.ticks[0].committed == len(sc.jobs)
    assert oracle.forecast == "perfect"
    assert all(r.start_s >= r.arrival_s - 1e-6 for r in oracle.records)
    s = res.summaries
    assert s["oracle:max_time_s=5"]["kgco2"] <= s["greedy"]["kgco2"] * 1.001
    assert "of_oracle_savings_pct" in res.comparison["greedy"]


def test_llm_trace_with_prompts_reports_gco2_per_prompt(tmp_path):
    cluster = load_cluster(DEMO / "demo-cluster.toml")
    carbon = {z: load_zone_files(z, [DEMO / f]) for z, f in ZONE_FILES.items()}
    trace = read_jobs(Path(__file__).parents[1] / "data" / "jobs" / "azure_llm_conv_head400.csv",
                      llm_batch_prompts=50)
    sc = build_scenario(cluster, trace, carbon, start=START, slack_s=6 * 3600)
    s = run_policies(sc, ["fifo"]).summaries["fifo"]
    assert s["prompts"] == 400
    assert s["gco2_per_prompt"] == pytest.approx(s["kgco2"] * 1000 / 400)


# -- the CLI -------------------------------------------------------------------------------------

def test_cli_zone_mismatch_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--cluster", str(DEMO / "demo-cluster.toml"), "--jobs", str(pai_slice(tmp_path, 5)),
              "--carbon", f"DE={DEMO / 'DE-LU.csv'}", "--policy", "fifo", "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "without --carbon data: GB, SG, US-CAL-CISO" in err


def test_cli_bad_trace_row_names_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_time,length,cpus\n0,400,1\n5,x,1\n")
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--cluster", str(DEMO / "demo-cluster.toml"), "--jobs", str(bad), *carbon_args(),
              "--policy", "fifo", "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert f"{bad}:3: malformed length" in capsys.readouterr().err


def test_cli_unknown_policy_lists_the_known_ones(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--policy", "fifo,magic", "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert "unknown policy 'magic'; known: " in capsys.readouterr().err


def test_cli_without_trace_arguments_runs_the_bundled_demo_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """Without --out the report is printed, never written: no folder appears where it ran."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--policy", "fifo"])
    assert e.value.code == 0
    captured = capsys.readouterr()
    assert "the bundled demo: 300 PAI jobs" in captured.err
    assert "kgCO2" in captured.out and "report written" not in captured.out
    assert list(tmp_path.iterdir()) == []


def test_report_files_have_portable_names_and_every_gpu_model_in_the_usage_plot(tmp_path, capsys):
    """A policy label with options becomes a file name without `:` or `=`; with --out the
    report names its files in report.json."""
    from scheduler.simulate.report import file_stem

    assert file_stem("cpsat:max_time_s=0.25") == "cpsat-max_time_s-0.25"
    assert file_stem("greedy") == "greedy"
    out = tmp_path / "r"
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--policy", "fifo,greedy:lateness_g_per_gpu_h=50", "--json", "--out", str(out)])
    assert e.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    names = sorted(p.name for p in out.iterdir())
    assert "jobs-greedy-lateness_g_per_gpu_h-50.csv" in names and "gpu_usage.png" in names
    assert all(":" not in n and "=" not in n for n in names)
    assert doc["files"]["report"] == str(out.resolve() / "report.json")


def test_gpu_usage_shows_a_gpu_model_no_policy_used_at_zero(tmp_path):
    from scheduler.simulate.report import gpu_hours_by_model

    sc = scenario(5, tmp_path)
    runs = run_policies(sc, parse_policies("fifo"), forecast="perfect").runs
    models = tuple(sc.cluster.gpus_by_model())
    used = {r.model for r in runs["fifo"].records if r.state == "done"}
    usage = gpu_hours_by_model(runs, models)["fifo"]
    assert set(usage) == set(models) | used
    assert all(usage[m] == 0.0 for m in set(models) - used) and all(usage[m] > 0 for m in used)
    assert len(used) < len(models)  # the scenario leaves a model idle: the case this test is about


@pytest.mark.parametrize("policy", ["greedy", "cpsat:max_time_s=0.5"])
def test_incremental_planning_keeps_plans_between_full_replans_and_loses_no_job(tmp_path, policy):
    """`full_replan_s`: ticks between full re-plans keep the earlier plans and place only new
    jobs; every job still runs once, energy is conserved, and the grams stay close to
    re-planning everything every tick (the trace's jobs barely compete for the same slots)."""
    sc = scenario(60, tmp_path, slack_s=12 * 3600)
    full = run_policies(sc, parse_policies(policy), forecast="perfect").runs[policy]
    inc = run_policies(sc, parse_policies(policy), forecast="perfect",
                       settings=SimSettings(full_replan_s=6 * 3600)).runs[policy]
    assert all(r.state == "done" and r.attempts == 1 for r in inc.records)
    assert sum(m.energy_j for m in inc.meters.values()) == pytest.approx(sum(r.energy_j for r in inc.records))
    kept_ticks = [t for t in inc.ticks if not t.full]
    assert kept_ticks and any(t.kept for t in kept_ticks)
    assert all(t.full for t in full.ticks)
    last_full = None
    for t in inc.ticks:  # no tick keeps plans 6 h or more after the last full re-plan
        if t.full:
            last_full = t.at_s
        else:
            assert last_full is not None and t.at_s - last_full < 6 * 3600
    grams = lambda run: sum(r.gco2 for r in run.records)  # noqa: E731
    assert grams(inc) == pytest.approx(grams(full), rel=0.10)


def test_nodes_of_one_zone_in_sites_with_different_pue_each_pay_their_own(tmp_path):
    """Issue 16 defect 6: a zone can hold two data centres. The cluster file used to be
    refused ("a policy sees one PUE per zone"); now each node's PUE (own, else [zone.Z] pue,
    else [site] pue) scales its own jobs, and the site meters still add up to the jobs."""
    cluster = cluster_from_dict({
        "site": {"pue": 1.3},
        "zone": {"DE": {"pue": 1.2}},
        "node": [{"name": "a-old-hall", "zone": "DE", "gpus": "8xH100", "pue": 1.6},
                 {"name": "b-new-hall", "zone": "DE", "gpus": "8xH100", "pue": 1.05},
                 {"name": "c-default", "zone": "DE", "gpus": "8xH100"},
                 {"name": "gb", "zone": "GB", "gpus": "8xH100"}]})
    assert {n.name: n.pue for n in cluster.nodes} == {"a-old-hall": 1.6, "b-new-hall": 1.05, "c-default": 1.2,
                                                      "gb": 1.3}
    assert {g.node: g.pue for g in cluster.gpu_slots()} == {n.name: n.pue for n in cluster.nodes}
    # simulated on the German halls alone, so the choice is between sites, not zones
    cluster = cluster_from_dict({"zone": {"DE": {"pue": 1.2}}, "node": [
        {"name": n.name, "zone": "DE", "gpus": "8xH100", "pue": n.pue} for n in cluster.nodes if n.zone == "DE"]})
    carbon = {"DE": load_zone_files("DE", [DEMO / ZONE_FILES["DE"]])}
    sc = build_scenario(cluster, read_jobs(pai_slice(tmp_path, 40)), carbon, start=START)
    result = run_policies(sc, ["fifo", "greedy"])
    hours = {"DE": hourly_intensity(DEMO / ZONE_FILES["DE"])}
    pue_of = {n.name: n.pue for n in cluster.nodes}
    for name, run in result.runs.items():
        done = [r for r in run.records if r.state == "done"]
        assert done
        for r in done:
            assert r.pue == pue_of[r.node]
            start, end = (datetime.fromtimestamp(t, timezone.utc) for t in (r.start_s, r.end_s))
            assert r.gco2 == pytest.approx(r.power_w * pue_of[r.node]
                                           * integral_g_per_kwh_s(hours[r.zone], start, end) / 3.6e6, rel=1e-6)
        # conservation: the zone meters (facility power x intensity) hold exactly the jobs' grams
        assert sum(m.gco2 for m in run.meters.values()) == pytest.approx(sum(r.gco2 for r in done), rel=1e-9)
        summary = result.summaries[name]
        facility = sum(r.energy_j * r.pue for r in done) / 3.6e6
        assert summary["facility_energy_kwh"] == pytest.approx(facility, rel=1e-9)
    # the carbon-aware policy prefers the efficient hall of the same zone over the old one
    greedy_de = [r.node for r in result.runs["greedy"].records if r.zone == "DE"]
    assert greedy_de.count("b-new-hall") > greedy_de.count("a-old-hall")
