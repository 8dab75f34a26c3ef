"""Site power budgets (issue 29 item 3, `[sites.S]`): one grid zone can hold several data
centres, each behind its own feed. A site's budget holds the planned and simulated power of
its own nodes only; its zone's budget covers the zone's other nodes; the daemon reads the
same keys for a site as for a zone, and its governor measures each budget over its own nodes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from sqlalchemy import select

from policies.model.energy import generic_power_w
from policies.types import QueuedJob, budget_text
from policies.pricing.power_cap import CapBounds
from scheduler.daemon.power_governor import PowerGovernor
from scheduler.power_budget import ZoneBudget
from scheduler.simulate.cluster import ClusterSpecError, cluster_from_dict
from scheduler.simulate.forecasts import ForecastModel
from scheduler.simulate.intensity import ZoneIntensity
from scheduler.simulate.model import Simulation
from scheduler.simulate.settings import SimSettings
from scheduler.site import SiteConfig
from scheduler.store.models import job_events
from tests.daemon.test_power_governor import measured_w, node, start_jobs  # noqa: F401  (the agent fixture)

START = datetime(2022, 10, 19, 0, tzinfo=timezone.utc)
NODE_PEAK_W = 4 * generic_power_w("H100", None)  # four busy H100s by the planner's model


def _flat_de() -> ZoneIntensity:
    return ZoneIntensity(zone="DE", first_hour=int(START.timestamp() // 3600), values_g_per_kwh=np.full(96, 300.0),
                         signal="average", source="synthetic")


def _run(cluster_table: dict, policy: str, params: dict | None = None):
    cluster = cluster_from_dict(cluster_table)
    carbon = {"DE": _flat_de()}
    jobs = [QueuedJob(id=i + 1, gpus=1, gpu_mem_gib=10, submitted_at=START + timedelta(minutes=10 * i),
                      est_runtime_s=2 * 3600.0, deadline=START + timedelta(hours=40)) for i in range(16)]
    sim = Simulation(cluster=cluster, jobs=jobs, carbon=carbon, policy=policy, policy_params=params,
                     forecast=ForecastModel(kind="perfect", zones=carbon, name="perfect"),
                     settings=SimSettings(plan_interval_s=900.0, wake_on_submit=True))
    return sim.run()


TWO_SITES = {
    "zone": {"DE": {"power_cap_w": 0.5 * NODE_PEAK_W}},  # covers node b only
    "sites": {"fra": {"power_cap_w": 0.5 * NODE_PEAK_W}},
    "node": [{"name": "a", "zone": "DE", "gpus": "4xH100", "site": "fra"},
             {"name": "b", "zone": "DE", "gpus": "4xH100"}],
}


@pytest.mark.parametrize("policy, params", [("greedy", None), ("cpsat", {"max_time_s": 0.5})])
def test_a_sites_budget_holds_its_own_nodes_and_its_zones_budget_the_others(policy, params):
    run = _run(TWO_SITES, policy, params)
    assert all(r.state == "done" for r in run.records)
    site, zone = run.site_meters["site:fra"], run.meters["DE"]
    assert site.over_cap_s == 0.0 and zone.over_cap_s == 0.0
    assert 0 < site.peak_w <= 0.5 * NODE_PEAK_W + 1e-6
    # node b alone is held to the zone's cap; with site a's power beside it the zone draws
    # more than that cap at once: the site's GPUs are not counted against the zone's budget
    # (both held to their caps at once: three GPUs' worth and more, where the zone's cap is two)
    assert max(w for _, w, _ in zone.timeline) > 0.75 * NODE_PEAK_W + 1e-6
    assert max(w for _, w, _ in site.timeline) > 0.25 * NODE_PEAK_W + 1e-6  # the site's node ran too
    on_a = [r for r in run.records if r.node == "a"]
    on_b = [r for r in run.records if r.node == "b"]
    assert on_a and on_b


def test_without_a_site_table_the_zones_budget_covers_every_node_of_the_zone():
    table = {"zone": TWO_SITES["zone"], "node": [dict(n, **{}) for n in TWO_SITES["node"]]}
    for n in table["node"]:
        n.pop("site", None)
    run = _run(table, "greedy")
    assert run.site_meters == {}
    assert max(w for _, w, _ in run.meters["DE"].timeline) <= 0.5 * NODE_PEAK_W + 1e-6


@pytest.mark.parametrize("table, words", [
    ({"sites": {"fra": {"power_cap_w": 100}}, "node": [{"name": "a", "zone": "DE", "gpus": "1xH100"}]},
     "has no nodes"),
    ({"node": [{"name": "a", "zone": "DE", "gpus": "1xH100", "site": "fra"}]}, "no [sites.S] table"),
    ({"sites": {"fra": {"power_cap_w": -5}}, "node": [{"name": "a", "zone": "DE", "gpus": "1xH100", "site": "fra"}]},
     "sites.fra.power_cap_w"),
    ({"sites": {"fra": {"power_cap_w": 100}},
      "node": [{"name": "a", "zone": "DE", "gpus": "1xH100", "site": "fra"},
               {"name": "b", "zone": "GB", "gpus": "1xH100", "site": "fra"}]}, "one grid zone"),
])
def test_a_bad_site_in_the_cluster_file_is_a_one_line_error(table, words):
    with pytest.raises(ClusterSpecError, match=words.replace("[", r"\[").replace(".", r"\.")) as e:
        cluster_from_dict(table)
    assert "\n" not in str(e.value)


# -- the daemon's configuration and planner input ------------------------------------------------

def test_the_daemon_reads_a_sites_budget_with_the_keys_of_a_zones():
    site = SiteConfig.from_config({
        "zones": {"DE": {"power_cap_w": 20000}},
        "sites": {"fra": {"nodes": ["a1", "a2"], "power_cap_w": 9000, "static_power_w": 1000,
                          "power_windows": [{"start": "17:00", "end": "19:00", "cap_w": 6000}]},
                  "muc": {"pue": 1.2, "nodes": ["m1"]}}})
    assert set(site.budgets) == {"DE", "site:fra"}
    assert site.budget_of_node("a1") == "site:fra" and site.budget_of_node("m1") is None  # muc: PUE only
    assert site.budget_of_node("b9") is None
    assert site.budget_nodes("site:fra") == ("a1", "a2") and site.budget_nodes("DE") is None
    assert site.site_budget_nodes() == {"site:fra": ("a1", "a2")}  # what the daemon's governor gets
    assert site.pue("DE", "a1") == 1.0 and site.pue("DE", "m1") == 1.2  # a budget-only site sets no PUE
    caps = site.power_caps({"site:fra"}, datetime(2026, 12, 2, 12, tzinfo=timezone.utc), 12 * 3600)
    assert [(c.zone, c.cap_w) for c in caps] == [("site:fra", 8000.0), ("site:fra", 5000.0)]  # less static
    assert budget_text("site:fra") == "site fra" and budget_text("DE") == "zone DE"


@pytest.mark.parametrize("sites, words", [
    ({"fra": {"power_cap_w": 9000}}, "sites.fra.nodes: a site with a power budget lists its nodes"),
    ({"fra": {"nodes": ["a"], "power_cap_w": "lots"}}, "sites.fra.power_cap_w"),
    ({"fra": {"nodes": ["a"]}}, "sites.fra.pue"),
    ({"fra": {"nodes": ["a"], "power_cap": 10}}, "unknown key"),
])
def test_a_bad_site_budget_is_refused_with_the_keys_path(sites, words):
    with pytest.raises(ValueError, match=words.replace(".", r"\.")) as e:
        SiteConfig.from_config({"sites": sites})
    assert "\n" not in str(e.value)


def test_the_governor_measures_a_site_over_its_own_nodes_and_its_zone_over_the_rest(node, store, tmp_path):
    agent, service, backend = node  # node n1 (zone DE), four emulated H100s
    (job,) = start_jobs(agent, service, store, tmp_path, [None])
    measured_w(agent, store, None)  # the agent samples and flushes its readings
    governor = PowerGovernor(store, {"site:fra": ZoneBudget(cap_w=400.0), "DE": ZoneBudget(cap_w=100.0)},
                             CapBounds(min_fraction=0.3), site_nodes={"site:fra": ("n1",)})
    actions = governor.tick()
    assert governor.last["site:fra"].gpus == 4 and governor.last["DE"].gpus == 0
    assert governor.last["site:fra"].measured_w > 400.0 and governor.last["DE"].measured_w == 0.0
    assert [(a.zone, a.job_id) for a in actions] == [("site:fra", job)]  # lowered by its site's budget
    with store.read() as conn:
        reasons = list(conn.execute(select(job_events.c.reason).where(job_events.c.job_id == job)).scalars())
    assert any("power governor: site fra measured" in r for r in reasons)
