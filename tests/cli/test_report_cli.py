"""Fleet reports and the disclosure export: grouping, hand-computed sums, access control,
and the `report` / `export` / `show` CLI formats, on SQLite and PostgreSQL.

The fleet (priced by time weighting: no power samples are stored):
  DE (H100 x2, node de1): 100 g/kWh 10:00-11:00 and 300 g/kWh 11:00-12:00 on 2 March,
                          200 g/kWh 10:00-11:00 on 3 March
  GB (MI300X x2, gb1):    50 g/kWh throughout
  1 alice eval     de1 1 GPU  2 Mar 10:00-11:00  1.0 kWh -> 100 g; 1000 prompts, 1e6 tokens, if-now 150 g
  2 alice finetune de1 2 GPUs 2 Mar 10:30-11:30  2.0 kWh -> 1x100 + 1x300 = 400 g; if-now 500 g; late
  3 bob   eval     gb1 1 GPU  2 Mar 10:00-12:00  1.0 kWh -> 50 g; 4000 prompts
  4 alice eval     de1 1 GPU  3 Mar 10:00-10:30  0.5 kWh -> 100 g; 1000 prompts, 5e5 tokens
  5 bob   (none)   gb1 1 GPU  3 Mar 10:00-11:00  0.5 kWh -> 25 g; FAILED
plus a PENDING job and one that ended in February, which no report of March counts.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, select, update

from policies.model.catalog import catalog
from scheduler.accounting.accountant import Accountant
from scheduler.carbon import CarbonSignals
from scheduler.cli import main as cli
from scheduler.cli.common import EXIT_USAGE
from scheduler.cli.report import export_csv, receipt_text
from scheduler.daemon.access import Caller, RequestError, ServiceConfig
from scheduler.daemon.api import ApiServer, accounting_routes
from scheduler.daemon.service import JobService
from scheduler.store.models import gpus, jobs, nodes
from telemetry.grid.readings import IntensityReading

D2 = datetime(2026, 3, 2, tzinfo=timezone.utc)
D3 = D2 + timedelta(days=1)
H = timedelta(hours=1)
SINCE, UNTIL = datetime(2026, 3, 1, tzinfo=timezone.utc), datetime(2026, 4, 1, tzinfo=timezone.utc)
KWH = 3.6e6
ALICE, BOB = Caller(1000, 1000), Caller(1001, 1001)
H100_PER_H = catalog()["H100"].list_price_usd / (4 * 8766)
MI300X_PER_H = catalog()["MI300X"].list_price_usd / (4 * 8766)


def _add_node(conn, name, zone, model):
    conn.execute(insert(nodes).values(name=name, zone=zone, backend="emulated", emulated=True,
                                      registered_at=D2 - 24 * H, last_heartbeat=D2))
    return [conn.execute(insert(gpus).values(node_name=name, index=i, uuid=f"{name}-{i}", model=model,
                                             vendor="nvidia", memory_gib=80, healthy=True)
                         .returning(gpus.c.id)).scalar_one() for i in range(2)]


def _job(conn, owner: Caller, owner_name: str, node: str, gpu_ids, start, end, energy_j, *, state="COMPLETED",
         **extra) -> int:
    return conn.execute(insert(jobs).values(
        name="j", state=state, owner_uid=owner.uid, owner_gid=owner.gid, owner_groups=[owner.gid],
        owner_name=owner_name, argv=["true"], cwd="/", env={}, gpus=len(gpu_ids), gpu_mem_gib=0.0,
        submitted_at=start, node=node, gpu_ids=gpu_ids, started_at=start, ended_at=end, exit_code=0,
        energy_j=energy_j, energy_method="counter" if energy_j else None, **extra).returning(jobs.c.id)).scalar_one()


@pytest.fixture
def fleet(store):
    ci = [("DE", D2 + 10 * H, 100.0), ("DE", D2 + 11 * H, 300.0), ("DE", D3 + 10 * H, 200.0)]
    ci += [("GB", t, 50.0) for t in (D2 + 10 * H, D2 + 11 * H, D3 + 10 * H)]
    CarbonSignals(store, track_status=False).writes.store_readings(
        IntensityReading(zone=z, at=t, duration_s=3600, gco2_per_kwh=v, signal="average", kind="actual",
                         issued_at=t + H, source="electricitymaps-csv") for z, t, v in ci)
    with store.write() as conn:
        de, gb = _add_node(conn, "de1", "DE", "H100"), _add_node(conn, "gb1", "GB", "MI300X")
        ids = [
            _job(conn, ALICE, "alice", "de1", [de[0]], D2 + 10 * H, D2 + 11 * H, 1.0 * KWH, workload="eval",
                 prompts=1000, tokens=1_000_000, est_gco2_if_now=150.0),
            _job(conn, ALICE, "alice", "de1", de, D2 + 10.5 * H, D2 + 11.5 * H, 2.0 * KWH, workload="finetune",
                 est_gco2_if_now=500.0, deadline=D2 + 11 * H),
            _job(conn, BOB, "bob", "gb1", [gb[0]], D2 + 10 * H, D2 + 12 * H, 1.0 * KWH, workload="eval",
                 prompts=4000),
            _job(conn, ALICE, "alice", "de1", [de[1]], D3 + 10 * H, D3 + 10.5 * H, 0.5 * KWH, workload="eval",
                 prompts=1000, tokens=500_000),
            _job(conn, BOB, "bob", "gb1", [gb[1]], D3 + 10 * H, D3 + 11 * H, 0.5 * KWH, state="FAILED"),
        ]
        conn.execute(insert(jobs).values(
            name="waiting", state="PENDING", owner_uid=ALICE.uid, owner_gid=ALICE.gid, owner_groups=[],
            owner_name="alice", argv=["true"], cwd="/", env={}, gpus=1, gpu_mem_gib=0.0, submitted_at=D3))
        _job(conn, ALICE, "alice", "de1", [de[0]], D2 - 20 * 24 * H, D2 - 20 * 24 * H + H, 9.0 * KWH)
    return store, ids


def _groups(report: dict) -> dict:
    return {g["group"]: g for g in report["groups"]}


def test_report_by_user_matches_the_hand_computed_fleet(fleet):
    store, ids = fleet
    acc = Accountant(store)
    r = acc.report(SINCE, UNTIL, by="user")
    g = _groups(r)
    assert set(g) == {"alice", "bob"}
    a, b = g["alice"], g["bob"]
    assert (a["jobs"], a["completed"], a["deadline_misses"]) == (3, 3, 1)
    assert a["gpu_hours"] == pytest.approx(1 + 2 + 0.5)
    assert a["energy_kwh"] == pytest.approx(3.5)
    assert a["kgco2"] == pytest.approx(0.6)
    assert a["gco2_per_prompt"] == pytest.approx((100 + 100) / 2000)
    assert a["tokens_per_j"] == pytest.approx(1_500_000 / (1.5 * KWH))
    assert a["counterfactual_kgco2"] == pytest.approx(0.65)
    assert a["saving_kgco2"] == pytest.approx(0.15)
    assert a["saving_pct"] == pytest.approx(150 / 650 * 100)
    assert a["usd"] == pytest.approx(3.5 * H100_PER_H + 3.5 * 0.10)
    assert a["usd_per_mtok"] == pytest.approx((1.5 * H100_PER_H + 1.5 * 0.10) / 1.5)
    assert (b["jobs"], b["completed"]) == (2, 1)
    assert b["kgco2"] == pytest.approx(0.075) and b["energy_kwh"] == pytest.approx(1.5)
    assert b["gco2_per_prompt"] == pytest.approx(50 / 4000)
    assert b["tokens_per_j"] is None and b["usd_per_mtok"] is None and b["saving_kgco2"] is None
    assert b["usd"] == pytest.approx(3 * MI300X_PER_H + 1.5 * 0.10)
    t = r["total"]
    assert (t["jobs"], t["gpu_hours"], t["energy_kwh"], t["kgco2"]) == (5, pytest.approx(6.5), pytest.approx(5.0),
                                                                     pytest.approx(0.675))
    assert r["jobs_without_gco2"] == 0
    assert t["intensity_g_per_kwh"] == pytest.approx(675 / 5)


def test_report_groupings(fleet):
    store, _ = fleet
    acc = Accountant(store)
    by_model = _groups(acc.report(SINCE, UNTIL, by="model"))
    assert by_model["H100"]["kgco2"] == pytest.approx(0.6) and by_model["MI300X"]["kgco2"] == pytest.approx(0.075)
    by_zone = _groups(acc.report(SINCE, UNTIL, by="zone"))
    assert set(by_zone) == {"DE", "GB"} and by_zone["GB"]["jobs"] == 2
    by_day = _groups(acc.report(SINCE, UNTIL, by="day"))
    assert set(by_day) == {"2026-03-02", "2026-03-03"}
    assert by_day["2026-03-02"]["kgco2"] == pytest.approx(0.55)
    assert by_day["2026-03-03"]["energy_kwh"] == pytest.approx(1.0)
    by_workload = _groups(acc.report(SINCE, UNTIL, by="workload"))
    assert {k: v["jobs"] for k, v in by_workload.items()} == {"eval": 3, "finetune": 1, None: 1}
    by_node = _groups(acc.report(SINCE, UNTIL, by="node"))
    assert by_node["de1"]["gpu_hours"] == pytest.approx(3.5)
    with pytest.raises(ValueError):
        acc.report(SINCE, UNTIL, by="colour")


def test_a_period_counts_only_jobs_that_ended_in_it(fleet):
    store, _ = fleet
    acc = Accountant(store)
    one_day = acc.report(D3, D3 + 24 * H, by="user")
    assert one_day["total"]["jobs"] == 2 and one_day["total"]["kgco2"] == pytest.approx(0.125)
    february = acc.report(SINCE - timedelta(days=28), SINCE, by="user")
    assert february["total"]["jobs"] == 1 and february["total"]["energy_kwh"] == pytest.approx(9.0)
    assert acc.report(UNTIL, UNTIL + H)["groups"] == []


def test_the_report_prices_finished_jobs_that_were_never_accounted(fleet):
    store, ids = fleet
    with store.read() as conn:
        assert conn.execute(select(jobs.c.gco2).where(jobs.c.id == ids[1])).scalar() is None
    Accountant(store).report(SINCE, UNTIL)
    with store.read() as conn:
        assert conn.execute(select(jobs.c.gco2).where(jobs.c.id == ids[1])).scalar() == pytest.approx(400.0)


def test_users_see_only_their_own_jobs_and_admins_everyone(fleet, tmp_path):
    store, ids = fleet
    service = JobService(store, ServiceConfig(daemon_uid=999_999), log_dir=tmp_path)
    routes = accounting_routes(Accountant(store), service)
    report, export, receipt = routes[("GET", "report")], routes[("GET", "export")], routes[("GET", "receipt")]
    q = {"since": ["2026-03-01"], "until": ["2026-04-01"], "by": ["user"]}
    assert set(_groups(report(ALICE, q))) == {"alice"}
    assert report(BOB, q)["total"]["jobs"] == 2 and report(BOB, q)["scope"] == "uid 1001"
    assert set(_groups(report(Caller(0, 0), q))) == {"alice", "bob"}
    assert export(ALICE, q)["totals"]["jobs"] == 3
    assert export(Caller(0, 0), q)["totals"]["jobs"] == 5
    assert receipt(ALICE, {"job": [str(ids[0])]})["gco2"] == pytest.approx(100.0)
    with pytest.raises(RequestError) as e:
        receipt(ALICE, {"job": [str(ids[2])]})
    assert e.value.status == 403
    with pytest.raises(RequestError) as e:
        receipt(ALICE, {"job": ["999999"]})
    assert e.value.status == 404
    for bad in ({"by": ["colour"]}, {"since": ["whenever"]}, {"since": ["2026-04-01"], "until": ["2026-03-01"]}):
        with pytest.raises(RequestError) as e:
            report(ALICE, bad)
        assert e.value.status == 400


def test_export_lists_each_system_with_its_methodology(fleet):
    store, _ = fleet
    doc = Accountant(store).export(SINCE, UNTIL)
    systems = {(s["node"], s["gpu_model"], s["zone"]): s for s in doc["systems"]}
    assert set(systems) == {("de1", "H100", "DE"), ("gb1", "MI300X", "GB")}
    de = systems[("de1", "H100", "DE")]
    assert de["it_energy_kwh"] == pytest.approx(3.5) and de["emissions_kgco2e"] == pytest.approx(0.6)
    assert de["facility_energy_kwh"] == pytest.approx(3.5)  # PUE 1.0 by default
    assert de["pue"] == [1.0] and de["signal"] == ["average"]
    assert de["measurement_shares"] == {"counter": pytest.approx(1.0)}
    assert de["intensity_basis_shares"] == {"actual": pytest.approx(1.0)}
    assert doc["totals"]["emissions_kgco2e"] == pytest.approx(0.675)
    assert doc["period"] == {"start": "2026-03-01T00:00:00Z", "end": "2026-04-01T00:00:00Z"}
    assert doc["generator"]["name"] == "carbonsched" and doc["generator"]["version"]
    sources = {s["source"]: s for s in doc["methodology"]["data_sources"]}
    assert sources["electricitymaps-csv"]["licence"].startswith("ODbL")
    assert sources["electricitymaps-csv"]["zones"] == ["DE", "GB"]
    for key in ("boundary", "energy_measurement", "emissions", "signal", "pue", "gaps"):
        assert doc["methodology"][key]


# -- the CLI ----------------------------------------------------------------------------------

def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        cli.main(list(argv))
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


@pytest.fixture
def db(fleet, monkeypatch, tmp_path):
    monkeypatch.setenv("CARBONSCHED_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("[accounting]\nenergy_price_usd_per_kwh = 0.2\n")
    store, ids = fleet
    return store.engine.url.render_as_string(hide_password=False), ids


def test_report_cli_formats(db, capsys, tmp_path):
    url, _ = db
    period = ("--since", "2026-03-01", "--until", "2026-04-01")
    code, out, _ = run_cli(capsys, "report", "--db", url, *period, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["total"]["kgco2"] == pytest.approx(0.675)
    assert data["assumptions"]["energy_price_usd_per_kwh"] == 0.2    # from the config file

    code, out, _ = run_cli(capsys, "report", "--db", url, *period, "--by", "zone", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["zone"] for r in rows] == ["DE", "GB", "TOTAL"]
    assert float(rows[0]["kgco2"]) == pytest.approx(0.6) and rows[1]["tokens_per_j"] == ""

    plot = tmp_path / "daily.png"
    code, out, _ = run_cli(capsys, "report", "--db", url, *period, "--by", "model", "--plot", str(plot))
    assert code == 0
    assert "H100" in out and "MI300X" in out and "TOTAL" in out and "TOK/J" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    code, _, err = run_cli(capsys, "report", "--db", url, "--since", "2026-04-01", "--until", "2026-03-01")
    assert code == EXIT_USAGE and "empty" in err


def test_export_cli_writes_json_and_csv(db, capsys, tmp_path):
    url, _ = db
    out_json, out_csv = tmp_path / "d.json", tmp_path / "d.csv"
    code, _, err = run_cli(capsys, "export", "--db", url, "--since", "2026-03-01", "--until", "2026-04-01",
                           "--out", str(out_json))
    assert code == 0 and "2 system(s)" in err
    assert json.loads(out_json.read_text())["totals"]["it_energy_kwh"] == pytest.approx(5.0)
    code, _, _ = run_cli(capsys, "export", "--db", url, "--since", "2026-03-01", "--until", "2026-04-01",
                         "--format", "csv", "--out", str(out_csv))
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert [(r["node"], r["zone"]) for r in rows] == [("de1", "DE"), ("gb1", "GB")]
    assert float(rows[1]["emissions_kgco2e"]) == pytest.approx(0.075)
    assert rows[0]["measurement_shares"] == "counter=1.0000" and "ODbL" in rows[0]["data_sources"]


def test_report_and_show_through_the_daemon_socket(db, capsys, tmp_path):
    url, ids = db
    from scheduler.store import Store

    store = Store(url)
    service = JobService(store, ServiceConfig(daemon_uid=os.geteuid()), log_dir=tmp_path / "logs")
    api = ApiServer(tmp_path / "s.sock", service, extra_routes=accounting_routes(Accountant(store), service))
    api.start()
    try:
        sock = str(tmp_path / "s.sock")
        code, out, _ = run_cli(capsys, "--socket", sock, "report", "--since", "2026-03-01", "--until",
                               "2026-04-01", "--by", "day")
        assert code == 0 and "2026-03-02" in out and "TOTAL" in out
        code, out, _ = run_cli(capsys, "--socket", sock, "show", str(ids[1]), "--json")
        job = json.loads(out)
        assert job["receipt"]["gco2"] == pytest.approx(400.0)
        assert job["receipt"]["deadline_met"] is False
        code, out, _ = run_cli(capsys, "--socket", sock, "show", str(ids[0]))
        assert "carbon receipt:" in out and "100.00 g" in out and "saved" in out
        code, out, _ = run_cli(capsys, "--socket", sock, "export", "--since", "2026-03-01", "--until", "2026-04-01")
        assert json.loads(out)["totals"]["jobs"] == 5
    finally:
        api.stop()
        store.dispose()


def test_what_jobs_reported_beats_what_was_declared_and_every_figure_says_which(fleet):
    """Job 1 reports 1250 prompts and 800k output tokens itself (it declared 1000 and 1e6);
    job 4 reports nothing: alice's per-prompt figures mix reported and declared counts."""
    store, ids = fleet
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == ids[0]).values(
            reported_prompts=1250, reported_input_tokens=300_000, reported_output_tokens=800_000))
    acc = Accountant(store)
    r = acc.receipt(ids[0])
    assert (r["prompts"], r["prompts_source"], r["declared_prompts"]) == (1250, "reported", 1000)
    assert (r["tokens"], r["tokens_source"], r["reported_input_tokens"]) == (800_000, "reported", 300_000)
    assert r["gco2_per_prompt"] == pytest.approx(100 / 1250)
    assert r["gco2_per_1k_tokens"] == pytest.approx(100 / 800)
    assert r["tokens_per_j"] == pytest.approx(800_000 / KWH)
    assert r["usd_per_mtok"] == pytest.approx(r["cost_usd"] / 0.8)
    declared = acc.receipt(ids[3])
    assert (declared["prompts"], declared["prompts_source"], declared["tokens_source"]) == (1000, "declared", "declared")
    text = receipt_text(r)
    assert "per prompt: 0.08 g (1,250 prompts, reported)" in text
    assert "(800,000 output tokens, reported); 0.222 tokens/J; $" in text

    a = _groups(acc.report(SINCE, UNTIL, by="user"))["alice"]
    assert a["prompts"] == 1250 + 1000 and a["prompts_source"] == "partly reported"
    assert a["gco2_per_prompt"] == pytest.approx((100 + 100) / 2250)
    assert a["tokens"] == 800_000 + 500_000 and a["tokens_per_j"] == pytest.approx(1_300_000 / (1.5 * KWH))
    assert a["gco2_per_1k_tokens"] == pytest.approx(200 / 1300)
    b = _groups(acc.report(SINCE, UNTIL, by="user"))["bob"]
    assert b["prompts_source"] == "declared" and b["tokens_source"] is None

    doc = acc.export(SINCE, UNTIL)
    assert doc["totals"]["prompts_source"] == "partly reported" and doc["totals"]["prompts"] == 1250 + 1000 + 4000
    de1 = next(s for s in doc["systems"] if s["node"] == "de1")
    assert de1["tokens_source"] == "partly reported" and de1["usd_per_mtok"] is not None
    assert "reported" in doc["methodology"]["work"]
    rows = list(csv.DictReader(io.StringIO(export_csv(doc))))
    assert {r["prompts_source"] for r in rows} == {"partly reported", "declared"}


