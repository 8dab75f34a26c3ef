"""Embodied carbon on receipts, reports, exports and metrics (scheduler/accounting/embodied.py).

Every expected figure is worked out by hand from the catalog's figures: a run's embodied
grams are its GPU-hours / (lifetime in years x 8766 h) x (GPU kgCO2e + host kgCO2e per GPU)
x 1000. The operational grams (average or marginal signal) and the embodied grams are
different quantities: no column ever holds a sum of two of them, except the SCI-style total
per prompt, which says so and gives both parts. Store-backed tests run on SQLite and
PostgreSQL (the `store` fixture).
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert

from scheduler.accounting.accountant import Accountant
from scheduler.carbon import CarbonSignals
from scheduler.carbon_config import CarbonConfig, ZoneConfig
from scheduler.cli.report import export_csv, receipt_text, report_table
from scheduler.metrics import StoreCollector
from scheduler.site import SiteConfig
from scheduler.store.models import jobs
from telemetry.grid.readings import IntensityReading

import fleet

T10 = datetime(2026, 3, 2, 10, 0, tzinfo=timezone.utc)
H = timedelta(hours=1)
HOURS_PER_YEAR = 8766.0
# the catalog's figures, as the issue gives them: NVIDIA's HGX H100 PCF (1,312 kg per 8-GPU
# board) and EcoLogits' 5,700 kg per 8-GPU server without GPUs; HGX B200 2,274 kg per 8 GPUs
H100_GPU_KG, H100_HOST_KG = 1312 / 8, 5700 / 8
B200_GPU_KG = 2274 / 8
LIFETIME_Y = 5.0


def embodied_g(gpu_hours: float, kg_per_gpu: float) -> float:
    return gpu_hours / (LIFETIME_Y * HOURS_PER_YEAR) * kg_per_gpu * 1000.0


def at(hh: int, mm: int = 0) -> datetime:
    return T10.replace(hour=hh, minute=mm)


def add_node(store, name: str, zone: str, model: str, n: int = 2) -> list[int]:
    return fleet.add_node(store, name, at=T10 - 24 * H, heartbeat=T10, zone=zone, model=model, n=n,
                          vendor="nvidia")


def add_job(store, *, node: str, gpu_ids: list[int], start: datetime, end: datetime, energy_j: float,
            **extra) -> int:
    with store.write() as conn:
        return conn.execute(insert(jobs).values(
            name="job", state="COMPLETED", owner_uid=1000, owner_gid=1000, owner_groups=[1000],
            owner_name="alice", argv=["true"], cwd="/", env={}, gpus=len(gpu_ids), gpu_mem_gib=0.0,
            submitted_at=start, node=node, gpu_ids=gpu_ids, started_at=start, ended_at=end, exit_code=0,
            energy_j=energy_j, energy_method="counter", **extra).returning(jobs.c.id)).scalar_one()


def add_intensity(store, zone: str, value: float, *, signal: str = "average") -> None:
    CarbonSignals(store, track_status=False).writes.store_readings(
        IntensityReading(zone=zone, at=t, duration_s=3600, gco2_per_kwh=value, signal=signal, kind="actual",
                         issued_at=t + H, source="electricitymaps-csv" if signal == "average" else "watttime-csv")
        for t in (at(10), at(11)))


def accountant(store, *, marginal: tuple[str, ...] = ()) -> Accountant:
    carbon = CarbonSignals(store, CarbonConfig(zones={z: ZoneConfig(z, signal="marginal") for z in marginal}),
                           track_status=False)
    return Accountant(store, carbon=carbon, site=SiteConfig(site_pue=1.0))


def test_the_embodied_line_is_gpu_hours_times_the_figure_over_the_lifetime(store):
    """2 H100 for 1 h = 2 GPU-h: 2 / (5 x 8766) x (164 + 712.5) kg = 39.995 g, apart from the
    operational 0.4 kWh x 150 g/kWh = 60 g; per prompt (1,000): 0.06 + 0.039995 g."""
    g = add_node(store, "de1", "DE", "H100")
    add_intensity(store, "DE", 150.0)
    job = add_job(store, node="de1", gpu_ids=g, start=at(10, 15), end=at(11, 15), energy_j=0.4 * 3.6e6,
                  prompts=1000)
    acc = accountant(store)
    acc.account(job)
    r = acc.receipt(job)

    gpu_g, host_g = embodied_g(2.0, H100_GPU_KG), embodied_g(2.0, H100_HOST_KG)
    assert gpu_g + host_g == pytest.approx(39.995, abs=1e-3)
    e = r["embodied"]
    assert e["gpu_hours"] == pytest.approx(2.0)
    assert e["gpu_gco2"] == pytest.approx(gpu_g) and e["host_gco2"] == pytest.approx(host_g)
    assert e["gco2"] == pytest.approx(gpu_g + host_g) and e["host_included"] is True
    assert (e["gpu_kgco2e_per_gpu"], e["host_kgco2e_per_gpu"], e["lifetime_years"]) == (164.0, 712.5, 5.0)
    assert (e["gpu_basis"], e["host_basis"]) == ("published", "published")
    assert "1,312 kgCO2e" in e["gpu_source"] and "5,700 kgCO2e" in e["host_source"] and e["lifetime_source"]
    # the operational figure is untouched by it
    assert r["gco2"] == pytest.approx(0.4 * 150.0) and r["gco2_per_prompt"] == pytest.approx(0.06)
    sci = r["sci"]
    assert sci["operational_gco2_per_prompt"] == pytest.approx(0.06)
    assert sci["embodied_gco2_per_prompt"] == pytest.approx((gpu_g + host_g) / 1000)
    assert sci["gco2_per_prompt"] == pytest.approx(0.06 + (gpu_g + host_g) / 1000)
    assert (sci["signal"], sci["prompts"]) == ("average", 1000) and "SCI" in sci["what"]

    text = receipt_text(r)
    assert "gCO2: 60.00 g = energy x 150 gCO2/kWh" in text
    assert "embodied: 40.00 g = GPU 7.48 g (published) + host 32.51 g (published): 2 GPU-h of H100 over a " \
           "5-year life; not added to gCO2" in text
    assert "SCI per prompt: 0.1 g = operational 0.06 g (average) + embodied 0.04 g" in text


def test_a_model_without_a_host_figure_shows_the_gpu_part_and_says_the_host_is_left_out(store):
    g = add_node(store, "us1", "DE", "B200", n=1)
    add_intensity(store, "DE", 100.0)
    job = add_job(store, node="us1", gpu_ids=g, start=at(10), end=at(12), energy_j=1.8e6)
    acc = accountant(store)
    acc.account(job)
    e = acc.receipt(job)["embodied"]
    assert e["gco2"] == pytest.approx(embodied_g(2.0, B200_GPU_KG)) == e["gpu_gco2"]
    assert e["host_gco2"] is None and e["host_included"] is False and e["host_basis"] == "unknown"
    assert "host share unknown, not included" in receipt_text(acc.receipt(job))


def test_an_unknown_figure_shows_unknown_not_zero(store):
    """The H100 PCIe card has no public figure: its receipt, report group and export system
    say unknown (null), and its GPU-hours are counted as without a figure, never as 0 g."""
    g = add_node(store, "pcie1", "DE", "H100-PCIe", n=1)
    add_intensity(store, "DE", 100.0)
    job = add_job(store, node="pcie1", gpu_ids=g, start=at(10), end=at(11), energy_j=0.2 * 3.6e6, prompts=10)
    acc = accountant(store)
    acc.account(job)
    r = acc.receipt(job)
    assert r["embodied"]["gco2"] is None and r["embodied"]["gpu_gco2"] is None
    assert r["embodied"]["gpu_basis"] == "unknown" and "no public figure" in r["embodied"]["gpu_source"]
    assert r["sci"] is None and r["gco2"] == pytest.approx(20.0)
    assert "embodied: unknown, not zero (no public figure" in receipt_text(r)

    report = acc.report(at(10), at(12), by="model")
    (group,) = report["groups"]
    assert group["embodied_kgco2e"] is None and group["embodied_gpu_kgco2e"] is None
    assert group["embodied_unknown_gpu_hours"] == pytest.approx(1.0) and group["sci_gco2_per_prompt"] is None
    assert "the embodied carbon of 1 GPU-h on models without a figure is unknown, not zero" in report_table(report)
    (system,) = acc.export(at(10), at(12))["systems"]
    assert system["embodied_kgco2e"] is None and system["embodied_basis"] == "unknown"
    assert system["embodied_unknown_gpu_hours"] == pytest.approx(1.0)


def test_average_marginal_and_embodied_are_never_summed_in_one_column(store):
    """One H100 job priced with DE's average signal and one with US's marginal one: the
    report and the export keep three figures apart (average kg, marginal kg, embodied kg);
    no figure in any of their columns equals a sum of two or three of them."""
    de, us = add_node(store, "de1", "DE", "H100", n=1), add_node(store, "us1", "US-CAL-CISO", "H100", n=1)
    add_intensity(store, "DE", 100.0)
    add_intensity(store, "US-CAL-CISO", 700.0, signal="marginal")
    a = add_job(store, node="de1", gpu_ids=de, start=at(10), end=at(11), energy_j=0.5 * 3.6e6, prompts=100)
    m = add_job(store, node="us1", gpu_ids=us, start=at(10), end=at(12), energy_j=0.5 * 3.6e6, prompts=300)
    acc = accountant(store, marginal=("US-CAL-CISO",))
    for job in (a, m):
        acc.account(job)
    avg_kg, marg_kg = 0.5 * 100 / 1000, 0.5 * 700 / 1000
    emb_a, emb_m = embodied_g(1.0, H100_GPU_KG + H100_HOST_KG), embodied_g(2.0, H100_GPU_KG + H100_HOST_KG)
    emb_kg = (emb_a + emb_m) / 1000

    report = acc.report(at(10), at(13), by="user")
    total = report["total"]
    assert total["signal"] == "mixed" and total["kgco2"] is None
    assert total["by_signal"]["average"]["kgco2"] == pytest.approx(avg_kg)
    assert total["by_signal"]["marginal"]["kgco2"] == pytest.approx(marg_kg)
    assert total["embodied_kgco2e"] == pytest.approx(emb_kg)
    assert total["embodied_gpu_kgco2e"] + total["embodied_host_kgco2e"] == pytest.approx(emb_kg)
    # the SCI-style totals per prompt exist per signal, each with its own jobs' parts
    assert total["sci_gco2_per_prompt"] is None
    assert total["by_signal"]["average"]["sci_gco2_per_prompt"] == pytest.approx((avg_kg * 1000 + emb_a) / 100)
    assert total["by_signal"]["marginal"]["sci_gco2_per_prompt"] == pytest.approx((marg_kg * 1000 + emb_m) / 300)

    doc = acc.export(at(10), at(13))
    totals = doc["totals"]
    assert totals["emissions_kgco2e"] is None
    assert totals["emissions_kgco2e_by_signal"] == {"average": pytest.approx(avg_kg),
                                                    "marginal": pytest.approx(marg_kg)}
    assert totals["embodied_kgco2e"] == pytest.approx(emb_kg)
    assert {s["zone"]: s["emissions_kgco2e"] for s in doc["systems"]} == {
        "DE": pytest.approx(avg_kg), "US-CAL-CISO": pytest.approx(marg_kg)}
    assert "never added" in doc["methodology"]["embodied"]["separate"]
    assert {f["gpu_model"] for f in doc["methodology"]["embodied"]["figures"]} == {"H100"}

    sums = [x + y for x, y in itertools.combinations((avg_kg, marg_kg, emb_kg), 2)] + [avg_kg + marg_kg + emb_kg]
    numbers = [v for fig in (total, totals, *report["groups"], *doc["systems"]) for v in _numbers(fig)]
    for s in sums:
        assert not any(v == pytest.approx(s, rel=1e-9) for v in numbers), s
    # the CSV keeps the three in their own columns
    header, *rows = [line.split(",") for line in export_csv(doc).splitlines()]
    for row in rows:
        cells = dict(zip(header, row))
        assert cells["embodied_kgco2e"] and cells["emissions_kgco2e"]
        assert float(cells["embodied_kgco2e"]) != pytest.approx(float(cells["emissions_kgco2e"]))


def test_a_receipt_shows_the_marginal_grams_where_known_beside_the_average_never_added(store):
    """DE is priced with its average signal (100 g/kWh); recorded marginal data (600 g/kWh)
    covers the run too: the receipt shows 0.5 kWh x 600 = 300 g marginal beside the 50 g
    average, and neither is added to the other or to the embodied grams."""
    g = add_node(store, "de1", "DE", "H100", n=1)
    add_intensity(store, "DE", 100.0)
    add_intensity(store, "DE", 600.0, signal="marginal")
    job = add_job(store, node="de1", gpu_ids=g, start=at(10), end=at(11), energy_j=0.5 * 3.6e6)
    acc = accountant(store)
    acc.account(job)
    r = acc.receipt(job)
    assert (r["signal"], r["gco2"]) == ("average", pytest.approx(50.0))
    assert r["operational_gco2_by_signal"] == {"average": pytest.approx(50.0), "marginal": pytest.approx(300.0)}
    assert r["embodied"]["gco2"] == pytest.approx(embodied_g(1.0, H100_GPU_KG + H100_HOST_KG))
    text = receipt_text(r)
    assert "gCO2: 50.00 g" in text
    assert "marginal signal: 300.00 g (the same run at DE's recorded marginal intensity; a different quantity, " \
           "never added to gCO2)" in text


def test_the_other_signal_is_unknown_where_its_data_does_not_cover_the_run(store):
    g = add_node(store, "de1", "DE", "H100", n=1)
    add_intensity(store, "DE", 100.0)
    CarbonSignals(store, track_status=False).writes.store_readings([IntensityReading(
        zone="DE", at=at(10), duration_s=3600, gco2_per_kwh=600.0, signal="marginal", kind="actual",
        issued_at=at(11), source="watttime-csv")])  # the 10:00 hour only; the run goes on to 11:30
    job = add_job(store, node="de1", gpu_ids=g, start=at(10), end=at(11, 30), energy_j=0.5 * 3.6e6)
    acc = accountant(store)
    acc.account(job)
    r = acc.receipt(job)
    assert r["operational_gco2_by_signal"] == {"average": pytest.approx(r["gco2"]), "marginal": None}
    assert "marginal signal" not in receipt_text(r)


def _numbers(fig) -> list[float]:
    if isinstance(fig, dict):
        return [v for x in fig.values() for v in _numbers(x)]
    if isinstance(fig, list):
        return [v for x in fig for v in _numbers(x)]
    return [float(fig)] if isinstance(fig, (int, float)) and not isinstance(fig, bool) else []


def test_the_metrics_give_embodied_grams_by_part_apart_from_the_gco2_series(store):
    h100, pcie = add_node(store, "de1", "DE", "H100"), add_node(store, "pcie1", "DE", "H100-PCIe", n=1)
    add_intensity(store, "DE", 100.0)
    acc = accountant(store)
    for job in (add_job(store, node="de1", gpu_ids=h100, start=at(10), end=at(11), energy_j=0.4 * 3.6e6),
                add_job(store, node="pcie1", gpu_ids=pcie, start=at(10), end=at(10, 30), energy_j=0.1 * 3.6e6)):
        acc.account(job)  # a job's GPU model is recorded when it is priced
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in StoreCollector(store).collect() for s in f.samples}

    def value(name: str, **labels) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("carbonsched_job_embodied_grams_total", method="measured", part="gpu") == \
        pytest.approx(embodied_g(2.0, H100_GPU_KG))
    assert value("carbonsched_job_embodied_grams_total", method="measured", part="host") == \
        pytest.approx(embodied_g(2.0, H100_HOST_KG))
    assert value("carbonsched_job_embodied_grams_total", method="modelled", part="gpu") == 0.0
    assert value("carbonsched_job_embodied_unknown_gpu_seconds_total", method="measured") == pytest.approx(1800.0)
    assert not any(name == "carbonsched_job_gco2_grams_total" and v == pytest.approx(embodied_g(2.0, 876.5))
                   for (name, _), v in samples.items())
