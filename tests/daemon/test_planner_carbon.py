"""The carbon-aware planner tick against the store (SQLite and PostgreSQL): what goes into the
snapshot (carbon curves from imported rows, PUE and power caps from the config, drained
GPUs, max delay, pinned plans, learned profiles) and what comes back out (estimates and
explanations stored per job, `plan` previews)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, update

from policies.types import PowerCap
from scheduler.carbon import CarbonSignals
from scheduler.carbon_curves import CarbonCurves, curve_from_forecast
from scheduler.carbon_signal import ForecastPoint
from scheduler.daemon.access import Caller, ServiceConfig
from scheduler.daemon.main import plan_preview
from scheduler.daemon.planner import Planner, preview_rows
from scheduler.daemon.policy_factory import make_policy
from scheduler.daemon.service import JobService
from scheduler.profiles import CompletedRun, fold_run
from scheduler.site import SiteConfig
from scheduler.store.models import gpus, jobs, nodes

from tests.conftest import DATA_DIR
import fleet

ROOT = Caller(uid=0, gid=0)
T = datetime(2022, 1, 10, 12, 0, tzinfo=timezone.utc)
CARBON = DATA_DIR / "carbon"
DE = CARBON / "DE-LU_2022-01-01_to_2022-01-21_hourly.csv"
GB = CARBON / "GB_2022-01-01_to_2022-01-14_hourly.csv"
CISO = CARBON / "US-CAL-CISO_2022-01-01_to_2022-01-14_hourly.csv"
DESIGN_PLAN_KEYS = {"job", "node", "gpus", "start", "gco2", "gco2_if_now", "reason"}


def add_node(store, name: str, zone: str, model: str = "H100", n: int = 1, memory_gib: float = 80.0) -> list[int]:
    return fleet.add_node(store, name, at=T, zone=zone, model=model, n=n, memory_gib=memory_gib, vendor="nvidia")


def import_carbon(store, *files) -> None:
    signals = CarbonSignals(store, track_status=False)
    for f in files:
        signals.writes.import_file(f)


def planner_for(store, policy: str = "greedy", *, site: SiteConfig | None = None,
                plan_interval_s: float = 15.0, clock=lambda: T) -> Planner:
    return Planner(store, make_policy(policy, plan_interval_s=plan_interval_s), clock=clock,
                   site=site, plan_interval_s=plan_interval_s)


@pytest.fixture
def service(store, tmp_path):
    return JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs", clock=lambda: T)


def submit(service, **body) -> int:
    return service.submit(ROOT, {"argv": ["true"], "gpus": 1, **body})["id"]


def job_row(store, job_id: int):
    with store.read() as conn:
        return conn.execute(select(jobs).where(jobs.c.id == job_id)).one()


def gpu_zone(store, gpu_id: int) -> str:
    with store.read() as conn:
        return conn.execute(select(nodes.c.zone).join(gpus, gpus.c.node_name == nodes.c.name)
                            .where(gpus.c.id == gpu_id)).scalar_one()


# -- carbon curves ------------------------------------------------------------------------------

def test_the_snapshot_has_a_slot_curve_per_zone_from_the_imported_carbon_rows(store, service):
    import_carbon(store, DE, GB)
    add_node(store, "de1", "DE")
    add_node(store, "gb1", "GB")
    planner = planner_for(store, "fifo")
    with store.read() as conn:
        snap, _ = planner.snapshot(conn)

    assert set(snap.carbon) == {"DE", "GB"}
    signals = CarbonSignals(store, track_status=False)
    for zone, curve in snap.carbon.items():
        assert curve.zone == zone and curve.step_s == snap.slot_s == 900.0
        assert curve.start <= T < curve.start + timedelta(seconds=curve.step_s)
        assert len(curve.values_g_per_kwh) * curve.step_s >= snap.horizon_s
        assert curve.signal == "average"
        end = curve.start + timedelta(seconds=curve.step_s * len(curve.values_g_per_kwh))
        fc = signals.forecast(zone, curve.start, end, as_of=T)
        for k in (0, 5, 40, 150):
            a = curve.start + timedelta(seconds=k * curve.step_s)
            assert curve.values_g_per_kwh[k] == pytest.approx(
                fc.mean_gco2_per_kwh(a, a + timedelta(seconds=curve.step_s)))
    # Real data: Germany's grid in January 2022 is far dirtier than Britain's.
    assert min(snap.carbon["DE"].values_g_per_kwh) > max(snap.carbon["GB"].values_g_per_kwh)
    assert snap.pue == {"DE": 1.0, "GB": 1.0}


def test_a_zone_without_any_carbon_data_gets_no_curve_and_is_logged_as_carbon_blind(store, caplog):
    import_carbon(store, DE)
    add_node(store, "de1", "DE")
    add_node(store, "lab", "LAB-1")  # no rows, no static value
    planner = planner_for(store, "fifo")
    with caplog.at_level(logging.WARNING, logger="scheduler.carbon_curves"):
        with store.read() as conn:
            snap, _ = planner.snapshot(conn)
    assert set(snap.carbon) == {"DE"}
    assert planner.blind_zones(snap) == ["LAB-1"]
    assert any("LAB-1" in r.getMessage() and "carbon-blind" in r.getMessage() for r in caplog.records)


def test_curves_are_cached_for_their_ttl_and_rebuilt_after_it(store):
    import_carbon(store, GB)

    class Counting:
        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def signal_of(self, zone):
            return self.inner.signal_of(zone)

        def forecast(self, *args, **kwargs):
            self.calls += 1
            return self.inner.forecast(*args, **kwargs)

        def climatology(self, *args):
            return self.inner.climatology(*args)

    counting = Counting(CarbonSignals(store, track_status=False))
    clock = [0.0]
    curves = CarbonCurves(counting, slot_s=900, horizon_s=48 * 3600, ttl_s=60, monotonic=lambda: clock[0])
    first = curves.for_zones(["GB"], T)
    clock[0] = 30.0
    assert curves.for_zones(["GB"], T + timedelta(seconds=30)) is first
    assert counting.calls == 1
    clock[0] = 61.0
    curves.for_zones(["GB"], T + timedelta(seconds=61))
    assert counting.calls == 2
    # A new slot starts: rebuilt at once, whatever the TTL.
    clock[0] = 62.0
    again = curves.for_zones(["GB"], T + timedelta(minutes=16))
    assert counting.calls == 3
    assert again["GB"].curve.start == T + timedelta(minutes=15)


def test_gaps_in_a_forecast_are_bridged_with_the_value_before_them():
    from scheduler.carbon_signal import CarbonForecast

    h = timedelta(hours=1)
    pts = (ForecastPoint(T, T + h, 100.0, "actual", "csv", T),
           ForecastPoint(T + 3 * h, T + 4 * h, 300.0, "actual", "csv", T))
    fc = CarbonForecast(zone="Z", signal="average", start=T, end=T + 4 * h, as_of=T, points=pts,
                        gaps=((T + h, T + 3 * h),), level="actual", source="csv", expected_mape_pct=0.0)
    curve = curve_from_forecast(fc, T, 1800, 8)
    assert curve.values_g_per_kwh == (100.0, 100.0, 100.0, 100.0, 100.0, 100.0, 300.0, 300.0)
    assert "bridged" in curve.source
    empty = CarbonForecast(zone="Z", signal="average", start=T, end=T + h, as_of=T, points=(),
                           gaps=((T, T + h),), level="none", source="none", expected_mape_pct=None)
    assert curve_from_forecast(empty, T, 900, 4) is None


def test_a_slot_straddling_two_hours_holds_their_time_weighted_mean():
    from scheduler.carbon_signal import CarbonForecast

    h = timedelta(hours=1)
    pts = (ForecastPoint(T, T + h, 100.0, "actual", "csv", T), ForecastPoint(T + h, T + 2 * h, 400.0, "actual", "csv", T))
    fc = CarbonForecast(zone="Z", signal="average", start=T, end=T + 2 * h, as_of=T, points=pts, gaps=(),
                        level="actual", source="csv", expected_mape_pct=0.0)
    curve = curve_from_forecast(fc, T + timedelta(minutes=45), 1800, 2)
    assert curve.values_g_per_kwh[0] == pytest.approx((15 * 100 + 15 * 400) / 30)


# -- site configuration ----------------------------------------------------------------------

def test_pue_and_power_caps_come_from_the_config_file(store):
    import tomllib

    add_node(store, "de1", "DE")
    add_node(store, "gb1", "GB")
    text = """