def test_prometheus_counts_reported_and_declared_work_apart(fleet):
    from scheduler.metrics import StoreCollector

    store, ids = fleet
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == ids[0]).values(reported_prompts=1250,
                                                                     reported_output_tokens=800_000))
    Accountant(store).report(SINCE, UNTIL)  # prices the March jobs
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for family in StoreCollector(store).collect() for s in family.samples}

    def of(name: str, source: str) -> float:  # all average-signal grams here
        return value[(name, (("method", "measured"), ("signal", "average"), ("source", source)))]

    # jobs count once they have a gCO2 figure (the February job has none: no carbon data then)
    assert of("carbonsched_job_prompts_total", "reported") == 1250
    assert of("carbonsched_job_prompts_total", "declared") == 4000 + 1000
    assert of("carbonsched_job_output_tokens_total", "reported") == 800_000
    assert of("carbonsched_job_output_tokens_total", "declared") == 500_000
    assert of("carbonsched_job_tokens_energy_joules_total", "reported") == pytest.approx(KWH)
    assert of("carbonsched_job_tokens_gco2_grams_total", "declared") == pytest.approx(100)


# -- issue 25, 9a/9b: average and marginal grams never added; one definition of intensity -------

@pytest.fixture
def two_signals(store):
    """1 kWh in DE priced with the average signal at 100 g/kWh on a PUE 1.5 site (150 g), and
    1 kWh in US-CAL priced with the marginal signal at 800 g/kWh (PUE 1.0: 800 g)."""
    with store.write() as conn:
        de, us = _add_node(conn, "de1", "DE", "H100"), _add_node(conn, "us1", "US-CAL-CISO", "H100")
        ids = [_job(conn, ALICE, "alice", "de1", [de[0]], D2 + 10 * H, D2 + 11 * H, 1.0 * KWH, zone="DE",
                    gpu_model="H100", pue=1.5, gco2=150.0, gco2_signal="average", gco2_basis="actual",
                    accounted_at=D2 + 12 * H, prompts=100),
               _job(conn, BOB, "bob", "us1", [us[0]], D2 + 10 * H, D2 + 11 * H, 1.0 * KWH, zone="US-CAL-CISO",
                    gpu_model="H100", pue=1.0, gco2=800.0, gco2_signal="marginal", gco2_basis="actual",
                    accounted_at=D2 + 12 * H, prompts=100)]
    return store, ids


