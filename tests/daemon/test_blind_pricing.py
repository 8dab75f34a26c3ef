"""A zone without carbon data (issue 16, defect 2): one price for every policy and path,
never 0, and said so in `plan` and `show`.

The rule (`policies.pricing.blind`): the highest intensity any zone of the snapshot has over the
planning horizon; with no carbon data at all, the highest static yearly mean of the built-in
table. The scheduler has already fallen back to a zone's static yearly mean where it has one
(so DE is never blind; a zone such as the default `local` is).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import update

from policies import GpuSlot, QueuedJob, Snapshot, get_policy
from policies.pricing.blind import NO_DATA_G_PER_KWH, blind_price
from policies.types import CarbonCurve
from policy_checker import violations
from scheduler.daemon.planner import preview_rows
from scheduler.store.models import gpus, jobs
from telemetry.grid.static import STATIC_YEARLY_GCO2_PER_KWH

from tests.daemon.test_planner_carbon import DE, add_node, import_carbon, job_row, planner_for, service, submit  # noqa: F401

NOW = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)
POLICIES = ["fifo", "greedy", "cpsat"]
# GB is clean now (50 g/kWh for 6 h), dirtier later: the highest value in the horizon is 300
GB_CURVE = CarbonCurve(zone="GB", start=NOW, step_s=3600, values_g_per_kwh=(50.0,) * 6 + (300.0,) * 54)


def plan(policy: str, snapshot: Snapshot):
    params = {"max_time_s": 1.0, "workers": 1} if policy == "cpsat" else {}
    p = get_policy(policy, **params).plan(snapshot)
    assert violations(snapshot, p) == []
    return p


def fleet(*zones: str) -> tuple[GpuSlot, ...]:
    """One free H100 per zone, on nodes named in the given order (fifo takes the first)."""
    return tuple(GpuSlot(i + 1, f"node{i}-{z}", z, 0, "H100", 80.0) for i, z in enumerate(zones))


def job(runtime_s: float) -> QueuedJob:
    return QueuedJob(1, 1, 0.0, NOW, est_runtime_s=runtime_s)


@pytest.mark.parametrize("policy", ["greedy", "cpsat"])
@pytest.mark.parametrize("runtime_s", [600.0, 3 * 3600.0], ids=["short", "long"])
def test_a_job_does_not_go_to_a_zone_without_data_as_if_it_were_free(policy, runtime_s):
    """The issue's case: a 10-minute job went to the zone with no data (priced 0 g) although
    the other zone was at 50 g/kWh (fifo's whole plan, on the blind zone's node that sorts
    first, scored 0 g and was kept). Priced at the highest intensity in the snapshot (300),
    the blind zone loses to GB's 50 now, for short and long jobs alike."""
    a = plan(policy, Snapshot(now=NOW, jobs=(job(runtime_s),), gpus=fleet("local", "GB"),
                              carbon={"GB": GB_CURVE})).by_job()[1]
    assert a.node == "node1-GB"


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("runtime_s", [600.0, 3 * 3600.0], ids=["short", "long"])
def test_every_policy_and_path_prices_a_blind_zone_alike_and_says_so(policy, runtime_s):
    """Only the blind zone can take the job (the other GPU is busy for days): its estimate is
    its energy at 300 g/kWh in fifo, the slot planner and short-job packing, never 0 or None."""
    gpus = (GpuSlot(1, "n-local", "local", 0, "H100", 80.0),
            GpuSlot(2, "n-GB", "GB", 0, "H100", 80.0, busy_until=NOW + timedelta(days=5)))
    a = plan(policy, Snapshot(now=NOW, jobs=(job(runtime_s),), gpus=gpus, carbon={"GB": GB_CURVE})).by_job()[1]
    assert a.node == "n-local"
    assert a.estimate.blind_g_per_kwh == 300.0
    assert a.estimate.gco2 == pytest.approx(a.estimate.energy_j / 3.6e6 * 300.0)
    assert a.estimate.gco2_if_now == pytest.approx(a.estimate.gco2)
    assert "priced blind at 300 g/kWh (the highest intensity in the snapshot, GB)" in a.explanation


def test_with_no_carbon_data_at_all_the_highest_static_yearly_mean_prices_every_zone():
    assert NO_DATA_G_PER_KWH == max(STATIC_YEARLY_GCO2_PER_KWH.values())
    s = Snapshot(now=NOW, jobs=(job(3600.0),), gpus=fleet("local", "lab"))
    assert blind_price(s).g_per_kwh == NO_DATA_G_PER_KWH
    for policy in POLICIES:
        a = plan(policy, s).by_job()[1]
        assert a.estimate.gco2 == pytest.approx(a.estimate.energy_j / 3.6e6 * NO_DATA_G_PER_KWH)
        assert a.estimate.gco2 > 0


# -- the daemon's planner, `plan` and `show` (SQLite and PostgreSQL) ------------------------------

def test_plan_and_show_say_a_zone_was_priced_blind_and_at_what(store, service):  # noqa: F811
    from scheduler.cli.output import job_detail, plan_table
    from scheduler.job_view import jobs_json
    from scheduler.jobs.views import job_select

    import_carbon(store, DE)
    add_node(store, "lab1", "local")  # the default zone: no carbon data anywhere
    add_node(store, "de1", "DE", n=1)
    with store.write() as conn:  # DE's GPU is drained: only the blind zone can take the job
        conn.execute(update(gpus).where(gpus.c.node_name == "de1").values(drained=True))
    job_id = submit(service, est_runtime_s=3600)
    planner = planner_for(store)
    rows = preview_rows(planner)
    price = rows[0]["priced_blind_g_per_kwh"]
    assert rows[0]["zone"] == "local" and rows[0]["carbon_blind"] and price > 0
    assert rows[0]["gco2"] == pytest.approx(rows[0]["energy_j"] / 3.6e6 * price)
    assert f"priced blind at {price:.0f} g/kWh" in plan_table(rows)

    planner.tick()
    row = job_row(store, job_id)
    assert row.est_gco2 == pytest.approx(row.est_energy_j / 3.6e6 * price)
    assert f"priced blind at {price:.0f} g/kWh (the highest intensity in the snapshot, DE)" in row.explanation
    with store.read() as conn:
        shown = jobs_json(conn.execute(job_select(store.dialect).where(jobs.c.id == job_id)), {})[0]
    assert "priced blind at" in job_detail({**shown, "owner_uid": 0, "events": []})
