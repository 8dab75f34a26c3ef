"""Carbon accounting (scheduler/accounting/): receipts against hand-computed values.

Every expected figure below is worked out by hand in the test from the power samples and
intensity rows the test itself writes, so a wrong weighting (mean power instead of each
part's own energy), a zero for a gap, or a missed PUE all show up as a different number.
Store-backed tests run on SQLite and PostgreSQL (the `store` fixture).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, select, update

from policies.types import J_PER_KWH
from scheduler.accounting.accountant import Accountant, record_actual_carbon
from scheduler.accounting.config import AccountingConfig
from scheduler.accounting.figures import difference
from scheduler.accounting.measurement import describe_measurement
from scheduler.accounting.reports import parse_period
from scheduler.accounting.run_carbon import IntensitySpan, run_carbon
from scheduler.carbon import CarbonSignals
from scheduler.carbon_config import CarbonConfig, ZoneConfig
from scheduler.samples import SampleStore, energy_note_of
from scheduler.site import SiteConfig
from scheduler.store.models import jobs
from telemetry.energy import Sample, integrate_power
from telemetry.grid.readings import IntensityReading
from telemetry.grid.static import STATIC_YEARLY_GCO2_PER_KWH

import fleet

T10 = datetime(2026, 3, 2, 10, 0, tzinfo=timezone.utc)
H = timedelta(hours=1)


def at(hh: int, mm: int = 0, ss: int = 0) -> datetime:
    return T10.replace(hour=hh, minute=mm, second=ss)


# -- helpers --------------------------------------------------------------------------------

def add_node(store, name: str, zone: str, model: str, n: int = 2) -> list[int]:
    return fleet.add_node(store, name, at=T10 - 24 * H, heartbeat=T10, zone=zone, model=model, n=n,
                          vendor="nvidia")


def add_job(store, *, node: str, gpu_ids: list[int], start: datetime, end: datetime, energy_j: float | None,
            method: str | None = "counter", owner: tuple[int, str] = (1000, "alice"),
            submitted: datetime | None = None, state: str = "COMPLETED", **extra) -> int:
    with store.write() as conn:
        return conn.execute(insert(jobs).values(
            name="job", state=state, owner_uid=owner[0], owner_gid=owner[0], owner_groups=[owner[0]],
            owner_name=owner[1], argv=["true"], cwd="/", env={}, gpus=len(gpu_ids), gpu_mem_gib=0.0,
            submitted_at=submitted or start, node=node, gpu_ids=gpu_ids, started_at=start, ended_at=end,
            exit_code=0, energy_j=energy_j, energy_method=method, **extra,
        ).returning(jobs.c.id)).scalar_one()


def add_intensity(store, zone: str, values: list[tuple[datetime, float]], *, signal: str = "average",
                  duration_s: int = 3600, source: str = "electricitymaps-csv") -> None:
    CarbonSignals(store, track_status=False).writes.store_readings(
        IntensityReading(zone=zone, at=t, duration_s=duration_s, gco2_per_kwh=v, signal=signal, kind="actual",
                         issued_at=t + timedelta(seconds=duration_s), source=source)
        for t, v in values)


def job_row(store, job_id: int):
    with store.read() as conn:
        return conn.execute(select(jobs).where(jobs.c.id == job_id)).one()


# The run of the intensity-change tests: 10:30 -> 11:30 on one GPU, 200 W until 10:59, a
# ramp to 600 W by 11:01, then 600 W. Intensity 100 g/kWh in the 10:00 hour, 400 in the 11:00.
#   [10:30, 10:59]  1740 s x 200 W                  = 348,000 J
#   [10:59, 11:00]  60 s x (200 + 400) / 2           =  18,000 J   -> 366,000 J at 100 g/kWh
#   [11:00, 11:01]  60 s x (400 + 600) / 2           =  30,000 J
#   [11:01, 11:30]  1740 s x 600 W                   = 1,044,000 J -> 1,074,000 J at 400 g/kWh
#   total 1,440,000 J = 0.4 kWh;  gCO2 = 366000/3.6e6*100 + 1074000/3.6e6*400 = 129.5 g
# (the mean-power shortcut would say 0.4 kWh x 250 g/kWh = 100 g).
STEP_POWER = [Sample(at(10, 30).timestamp(), 200.0, None), Sample(at(10, 59).timestamp(), 200.0, None),
              Sample(at(11, 1).timestamp(), 600.0, None), Sample(at(11, 30).timestamp(), 600.0, None)]
STEP_ENERGY_J = 1_440_000.0
STEP_GCO2 = 366_000 / 3.6e6 * 100 + 1_074_000 / 3.6e6 * 400
SPANS = [IntensitySpan(at(10), at(11), 100.0, "actual", "electricitymaps-csv"),
         IntensitySpan(at(11), at(12), 400.0, "actual", "electricitymaps-csv")]


# -- the pure computation -------------------------------------------------------------------

def test_power_integral_is_the_trapezoid_rule_and_cutting_it_changes_nothing():
    assert integrate_power(STEP_POWER, at(10, 30).timestamp(), at(11, 30).timestamp()) == pytest.approx(STEP_ENERGY_J)
    first = integrate_power(STEP_POWER, at(10, 30).timestamp(), at(11).timestamp())
    second = integrate_power(STEP_POWER, at(11).timestamp(), at(11, 30).timestamp())
    assert first == pytest.approx(366_000.0)
    assert second == pytest.approx(1_074_000.0)


def test_a_run_across_an_intensity_change_weights_each_part_by_its_own_energy():
    run = run_carbon(STEP_ENERGY_J, at(10, 30), at(11, 30), SPANS, gpu_power=[STEP_POWER])
    assert run.gco2 == pytest.approx(STEP_GCO2)
    assert run.gco2 == pytest.approx(129.5)
    assert run.gco2 != pytest.approx(STEP_ENERGY_J / J_PER_KWH * 250.0)  # not the mean-power shortcut
    assert [(p.start, p.end, p.gco2_per_kwh) for p in run.pieces] == [(at(10, 30), at(11), 100.0),
                                                                    (at(11), at(11, 30), 400.0)]
    assert [p.energy_j for p in run.pieces] == pytest.approx([366_000.0, 1_074_000.0])
    assert run.basis == "actual" and run.coverage == pytest.approx(1.0) and run.gaps == ()
    assert run.weighting == "power-samples"
    assert run.intensity_g_per_kwh == pytest.approx(STEP_GCO2 / 0.4)


def test_pue_multiplies_and_the_measured_energy_is_the_authority_over_the_samples_shape():
    run = run_carbon(2 * STEP_ENERGY_J, at(10, 30), at(11, 30), SPANS, gpu_power=[STEP_POWER], pue=1.25)
    # the counter said twice what the samples integrate to: both parts scale, the shape stays
    assert [p.energy_j for p in run.pieces] == pytest.approx([732_000.0, 2_148_000.0])
    assert run.gco2 == pytest.approx(2 * STEP_GCO2 * 1.25)
    assert run.intensity_g_per_kwh == pytest.approx(STEP_GCO2 / 0.4)  # before PUE


def test_the_gpus_of_a_job_add_up_and_each_contributes_its_own_shape():
    flat = [Sample(at(10, 30).timestamp(), 100.0, None), Sample(at(11, 30).timestamp(), 100.0, None)]  # 180,000 J/half h
    run = run_carbon(STEP_ENERGY_J + 360_000.0, at(10, 30), at(11, 30), SPANS, gpu_power=[STEP_POWER, flat])
    expected = (366_000 + 180_000) / 3.6e6 * 100 + (1_074_000 + 180_000) / 3.6e6 * 400
    assert run.gco2 == pytest.approx(expected)


def test_without_samples_the_energy_is_priced_at_the_time_weighted_mean_intensity():
    run = run_carbon(STEP_ENERGY_J, at(10, 30), at(11, 30), SPANS)
    assert run.weighting == "time"
    assert run.gco2 == pytest.approx(0.4 * (100 + 400) / 2)


def test_a_gap_filled_by_the_static_mean_is_reported_and_never_priced_at_zero():
    spans = [SPANS[0], IntensitySpan(at(11), at(12), 411.0, "static", "static")]
    run = run_carbon(STEP_ENERGY_J, at(10, 30), at(11, 30), spans)
    assert run.gco2 == pytest.approx(0.2 * 100 + 0.2 * 411)
    assert run.basis == "mixed"
    assert run.coverage == pytest.approx(0.5)
    assert run.gaps == ((at(11), at(11, 30), "static"),)


def test_a_gap_without_any_value_leaves_the_figure_unknown_not_zero():
    run = run_carbon(STEP_ENERGY_J, at(10, 30), at(11, 30), SPANS[:1])
    assert run.gco2 is None
    assert run.basis is None
    assert run.coverage == pytest.approx(0.5)
    assert run.gaps == ((at(11), at(11, 30), None),)


def test_a_run_inside_one_period_and_an_instant_run():
    run = run_carbon(36_000.0, at(10, 10), at(10, 20), SPANS)
    assert run.gco2 == pytest.approx(0.01 * 100)
    instant = run_carbon(0.0, at(10, 10), at(10, 10), SPANS)
    assert instant.gco2 == 0.0 and instant.basis == "actual"


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError):
        run_carbon(1.0, at(11), at(10), SPANS)
    with pytest.raises(ValueError):
        run_carbon(-1.0, at(10), at(11), SPANS)
    with pytest.raises(ValueError):
        run_carbon(1.0, at(10).replace(tzinfo=None), at(11), SPANS)


def test_measurement_methods_are_named_and_a_counter_fault_is_told_apart():
    assert describe_measurement("counter", None)["counter_fault"] is False
    fault = describe_measurement("integral", "GPU 3: energy counter went backwards")
    assert fault["counter_fault"] is True
    assert "after a counter fault" in fault["description"] and "backwards" in fault["description"]
    plain = describe_measurement("integral", "GPU 3: no energy counter")
    assert plain["counter_fault"] is False
    assert describe_measurement("integral+static", None)["static_share"] is True
    assert describe_measurement(None, None)["method"] is None


def test_accounting_config_defaults_and_validation():
    cfg = AccountingConfig.from_config({})
    assert (cfg.gpu_lifetime_years, cfg.energy_price_usd_per_kwh) == (4.0, 0.10)
    cfg = AccountingConfig.from_config({"accounting": {"energy_price_usd_per_kwh": 0.3,
                                                       "zone_energy_price_usd_per_kwh": {"DE": 0.25}}})
    assert cfg.energy_price("DE") == 0.25 and cfg.energy_price("GB") == 0.3
    for bad in ({"gpu_lifetime_years": 0}, {"energy_price_usd_per_kwh": -1}, {"bogus": 1}):
        with pytest.raises(ValueError):
            AccountingConfig.from_config({"accounting": bad})


def test_periods_take_iso_times_or_durations_back_from_now():
    now = at(12)
    assert parse_period("2h", None, now) == (at(10), at(12))
    assert parse_period("2026-03-02", "2026-03-02T11:00Z", now) == (at(0), at(11))
    assert parse_period(None, None, now) == (now - timedelta(days=30), now)
    with pytest.raises(ValueError):
        parse_period("1h", "2h", now)
    with pytest.raises(ValueError):
        parse_period("yesterday-ish", None, now)


# -- receipts from the store ----------------------------------------------------------------

def test_receipts_and_reports_use_the_pue_of_the_nodes_site_not_one_per_zone(store):
    """Issue 16 defect 6: two data centres in DE. The same run costs 1.05 x in the new hall
    (its site) and 1.6 x in the old one (the node's own value), not DE's 1.2 for both."""
    new = add_node(store, "de-new", "DE", "H100")
    old = add_node(store, "de-old", "DE", "H100")
    add_intensity(store, "DE", [(at(10), 100.0), (at(11), 400.0)])
    site = SiteConfig.from_config({"zones": {"DE": {"pue": 1.2}}, "sites": {"fra": {"pue": 1.05, "nodes": ["de-new"]}},
                                   "nodes": {"de-old": {"pue": 1.6}}})
    acc = Accountant(store, site=site)
    jobs_ = {name: add_job(store, node=name, gpu_ids=[g[0]], start=at(10, 30), end=at(11, 30),
                           energy_j=STEP_ENERGY_J) for name, g in (("de-new", new), ("de-old", old))}
    for job in jobs_.values():
        acc.account(job)
    flat = (0.5 * 100.0 + 0.5 * 400.0) * STEP_ENERGY_J / 3.6e6  # no samples: time-weighted
    for name, pue in (("de-new", 1.05), ("de-old", 1.6)):
        r = acc.receipt(jobs_[name])
        assert r["pue"] == pue and r["gco2"] == pytest.approx(flat * pue)
    report = acc.report(at(10), at(12), by="node")
    facility = {g["group"]: g["facility_energy_kwh"] for g in report["groups"]}
    assert facility == {"de-new": pytest.approx(0.4 * 1.05), "de-old": pytest.approx(0.4 * 1.6)}
    doc = acc.export(at(10), at(12))
    assert {s["node"]: s["pue"] for s in doc["systems"]} == {"de-new": [1.05], "de-old": [1.6]}
    assert "[sites.SITE]" in doc["methodology"]["pue"]



def test_receipt_of_a_run_across_an_intensity_change_from_stored_samples(store):
    g = add_node(store, "de1", "DE", "H100")
    SampleStore(store).write([(g[0], s) for s in STEP_POWER])
    add_intensity(store, "DE", [(at(10), 100.0), (at(11), 400.0)])
    job = add_job(store, node="de1", gpu_ids=[g[0]], start=at(10, 30), end=at(11, 30), energy_j=STEP_ENERGY_J,
                  submitted=at(10), deadline=at(12), prompts=1000, tokens=500_000,
                  est_gco2=120.0, est_gco2_if_now=200.0, explanation="H100 in DE now")
    acc = Accountant(store, site=SiteConfig(site_pue=1.0, zone_pue={"DE": 1.2}))
    run = acc.account(job)
    assert run.gco2 == pytest.approx(STEP_GCO2 * 1.2)
    row = job_row(store, job)
    assert row.gco2 == pytest.approx(STEP_GCO2 * 1.2)
    assert (row.zone, row.gpu_model, row.pue, row.gco2_signal, row.gco2_basis) == ("DE", "H100", 1.2, "average",
                                                                                  "actual")
    assert row.gco2_coverage == pytest.approx(1.0) and row.accounted_at is not None

    r = acc.receipt(job)
    gco2 = STEP_GCO2 * 1.2
    assert r["gco2"] == pytest.approx(gco2)
    assert r["energy_j"] == STEP_ENERGY_J and r["energy_kwh"] == pytest.approx(0.4)
    assert r["measurement"]["method"] == "counter" and not r["measurement"]["counter_fault"]
    assert (r["signal"], r["pue"], r["intensity_basis"], r["weighting"]) == ("average", 1.2, "actual",
                                                                             "power-samples")
    assert r["intensity_sources"] == ["electricitymaps-csv"] and r["intensity_gaps"] == []
    assert [p["gco2_per_kwh"] for p in r["pieces"]] == [100.0, 400.0]
    assert r["gco2_per_prompt"] == pytest.approx(gco2 / 1000)
    assert r["gco2_per_1k_tokens"] == pytest.approx(gco2 / 500)
    assert r["tokens_per_j"] == pytest.approx(500_000 / STEP_ENERGY_J)
    assert (r["wait_s"], r["runtime_s"], r["deadline_met"]) == (1800.0, 3600.0, True)
    assert (r["gpu_model"], r["zone"], r["node"]) == ("H100", "DE", "de1")
    assert r["started_at"] == "2026-03-02T10:30:00Z" and r["ended_at"] == "2026-03-02T11:30:00Z"
    # measured emissions scaled by the plan's own if-now / chosen estimates (200 g / 120 g)
    assert r["counterfactual"]["gco2"] == pytest.approx(gco2 * 200.0 / 120.0)
    assert r["counterfactual"]["estimate_gco2"] == 200.0 and r["counterfactual"]["explanation"] == "H100 in DE now"
    assert r["saving_gco2"] == pytest.approx(gco2 * (200.0 / 120.0 - 1))
    assert r["saving_pct"] == pytest.approx(40.0)
    assert r["plan_saving_gco2"] == pytest.approx(80.0)
    # started at submission (10:00), the same energy would have met only the 100 g/kWh hour
    assert r["gco2_if_started_at_submit"] == pytest.approx(0.4 * 100 * 1.2)
    # cost: 1 GPU-hour of an H100 (list price / 4 years) + 0.4 kWh x 1.2 x $0.10
    from policies.model.catalog import catalog

    assert r["cost_usd"] == pytest.approx(catalog()["H100"].list_price_usd / (4 * 8766) + 0.4 * 1.2 * 0.10)


def test_receipt_of_a_run_measured_by_integration_after_a_counter_fault(store):
    """The counter jumps backwards mid-run (a reset): the energy is the power integral, the
    receipt says why, and the carbon is priced across the intensity change from the samples."""
    g = add_node(store, "de1", "DE", "MI300X")
    start, end = at(10, 50), at(11, 10)            # 20 minutes, every 10 s
    samples = []
    for i in range(0, 121):
        t = start.timestamp() + 10 * i
        power = 300.0 if t < at(11).timestamp() else 900.0
        counter = 3000.0 * i if i < 60 else 3000.0 * (i - 60)   # reset at 11:00
        samples.append((g[0], Sample(t, power, counter)))
    SampleStore(store).write(samples)
    measured = SampleStore(store).job_energy([g[0]], start.timestamp(), end.timestamp())
    assert measured.method == "integral"
    # by hand: 10:50:00 -> 10:59:50 at 300 W = 177,000 J; the ramp 300 -> 900 W over
    # 10:59:50 -> 11:00:00 = 6,000 J (before the change); 11:00 -> 11:10 at 900 W = 540,000 J
    first_j = 590 * 300.0 + 10 * (300 + 900) / 2
    second_j = 600 * 900.0
    assert measured.energy_j == pytest.approx(first_j + second_j)
    add_intensity(store, "DE", [(at(10), 200.0), (at(11), 50.0)])
    job = add_job(store, node="de1", gpu_ids=[g[0]], start=start, end=end, energy_j=measured.energy_j,
                  method=measured.method)
    run = record_actual_carbon(store, job, energy_note=energy_note_of(measured.per_gpu))
    assert run.gco2 == pytest.approx(first_j / 3.6e6 * 200 + second_j / 3.6e6 * 50)
    r = Accountant(store).receipt(job)
    assert r["measurement"]["counter_fault"] is True
    assert "backwards" in r["measurement"]["description"]
    assert r["gco2"] == pytest.approx(run.gco2)
    assert "backwards" in job_row(store, job).energy_note


def test_a_counter_fault_note_is_rederived_from_raw_samples_when_the_agent_gave_none(store):
    g = add_node(store, "de1", "DE", "MI300X")
    start = at(10, 0)
    SampleStore(store).write([(g[0], Sample(start.timestamp() + 10 * i, 300.0, 5000.0)) for i in range(61)])
    job = add_job(store, node="de1", gpu_ids=[g[0]], start=start, end=start + timedelta(minutes=10),
                  energy_j=180_000.0, method="integral")
    Accountant(store).account(job)
    assert "stuck" in job_row(store, job).energy_note


def test_minute_rollups_stand_in_for_raw_samples_after_retention(store):
    g = add_node(store, "de1", "DE", "H100")
    # 10:58 and 10:59 at 100 W, 11:00 and 11:01 at 500 W, sampled every 10 s, then rolled up
    rows = []
    for minute, watts in ((58, 100.0), (59, 100.0), (0, 500.0), (1, 500.0)):
        base = (at(10, minute) if minute >= 58 else at(11, minute)).timestamp()
        rows += [(g[0], Sample(base + s, watts, None)) for s in range(0, 60, 10)]
    SampleStore(store).write(rows)
    SampleStore(store).rollup(retention_s=0, now_s=at(13).timestamp())
    add_intensity(store, "DE", [(at(10), 100.0), (at(11), 300.0)])
    job = add_job(store, node="de1", gpu_ids=[g[0]], start=at(10, 58), end=at(11, 2), energy_j=72_000.0)
    r = Accountant(store).receipt(job)
    assert r["weighting"] == "minute-means"
    # minute means at mid-minute: 100 W until 10:59:30, ramp to 500 W by 11:00:30, 500 W after
    # before 11:00: 90 s x 100 + 30 s x (100 + 300)/2 = 15,000 ; after: 30 s x 400 + 90 s x 500 = 57,000
    assert [p["energy_j"] for p in r["pieces"]] == pytest.approx([15_000.0, 57_000.0])
    assert r["gco2"] == pytest.approx(15_000 / 3.6e6 * 100 + 57_000 / 3.6e6 * 300)


def test_a_gap_in_the_record_is_priced_at_the_static_mean_and_re_priced_when_actuals_arrive(store):
    g = add_node(store, "de1", "DE", "H100")
    add_intensity(store, "DE", [(at(10), 100.0)])
    job = add_job(store, node="de1", gpu_ids=[g[0]], start=at(10, 30), end=at(11, 30), energy_j=STEP_ENERGY_J)
    clock = [at(12)]
    acc = Accountant(store, clock=lambda: clock[0])
    assert acc.backfill() == 1
    row = job_row(store, job)
    static = STATIC_YEARLY_GCO2_PER_KWH["DE"]
    assert row.gco2 == pytest.approx(0.2 * 100 + 0.2 * static)
    assert (row.gco2_basis, row.gco2_coverage) == ("mixed", pytest.approx(0.5))
    r = acc.receipt(job)
    assert r["intensity_gaps"] == [{"start": "2026-03-02T11:00:00Z", "end": "2026-03-02T11:30:00Z",
                                    "filled_by": "static"}]
    assert r["gco2_if_started_at_submit"] is None  # a static what-if says nothing about timing

    add_intensity(store, "DE", [(at(11), 400.0)])          # the 11:00 hour lands later
    assert acc.backfill() == 0                              # not again within the hour
    clock[0] = at(14)
    assert acc.backfill() == 1
    row = job_row(store, job)
    assert row.gco2 == pytest.approx(0.4 * 250) and row.gco2_basis == "actual"
    clock[0] = at(16)
    assert acc.backfill() == 0                              # actual figures are final


def test_a_zone_without_any_value_has_no_figure_until_data_arrives(store):
    g = add_node(store, "x1", "XX-NOWHERE", "H100")
    job = add_job(store, node="x1", gpu_ids=[g[0]], start=at(10, 30), end=at(11, 30), energy_j=STEP_ENERGY_J)
    acc = Accountant(store, clock=lambda: at(20))
    acc.account(job)
    row = job_row(store, job)
    assert row.gco2 is None and row.gco2_basis is None
    r = acc.receipt(job)
    assert r["gco2"] is None and r["gco2_per_prompt"] is None
    add_intensity(store, "XX-NOWHERE", [(at(10), 100.0), (at(11), 400.0)], source="csv")
    assert Accountant(store, clock=lambda: at(22)).backfill() == 1
    assert job_row(store, job).gco2 == pytest.approx(100.0)


def test_a_marginal_zone_is_never_filled_with_the_average_static_mean(store):
    g = add_node(store, "de1", "DE", "H100")
    add_intensity(store, "DE", [(at(10), 500.0)], signal="marginal", source="watttime")
    carbon = CarbonSignals(store, CarbonConfig(zones={"DE": ZoneConfig("DE", signal="marginal")}),
                           track_status=False)
    job = add_job(store, node="de1", gpu_ids=[g[0]], start=at(10, 30), end=at(11, 30), energy_j=STEP_ENERGY_J)
    r = Accountant(store, carbon=carbon).receipt(job)
    assert r["signal"] == "marginal"
    assert r["gco2"] is None
    assert r["intensity_gaps"] == [{"start": "2026-03-02T11:00:00Z", "end": "2026-03-02T11:30:00Z",
                                    "filled_by": None}]


def test_unmeasured_and_unfinished_jobs(store):
    g = add_node(store, "de1", "DE", "H100")
    add_intensity(store, "DE", [(at(10), 100.0)])
    unmeasured = add_job(store, node="de1", gpu_ids=[g[0]], start=at(10), end=at(10, 30), energy_j=None,
                         method=None)
    acc = Accountant(store)
    assert acc.account(unmeasured) is None
    r = acc.receipt(unmeasured)
    assert r["gco2"] is None and r["measurement"]["method"] is None and r["cost_usd"] is None
    running = add_job(store, node="de1", gpu_ids=[g[1]], start=at(10), end=None, energy_j=None, state="RUNNING")
    with pytest.raises(ValueError):
        acc.account(running)
    assert acc.receipt(running)["ended_at"] is None


def test_a_missed_deadline_shows_on_the_receipt(store):
    g = add_node(store, "de1", "DE", "H100")
    job = add_job(store, node="de1", gpu_ids=[g[0]], start=at(10), end=at(11), energy_j=1000.0, deadline=at(10, 30))
    assert Accountant(store).receipt(job)["deadline_met"] is False


def test_the_agent_path_records_gco2_for_a_job_it_ran(store):
    """record_actual_carbon is what the agent calls when a job ends: it fills jobs.gco2."""
    g = add_node(store, "de1", "DE", "H100")
    add_intensity(store, "DE", [(at(10), 100.0), (at(11), 400.0)])
    job = add_job(store, node="de1", gpu_ids=g, start=at(10, 30), end=at(11, 30), energy_j=STEP_ENERGY_J)
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job).values(gco2=None))
    record_actual_carbon(store, job, tokens=123)
    row = job_row(store, job)
    assert row.gco2 == pytest.approx(100.0) and row.tokens == 123


def test_a_saving_that_is_rounding_noise_is_reported_as_zero():
    assert difference(0.233, 0.233 + 2.78e-17) == 0.0
    assert difference(150.0, 100.0) == 50.0
    assert difference(None, 1.0) is None


def test_report_and_export_figures_carry_no_binary_noise():
    """A sum or ratio of measured figures prints as the number it is: 411.0, not
    410.99999999999994 (twelve significant digits: far past any measurement behind it)."""
    from scheduler.accounting.figures import tidy

    doc = {"a": 410.99999999999994, "b": [0.1 + 0.2, {"c": 1e-17 + 3.0}], "n": 3, "s": "x", "z": None}
    assert tidy(doc) == {"a": 411.0, "b": [0.3, {"c": 3.0}], "n": 3, "s": "x", "z": None}
    assert tidy(123456.789012345) == 123456.789012