def test_report_totals_never_add_average_and_marginal_grams(two_signals):
    store, _ = two_signals
    r = Accountant(store).report(SINCE, UNTIL, by="zone")
    t = r["total"]
    assert t["energy_kwh"] == pytest.approx(2.0) and t["jobs"] == 2  # energy adds up, grams do not
    assert t["signal"] == "mixed"
    assert t["kgco2"] is None and t["intensity_g_per_kwh"] is None and t["gco2_per_prompt"] is None
    assert t["by_signal"]["average"]["kgco2"] == pytest.approx(0.15)
    assert t["by_signal"]["marginal"]["kgco2"] == pytest.approx(0.8)
    g = _groups(r)
    assert g["DE"]["signal"] == "average" and g["DE"]["kgco2"] == pytest.approx(0.15)
    assert g["US-CAL-CISO"]["signal"] == "marginal" and g["US-CAL-CISO"]["kgco2"] == pytest.approx(0.8)
    # one definition of intensity (receipts' too): grams per kWh of facility energy, PUE out
    assert g["DE"]["intensity_g_per_kwh"] == pytest.approx(100.0)
    assert t["by_signal"]["average"]["intensity_g_per_kwh"] == pytest.approx(100.0)
    text = cli_report_table(r)
    assert "0.15 kg at 100 g/kWh (average)" in text and "0.8 kg at 800 g/kWh (marginal)" in text


