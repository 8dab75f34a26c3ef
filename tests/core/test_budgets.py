"""Account budgets, the arithmetic (`scheduler.budgets`): how `--limit` is written and what
its mistakes say, the periods, and which jobs a limit lets through.

- `co2=500kg/month`, `energy=800kWh/quarter`, `gpu_hours=1000/month`, `co2=2t/2026-11-01..2026-12-31`;
  `co2=none` removes it. Every mistake is one line naming the fix.
- Months and quarters are UTC calendar ones; a date range binds only inside it, both days included.
- A job is let through while its estimate fits what its account and every ancestor have
  left; an ancestor's usage is its whole subtree's; the first limit it would pass is named,
  Slurm-style; a job alone over a whole limit is told it could never start.
- Flexible jobs may pass a limit by the grace, when the operator allows one.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from scheduler.budgets import BudgetError, Budgets, Charged, Limit, Usage, parse_limit, period_window

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc)


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


@pytest.mark.parametrize("text, currency, amount, period", [
    ("co2=500kg/month", "kgco2e", 500.0, "month"),
    ("co2=2t/2026-11-01..2026-12-31", "kgco2e", 2000.0, "2026-11-01..2026-12-31"),
    ("co2=250g/quarter", "kgco2e", 0.25, "quarter"),
    ("energy=800kWh/quarter", "kwh", 800.0, "quarter"),
    ("energy=1.5MWh/month", "kwh", 1500.0, "month"),
    ("gpu_hours=1000/month", "gpu_hours", 1000.0, "month"),
    ("gpu_hours=1000h/Month", "gpu_hours", 1000.0, "month"),
])
def test_a_limit_is_key_amount_with_its_unit_and_a_period(text, currency, amount, period):
    assert parse_limit(text) == (currency, Limit(currency, amount, period))


def test_none_removes_a_limit():
    assert parse_limit("co2=none") == ("kgco2e", None)
    assert parse_limit("energy=None") == ("kwh", None)


@pytest.mark.parametrize("text, fragment", [
    ("co2", "write KEY=AMOUNT/PERIOD"),
    ("carbon=5kg/month", "unknown key 'carbon'; use co2, energy, gpu_hours"),
    ("co2=500/month", "co2 takes a unit: g, kg, t"),
    ("co2=500kg", "give a period after /"),
    ("energy=800kw/month", "energy takes a unit: wh, kwh, mwh"),
    ("gpu_hours=10kg/month", "gpu_hours takes a number of GPU-hours"),
    ("co2=-5kg/month", "bad amount"),
    ("co2=0kg/month", "the amount must be above 0"),
    ("co2=5kg/week", "use month, quarter or a date range"),
    ("co2=5kg/2026-12-31..2026-11-01", "ends before it starts"),
    ("co2=5kg/2026-02-30..2026-03-01", "bad date"),
])
def test_each_mistake_in_a_limit_is_one_line_saying_what_to_write(text, fragment):
    with pytest.raises(BudgetError) as e:
        parse_limit(text)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_months_and_quarters_are_utc_calendar_periods():
    assert period_window("month", NOW) == (utc(2026, 11, 1), utc(2026, 12, 1))
    assert period_window("month", utc(2026, 12, 31, 23, 59)) == (utc(2026, 12, 1), utc(2027, 1, 1))
    assert period_window("quarter", NOW) == (utc(2026, 10, 1), utc(2027, 1, 1))
    assert period_window("quarter", utc(2026, 2, 1)) == (utc(2026, 1, 1), utc(2026, 4, 1))


def test_a_date_range_binds_only_inside_it_both_days_included():
    period = "2026-11-01..2026-11-30"
    assert period_window(period, utc(2026, 11, 30, 23)) == (utc(2026, 11, 1), utc(2026, 12, 1))
    assert period_window(period, utc(2026, 12, 1)) is None
    assert period_window(period, utc(2026, 10, 31, 23)) is None


def co2(kg: float) -> Usage:
    return Usage(kgco2e=kg)


TREE = {"research": None, "research/nlp": "research", "research/vision": "research", "default": None}


def test_a_job_fits_while_its_estimate_stays_within_what_is_left_and_is_then_committed():
    budgets = Budgets({"research/nlp": {"kgco2e": Limit("kgco2e", 500.0, "month")}}, TREE, NOW,
                      [Charged("research/nlp", utc(2026, 11, 3), co2(470.0)),
                       Charged("research/nlp", utc(2026, 10, 30), co2(400.0))])  # last month: not counted
    assert budgets.admit("research/nlp", co2(20.0)) is None
    why = budgets.admit("research/nlp", co2(20.0))  # 490 committed now
    assert why == ("account research/nlp: co2 limit 500 kg/month, 490 kg used or committed, this job ~20 kg "
                   "(AssocGrpCO2Limit)")
    assert budgets.admit("research/nlp", co2(10.0)) is None  # exactly at the limit still fits


def test_a_childs_limit_and_its_parents_both_bind_and_the_parent_counts_its_subtree():
    limits = {"research": {"kgco2e": Limit("kgco2e", 100.0, "month")},
              "research/nlp": {"kgco2e": Limit("kgco2e", 80.0, "month")}}
    budgets = Budgets(limits, TREE, NOW, [Charged("research/vision", NOW, co2(50.0))])
    # nlp's own 80 kg would allow 60, but the parent has only 50 left after vision's use
    assert "account research: co2 limit 100 kg/month" in budgets.admit("research/nlp", co2(60.0))
    assert budgets.admit("research/nlp", co2(45.0)) is None
    # and the child's own limit binds though the parent has room
    budgets = Budgets(limits, TREE, NOW)
    assert "account research/nlp: co2 limit 80 kg/month" in budgets.admit("research/nlp", co2(90.0))


def test_a_periods_summed_charge_counts_only_against_limits_of_that_period():
    month, quarter = period_window("month", NOW), period_window("quarter", NOW)
    limits = {"research": {"kgco2e": Limit("kgco2e", 100.0, "month"), "kwh": Limit("kwh", 100.0, "quarter")}}
    budgets = Budgets(limits, TREE, NOW, [Charged("research", month[0], Usage(0, 10.0, 30.0), month),
                                          Charged("research", quarter[0], Usage(0, 50.0, 90.0), quarter)])
    used = {s.limit.currency: s.used for s in budgets.standings()}
    assert used == {"kgco2e": 30.0, "kwh": 50.0}


def test_each_currency_binds_on_its_own():
    limits = {"research": {"gpu_hours": Limit("gpu_hours", 10.0, "month"), "kwh": Limit("kwh", 100.0, "month")}}
    budgets = Budgets(limits, TREE, NOW)
    assert "(AssocGrpGPUHoursLimit)" in budgets.admit("research/nlp", Usage(11.0, 1.0, 0.0))
    assert "(AssocGrpEnergyLimit)" in budgets.admit("research/nlp", Usage(1.0, 101.0, 0.0))
    assert budgets.admit("research/nlp", Usage(10.0, 100.0, 1e6)) is None  # no co2 limit set


def test_accounts_outside_the_limited_subtree_are_not_held():
    budgets = Budgets({"research": {"kgco2e": Limit("kgco2e", 1.0, "month")}}, TREE, NOW)
    assert budgets.admit("default", co2(1e6)) is None
    assert not budgets.binds("default")


def test_a_job_alone_over_a_whole_limit_is_told_it_could_never_start():
    budgets = Budgets({"research": {"kgco2e": Limit("kgco2e", 500.0, "month")}}, TREE, NOW)
    why = budgets.alone_over("research/nlp", co2(600.0))
    assert why == ("this job needs ~600 kg, more than account research's whole co2 limit of 500 kg/month: "
                   "it could never start under it (AssocGrpCO2Limit)")
    assert budgets.alone_over("research/nlp", co2(499.0)) is None
    # a date range still to come binds it too; one that is over does not
    ahead = Budgets({"research": {"kgco2e": Limit("kgco2e", 5.0, "2027-01-01..2027-01-31")}}, TREE, NOW)
    assert "could never start" in ahead.alone_over("research", co2(6.0))
    past = Budgets({"research": {"kgco2e": Limit("kgco2e", 5.0, "2026-01-01..2026-01-31")}}, TREE, NOW)
    assert past.alone_over("research", co2(6.0)) is None


def test_flexible_jobs_may_pass_a_limit_by_the_grace_others_may_not():
    limits = {"research": {"kgco2e": Limit("kgco2e", 100.0, "month")}}
    charged = [Charged("research", NOW, co2(95.0))]
    budgets = Budgets(limits, TREE, NOW, charged, flexible_grace_pct=10.0)
    assert budgets.admit("research", co2(10.0)) is not None
    assert budgets.admit("research", co2(10.0), flexible=True) is None  # 105 <= 110
    assert Budgets(limits, TREE, NOW, charged).admit("research", co2(10.0), flexible=True) is not None  # off by default


def test_standings_give_each_limit_in_force_with_its_use_and_the_80_percent_mark():
    limits = {"research": {"kgco2e": Limit("kgco2e", 100.0, "month")},
              "research/nlp": {"kwh": Limit("kwh", 50.0, "2026-01-01..2026-01-31")}}  # not in force now
    budgets = Budgets(limits, TREE, NOW, [Charged("research/nlp", NOW, Usage(1.0, 5.0, 85.0))])
    [s] = budgets.standings()
    assert (s.account, s.used, s.fraction) == ("research", 85.0, 0.85)
    doc = s.as_json()
    assert doc["warning"] is True and doc["period_start"] == "2026-11-01T00:00:00Z" and doc["text"] == "100 kg/month"


def test_the_flexible_grace_is_an_accounting_key_off_by_default():
    from scheduler.accounting.config import AccountingConfig

    assert AccountingConfig.from_config({}).flexible_grace_pct == 0.0
    assert AccountingConfig.from_config({"accounting": {"flexible_grace_pct": 10}}).flexible_grace_pct == 10.0
    with pytest.raises(ValueError, match="flexible_grace_pct"):
        AccountingConfig.from_config({"accounting": {"flexible_grace_pct": -5}})
