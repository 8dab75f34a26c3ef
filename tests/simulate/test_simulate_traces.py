"""Simulator inputs: job trace adapters, cluster files, carbon files and forecast models."""

from __future__ import annotations

import csv
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from scheduler.simulate.cluster import ClusterSpecError, cluster_from_dict, load_cluster
from scheduler.simulate.forecasts import parse_forecast
from scheduler.simulate.intensity import (
    CarbonInputError,
    check_zones,
    from_hourly,
    load_carbon,
    load_zone_files,
)
from scheduler.simulate.scenario import build_scenario, demo_dir
from scheduler.simulate.traces import TraceFormatError, detect_format, read_jobs

DATA = Path(__file__).parents[1] / "data"
DEMO = demo_dir()
LLM_SLICE = DATA / "jobs" / "azure_llm_conv_head400.csv"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# -- job traces ----------------------------------------------------------------------------------

def test_header_detection_tells_the_four_formats_apart():
    assert detect_format(["arrival_time", "length", "cpus"]) == "gaia"
    assert detect_format("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                         "creation_time,deletion_time,scheduled_time".split(",")) == "alibaba"
    assert detect_format(["TIMESTAMP", "ContextTokens", "GeneratedTokens"]) == "llm"
    assert detect_format(["submit_time", "gpus", "runtime_s", "workload"]) == "generic"
    assert detect_format(["a", "b"]) is None


def test_gaia_slice_in_seconds_is_read_as_seconds():
    trace = read_jobs(DEMO / "pai_demo.csv")
    with open(DEMO / "pai_demo.csv") as f:
        rows = list(csv.DictReader(f))
    assert trace.fmt == "gaia" and trace.time_unit == "s"
    assert len(trace.jobs) == len(rows)
    assert trace.jobs[3].arrival_s == float(rows[3]["arrival_time"])
    assert trace.jobs[3].est_runtime_s == float(rows[3]["length"])
    assert trace.jobs[2].gpus == int(rows[2]["cpus"])


def test_gaia_trace_with_lengths_in_hours_is_detected(tmp_path):
    p = write(tmp_path, "h.csv", "arrival_time,length,cpus\n0.0,25.4,1\n0.5,0.66,2\n10.25,1.5,1\n")
    trace = read_jobs(p)
    assert trace.time_unit == "h"
    assert trace.jobs[1].arrival_s == pytest.approx(0.5 * 3600)
    assert trace.jobs[1].est_runtime_s == pytest.approx(0.66 * 3600)
    forced = read_jobs(p, time_unit="s")
    assert forced.jobs[1].est_runtime_s == pytest.approx(0.66)


def test_bad_row_names_file_and_line(tmp_path):
    p = write(tmp_path, "bad.csv", "arrival_time,length,cpus\n0,400,1\n10,abc,1\n")
    with pytest.raises(TraceFormatError) as e:
        read_jobs(p)
    assert e.value.line == 3 and "length" in str(e.value) and str(p) in str(e.value)
    p2 = write(tmp_path, "short.csv", "arrival_time,length,cpus\n0,400,1\n5,600\n")
    with pytest.raises(TraceFormatError, match=r":3: expected 3 fields"):
        read_jobs(p2)
    p3 = write(tmp_path, "neg.csv", "arrival_time,length,cpus\n0,400,0\n")
    with pytest.raises(TraceFormatError, match=r":2: cpus"):
        read_jobs(p3)


def test_unknown_header_is_a_clear_error(tmp_path):
    p = write(tmp_path, "x.csv", "foo,bar\n1,2\n")
    with pytest.raises(TraceFormatError, match="unrecognised header"):
        read_jobs(p)


def test_alibaba_pods_become_gpu_jobs_and_the_rest_is_counted(tmp_path):
    header = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
              "creation_time,deletion_time,scheduled_time\n")
    rows = [
        "pod-a,8000,32768,2,1000,V100M32,BE,Succeeded,100,5100,300",      # 2 GPUs, runs 4800 s
        "pod-b,4000,16384,1,500,T4,LS,Running,200,900,210",                # GPU share, latency-sensitive
        "pod-c,2000,4096,0,0,,BE,Succeeded,300,800,310",                   # CPU only
        "pod-d,2000,4096,1,1000,P100,BE,Pending,400,,",                    # never scheduled
        "pod-e,2000,4096,1,1000,P100,BE,Running,500,,600",                 # still running
    ]
    p = write(tmp_path, "pods.csv", header + "\n".join(rows) + "\n")
    trace = read_jobs(p)
    assert trace.fmt == "alibaba"
    assert [(j.name, j.gpus, j.est_runtime_s, j.arrival_s) for j in trace.jobs] == [
        ("pod-a", 2, 4800.0, 100.0), ("pod-b", 1, 690.0, 200.0)]
    assert trace.jobs[1].slack_s == 0.0 and trace.jobs[0].slack_s is None
    assert trace.skipped == {"CPU-only pods": 1, "pods never scheduled": 1,
                             "pods still running at the trace end": 1}
    bad = write(tmp_path, "bad.csv", header + "pod-x,1,1,1,1000,T4,BE,Succeeded,100,500,50\n")
    with pytest.raises(TraceFormatError, match=r":2: .*scheduled"):
        read_jobs(bad)


