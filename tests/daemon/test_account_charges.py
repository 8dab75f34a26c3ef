"""What each account is charged for a period (SQLite and PostgreSQL): its finished jobs'
GPU-hours, kWh, operational kgCO2e and embodied kgCO2e, as measured and times the QOS usage
factor (flexible 0.5, urgent 1.5); `report --by account` gives it per group and
`export --by account` as a statement per account, whose subtree figures add up the
accounts under it, as their limits count them. Jobs that ended outside the period are not in it.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import update

from scheduler.accounting.accountant import Accountant
from scheduler.accounting.embodied import embodied_of
from scheduler.accounting.statements import STATEMENT_COLUMNS, statement_csv_rows
from scheduler.budgets import BudgetError, named_period
from scheduler.daemon.access import Caller, ServiceConfig
from scheduler.daemon.service import JobService
from scheduler.qos import QosTable
from scheduler.store.models import jobs

ROOT = Caller(uid=0, gid=0)
NOV = (datetime(2026, 11, 1, tzinfo=timezone.utc), datetime(2026, 12, 1, tzinfo=timezone.utc))
NOW = datetime(2026, 12, 2, tzinfo=timezone.utc)


@pytest.fixture
def service(store, tmp_path):
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs", clock=lambda: NOW)
    for name in ("research", "research/nlp"):
        service.accounts.route("POST", ["accounts", "add"], {}, {"name": name}, ROOT)
        service.accounts.route("POST", ["users", "add"], {}, {"user": "root", "account": name}, ROOT)
    return service


def finished(store, service, account: str, qos: str, *, gco2: float, kwh: float, hours: float,
             ended: datetime = datetime(2026, 11, 20, tzinfo=timezone.utc)) -> int:
    job_id = service.submit(ROOT, {"argv": ["true"], "gpus": 1, "account": account, "qos": qos,
                                   "est_runtime_s": hours * 3600.0})["id"]
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(
            state="COMPLETED", started_at=ended - timedelta(hours=hours), ended_at=ended, gpu_ids=[1], gpus=1,
            gpu_model="H100", zone="DE", node="de1", energy_j=kwh * 3.6e6, gco2=gco2, gco2_signal="average",
            pue=1.0, accounted_at=ended))  # priced as shown (the ledger leaves it be)
    return job_id


@pytest.fixture
def accountant(store):
    return Accountant(store, usage_factors=QosTable().usage_factors(), clock=lambda: NOW)


def test_a_statement_charges_each_account_its_usage_times_the_qos_factor(store, service, accountant):
    finished(store, service, "research/nlp", "flexible", gco2=2000.0, kwh=4.0, hours=2.0)
    finished(store, service, "research", "urgent", gco2=1000.0, kwh=1.0, hours=1.0)
    finished(store, service, "research", "normal", gco2=9000.0, kwh=9.0, hours=9.0,
             ended=datetime(2026, 12, 1, 0, 30, tzinfo=timezone.utc))  # December: not in November's statement
    doc = accountant.statement(*NOV)
    rows = {r["account"]: r for r in doc["accounts"]}
    nlp, research = rows["research/nlp"], rows["research"]
    embodied_per_hour = embodied_of("H100").g_per_gpu_hour("all") / 1000.0
    assert nlp["usage"]["kgco2e"] == pytest.approx(2.0) and nlp["charged"]["kgco2e"] == pytest.approx(1.0)
    assert nlp["usage"]["energy_kwh"] == pytest.approx(4.0) and nlp["charged"]["energy_kwh"] == pytest.approx(2.0)
    assert nlp["charged"]["gpu_hours"] == pytest.approx(1.0)
    assert nlp["usage"]["embodied_kgco2e"] == pytest.approx(2 * embodied_per_hour)
    assert nlp["charged"]["embodied_kgco2e"] == pytest.approx(embodied_per_hour)
    assert research["jobs"] == 1 and research["charged"]["kgco2e"] == pytest.approx(1.5)
    assert research["charged"]["gpu_hours"] == pytest.approx(1.5)
    # the parent's subtree is what its limits count: its own and nlp's charges
    assert research["subtree_charged"]["kgco2e"] == pytest.approx(2.5)
    assert research["subtree_charged"]["gpu_hours"] == pytest.approx(2.5)
    assert rows["default"]["jobs"] == 0
    assert [r["account"] for r in doc["accounts"]] == ["default", "research", "research/nlp"]
    assert doc["period"] == {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"}


def test_operational_and_embodied_are_never_summed_and_signals_are_kept_apart(store, service, accountant):
    finished(store, service, "research", "normal", gco2=1000.0, kwh=1.0, hours=1.0)
    marginal = finished(store, service, "research", "normal", gco2=3000.0, kwh=1.0, hours=1.0)
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == marginal).values(gco2_signal="marginal"))
    research = {r["account"]: r for r in accountant.statement(*NOV)["accounts"]}["research"]
    assert research["usage"]["kgco2e"] is None and research["usage"]["signal"] == "mixed"
    assert research["usage"]["kgco2e_by_signal"] == {"average": pytest.approx(1.0), "marginal": pytest.approx(3.0)}
    assert research["usage"]["embodied_kgco2e"] == pytest.approx(2 * embodied_of("H100").g_per_gpu_hour("all") / 1000)


def test_the_statement_as_csv_has_one_row_per_account(store, service, accountant):
    finished(store, service, "research/nlp", "flexible", gco2=2000.0, kwh=4.0, hours=2.0)
    rows = list(csv.reader(io.StringIO("\n".join(",".join(map(str, r)) for r in statement_csv_rows(
        accountant.statement(*NOV))))))
    assert tuple(rows[0]) == STATEMENT_COLUMNS
    by = {r[0]: dict(zip(STATEMENT_COLUMNS, r)) for r in rows[1:]}
    assert float(by["research/nlp"]["charged_kgco2e"]) == pytest.approx(1.0)
    assert float(by["research"]["subtree_charged_kgco2e"]) == pytest.approx(1.0)
    assert by["research/nlp"]["period_start"] == "2026-11-01T00:00:00Z"


def test_report_by_account_gives_each_groups_usage_and_its_charge(store, service, accountant):
    finished(store, service, "research/nlp", "flexible", gco2=2000.0, kwh=4.0, hours=2.0)
    finished(store, service, "research", "urgent", gco2=1000.0, kwh=1.0, hours=1.0)
    data = accountant.report(*NOV, by="account")
    groups = {g["group"]: g for g in data["groups"]}
    assert set(groups) == {"research", "research/nlp"}
    assert groups["research/nlp"]["kgco2"] == pytest.approx(2.0)
    assert groups["research/nlp"]["charged"]["kgco2e"] == pytest.approx(1.0)
    assert groups["research"]["charged"]["energy_kwh"] == pytest.approx(1.5)
    assert data["usage_factors"]["flexible"] == 0.5


def test_a_user_sees_a_statement_of_their_own_jobs_only(store, service, accountant):
    finished(store, service, "research", "normal", gco2=1000.0, kwh=1.0, hours=1.0)
    with store.write() as conn:
        conn.execute(update(jobs).values(owner_uid=40001))
    assert [r["account"] for r in accountant.statement(*NOV, owner_uid=40001)["accounts"]] == ["research"]
    assert accountant.statement(*NOV, owner_uid=40002)["accounts"] == []


@pytest.mark.parametrize("text, start, end", [
    ("2026-11", datetime(2026, 11, 1), datetime(2026, 12, 1)),
    ("2026-12", datetime(2026, 12, 1), datetime(2027, 1, 1)),
    ("2026-Q4", datetime(2026, 10, 1), datetime(2027, 1, 1)),
    ("2026-11-01..2026-11-15", datetime(2026, 11, 1), datetime(2026, 11, 16)),
])
def test_a_statement_period_is_a_month_a_quarter_or_a_date_range(text, start, end):
    assert named_period(text) == (start.replace(tzinfo=timezone.utc), end.replace(tzinfo=timezone.utc))


@pytest.mark.parametrize("text", ["2026-13", "2026-Q5", "november", "2026-11-15..2026-11-01"])
def test_a_malformed_statement_period_is_one_line(text):
    with pytest.raises(BudgetError) as e:
        named_period(text)
    assert "\n" not in str(e.value) and "--period" in str(e.value)