def test_export_splits_emissions_by_signal(two_signals):
    store, _ = two_signals
    doc = Accountant(store).export(SINCE, UNTIL)
    assert doc["totals"]["emissions_kgco2e"] is None and doc["totals"]["signal"] == "mixed"
    assert doc["totals"]["emissions_kgco2e_by_signal"] == {"average": pytest.approx(0.15),
                                                           "marginal": pytest.approx(0.8)}
    systems = {s["zone"]: s for s in doc["systems"]}
    assert systems["DE"]["emissions_kgco2e"] == pytest.approx(0.15) and systems["DE"]["signal"] == ["average"]
    assert systems["DE"]["intensity_g_per_kwh"] == pytest.approx(100.0)
    rows = list(csv.DictReader(io.StringIO(export_csv(doc))))
    assert {r["zone"]: (r["emissions_kgco2e_average"], r["emissions_kgco2e_marginal"]) for r in rows} == {
        "DE": ("0.15", ""), "US-CAL-CISO": ("", "0.8")}


def test_the_gco2_metric_is_one_series_per_signal(two_signals):
    from scheduler.metrics import StoreCollector

    store, _ = two_signals
    grams = {tuple(s.labels.values()): s.value for fam in StoreCollector(store).collect()
             if fam.name == "carbonsched_job_gco2_grams" for s in fam.samples}
    assert grams[("measured", "average")] == pytest.approx(150.0)
    assert grams[("measured", "marginal")] == pytest.approx(800.0)


