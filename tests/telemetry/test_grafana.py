"""grafana/carbonsched.json: it parses, and every PromQL expression in it uses only metric
names that carbonsched's exporters actually emit.

The emitted names are collected from a real `Metrics` registry with the daemon's and an
agent's collectors over a test store (an emulated GPU node that has sampled once, a
finished job with gCO2 and prompts, one planner tick observed), so a renamed metric or a
dashboard typo fails here, not on an operator's wall.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import insert

from policies.model.catalog import parse_fleet
from scheduler.metrics import GpuCollector, Metrics, StoreCollector
from scheduler.node.agent import Agent
from scheduler.node.config import AgentConfig
from scheduler.store import Store
from scheduler.store.models import jobs
from telemetry.gpu import EmulatedBackend, EmulatedModel

DASHBOARD = Path(__file__).resolve().parents[2] / "grafana" / "carbonsched.json"

# PromQL words that are not metric names (functions are recognised by the "(" after them).
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
            "offset", "inf", "nan"}


@pytest.fixture
def emitted(tmp_path) -> tuple[set[str], dict[str, float]]:
    """Sample names (and values) a scrape of the daemon with a local agent returns."""
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.upgrade()
    backend = EmulatedBackend([EmulatedModel(m.name, m.vendor, m.memory_gib, m.idle_w, m.tdp_w)
                               for m in parse_fleet("2xH100")], node="n1", seed=1)
    agent = Agent(store, backend, AgentConfig(node="n1", zone="DE", state_dir=tmp_path / "state"))
    agent.register()
    agent.sampler.sample_once()
    now = datetime.now(timezone.utc)
    with store.write() as conn:
        for gco2, prompts in ((12.0, 100), (30.0, 200), (5.0, None)):
            conn.execute(insert(jobs).values(
                name="j", state="COMPLETED", owner_uid=0, owner_gid=0, owner_groups=[0], owner_name="root",
                argv=["true"], cwd="/", env={}, gpus=1, gpu_mem_gib=0.0, submitted_at=now - timedelta(hours=1),
                started_at=now - timedelta(hours=1), ended_at=now, energy_j=1000.0, gco2=gco2, prompts=prompts))
    metrics = Metrics()
    metrics.add(StoreCollector(store))
    metrics.add(GpuCollector(agent))
    metrics.planner_duration.labels("greedy").observe(0.01)
    values: dict[str, float] = {}
    for family in metrics.registry.collect():
        for s in family.samples:
            values[s.name] = values.get(s.name, 0.0) + s.value
    agent.stop()
    backend.close()
    store.dispose()
    return set(values), values


def dashboard_expressions(dash: dict) -> list[str]:
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", []) if t.get("expr")]
    for var in dash.get("templating", {}).get("list", []):
        q = var.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if var.get("type") == "query" and q:
            exprs.append(q)
    return exprs


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions, keywords,
    label names (inside {} or by/without/on (...)), ranges or strings."""
    s = re.sub(r"label_values\(\s*([^,()]+?)\s*,\s*\w+\s*\)", r"\1", expr)  # Grafana: (metric, label)
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', s)
    s = re.sub(r"\{[^}]*\}", "", s)
    s = re.sub(r"\[[^\]]*\]", "", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", s)
    s = s.replace("$__rate_interval", "").replace("$__interval", "")
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = m.group(0)
        rest = s[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def test_the_dashboard_parses_and_has_the_panels_operators_need():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["title"] and dash["uid"] and dash["panels"]
    titles = {p["title"] for p in dash["panels"]}
    assert {"Power per GPU", "Queue depth by state", "gCO2 per prompt"} <= titles
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["datasource"]["type"] == "prometheus"
        assert set(p["gridPos"]) == {"x", "y", "w", "h"}


def test_every_expression_uses_only_metrics_the_exporters_emit(emitted):
    names, _ = emitted
    assert "carbonsched_gpu_power_watts" in names and "carbonsched_job_prompts_total" in names
    exprs = dashboard_expressions(json.loads(DASHBOARD.read_text()))
    assert len(exprs) >= 10
    for expr in exprs:
        used = metric_names(expr)
        assert used, f"no metric in {expr!r}"
        assert used <= names, f"{expr!r} uses {sorted(used - names)}, not emitted (emitted: {sorted(names)})"


def test_the_name_check_itself_catches_a_wrong_name(emitted):
    names, _ = emitted
    assert metric_names('sum by (node) (carbonsched_gpu_power_watts{node=~"$node"})') == {
        "carbonsched_gpu_power_watts"}
    assert not metric_names("rate(carbonsched_job_gco2_grams[1h])") <= names   # counters end in _total
    assert metric_names("histogram_quantile(0.95, sum by (le) (rate(x_bucket[5m])))") == {"x_bucket"}
    assert metric_names("label_values(carbonsched_gpu_power_watts, node)") == {"carbonsched_gpu_power_watts"}


def test_gco2_per_prompt_is_the_ratio_of_the_two_counters(emitted):
    _, values = emitted
    # jobs with prompts: 12 g / 100 and 30 g / 200; the one without prompts is left out
    assert values["carbonsched_job_prompts_total"] == 300
    assert values["carbonsched_job_prompts_gco2_grams_total"] == pytest.approx(42.0)
    assert values["carbonsched_job_gco2_grams_total"] == pytest.approx(47.0)


def test_every_panel_of_power_energy_or_grams_shows_whether_they_are_measured_or_modelled():
    """Issue 16 defect 7: an emulated fleet's figures come from a power model; each panel that
    can include them keeps the `method` label apart and says what `modelled` means."""
    dash = json.loads(DASHBOARD.read_text())
    physical = ("carbonsched_gpu_power_watts", "carbonsched_gpu_energy_joules", "carbonsched_job_energy_joules",
                "carbonsched_job_gco2_grams", "carbonsched_job_prompts")
    checked = 0
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            if any(m in target.get("expr", "") for m in physical):
                checked += 1
                assert "{{method}}" in target.get("legendFormat", ""), panel["title"]
                assert "modelled" in panel.get("description", "") and "NOT measured" in panel["description"]
    assert checked >= 8

