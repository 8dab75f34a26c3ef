"""Who owns a simulated job: the generic trace's `user`, `account` and `qos` columns, and the
defaults that make a trace without them one account of `normal` jobs."""

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
    assert tenants == {1: Tenant("ana", "research/nlp", "urgent"), 2: Tenant("bo", "default", "normal"),
                       3: Tenant(None, "ops", "flexible")}


def test_a_trace_without_owners_is_one_default_account_of_normal_jobs(tmp_path):
    trace = read_jobs(write(tmp_path, "submit_time,runtime_s\n0,60\n5,60\n"))
    assert set(tenants_of(trace).values()) == {Tenant(None, "default", "normal")}
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


def test_simulate_reports_each_account_and_qos(tmp_path):
    """Two accounts on one H100 node, one flooding it: the report gives each account's
    GPU-hours, shares and waits, each QOS's waits and Jain's index, in the run's JSON."""
    from scheduler.simulate.runner import run_policies
    from scheduler.simulate.scenario import build_scenario, demo_inputs

    cluster, _, carbon, start = demo_inputs()
    rows = ["submit_time,runtime_s,gpus,account,qos"]
    rows += [f"{i * 60},1800,1,flood,normal" for i in range(12)]
    rows += ["30,1800,1,quiet,urgent", "90,1800,1,quiet,normal"]
    trace = read_jobs(write(tmp_path, "\n".join(rows) + "\n"))
    scenario = build_scenario(cluster, trace, carbon, start=start)
    summary = run_policies(scenario, ["fifo"]).summaries["fifo"]
    accounts = summary["accounts"]
    assert set(accounts) == {"flood", "quiet"}
    assert accounts["flood"]["shares"] == accounts["quiet"]["shares"] == 1
    assert accounts["flood"]["gpu_hours"] > accounts["quiet"]["gpu_hours"] > 0
    assert sum(a["share_delivered"] for a in accounts.values()) == pytest.approx(1.0)
    assert summary["qos"]["urgent"]["jobs"] == 1 and summary["qos"]["normal"]["jobs"] == 13
    assert 0 < summary["fairness"]["jain"] <= 1.0