def cli_report_table(data: dict) -> str:
    from scheduler.cli.report import report_table

    return report_table(data)


# -- an unknown emission is never 0 (issue 28) ------------------------------------------------

@pytest.fixture
def local_zone(store, monkeypatch, tmp_path):
    """A one-machine install on the default zone `local`: energy measured, no carbon data."""
    monkeypatch.setenv("CARBONSCHED_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    with store.write() as conn:
        gpu = _add_node(conn, "box", "local", "H100")
        for k in range(2):
            _job(conn, ALICE, "alice", "box", [gpu[k]], D2 + 10 * H, D2 + 11 * H, 1.0 * KWH, zone="local")
    return store


def test_a_fleet_with_no_carbon_data_reports_unknown_emissions_not_zero_and_says_why(local_zone, capsys, tmp_path):
    store = local_zone
    r = Accountant(store).report(SINCE, UNTIL, by="user")
    assert r["total"]["kgco2"] is None and _groups(r)["alice"]["kgco2"] is None
    assert r["total"]["energy_kwh"] == pytest.approx(2.0)       # the energy is known
    assert r["jobs_without_gco2"] == 2
    assert r["unpriced"] == [{"zone": "local", "jobs": 2, "jobs_unmeasured": 0, "zone_has_data": False,
                              "why": "zone local has no carbon data (import it: carbonsched carbon import FILE "
                                     "--zone local)"}]
    doc = Accountant(store).export(SINCE, UNTIL)
    assert doc["totals"]["emissions_kgco2e"] is None and doc["systems"][0]["emissions_kgco2e"] is None
    assert doc["totals"]["jobs_without_emissions"] == 2

    url = store.engine.url.render_as_string(hide_password=False)
    period = ("--since", "2026-03-01", "--until", "2026-04-01")
    code, out, _ = run_cli(capsys, "report", "--db", url, *period)
    assert code == 0
    total = next(line for line in out.splitlines() if line.startswith("TOTAL")).split()
    assert total[4] == "-"                                         # KGCO2: unknown, not 0
    assert "2 job(s) are unpriced" in out and "zone local has no carbon data" in out
    code, out, _ = run_cli(capsys, "export", "--db", url, *period)
    assert json.loads(out)["totals"]["emissions_kgco2e"] is None
    code, _, err = run_cli(capsys, "export", "--db", url, *period, "--out", str(tmp_path / "d.json"))
    assert code == 0 and "emissions unknown (2 job(s) unpriced)" in err


def test_a_partly_priced_group_sums_only_the_priced_jobs_and_counts_the_rest(fleet):
    store, ids = fleet
    with store.write() as conn:
        gpu = _add_node(conn, "box", "local", "H100")
        _job(conn, ALICE, "alice", "box", [gpu[0]], D2 + 10 * H, D2 + 11 * H, 1.0 * KWH, zone="local")
    r = Accountant(store).report(SINCE, UNTIL, by="user")
    assert _groups(r)["alice"]["kgco2"] == pytest.approx(0.6)     # its DE jobs; the local one is unpriced
    assert r["jobs_without_gco2"] == 1 and r["unpriced"][0]["zone"] == "local"


def test_report_plot_refuses_an_unwritable_path_before_printing_anything(db, capsys, tmp_path):
    url, _ = db
    code, out, err = run_cli(capsys, "report", "--db", url, "--plot", str(tmp_path / "nodir" / "p.png"))
    assert code == EXIT_USAGE and out == "" and "no directory" in err and len(err.splitlines()) == 1


def test_a_plot_of_a_period_without_priced_emissions_has_no_negative_axis(local_zone, tmp_path):
    from scheduler.cli.report import plot_daily

    data = Accountant(local_zone).report(SINCE, UNTIL, by="day")
    assert [g["kgco2"] for g in data["groups"]] == [None]
    plot_daily(data, str(tmp_path / "p.png"))  # draws, with a note instead of a zero bar
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_the_report_table_never_prints_an_exponent():
    """A demo's handful of seconds-long jobs saved 0.0000482 kg, which printed as 4.82e-05."""
    from scheduler.cli.report import _num

    assert _num(4.82e-05, ".3g") == "0.0000482"
    assert _num(0.0005761, ".4g") == "0.0005761"
    assert _num(123456.0, ".4g") == "123500"  # four significant digits, as ".4g" meant
    assert _num(411.2, ".0f") == "411" and _num(None, ".4g") == "-" and _num(0.0, ".3g") == "0"
    for v in (3.2e-9, 7.7e-06, 1.5e7, 9.99e-5):
        assert "e" not in _num(v, ".3g") and "e" not in _num(v, ".4g")


def test_figures_in_plans_and_receipts_never_print_an_exponent():
    """The demo's plan said "1.51e+03 J/prompt" (an MI300X running llm-reason)."""
    from policies.types import sig
    from policies.model.operating_point import job_choice

    assert [sig(1514.2), sig(4.82e-05), sig(0.25), sig(12.345, 4), sig(0.0), sig(-0.00032)] == [
        "1510", "0.0000482", "0.25", "12.35", "0", "-0.00032"]
    note = job_choice("llm-reason", "MI300X", 1, None, None, None).note
    figure = re.search(r"(\S+) J/prompt", note).group(1)
    assert float(figure) >= 1000 and re.fullmatch(r"\d{4}", figure) and "e+" not in note, note


def test_the_clis_significant_figures_are_the_policies_own():
    """Two copies of one rule (the CLI cannot import `policies` at start-up): held equal."""
    from policies.types import sig
    from scheduler.text_table import significant

    for v in (0.0, 4.82e-05, -3.2e-9, 0.25, 1.0, 12.345, 999.5, 1514.2, 123456.0, 1.5e7, float("inf")):
        for digits in (2, 3, 4):
            assert significant(v, digits) == sig(v, digits)


def test_the_daily_plot_names_its_period_marks_modelled_days_and_keeps_its_legend_off_the_data():
    from scheduler.cli.report import daily_figure

    def day(name, kg, modelled):
        return {"group": name, "kgco2": kg, "intensity_g_per_kwh": 300.0, "jobs_modelled": modelled}

    data = {"since": "2026-12-01T00:00:00+00:00", "until": "2026-12-03T00:00:00+00:00", "scope": "all users",
            "groups": [day("2026-12-01", 1.5, 0), day("2026-12-02", 2.0, 3)], "jobs_without_gco2": 0}
    fig = daily_figure(data)
    fig.canvas.draw()
    ax = fig.axes[0]
    assert "2026-12-01T00:00 to 2026-12-03T00:00 UTC" in ax.get_title()
    assert [bar.get_hatch() for bar in ax.patches] == [None, "///"]
    legend = fig.legends[0]
    assert "kgCO2, energy partly modelled" in [t.get_text() for t in legend.get_texts()]
    renderer = fig.canvas.get_renderer()
    assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))