def test_llm_requests_are_batched_by_count_and_window():
    with open(LLM_SLICE) as f:
        rows = list(csv.DictReader(f))
    trace = read_jobs(LLM_SLICE, llm_batch_prompts=150, llm_batch_window_s=3600)
    assert trace.fmt == "llm"
    # 400 requests in batches of at most 150: 150, 150, 100
    assert [j.prompts for j in trace.jobs] == [150, 150, 100]
    assert sum(j.tokens for j in trace.jobs) == sum(int(r["ContextTokens"]) + int(r["GeneratedTokens"])
                                                   for r in rows)
    assert all(j.workload == "llm-chat-8b" and j.gpus == 1 for j in trace.jobs)
    # the origin is the first request; a batch is submitted when its last request arrives
    first = datetime.fromisoformat(rows[0]["TIMESTAMP"][:26]).replace(tzinfo=timezone.utc)
    assert trace.origin == first
    last_of_first = datetime.fromisoformat(rows[149]["TIMESTAMP"][:26]).replace(tzinfo=timezone.utc)
    assert trace.jobs[0].arrival_s == pytest.approx((last_of_first - first).total_seconds(), abs=1e-6)
    # a 30 s window cuts more often than the count does
    by_window = read_jobs(LLM_SLICE, llm_batch_prompts=10_000, llm_batch_window_s=30)
    assert len(by_window.jobs) >= 3 and sum(j.prompts for j in by_window.jobs) == 400
    for j in by_window.jobs:
        assert j.prompts <= 400


def test_generic_csv_with_iso_times_durations_work_and_deadlines(tmp_path):
    p = write(tmp_path, "g.csv",
              "name,submit_time,gpus,runtime,work_gpu_h,workload,prompts,deadline,gpu_mem_gib\n"
              "a,2022-10-19T16:00:00Z,2,90m,,,,2022-10-20T16:00:00Z,40\n"
              "b,2022-10-19T17:00:00Z,4,,8,,,,\n"
              "c,2022-10-19T18:30:00+02:00,1,,,llm-chat-8b,5000,,\n")
    trace = read_jobs(p)
    assert trace.fmt == "generic"
    assert trace.origin == datetime(2022, 10, 19, 16, tzinfo=timezone.utc)
    a, c, b = trace.jobs  # sorted by arrival: c (16:30 UTC) comes before b (17:00 UTC)
    assert (a.arrival_s, a.gpus, a.est_runtime_s, a.deadline_s, a.gpu_mem_gib) == (0.0, 2, 5400.0, 86400.0, 40.0)
    assert (b.arrival_s, b.est_runtime_s) == (3600.0, 8 * 3600 / 4)
    assert (c.arrival_s, c.workload, c.prompts, c.est_runtime_s) == (1800.0, "llm-chat-8b", 5000, None)


