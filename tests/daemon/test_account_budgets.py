"""Account budgets in the daemon (SQLite and PostgreSQL): limits set by an operator, held by
the planner the way Slurm holds a job at `GrpTRESMins`, refused at submit when a job could
never fit, and shown in `share`.

- A job whose plan would take its account over this month's CO2 limit waits with a REASON
  naming the limit, the account's use and the job's estimate, and no other job's details;
  once the next month begins (the clock moves on) it is planned.
- A child account's limit and its parent's both bind; the parent counts its whole subtree.
- A running job is never stopped by a limit: it counts, and a queued job waits instead.
- A job that alone is over a whole limit is refused at submit with one line.
- Usage is charged times the job's QOS usage factor (flexible 0.5, urgent 1.5).
- Raising a limit lets a held job through at the next tick (the tick is not skipped as
  unchanged); a flexible job may use the grace an operator allows, a normal one not.
- The limits are set with `account modify --limit`, listed with the accounts, and a
  malformed one is refused with one line; `share` shows this period's use of each.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import update

from scheduler.carbon import CarbonSignals
from scheduler.daemon.access import Caller, RequestError, ServiceConfig
from scheduler.daemon.planner import Planner
from scheduler.daemon.policy_factory import make_policy
from scheduler.daemon.service import JobService
from scheduler.qos import QosTable
from scheduler.standing import Standing
from scheduler.store.models import jobs, nodes

from tests.daemon.test_planner_carbon import DE, T, add_node, import_carbon, job_row

ROOT = Caller(uid=0, gid=0)
NEXT_MONTH = datetime(2022, 2, 1, 0, 5, tzinfo=timezone.utc)


class Clock:
    """The daemon's clock, moved on by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock():
    return Clock(T)


@pytest.fixture
def service(store, tmp_path, clock):
    return JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs", clock=clock,
                      carbon=CarbonSignals(store, track_status=False))


@pytest.fixture
def world(store, service, clock):
    """DE's carbon, one H100 in DE, and the accounts research, research/nlp, research/vision."""
    import_carbon(store, DE)
    add_node(store, "de1", "DE")
    for name in ("research", "research/nlp", "research/vision"):
        op(service, "accounts/add", {"name": name})
        op(service, "users/add", {"user": "root", "account": name})
    return Planner(store, make_policy("greedy", plan_interval_s=15.0), clock=clock, plan_interval_s=15.0,
                   standing=Standing(QosTable()))


def op(service, path: str, body=None, method: str = "POST"):
    return service.accounts.route(method, path.split("/"), {}, body, ROOT)[1]


def submit(service, **body) -> int:
    return service.submit(ROOT, {"argv": ["true"], "gpus": 1, **body})["id"]


def ran(store, service, account: str, *, gco2: float, hours: float = 1.0, qos: str = "normal",
        ended: datetime = T - timedelta(hours=1), state: str = "COMPLETED") -> int:
    """A job of `account` that ran for `hours` on GPU 1 and emitted `gco2` (still running:
    `state` RUNNING, its plan's estimate `gco2`)."""
    job_id = submit(service, est_runtime_s=hours * 3600.0, account=account, qos=qos)
    values = dict(state=state, started_at=ended - timedelta(hours=hours), gpu_ids=[1])
    if state == "RUNNING":
        values.update(est_gco2=gco2, est_energy_j=0.7 * hours * 3.6e6, est_runtime_planned_s=hours * 3600.0)
    else:
        values.update(ended_at=ended, gco2=gco2, energy_j=0.7 * hours * 3.6e6)
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))
    return job_id


def heartbeat(store, at: datetime) -> None:
    with store.write() as conn:
        conn.execute(update(nodes).values(last_heartbeat=at))


def test_a_job_over_its_accounts_remaining_co2_waits_with_its_reason_and_is_planned_next_month(
        store, service, world, clock):
    op(service, "accounts/modify", {"name": "research/nlp", "limits": ["co2=1kg/month"]})
    ran(store, service, "research/nlp", gco2=950.0)
    job = submit(service, est_runtime_s=3600.0, account="research/nlp")
    world.tick()
    row = job_row(store, job)
    assert row.state == "PENDING"
    assert row.reason.startswith("account research/nlp: co2 limit 1 kg/month, 0.95 kg used or committed, "
                                 "this job ~0.")
    assert row.reason.endswith("(AssocGrpCO2Limit)")
    assert "root" not in row.reason and "job " not in row.reason.replace("this job", "")
    clock.now = NEXT_MONTH
    heartbeat(store, NEXT_MONTH)
    world.tick()
    assert job_row(store, job).state == "PLANNED"