[carbonsched]
policy = "greedy"
[carbonsched.site]
pue = 1.3
[carbonsched.zones.DE]
pue = 1.1
power_cap_w = 5000
"""
    config = tomllib.loads(text)["carbonsched"]
    site = SiteConfig.from_config(config)
    planner = planner_for(store, "fifo", site=site)
    with store.read() as conn:
        snap, _ = planner.snapshot(conn)
    assert snap.pue == {"DE": 1.1, "GB": 1.3}
    assert snap.power_caps == (PowerCap(zone="DE", cap_w=5000.0),)


def test_a_sites_budget_covers_its_nodes_and_not_its_zones(store):
    add_node(store, "de1", "DE")
    add_node(store, "fra1", "DE")
    site = SiteConfig.from_config({"zones": {"DE": {"power_cap_w": 5000}},
                                   "sites": {"fra": {"nodes": ["fra1"], "power_cap_w": 3000}}})
    planner = planner_for(store, "fifo", site=site)
    with store.read() as conn:
        snap, _ = planner.snapshot(conn)
    assert {g.node: g.budget for g in snap.gpus} == {"de1": None, "fra1": "site:fra"}
    assert set(snap.power_caps) == {PowerCap(zone="DE", cap_w=5000.0), PowerCap(zone="site:fra", cap_w=3000.0)}


@pytest.mark.parametrize("config, fragment", [
    ({"site": {"pue": 0.9}}, "site.pue"),
    ({"site": {"pue": "high"}}, "site.pue"),
    ({"site": {"peu": 1.2}}, "unknown key"),
    ({"zones": {"DE": {"pue": 7}}}, "zones.DE.pue"),
    ({"zones": {"DE": {"power_cap_w": -5}}}, "zones.DE.power_cap_w"),
    ({"zones": {"DE": {"power_cap": 5}}}, "unknown key"),
    ({"zones": {"DE": 1.2}}, "zones.DE"),
])
def test_bad_site_settings_are_refused_naming_the_key(config, fragment):
    with pytest.raises(ValueError, match=fragment.replace(".", r"\.")):
        SiteConfig.from_config(config)


# -- policy selection -----------------------------------------------------------------------------

def test_the_oracle_is_refused_by_the_daemon_as_simulation_only():
    with pytest.raises(ValueError, match="simulat"):
        make_policy("oracle")


def test_an_unknown_policy_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="fifo"):
        make_policy("fastest")


def test_cpsat_gets_a_time_limit_scaled_to_the_plan_interval():
    assert make_policy("cpsat", plan_interval_s=15).max_time_s == pytest.approx(7.5)
    assert make_policy("cpsat", plan_interval_s=120).max_time_s == pytest.approx(10.0)
    assert make_policy("cpsat", plan_interval_s=4).max_time_s == pytest.approx(2.0)


def test_the_daemon_plans_with_cpsat_by_default():
    from scheduler.daemon.main import DaemonConfig

    assert DaemonConfig(db_url="sqlite://", socket_path=None, state_dir=None).policy == "cpsat"


# -- constraints honoured through the store ---------------------------------------------------------

def test_drained_gpus_are_in_the_snapshot_as_drained_and_never_planned(store, service):
    import_carbon(store, DE, GB)
    (de,) = add_node(store, "de1", "DE")
    (gb,) = add_node(store, "gb1", "GB")
    planner = planner_for(store)
    job = submit(service, est_runtime_s=3600)
    _, plan = planner.preview()
    assert plan.by_job()[job].gpu_ids == (gb,)  # the cleaner zone, while it is open

    with store.write() as conn:
        conn.execute(update(gpus).where(gpus.c.id == gb).values(drained=True))
    with store.read() as conn:
        snap, _ = planner.snapshot(conn)
    assert {g.id: g.drained for g in snap.gpus} == {de: False, gb: True}
    planner.tick()
    assert job_row(store, job).planned_gpu_ids == [de]


def test_max_delay_is_read_from_the_job_and_bounds_the_planned_start(store, service):
    import_carbon(store, CISO)  # a deep evening valley: waiting pays
    add_node(store, "ca1", "US-CAL-CISO")
    planner = planner_for(store)
    free = submit(service, est_runtime_s=3600)
    bounded = submit(service, est_runtime_s=3600, max_delay_s=3600)
    with store.read() as conn:
        snap, _ = planner.snapshot(conn)
    assert {j.id: j.max_delay_s for j in snap.jobs} == {free: None, bounded: 3600.0}

    # Each alone on the GPU: without a bound the cheapest start is hours away.
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == bounded).values(state="CANCELLED"))
    planner.tick()
    assert job_row(store, free).planned_start - T > timedelta(hours=2)
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == free).values(state="CANCELLED"))
        conn.execute(update(jobs).where(jobs.c.id == bounded).values(state="PENDING"))
    planner.tick()
    assert job_row(store, bounded).planned_start <= T + timedelta(hours=1)


def test_a_job_starting_before_the_next_tick_keeps_its_gpus_and_start(store, service):
    import_carbon(store, DE, GB)
    (de,) = add_node(store, "de1", "DE")
    (gb,) = add_node(store, "gb1", "GB")
    planner = planner_for(store, plan_interval_s=15)
    job = submit(service, est_runtime_s=3600)
    planner.tick()
    assert job_row(store, job).planned_gpu_ids == [gb]

    # Its plan says: the dirty zone, 5 s from now (within this tick): it is pinned there.
    soon = T + timedelta(seconds=5)
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job).values(planned_node="de1", planned_gpu_ids=[de],
                                                                 planned_start=soon))
    rev = job_row(store, job).plan_rev
    with store.read() as conn:
        snap, _ = planner.snapshot(conn)
    assert [j.pinned for j in snap.jobs] == [True]
    assert snap.pinned[job].gpu_ids == (de,) and snap.pinned[job].start_at == soon
    stats = planner.tick()
    row = job_row(store, job)
    assert (row.planned_gpu_ids, row.planned_start, row.plan_rev) == ([de], soon, rev)
    assert stats.pinned == 1 and stats.moved == 0

    # The same plan an hour ahead is not pinned: the policy moves it to the cleaner zone.
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job).values(planned_start=T + timedelta(hours=1)))
    planner.tick()
    assert job_row(store, job).planned_gpu_ids == [gb]


def test_a_plan_on_a_gpu_that_was_drained_is_not_pinned(store, service):
    import_carbon(store, DE, GB)
    (de,) = add_node(store, "de1", "DE")
    (gb,) = add_node(store, "gb1", "GB")
    planner = planner_for(store)
    job = submit(service, est_runtime_s=3600)
    planner.tick()
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job).values(planned_start=T + timedelta(seconds=5)))
        conn.execute(update(gpus).where(gpus.c.id == gb).values(drained=True))
    with store.read() as conn:
        snap, _ = planner.snapshot(conn)
    assert [j.pinned for j in snap.jobs] == [False]
    planner.tick()
    assert job_row(store, job).planned_gpu_ids == [de]


# -- what the plan stores and shows ---------------------------------------------------------------

def test_planned_jobs_store_the_estimate_and_explanation_the_policy_gave(store, service):
    import_carbon(store, DE, GB)
    add_node(store, "de1", "DE")
    add_node(store, "gb1", "GB")
    planner = planner_for(store)
    job = submit(service, est_runtime_s=3600, prompts=1000)
    _, plan = planner.preview()
    a = plan.by_job()[job]
    planner.tick()
    row = job_row(store, job)
    assert row.state == "PLANNED"
    assert row.est_gco2 == pytest.approx(a.estimate.gco2) and row.est_gco2 > 0
    assert row.est_gco2_if_now == pytest.approx(a.estimate.gco2_if_now)
    assert row.est_energy_j == pytest.approx(a.estimate.energy_j)
    assert row.est_runtime_planned_s == pytest.approx(a.estimate.runtime_s)
    assert row.binding == a.estimate.binding
    assert row.deadline_miss is bool(a.estimate.deadline_miss)
    assert row.explanation == a.explanation and row.explanation

    shown = service.get_job(ROOT, job)
    assert shown["est_gco2"] == pytest.approx(a.estimate.gco2)
    assert shown["est_gco2_per_prompt"] == pytest.approx(a.estimate.gco2 / 1000)
    assert shown["est_gco2_if_now"] == pytest.approx(a.estimate.gco2_if_now)
    assert shown["est_gco2_if_now_per_prompt"] == pytest.approx(a.estimate.gco2_if_now / 1000)
    assert shown["explanation"] == a.explanation


def test_a_withdrawn_plan_clears_its_estimate_but_keeps_its_counterfactual(store, service):
    """The "if run now" figure is fixed when the job is first planned (policies.pricing.counterfactual):
    it stays for the job's next plan; the plan's own estimate goes with the plan."""
    import_carbon(store, GB)
    (gb,) = add_node(store, "gb1", "GB")
    planner = planner_for(store)
    job = submit(service, est_runtime_s=3600)
    planner.tick()
    planned = job_row(store, job)
    assert planned.est_gco2 is not None and planned.est_gco2_if_now is not None
    with store.write() as conn:
        conn.execute(update(gpus).where(gpus.c.id == gb).values(healthy=False))
    planner.tick()
    row = job_row(store, job)
    assert row.state == "PENDING"
    assert (row.est_gco2, row.binding, row.deadline_miss) == (None, None, False)
    assert row.est_gco2_if_now == planned.est_gco2_if_now


def test_plan_preview_gives_the_documented_keys_and_writes_nothing(store, service):
    import_carbon(store, DE, GB)
    add_node(store, "de1", "DE")
    add_node(store, "gb1", "GB")
    planner = planner_for(store)
    placed = submit(service, est_runtime_s=3600, prompts=500)
    too_big = submit(service, est_runtime_s=3600, gpu_mem_gib=79)
    with store.write() as conn:
        conn.execute(update(gpus).values(memory_gib=40.0))
    preview = plan_preview(preview_rows(planner), service, ROOT)
    assert [p["job"] for p in preview] == [placed, too_big]
    for p in preview:
        assert DESIGN_PLAN_KEYS <= set(p)
    p = preview[0]
    assert p["zone"] == "GB" and p["model"] == "H100" and p["gpus"] == [0]
    assert p["gco2"] > 0 and p["gco2_if_now"] > 0
    assert p["gco2_per_prompt"] == pytest.approx(p["gco2"] / 500)
    assert preview[1]["node"] is None and preview[1]["reason"]
    assert {job_row(store, j).state for j in (placed, too_big)} == {"PENDING"}


def test_a_learned_profile_changes_the_next_estimate(store, service):
    import_carbon(store, GB)
    add_node(store, "gb1", "GB")
    planner = planner_for(store)
    job = submit(service, workload="custom:site-eval", prompts=1000)
    _, before = planner.preview()
    assert before.by_job()[job].estimate.runtime_s == pytest.approx(3600, rel=0.5)  # no profile yet
    # This cluster measured 10 prompts/s per H100 at 500 W for this workload.
    store.transact(lambda conn: fold_run(conn, CompletedRun(
        job_id=0, workload="custom:site-eval", model="H100", gpus=1, runtime_s=100.0, energy_j=50_000.0,
        prompts=1000), T))
    with store.read() as conn:
        snap, _ = planner.snapshot(conn)
    assert any(p.workload == "custom:site-eval" and p.model == "H100" for p in snap.profiles)
    _, after = planner.preview()
    est = after.by_job()[job].estimate
    assert est.runtime_s == pytest.approx(100.0, rel=0.01)
    assert est.energy_j == pytest.approx(50_000.0, rel=0.01)
    assert est.gco2 < before.by_job()[job].estimate.gco2


def test_a_stored_estimate_is_refreshed_when_a_learned_profile_moves_it(store, service):
    import_carbon(store, GB)
    add_node(store, "gb1", "GB")
    planner = planner_for(store)
    job = submit(service, workload="custom:site-eval", prompts=1000)
    planner.tick()
    old = job_row(store, job)
    store.transact(lambda conn: fold_run(conn, CompletedRun(
        job_id=0, workload="custom:site-eval", model="H100", gpus=1, runtime_s=100.0, energy_j=50_000.0,
        prompts=1000), T))
    stats = planner.tick()
    new = job_row(store, job)
    assert stats.moved + stats.refreshed == 1
    assert new.est_runtime_planned_s == pytest.approx(100.0, rel=0.01)
    assert new.est_gco2 < old.est_gco2


def test_an_unchanged_snapshot_is_not_planned_again_but_any_change_is(store, service):
    import_carbon(store, DE)
    add_node(store, "de1", "DE", n=2)
    planner = planner_for(store)
    calls = []
    inner = planner.policy.plan
    planner.policy.plan = lambda snap: calls.append(snap.now) or inner(snap)
    submit(service, est_runtime_s=3600 * 6)
    assert not planner.tick().skipped
    planner.tick()  # the plan it wrote changes the snapshot once (the job is now PLANNED)
    assert planner.tick().skipped and planner.tick().skipped
    n = len(calls)
    submit(service, est_runtime_s=3600)
    assert not planner.tick().skipped and len(calls) == n + 1
    with store.write() as conn:
        conn.execute(update(gpus).values(drained=True).where(gpus.c.index == 1))
    assert not planner.tick().skipped


def test_an_unchanged_snapshot_is_still_planned_again_after_a_while(store, service, monkeypatch):
    import scheduler.daemon.planner as planner_module

    import_carbon(store, DE)
    add_node(store, "de1", "DE")
    planner = planner_for(store)
    submit(service, est_runtime_s=3600 * 6)
    planner.tick()
    planner.tick()
    assert planner.tick().skipped
    monkeypatch.setattr(planner_module, "REPLAN_AT_LEAST_S", 0.0)
    assert not planner.tick().skipped


def test_a_job_with_only_a_short_time_limit_is_planned_for_that_long_not_the_default(store, service):
    import_carbon(store, DE)
    add_node(store, "de1", "DE")
    planner = planner_for(store)
    limited = submit(service, time_limit_s=30)
    unknown = submit(service)
    with store.read() as conn:
        snap, _ = planner.snapshot(conn)
    est = {j.id: j.est_runtime_s for j in snap.jobs}
    assert est[limited] == 30.0
    assert est[unknown] is None  # the default runtime applies


def test_carbon_imported_by_another_process_reaches_the_very_next_plan(store, service, db_url, tmp_path):
    """Issue 16 defect 4: the curves are cached (60 s TTL), but an import in another process
    (here: another Store and CarbonSignals on the same database) must not wait for it. A job
    submitted right after the import is planned into the imported forecast's valley."""
    from scheduler.store import Store

    add_node(store, "lab1", "LAB-1")  # no carbon data, no static value: planned blind
    planner = planner_for(store)
    planner.curves.ttl_s = 3600.0  # the cache alone would keep the blind curve for an hour
    assert planner.tick().blind_zones == ("LAB-1",)

    # 400 g/kWh for a day, but 50 g/kWh from 5 h to 6 h from now: a forecast issued now
    csv = tmp_path / "lab.csv"
    csv.write_text("time,gco2_per_kwh,zone,issued_at\n" + "".join(
        f"{(T + timedelta(hours=h)).isoformat()},{50 if h == 5 else 400},LAB-1,{T.isoformat()}\n"
        for h in range(24)))
    other = Store(db_url)
    try:
        CarbonSignals(other, track_status=False).writes.import_file(csv)
    finally:
        other.dispose()

    job = submit(service, est_runtime_s=3600, deadline=(T + timedelta(hours=12)).isoformat())
    stats = planner.tick()
    assert stats.blind_zones == ()
    row = job_row(store, job)
    assert row.planned_start == T + timedelta(hours=5)
    assert row.est_gco2 is not None and row.est_gco2 < row.est_gco2_if_now / 4


