"""Who owns a simulated job: the generic trace's `user`, `account` and `qos` columns; a trace
without them is one account whose jobs follow the scenario's slack alone. A QOS gives a job
its level's bounds on carbon, and fair share orders the accounts under contention."""

from pathlib import Path

import pytest

from scheduler.simulate.tenancy import Tenant, account_shares, tenants_of
from scheduler.simulate.traces import TraceFormatError, read_jobs


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "jobs.csv"
    p.write_text(text)
    return p


def test_generic_trace_names_each_jobs_user_account_and_qos(tmp_path):
    trace = read_jobs(write(tmp_path, "submit_time,runtime_s,user,account,qos\n"
                                      "0,60,ana,research/nlp,URGENT\n10,60,bo,,\n20,60,,ops,flexible\n"))
    tenants = tenants_of(trace)
    assert tenants == {1: Tenant("ana", "research/nlp", "urgent"), 2: Tenant("bo", "default", None),
                       3: Tenant(None, "ops", "flexible")}


def test_a_trace_without_owners_is_one_default_account_without_qos_rules(tmp_path):
    trace = read_jobs(write(tmp_path, "submit_time,runtime_s\n0,60\n5,60\n"))
    assert set(tenants_of(trace).values()) == {Tenant(None, "default", None)}
    assert account_shares(tenants_of(trace)) == {"default": 1}


@pytest.mark.parametrize("value", ["a b", "/top", "top/", "a//b", "x;drop"])
def test_a_bad_account_name_names_the_file_and_line(tmp_path, value):
    path = write(tmp_path, f"submit_time,runtime_s,account\n0,60,ok\n1,60,{value}\n")
    with pytest.raises(TraceFormatError, match=r"jobs.csv:3: account"):
        read_jobs(path)


def test_accounts_get_equal_shares_unless_the_scenario_gives_them():
    tenants = {1: Tenant(account="a"), 2: Tenant(account="b"), 3: Tenant(account="a")}
    assert account_shares(tenants) == {"a": 1, "b": 1}
    assert account_shares(tenants, {"b": 3}) == {"a": 1, "b": 3}
    with pytest.raises(ValueError, match="whole numbers"):
        account_shares(tenants, {"a": -1})


def test_simulate_reports_each_account_and_qos_over_the_busy_period(tmp_path):
    """Two accounts on one H100, one flooding it: the report gives each account's GPU-hours in
    the windows where jobs asked for more GPUs than there are, its fair target there, its
    waits, each QOS's waits and Jain's index, in the run's JSON."""
    from scheduler.simulate.runner import run_policies

    rows = ["submit_time,runtime_s,gpus,account,qos"]
    rows += [f"{i * 60},1800,1,flood,normal" for i in range(12)]
    rows += ["30,1800,1,quiet,urgent", "90,1800,1,quiet,normal"]
    summary = run_policies(one_gpu_scenario(tmp_path, rows), ["fifo"]).summaries["fifo"]
    accounts = summary["accounts"]
    assert set(accounts) == {"flood", "quiet"}
    assert accounts["flood"]["shares"] == accounts["quiet"]["shares"] == 1
    assert accounts["flood"]["gpu_hours"] > accounts["quiet"]["gpu_hours"] > 0
    assert sum(a["share_delivered"] for a in accounts.values()) == pytest.approx(1.0)
    assert sum(a["share_target"] for a in accounts.values()) == pytest.approx(1.0)
    assert summary["fairness"]["busy_windows"] >= 5
    assert summary["qos"]["urgent"]["jobs"] == 1 and summary["qos"]["normal"]["jobs"] == 13
    assert 0 < summary["fairness"]["jain"] <= 1.0


def test_a_cluster_that_is_never_full_has_no_busy_period():
    from scheduler.simulate.records import JobRecord
    from scheduler.simulate.tenancy import tenant_figures

    from policies.types import QueuedJob
    from datetime import datetime, timezone

    job = QueuedJob(1, 1, 0.0, datetime(2022, 1, 1, tzinfo=timezone.utc), 600.0)
    r = JobRecord(job=job, arrival_s=0.0, deadline_s=None, state="done", start_s=0.0, end_s=600.0, gpu_ids=(0,))
    figures = tenant_figures([r], {1: Tenant(account="a")}, {"a": 1}, capacity_gpus=4)
    assert figures["fairness"] == {"jain": None, "busy_windows": 0}
    assert figures["accounts"]["a"]["gpu_hours"] == 0.0 and figures["accounts"]["a"]["share_target"] is None


def one_gpu_scenario(tmp_path, rows: list[str], **kw):
    """The demo's carbon and a cluster of one H100 in DE."""
    from scheduler.simulate.cluster import load_cluster
    from scheduler.simulate.scenario import build_scenario, demo_inputs

    _, _, carbon, start = demo_inputs()
    cluster_file = tmp_path / "one.toml"
    cluster_file.write_text('[[node]]\nname = "de1"\nzone = "DE"\ngpus = "1xH100"\n')
    trace = read_jobs(write(tmp_path, "\n".join(rows) + "\n"))
    return build_scenario(load_cluster(cluster_file), trace, {"DE": carbon["DE"]}, start=start, **kw)


def test_a_qos_bounds_what_carbon_does_with_a_simulated_job_as_in_the_daemon(tmp_path):
    """The same two-hour job, 20 h of slack: urgent starts at once; flexible may wait for the
    cleaner hours; a job without a QOS follows the scenario's slack alone and waits too."""
    from scheduler.simulate.runner import run_policies

    starts = {}
    for qos in ("urgent", "flexible", ""):
        sc = one_gpu_scenario(tmp_path, ["submit_time,runtime_s,qos", f"0,7200,{qos}"], slack_s=20 * 3600.0)
        r = run_policies(sc, ["greedy"]).runs["greedy"].records[0]
        starts[qos or "none"] = r.start_s - r.arrival_s
    assert starts["urgent"] < 900.0
    assert starts["flexible"] > 3600.0 and starts["none"] > 3600.0


def test_an_unknown_qos_in_a_trace_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown QOS 'gold'; known: flexible, normal, urgent"):
        one_gpu_scenario(tmp_path, ["submit_time,runtime_s,qos", "0,60,gold"])


def test_fair_share_serves_the_account_that_has_used_less_first(tmp_path):
    """One GPU; account `flood` submits eight one-hour jobs, then `quiet` one; all urgent
    (no carbon wait). With fair share the quiet account's job runs as soon as the flood's
    first one is done; without it, after all of the flood's jobs that came before it."""
    from scheduler.simulate.runner import run_policies
    from scheduler.simulate.settings import SimSettings

    rows = ["submit_time,runtime_s,account,qos"] + [f"{i},3600,flood,urgent" for i in range(8)] + ["60,3600,quiet,urgent"]
    sc = one_gpu_scenario(tmp_path, rows, slack_s=48 * 3600.0)
    waits = {}
    for fair in (True, False):
        run = run_policies(sc, ["greedy"], settings=SimSettings(fair_share=fair)).runs["greedy"]
        quiet = next(r for r in run.records if sc.tenants[r.job.id].account == "quiet")
        waits[fair] = quiet.start_s - quiet.arrival_s
    assert waits[True] <= 3600.0 + 900.0
    assert waits[False] >= 7 * 3600.0
