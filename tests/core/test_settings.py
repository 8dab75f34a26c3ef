"""One table of settings: flag, then environment, then config file, then default; every
problem reported at once with its key and where the value came from."""

from __future__ import annotations

import argparse

import pytest

from scheduler import settings
from scheduler.settings import AGENT, DAEMON, SETTINGS, ConfigErrors, add_flags, check_file, resolve


def parse(scope: str, *argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_flags(p, scope)
    return p.parse_args(list(argv))


def test_every_setting_has_a_flag_an_env_var_and_help():
    for s in SETTINGS:
        assert s.env == "CARBONSCHED_" + s.key.upper()
        assert s.flag == "--" + s.key.replace("_", "-")
        assert s.help and s.scopes <= {DAEMON, AGENT}
    p = argparse.ArgumentParser()
    add_flags(p, DAEMON)
    text = " ".join(p.format_help().split())
    for s in SETTINGS:
        if DAEMON in s.scopes:
            assert s.flag in text and f"[env: {s.env}]" in text.replace("- ", "-")


def test_flag_beats_env_beats_file_beats_default():
    config = {"grace": "30s", "sample_hz": 2, "zone": "GB"}
    env = {"CARBONSCHED_GRACE": "20s", "CARBONSCHED_ZONE": "FR"}
    r = resolve(AGENT, parse(AGENT, "--grace", "5s"), config, env, config_path="/etc/c.toml")
    assert r["grace"] == 5.0 and r.sources["grace"] == "flag --grace"
    assert r["zone"] == "FR" and r.sources["zone"] == "env CARBONSCHED_ZONE"
    assert r["sample_hz"] == 2.0 and r.sources["sample_hz"] == "config key `sample_hz` in /etc/c.toml"
    assert r["dispatch_interval"] == 1.0 and r.sources["dispatch_interval"] == "default"


EXISTING_GROUPS = [g.gr_name for g in __import__("grp").getgrall()[:2]]


def test_all_problems_are_reported_together_with_their_key_and_source():
    config = {"grace": "soon", "polcy": "cpsat", "sample_hz": 1000, "admin_groups": EXISTING_GROUPS[0]}
    env = {"CARBONSCHED_METRICS_PORT": "99999"}
    with pytest.raises(ConfigErrors) as e:
        resolve(DAEMON, parse(DAEMON, "--plan-interval", "0s"), config, env, config_path="/etc/c.toml")
    errors = e.value.errors
    assert any("config key `grace`" in x and "malformed duration" in x for x in errors)
    assert any("unknown config key `polcy`; did you mean `policy`?" in x for x in errors)
    assert any("config key `sample_hz`" in x and "<= 100" in x for x in errors)
    assert any(x.startswith("env CARBONSCHED_METRICS_PORT") and "65535" in x for x in errors)
    assert any(x.startswith("flag --plan-interval") and "positive" in x for x in errors)
    assert len(errors) == 5, errors  # admin_groups as a comma string (of real groups) is fine


@pytest.mark.parametrize("key, value, message", [
    ("policy", "oracle", "only in `carbonsched simulate`"),
    ("policy", "magic", "unknown policy"),
    ("db", "mysql://x/y", "SQLite or PostgreSQL"),
    ("emulate", "4xGTX1080", "unknown GPU model"),
    ("log_level", "LOUD", "DEBUG, INFO"),
    ("planner_process", "maybe", "true or false"),
    ("api_max_inflight_per_uid", 2.5, "whole number"),
    ("time_limit_factor", 0.5, ">= 1"),
    ("full_replan", "often", "malformed duration"),
    ("full_replan", "0s", "positive duration"),
    # issue 25: what used to pass `config check` and then broke the daemon
    ("node_lost_after", "1ms", "at least 30s"),
    ("admin_groups", "no-such-group-cs25", "does not exist on this host"),
    ("metrics_addr", "", "non-empty"),
])
def test_bad_values_get_a_reason(key, value, message):
    errors = check_file({key: value})
    assert len(errors) == 1 and message in errors[0] and f"`{key}`" in errors[0], errors


def test_typed_values_come_out_parsed():
    r = resolve(DAEMON, parse(DAEMON, "--no-planner-process", "--admin-groups", ", ".join(EXISTING_GROUPS)),
                {"node_lost_after": "10m", "db": "postgresql://u@h/db", "metrics_port": 9100}, {})
    assert r["planner_process"] is False
    assert r["admin_groups"] == EXISTING_GROUPS
    assert r["node_lost_after"] == 600.0
    assert r["db"] == "postgresql+psycopg://u@h/db"
    assert r["metrics_port"] == 9100


def test_full_replan_is_unset_by_default_and_parses_from_file_env_and_flag():
    assert resolve(DAEMON, parse(DAEMON), {}, {})["full_replan"] is None
    assert resolve(DAEMON, parse(DAEMON), {"full_replan": "6h"}, {})["full_replan"] == 6 * 3600.0
    assert resolve(DAEMON, parse(DAEMON), {}, {"CARBONSCHED_FULL_REPLAN": "90m"})["full_replan"] == 5400.0
    assert resolve(DAEMON, parse(DAEMON, "--full-replan", "1h30m"), {}, {})["full_replan"] == 5400.0
    with pytest.raises(ConfigErrors) as e:
        resolve(DAEMON, parse(DAEMON, "--full-replan", "0s"), {}, {})
    assert any(x.startswith("flag --full-replan") for x in e.value.errors), e.value.errors


def test_nested_tables_are_checked_by_their_owner(monkeypatch):
    monkeypatch.setitem(settings.TABLES, "site", lambda table, config: [] if isinstance(table, dict)
                        else ["must be a table"])
    assert check_file({"site": {"pue": 1.2}}) == []
    assert check_file({"site": 3}) == ["[site] must be a table"]


# -- the shipped example and `carbonsched config` ----------------------------------------------

import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tomllib  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "systemd" / "config.toml.example"


def test_the_example_config_documents_every_setting():
    text = EXAMPLE.read_text()
    for s in SETTINGS:
        assert re.search(rf"^#?\s*{s.key}\s*=", text, re.M), f"{s.key} is not in {EXAMPLE.name}"


def config_cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARBONSCHED_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "scheduler", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)


