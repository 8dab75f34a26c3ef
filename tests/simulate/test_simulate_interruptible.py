"""The simulator runs interruptible jobs in their planned segments (issue 30).

A synthetic zone whose intensity is clean, then dirty, then clean again: an 8-hour job with
a deadline that one piece cannot meet in clean hours is cut around the dirty hours by
greedy. The simulator must run each segment, conserve the job's work across them (a
checkpoint job's segments do its runtime plus one resume cost per resume, no more, no less),
count a pause job's idle power while it holds its GPUs, and account the meters' energy and
grams as the sum of the segments (and pauses).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from policies.types import QueuedJob
from policies.problem.segments import idle_power_w
from scheduler.simulate.cluster import cluster_from_dict
from scheduler.simulate.forecasts import ForecastModel
from scheduler.simulate.intensity import ZoneIntensity
from scheduler.simulate.model import Simulation
from scheduler.simulate.scenario import Interruptible
from scheduler.simulate.settings import SimSettings
from scheduler.simulate.traces import read_jobs

START = datetime(2022, 10, 19, 0, tzinfo=timezone.utc)
RESUME_S = 300.0
RUNTIME_S = 8 * 3600.0


def _zone() -> ZoneIntensity:
    # 6 clean hours, 6 dirty, 12 clean, then dirty for two days
    hours = [100.0] * 6 + [500.0] * 6 + [100.0] * 12 + [400.0] * 48
    return ZoneIntensity(zone="DE", first_hour=int(START.timestamp() // 3600), values_g_per_kwh=np.array(hours),
                         signal="average", source="synthetic")


def _run(kind: str | None, gpus: int = 1):
    cluster = cluster_from_dict({"node": [{"name": "n", "zone": "DE", "gpus": f"{gpus}xH100"}]})
    carbon = {"DE": _zone()}
    job = QueuedJob(id=1, gpus=1, gpu_mem_gib=10, submitted_at=START, est_runtime_s=RUNTIME_S,
                    deadline=START + timedelta(hours=15), interruptible=kind, min_run_s=3600.0,
                    resume_cost_s=RESUME_S)
    sim = Simulation(cluster=cluster, jobs=[job], carbon=carbon, policy="greedy",
                     forecast=ForecastModel(kind="perfect", zones=carbon, name="perfect"),
                     settings=SimSettings(plan_interval_s=900.0, wake_on_submit=True))
    return sim.run()


def _metered(run) -> tuple[float, float]:
    return sum(m.energy_j for m in run.meters.values()), sum(m.gco2 for m in run.meters.values())


def test_a_checkpoint_job_runs_in_segments_that_conserve_its_work():
    run = _run("checkpoint")
    r = run.records[0]
    assert r.state == "done"
    assert len(r.segment_log) >= 2, r.explanation
    # work: every segment's running time less the resume it paid adds up to the job's runtime
    ran = [end - start for start, end, _, _ in r.segment_log]
    resumes = len(r.segment_log) - 1
    assert sum(ran) == pytest.approx(RUNTIME_S + resumes * RESUME_S, abs=1e-6)
    # no segment runs in the dirty hours (06:00-12:00)
    dirty = (START + timedelta(hours=6)).timestamp(), (START + timedelta(hours=12)).timestamp()
    assert all(end <= dirty[0] + 1e-6 or start >= dirty[1] - 1e-6 for start, end, _, _ in r.segment_log)
    assert r.end_s <= (START + timedelta(hours=15)).timestamp()
    assert r.job.resume_count == resumes
    # the meters saw exactly the segments
    energy, gco2 = _metered(run)
    assert energy == pytest.approx(sum(e for *_, e, _ in r.segment_log), rel=1e-9)
    assert energy == pytest.approx(r.energy_j, rel=1e-9)
    assert gco2 == pytest.approx(r.gco2, rel=1e-9)


def test_a_checkpoint_job_emits_less_than_the_same_job_in_one_piece():
    whole = _run(None)
    cut = _run("checkpoint")
    assert len(whole.records[0].segment_log) == 1
    assert _metered(cut)[1] < 0.7 * _metered(whole)[1]


def test_a_pause_job_holds_its_gpus_and_its_idle_energy_is_counted():
    run = _run("pause")
    r = run.records[0]
    assert r.state == "done"
    assert len(r.segment_log) >= 2
    ran = [end - start for start, end, _, _ in r.segment_log]
    assert sum(ran) == pytest.approx(RUNTIME_S + (len(ran) - 1) * RESUME_S, abs=1e-6)
    paused_s = sum(b[0] - a[1] for a, b in zip(r.segment_log, r.segment_log[1:]))
    assert paused_s > 3600
    assert r.idle_energy_j == pytest.approx(idle_power_w("H100", 1) * paused_s, rel=1e-9)
    energy, gco2 = _metered(run)
    busy = sum(e for *_, e, _ in r.segment_log)
    assert energy == pytest.approx(busy + r.idle_energy_j, rel=1e-9)
    assert gco2 == pytest.approx(r.gco2, rel=1e-9)
    assert r.idle_gco2 > 0


def test_pause_job_gpus_are_not_given_to_another_job_during_its_pause():
    cluster = cluster_from_dict({"node": [{"name": "n", "zone": "DE", "gpus": "1xH100"}]})
    carbon = {"DE": _zone()}
    pause = QueuedJob(id=1, gpus=1, gpu_mem_gib=10, submitted_at=START, est_runtime_s=RUNTIME_S,
                      deadline=START + timedelta(hours=15), interruptible="pause", min_run_s=3600.0)
    # a short job arriving in the pause: it would start at once on a free GPU
    other = QueuedJob(id=2, gpus=1, gpu_mem_gib=10, submitted_at=START + timedelta(hours=7), est_runtime_s=3600.0)
    sim = Simulation(cluster=cluster, jobs=[pause, other], carbon=carbon, policy="greedy",
                     forecast=ForecastModel(kind="perfect", zones=carbon, name="perfect"),
                     settings=SimSettings(plan_interval_s=900.0, wake_on_submit=True))
    run = sim.run()
    p, o = run.records
    assert len(p.segment_log) >= 2
    held = p.segment_log[0][0], p.segment_log[-1][1]
    assert o.state == "done"
    assert o.end_s <= held[0] + 1e-6 or o.start_s >= held[1] - 1e-6


def test_share_of_interruptible_jobs_and_the_trace_column(tmp_path):
    from scheduler.simulate.scenario import build_scenario

    trace = tmp_path / "jobs.csv"
    rows = ["submit_time,gpus,runtime_s,interruptible"]
    rows += [f"{i * 60},1,7200,{'pause' if i == 0 else ''}" for i in range(40)]
    trace.write_text("\n".join(rows) + "\n")
    cluster = cluster_from_dict({"node": [{"name": "n", "zone": "DE", "gpus": "8xH100"}]})
    sc = build_scenario(cluster, read_jobs(trace), {"DE": _zone()}, start=START,
                        interruptible=Interruptible(share=0.5, kind="checkpoint", min_run_s=1800.0,
                                                    resume_cost_s=60.0))
    kinds = [j.interruptible for j in sc.jobs]
    assert kinds[0] == "pause"  # the trace's own column wins
    cut = [j for j in sc.jobs[1:] if j.interruptible == "checkpoint"]
    assert 10 <= len(cut) <= 30
    assert all(j.min_run_s == 1800.0 and j.resume_cost_s == 60.0 for j in cut)
    assert sc.notes["interruptible_jobs"] == 1 + len(cut)
    again = build_scenario(cluster, read_jobs(trace), {"DE": _zone()}, start=START,
                           interruptible=Interruptible(share=0.5))
    assert [j.interruptible for j in again.jobs] == kinds  # seeded
    with pytest.raises(ValueError):
        Interruptible(share=1.5)


def test_a_long_checkpoint_job_is_planned_over_its_whole_window_past_the_horizon():
    """A 40-hour checkpoint job due in 64 hours: dirty hours at 16-40 h, clean ones at 48-64 h,
    past the 48-hour planning horizon. The simulated planner stretches its horizon to the
    job's deadline, so the job skips most of the dirty hours and still finishes on time."""
    hours = [100.0] * 16 + [600.0] * 24 + [300.0] * 8 + [50.0] * 20 + [400.0] * 100
    carbon = {"DE": ZoneIntensity(zone="DE", first_hour=int(START.timestamp() // 3600),
                                  values_g_per_kwh=np.array(hours), signal="average", source="synthetic")}
    cluster = cluster_from_dict({"node": [{"name": "n", "zone": "DE", "gpus": "1xH100"}]})
    job = QueuedJob(id=1, gpus=1, gpu_mem_gib=10, submitted_at=START, est_runtime_s=40 * 3600.0,
                    deadline=START + timedelta(hours=64), interruptible="checkpoint", min_run_s=3600.0,
                    resume_cost_s=60.0)
    run = Simulation(cluster=cluster, jobs=[job], carbon=carbon, policy="greedy",
                     forecast=ForecastModel(kind="perfect", zones=carbon, name="perfect"),
                     settings=SimSettings(plan_interval_s=3600.0, wake_on_submit=True)).run()
    r = run.records[0]
    assert r.state == "done" and r.end_s <= job.deadline.timestamp() + 1.0
    t0 = START.timestamp()
    dirty_h = sum(max(0.0, min(e, t0 + 40 * 3600) - max(s, t0 + 16 * 3600)) for s, e in
                  ((seg[0], seg[1]) for seg in r.segment_log)) / 3600.0
    assert dirty_h <= 4.0, r.segment_log  # a 48-hour horizon leaves 16 of the 24 dirty hours in the run