def test_a_childs_limit_and_its_parents_both_bind(store, service, world):
    op(service, "accounts/modify", {"name": "research", "limits": ["co2=1kg/month"]})
    op(service, "accounts/modify", {"name": "research/nlp", "limits": ["co2=50kg/month"]})
    ran(store, service, "research/vision", gco2=950.0)  # the sibling's use counts against the parent
    held_by_parent = submit(service, est_runtime_s=3600.0, account="research/nlp")
    world.tick()
    assert job_row(store, held_by_parent).reason.startswith("account research: co2 limit 1 kg/month, 0.95 kg")

    op(service, "accounts/modify", {"name": "research", "limits": ["co2=none"]})
    op(service, "accounts/modify", {"name": "research/nlp", "limits": ["co2=0.9kg/month"]})
    ran(store, service, "research/nlp", gco2=880.0)
    world.tick()
    assert job_row(store, held_by_parent).reason.startswith("account research/nlp: co2 limit 0.9 kg/month, 0.88 kg")
    # the vision account, under the same parent but with no limit of its own, is not held
    free = submit(service, est_runtime_s=3600.0, account="research/vision")
    world.tick()
    assert job_row(store, free).state == "PLANNED"


def test_a_running_job_is_never_stopped_by_a_limit_and_counts_against_it(store, service, world):
    add_node(store, "de2", "DE")
    running = ran(store, service, "research", gco2=5000.0, hours=10.0, state="RUNNING", ended=T + timedelta(hours=5))
    op(service, "accounts/modify", {"name": "research", "limits": ["co2=1kg/month"]})
    queued = submit(service, est_runtime_s=600.0, account="research")
    world.tick()
    row = job_row(store, running)
    assert row.state == "RUNNING" and row.cancel_requested_at is None
    assert job_row(store, queued).reason.startswith("account research: co2 limit 1 kg/month, 5 kg used or committed")


def test_a_job_alone_over_a_whole_limit_is_refused_at_submit_with_one_line(store, service, world):
    op(service, "accounts/modify", {"name": "research", "limits": ["gpu_hours=10/month"]})
    with pytest.raises(RequestError) as e:
        submit(service, est_runtime_s=6 * 3600.0, gpus=2, account="research/nlp")
    assert e.value.status == 400 and "\n" not in e.value.message
    assert e.value.message == ("refused: this job needs ~12 GPU-h, more than account research's whole gpu_hours "
                               "limit of 10 GPU-h/month: it could never start under it (AssocGrpGPUHoursLimit)")
    op(service, "accounts/modify", {"name": "research", "limits": ["gpu_hours=none", "co2=1kg/month"]})
    with pytest.raises(RequestError) as e:  # 40 H100-hours at DE's intensity now: far over 1 kg
        submit(service, est_runtime_s=40 * 3600.0, account="research")
    assert e.value.status == 400 and "co2 limit of 1 kg/month" in e.value.message
    assert submit(service, est_runtime_s=600.0, account="research") > 0  # one that fits is taken


def test_usage_is_charged_times_the_qos_usage_factor(store, service, world):
    op(service, "accounts/modify", {"name": "research/nlp", "limits": ["co2=10kg/month"]})
    op(service, "accounts/modify", {"name": "research/vision", "limits": ["co2=10kg/month", "gpu_hours=100/month"]})
    ran(store, service, "research/nlp", gco2=2000.0, qos="flexible")  # x 0.5
    ran(store, service, "research/vision", gco2=2000.0, hours=2.0, qos="urgent")  # x 1.5
    doc = service.standing.share(ROOT)
    used = {(b["account"], b["currency"]): b["used"] for b in doc["budgets"]}
    assert used[("research/nlp", "kgco2e")] == pytest.approx(1.0)
    assert used[("research/vision", "kgco2e")] == pytest.approx(3.0)
    assert used[("research/vision", "gpu_hours")] == pytest.approx(3.0)  # 2 GPU-hours x 1.5