def test_config_check_passes_the_example_and_reads_it_as_toml():
    tomllib.loads(EXAMPLE.read_text())
    proc = config_cli("--config", str(EXAMPLE), "config", "check")
    assert proc.returncode == 0, proc.stderr
    assert "config OK" in proc.stdout


def test_config_check_lists_every_problem_with_its_key(tmp_path):
    bad = tmp_path / "config.toml"
    bad.write_text('[carbonsched]\npolcy = "cpsat"\ngrace = "soon"\nsample_hz = -1\n'
                   '[carbonsched.site]\npue = 9\n')
    proc = config_cli("--config", str(bad), "config", "check")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert any("`polcy`; did you mean `policy`?" in x for x in lines)
    assert any("`grace`" in x for x in lines)
    assert any("`sample_hz`" in x for x in lines)
    assert any("[site]" in x and "PUE" in x for x in lines)


def test_config_check_names_an_unknown_policy_option_and_the_known_ones(tmp_path):
    bad = tmp_path / "config.toml"
    bad.write_text('policy = "cpsat:foo=1"\n')
    proc = config_cli("--config", str(bad), "config", "check")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert "policy 'cpsat' has no option 'foo'; its options: max_time_s," in proc.stderr
    assert "__init__" not in proc.stderr


def test_the_daemon_refuses_to_start_on_a_bad_config_saying_why(tmp_path):
    bad = tmp_path / "config.toml"
    bad.write_text('plan_interval = "often"\nmetrics_port = 70000\n')
    proc = config_cli("--config", str(bad), "daemon", "--state-dir", str(tmp_path / "s"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "`plan_interval`" in proc.stderr and "`metrics_port`" in proc.stderr


def test_config_show_says_where_each_value_comes_from(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('grace = "30s"\n')
    proc = config_cli("--config", str(cfg), "config", "show", "--json")
    assert proc.returncode == 0, proc.stderr
    import json

    shown = {x["key"]: x for x in json.loads(proc.stdout)["settings"]}
    assert shown["grace"]["value"] == 30.0 and "config key `grace`" in shown["grace"]["source"]
    assert shown["plan_interval"]["source"] == "default"


def test_config_check_knows_the_site_and_node_pue_tables(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[carbonsched.sites.fra]\npue = 1.1\nnodes = ["a", "b"]\n[carbonsched.nodes.c]\npue = 1.4\n')
    proc = config_cli("--config", str(good), "config", "check")
    assert proc.returncode == 0, proc.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[carbonsched.sites.fra]\npue = 1.1\nnodes = ["a"]\n[carbonsched.nodes.a]\npue = 0.7\n')
    proc = config_cli("--config", str(bad), "config", "check")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len([x for x in proc.stderr.splitlines() if "nodes.a.pue" in x]) == 1