def test_every_write_of_a_zones_carbon_data_moves_its_version(store, tmp_path):
    signals = CarbonSignals(store, track_status=False)
    assert signals.data_versions(["DE", "GB"]) == {"DE": 0, "GB": 0}
    signals.writes.import_file(DE)
    after_import = signals.data_versions(["DE", "GB"])
    assert after_import["DE"] > 0 and after_import["GB"] == 0
    signals.writes.import_file(DE)  # the same values again (an upsert) still counts as a change
    assert signals.data_versions(["DE"])["DE"] > after_import["DE"]


SITES_CONFIG = """
[carbonsched.site]
pue = 1.3
[carbonsched.zones.DE]
pue = 1.2
[carbonsched.sites.fra-new]
pue = 1.05
nodes = ["z-new-hall"]
[carbonsched.nodes.a-old-hall]
pue = 1.6
"""


def test_pue_belongs_to_the_nodes_site_not_only_to_its_zone():
    """Issue 16 defect 6: [nodes.N] pue, then the [sites.S] listing the node, then [zones.Z]
    pue, then [site] pue."""
    import tomllib

    site = SiteConfig.from_config(tomllib.loads(SITES_CONFIG)["carbonsched"])
    assert site.pue("DE", "a-old-hall") == 1.6 and site.pue_source("DE", "a-old-hall") == "nodes.a-old-hall"
    assert site.pue("DE", "z-new-hall") == 1.05 and site.pue_source("DE", "z-new-hall") == "sites.fra-new"
    assert site.pue("DE", "other") == 1.2 and site.pue_source("DE", "other") == "zones.DE"
    assert site.pue("GB", "other") == 1.3 and site.pue("GB") == 1.3
    assert site.node_site_pue("other") is None