def test_generic_row_without_any_runtime_is_rejected_with_its_line(tmp_path):
    p = write(tmp_path, "g.csv", "submit_time,gpus,runtime_s\n0,1,60\n10,1,\n")
    with pytest.raises(TraceFormatError, match=r":3: a job needs"):
        read_jobs(p)


# -- cluster files -------------------------------------------------------------------------------

def test_example_clusters_load():
    root = Path(__file__).parents[2] / "examples"
    c4 = load_cluster(root / "cluster-4zone.toml")
    assert c4.zones == ["DE", "GB", "SG", "US-CAL-CISO"]
    assert sum(c4.gpus_by_model().values()) == 64 and len(c4.gpu_slots()) == 64
    assert c4.pue["US-CAL-CISO"] == 1.1 and c4.max_gpus_per_node() == 8
    gaia = load_cluster(root / "cluster-gaia-de.toml")
    assert gaia.zones == ["DE"] and gaia.gpus_by_model() == {"H100": 1024}


@pytest.mark.parametrize("data, message", [
    ({"node": []}, "no \\[\\[node\\]\\]"),
    ({"node": [{"name": "a", "zone": "DE", "gpus": "8xFOO"}]}, "unknown GPU model"),
    ({"node": [{"name": "a", "zone": "DE", "gpus": "8xH100"}, {"name": "a", "zone": "DE", "gpus": "8xH100"}]},
     "duplicate node name"),
    ({"node": [{"name": "a", "zone": "DE", "gpus": "8xH100", "pue": 0.9}]}, "below 1.0"),
    ({"node": [{"name": "a", "zone": "DE", "gpus": "8xH100", "color": "red"}]}, "unknown key"),
])
def test_bad_cluster_files_say_what_is_wrong(data, message):
    with pytest.raises(ClusterSpecError, match=message):
        cluster_from_dict(data, "c.toml")


def test_carbon_zone_mismatch_is_a_clear_error():
    cluster = cluster_from_dict({"node": [{"name": "a", "zone": "DE", "gpus": "8xH100"},
                                          {"name": "b", "zone": "FR", "gpus": "8xH100"}]})
    carbon = load_carbon([f"DE={DEMO / 'DE-LU.csv'}", f"GB={DEMO / 'GB.csv'}"])
    with pytest.raises(CarbonInputError) as e:
        check_zones(cluster.zones, carbon)
    assert "without --carbon data: FR" in str(e.value) and "not in the cluster: GB" in str(e.value)
    with pytest.raises(CarbonInputError, match="expected ZONE=FILE"):
        load_carbon([str(DEMO / "GB.csv")])


def test_carbon_file_read_with_the_carbon_layer_and_relabelled():
    de = load_zone_files("DE", [DEMO / "DE-LU.csv"])
    with open(DEMO / "DE-LU.csv", encoding="utf-8") as f:
        rows = list(csv.reader(f))[1:]
    assert de.n_hours == len(rows) and de.signal == "average"
    assert de.values_g_per_kwh[5] == float(rows[5][4])
    start = datetime.fromisoformat(rows[0][0]).replace(tzinfo=timezone.utc).timestamp()
    # integral over 1.5 hours from the start of hour 2
    t0 = start + 2 * 3600
    expected = float(rows[2][4]) * 3600 + float(rows[3][4]) * 1800
    assert de.integral_g_per_kwh_s(t0, t0 + 5400) == pytest.approx(expected)


# -- forecast models -----------------------------------------------------------------------------

def _zone():
    values = {h: 100.0 + 10 * (h % 24) + h * 0.5 for h in range(460_000, 460_000 + 24 * 10)}
    return from_hourly("Z", values, signal="average", source="test")


def test_perfect_forecast_is_the_actual_intensity():
    z = _zone()
    f = parse_forecast("perfect", {"Z": z})
    now = (460_000 + 48) * 3600 + 1200
    curve = f.curve("Z", now, 6 * 3600)
    assert curve.start.timestamp() == (460_000 + 48) * 3600 and curve.step_s == 3600
    assert list(curve.values_g_per_kwh) == [z.hour_value(460_048 + i) for i in range(7)]