def test_export_by_account_writes_each_accounts_statement_for_a_month(db, capsys, tmp_path):
    url, _ = db
    code, out, _ = run_cli(capsys, "export", "--db", url, "--by", "account", "--period", "2026-03")
    assert code == 0
    doc = json.loads(out)
    assert doc["period"] == {"start": "2026-03-01T00:00:00Z", "end": "2026-04-01T00:00:00Z"}
    [default] = [a for a in doc["accounts"] if a["account"] == "default"]
    assert default["jobs"] == 5 and default["usage"]["kgco2e"] == pytest.approx(0.675)
    assert default["charged"]["kgco2e"] == pytest.approx(0.675)  # every job under normal: factor 1
    out_csv = tmp_path / "s.csv"
    code, _, err = run_cli(capsys, "export", "--db", url, "--by", "account", "--period", "2026-03",
                           "--format", "csv", "--out", str(out_csv))
    assert code == 0 and "account(s)" in err
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert float({r["account"]: r for r in rows}["default"]["charged_energy_kwh"]) == pytest.approx(5.0)
    code, _, err = run_cli(capsys, "export", "--db", url, "--by", "account", "--period", "2026-13")
    assert code == EXIT_USAGE and "--period" in err and len(err.strip().splitlines()) == 1
    code, out, _ = run_cli(capsys, "report", "--db", url, "--since", "2026-03-01", "--until", "2026-04-01",
                           "--by", "account")
    assert code == 0 and "charged (usage x QOS usage factor" in out and "default" in out