@pytest.mark.parametrize("config, fragment", [
    ({"sites": {"fra": {"nodes": ["a"]}}}, "sites.fra.pue"),
    ({"sites": {"fra": {"pue": 1.1, "nodes": "a"}}}, "sites.fra.nodes"),
    ({"sites": {"fra": {"pue": 1.1, "nodes": ["a"]}, "muc": {"pue": 1.2, "nodes": ["a"]}}}, "already in site"),
    ({"sites": {"fra": {"pue": 1.1, "hall": 2}}}, "unknown key"),
    ({"nodes": {"a": {"pue": 0.5}}}, "nodes.a.pue"),
    ({"nodes": {"a": {"peu": 1.5}}}, "unknown key"),
])
def test_bad_site_or_node_pue_settings_are_refused_naming_the_key(config, fragment):
    with pytest.raises(ValueError, match=fragment.replace(".", r"\.")):
        SiteConfig.from_config(config)


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
def test_the_planner_prices_each_gpu_at_its_own_sites_pue_and_prefers_the_efficient_hall(store, service, policy):
    import tomllib

    import_carbon(store, DE)
    add_node(store, "a-old-hall", "DE")
    add_node(store, "z-new-hall", "DE")
    add_node(store, "m-zone-default", "DE")
    site = SiteConfig.from_config(tomllib.loads(SITES_CONFIG)["carbonsched"])
    planner = planner_for(store, policy, site=site)
    with store.read() as conn:
        snap, _ = planner.snapshot(conn)
    assert {g.node: snap.gpu_pue(g) for g in snap.gpus} == {"a-old-hall": 1.6, "z-new-hall": 1.05,
                                                            "m-zone-default": 1.2}
    job = submit(service, est_runtime_s=3600, deadline=(T + timedelta(hours=2)).isoformat())
    with store.read() as conn:
        snap, _ = planner.snapshot(conn)
    planner.tick()
    row = job_row(store, job)
    assert row.planned_node == "z-new-hall"
    # the same run on the old hall costs 1.6 / 1.05 times as much: the estimate scales with PUE
    from policies.solvers.placement import plan_score
    from policies.problem.instance import compile_problem
    from policies.types import Assignment, Plan

    old_gpu = next(g.id for g in snap.gpus if g.node == "a-old-hall")
    problem = compile_problem(snap)
    here = plan_score(problem, Plan((Assignment(job, "z-new-hall", tuple(row.planned_gpu_ids), row.planned_start),)))
    there = plan_score(problem, Plan((Assignment(job, "a-old-hall", (old_gpu,), row.planned_start),)))
    assert there.gco2 / here.gco2 == pytest.approx(1.6 / 1.05)