def test_noisy_forecast_is_seeded_and_reproducible():
    z = _zone()
    now = (460_000 + 72) * 3600
    a = parse_forecast("noisy:0.2", {"Z": z}, seed=7).curve("Z", now, 24 * 3600).values_g_per_kwh
    b = parse_forecast("noisy:20%", {"Z": z}, seed=7).curve("Z", now, 24 * 3600).values_g_per_kwh
    c = parse_forecast("noisy:0.2", {"Z": z}, seed=8).curve("Z", now, 24 * 3600).values_g_per_kwh
    actual = [z.hour_value(460_072 + i) for i in range(25)]
    assert a == b and a != c and list(a) != actual
    rel = [abs(x / y - 1) for x, y in zip(a, actual)]
    assert 0.05 < sum(rel) / len(rel) < 0.4  # about sigma * sqrt(2/pi) = 0.16
    zero = parse_forecast("noisy:0", {"Z": z}).curve("Z", now, 24 * 3600).values_g_per_kwh
    assert list(zero) == actual


def test_persistence_is_the_value_24h_earlier():
    z = _zone()
    issue = 460_000 + 100
    curve = parse_forecast("persistence", {"Z": z}).curve("Z", issue * 3600 + 600, 30 * 3600)
    values = curve.values_g_per_kwh
    for i in range(24):  # targets up to a day ahead: the same hour yesterday
        assert values[i] == z.hour_value(issue + i - 24)
    for i in range(24, 31):  # the next day: two days earlier (yesterday's value is not known yet)
        assert values[i] == z.hour_value(issue + i - 48)


def test_own_model_uses_only_hours_known_at_the_tick():
    z = _zone()
    issue = 460_000 + 200
    values = dict(z.hourly_dict())
    f1 = parse_forecast("model", {"Z": z}).curve("Z", issue * 3600, 24 * 3600).values_g_per_kwh
    for h in range(issue, issue + 40):  # change the future
        values[h] = 9999.0
    f2 = parse_forecast("model", {"Z": from_hourly("Z", values, signal="average", source="t")}) \
        .curve("Z", issue * 3600, 24 * 3600).values_g_per_kwh
    assert f1 == f2
    from telemetry.grid.forecast import baseline_forecast

    expected = baseline_forecast(z.hourly_dict(), issue - 1, range(issue, issue + 25))
    assert list(f1) == expected


def test_unknown_forecast_is_refused():
    with pytest.raises(ValueError, match="unknown forecast"):
        parse_forecast("crystal-ball", {})
    with pytest.raises(ValueError, match="noisy needs"):
        parse_forecast("noisy", {})


# -- scenario -------------------------------------------------------------------------------------

def test_scenario_aligns_the_trace_and_sets_deadlines_and_max_wait():
    cluster = load_cluster(DEMO / "demo-cluster.toml")
    carbon = {z: load_zone_files(z, [DEMO / f]) for z, f in
              {"DE": "DE-LU.csv", "GB": "GB.csv", "US-CAL-CISO": "US-CAL-CISO.csv", "SG": "SG.csv"}.items()}
    trace = read_jobs(DEMO / "pai_demo.csv")
    start = datetime(2022, 10, 19, 16, tzinfo=timezone.utc)
    sc = build_scenario(cluster, trace, carbon, start=start, slack_s=6 * 3600, max_wait_s=3600)
    assert sc.jobs[0].submitted_at == start
    j = sc.jobs[10]
    assert j.submitted_at == start + timedelta(seconds=trace.jobs[10].arrival_s - trace.jobs[0].arrival_s)
    assert j.max_delay_s == 3600
    # the slack is on top of the job's runtime on the fastest model that can take it (B200 here)
    from policies.model.energy import ProfileBook, job_shape, seed_profiles

    best = min(job_shape(j, m, ProfileBook(seed_profiles()), 3600).runtime_s for m in cluster.gpus_by_model())
    assert j.deadline == j.submitted_at + timedelta(seconds=best + 6 * 3600)
    with pytest.raises(CarbonInputError, match="outside the carbon data"):
        build_scenario(cluster, trace, carbon, start=datetime(2021, 1, 1, tzinfo=timezone.utc))