def test_share_marks_a_limit_80_percent_used_and_the_planner_logs_it_once(store, service, world, caplog):
    op(service, "accounts/modify", {"name": "research", "limits": ["co2=1kg/month"]})
    ran(store, service, "research/nlp", gco2=850.0)
    [b] = service.standing.share(ROOT)["budgets"]
    assert (b["account"], b["used_fraction"], b["warning"]) == ("research", pytest.approx(0.85), True)
    assert (b["period_start"], b["period_end"]) == ("2022-01-01T00:00:00Z", "2022-02-01T00:00:00Z")
    with caplog.at_level(logging.WARNING, logger="scheduler.daemon.budget_gate"):
        world.tick()
        submit(service, est_runtime_s=60.0, account="research")
        world.tick()
    warnings = [r.getMessage() for r in caplog.records if "% of its co2 limit" in r.getMessage()]
    assert warnings == ["account research has used or committed 85 % of its co2 limit (0.85 kg used of "
                        "1 kg/month since 2022-01-01)"]


def test_limits_are_listed_with_the_accounts_and_a_malformed_one_is_one_line(store, service, world):
    out = op(service, "accounts/modify", {"name": "research", "limits": ["co2=500kg/month", "energy=800kWh/quarter"]})
    assert out["limits"]["kgco2e"] == {"amount": 500.0, "unit": "kg", "period": "month", "text": "500 kg/month"}
    listed = {a["name"]: a for a in op(service, "accounts", method="GET")}
    assert set(listed["research"]["limits"]) == {"kgco2e", "kwh"} and listed["research/nlp"]["limits"] == {}
    with pytest.raises(RequestError) as e:
        op(service, "accounts/modify", {"name": "research", "limits": ["co2=500/month"]})
    assert e.value.status == 400 and "\n" not in e.value.message and "co2 takes a unit" in e.value.message
    # a refused change changes nothing
    assert {a["name"]: a for a in op(service, "accounts", method="GET")}["research"]["limits"] == listed["research"]["limits"]


def test_an_account_with_limits_is_deleted_with_them(store, service, world):
    op(service, "accounts/modify", {"name": "research/vision", "limits": ["co2=1t/2022-01-01..2022-03-31"]})
    op(service, "accounts/delete", {"name": "research/vision"})
    op(service, "accounts/add", {"name": "research/vision"})
    assert {a["name"]: a for a in op(service, "accounts", method="GET")}["research/vision"]["limits"] == {}


def test_without_limits_the_planner_reads_no_usage(store, service, world, monkeypatch):
    import scheduler.budget_book as book

    monkeypatch.setattr(book, "budget_finished", lambda *a, **k: pytest.fail("usage read without limits"))
    monkeypatch.setattr(book, "budget_running", lambda *a, **k: pytest.fail("usage read without limits"))
    job = submit(service, est_runtime_s=600.0, account="research")
    world.tick()
    assert job_row(store, job).state == "PLANNED"


def test_raising_a_limit_lets_the_held_job_through_at_the_next_tick(store, service, world):
    op(service, "accounts/modify", {"name": "research", "limits": ["co2=1kg/month"]})
    ran(store, service, "research", gco2=990.0)
    job = submit(service, est_runtime_s=3600.0, account="research")
    world.tick()
    assert job_row(store, job).state == "PENDING"
    op(service, "accounts/modify", {"name": "research", "limits": ["co2=2kg/month"]})
    world.tick()  # nothing else changed: the tick is not skipped as unchanged
    assert job_row(store, job).state == "PLANNED"


def test_a_flexible_job_may_use_the_grace_an_operator_allows(store, service, clock):
    from scheduler.standing import StandingSettings

    import_carbon(store, DE)
    add_node(store, "de1", "DE")
    op(service, "accounts/add", {"name": "lab"})
    op(service, "users/add", {"user": "root", "account": "lab"})
    op(service, "accounts/modify", {"name": "lab", "limits": ["gpu_hours=10/month"]})
    ran(store, service, "lab", gco2=0.0, hours=9.8)
    normal = submit(service, est_runtime_s=3600.0, account="lab")
    flexible = submit(service, est_runtime_s=3600.0, account="lab", qos="flexible",
                      deadline=(T + timedelta(hours=20)).isoformat())  # charged 0.5 GPU-hours
    strict = Planner(store, make_policy("greedy", plan_interval_s=15.0), clock=clock, plan_interval_s=15.0,
                     standing=Standing(QosTable()))
    strict.tick()
    assert [job_row(store, j).state for j in (normal, flexible)] == ["PENDING", "PENDING"]
    graced = Planner(store, make_policy("greedy", plan_interval_s=15.0), clock=clock, plan_interval_s=15.0,
                     standing=Standing(QosTable(), StandingSettings(flexible_grace_pct=10.0)))
    graced.tick()
    assert job_row(store, normal).reason.endswith("(AssocGrpGPUHoursLimit)")
    assert job_row(store, flexible).state == "PLANNED"  # 9.8 + 0.5 <= 10 x 1.1
