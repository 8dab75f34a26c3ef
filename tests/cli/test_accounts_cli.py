"""`carbonsched account`, `user`, and submit's `--account`, `--qos`, `--time`, run as real
subprocesses against the daemon's API (served in this process over a SQLite store): every
mistake is one line and its exit code, `--json` everywhere, `--time 90` is 90 minutes, and
a user who is not an operator cannot change accounts.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess

import pytest

from cli_process import one_line_error, run
from daemon_harness import readable_code_copy, world_dir
from scheduler.daemon.access import ServiceConfig
from scheduler.daemon.api import ApiServer
from scheduler.daemon.service import JobService
from scheduler.store import Store


@pytest.fixture(scope="module")
def socket_path():
    root = world_dir("cs-accounts-cli-")
    store = Store(f"sqlite:///{root / 'db.sqlite'}")
    store.upgrade()
    api = ApiServer(root / "s.sock", JobService(store, ServiceConfig(daemon_uid=0), log_dir=root / "logs"))
    api.start()
    try:
        yield root / "s.sock"
    finally:
        api.stop()
        store.dispose()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cs(cli_env, socket_path):
    """`carbonsched --socket S ARGS` as this (root: an operator) user."""
    return lambda *args: run(cli_env, "--socket", str(socket_path), *args)


def as_json(proc: subprocess.CompletedProcess):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_accounts_are_added_listed_modified_and_deleted_with_json(cs):
    added = as_json(cs("account", "add", "lab", "--shares", "3", "--description", "the lab", "--json"))
    assert (added["name"], added["parent"], added["shares"]) == ("lab", None, 3)
    assert as_json(cs("account", "add", "lab/nlp", "--json"))["parent"] == "lab"
    assert as_json(cs("account", "modify", "lab/nlp", "--shares", "2", "--json"))["shares"] == 2
    listed = {a["name"]: a for a in as_json(cs("account", "list", "--json"))}
    assert {"default", "lab", "lab/nlp"} <= set(listed) and listed["lab/nlp"]["depth"] == 1
    text = cs("account", "list")
    assert text.returncode == 0 and "  lab/nlp" in text.stdout and "SHARES" in text.stdout
    proc = cs("account", "delete", "lab")
    assert proc.returncode == 6 and "sub-accounts (lab/nlp)" in one_line_error(proc)
    assert as_json(cs("account", "delete", "lab/nlp", "--json"))["deleted"] is True
    assert cs("account", "delete", "lab").returncode == 0


def test_users_are_added_listed_and_removed_with_json(cs):
    assert cs("account", "add", "team").returncode == 0
    me = pwd.getpwuid(os.getuid()).pw_name
    assert as_json(cs("user", "add", me, "--account", "team", "--json")) == \
        {"user": me, "account": "team", "default": True}
    assert as_json(cs("user", "list", me, "--json")) == [{"user": me, "account": "team", "default": True}]
    job = as_json(cs("submit", "--json", "--", "true"))["id"]
    assert as_json(cs("show", str(job), "--json"))["account"] == "team"  # the user's default
    proc = cs("submit", "--account", "default", "--", "true")
    assert proc.returncode == 2 and "not in account 'default'" in one_line_error(proc)
    assert as_json(cs("user", "delete", me, "--json")) == [{"user": me, "account": "team", "default": True}]


@pytest.mark.parametrize("args, words", [
    (["--account", "nope"], "no account 'nope'"),
    (["--qos", "gold"], "unknown QOS 'gold'"),
    (["--time", "1h"], "--time: malformed time"),
    (["--time", "0"], "--time: time '0' is zero"),
    (["--time", "90", "--time-limit", "2h"], "not both"),
])
def test_submit_mistakes_are_one_line_and_exit_2(cs, args, words):
    proc = cs("submit", *args, "--", "true")
    assert proc.returncode == 2, proc.stderr
    assert words in one_line_error(proc)


def test_time_90_is_90_minutes_and_show_gives_account_and_qos(cs):
    job = as_json(cs("submit", "-t", "90", "-q", "flexible", "--json", "--", "true"))["id"]
    shown = as_json(cs("show", str(job), "--json"))
    assert (shown["time_limit_s"], shown["account"], shown["qos"]) == (5400.0, "default", "flexible")
    assert as_json(cs("show", str(as_json(cs("submit", "--time", "1-02:30", "--json", "--", "true"))["id"]),
                      "--json"))["time_limit_s"] == (26 * 60 + 30) * 60
    text = cs("show", str(job))
    assert "account: default (QOS flexible)" in text.stdout


def test_a_job_with_no_limit_at_all_gets_the_finite_site_default(cs):
    job = as_json(cs("submit", "--json", "--", "true"))["id"]
    assert as_json(cs("show", str(job), "--json"))["time_limit_s"] == 86400.0


def test_a_user_who_is_not_an_operator_cannot_add_accounts_but_may_list_their_own(socket_path):
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user `nobody` on this host")
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    runuser = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")
    if runuser is None or os.getuid() != 0:
        pytest.skip("needs root and runuser to run the command line as another user")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(readable_code_copy()), "COLUMNS": "80"}

    def as_nobody(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([runuser, "-u", "nobody", "--", python, "-m", "scheduler", "--socket",
                               str(socket_path), *args], capture_output=True, text=True, env=env, cwd="/",
                              timeout=60)

    proc = as_nobody("account", "add", "mine")
    assert proc.returncode == 5, proc.stderr
    assert "only an operator" in one_line_error(proc)
    proc = as_nobody("user", "add", "nobody", "--account", "default")
    assert proc.returncode == 5 and "only an operator" in one_line_error(proc)
    proc = as_nobody("user", "list", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout) == []


def test_config_check_names_each_bad_qos_setting_in_one_line(cli_env, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[qos.urgent]\npriority = -1\n[qos.debug]\ndefer = "soon"\nmax_time_limit = "1h"\n'
                      'default_time_limit = "2h"\n')
    proc = run(cli_env, "--config", str(config), "config", "check")
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr
    assert any("[qos] urgent: priority: must be a whole number" in line for line in lines), proc.stderr
    assert any("[qos] debug: defer: must be one of urgent, normal, flexible" in line for line in lines)
    good = tmp_path / "good.toml"
    good.write_text('[qos.debug]\npriority = 50\ndefer = "urgent"\nmax_time_limit = "30m"\n')
    assert run(cli_env, "--config", str(good), "config", "check").returncode == 0


def test_share_and_priority_print_tables_and_json(cs):
    assert cs("account", "add", "shareview").returncode == 0
    doc = as_json(cs("share", "--json"))
    assert doc["currency"] == "gpu_hours"
    assert {"default", "shareview"} <= {r["account"] for r in doc["associations"]}
    text = cs("share")
    assert text.returncode == 0 and "FAIRSHARE" in text.stdout and "half-life of 7 days" in text.stdout
    job = as_json(cs("submit", "--json", "--qos", "urgent", "--", "true"))["id"]
    ranked = as_json(cs("priority", "--json"))["jobs"]
    assert job in [j["job_id"] for j in ranked]
    text = cs("priority")
    assert text.returncode == 0 and "PRIORITY" in text.stdout and "weights: fair share" in text.stdout


def test_limits_are_set_listed_and_removed_and_a_mistake_is_one_line_exit_2(cs):
    assert cs("account", "add", "budgeted").returncode == 0
    out = as_json(cs("account", "modify", "budgeted", "--limit", "co2=500kg/month", "--limit",
                     "energy=800kWh/quarter", "--json"))
    assert out["limits"]["kgco2e"]["text"] == "500 kg/month" and out["limits"]["kwh"]["period"] == "quarter"
    text = cs("account", "list")
    assert "LIMITS" in text.stdout and "co2 500 kg/month, energy 800 kWh/quarter" in text.stdout
    text = cs("share")
    assert text.returncode == 0 and "co2 500 kg/month" in text.stdout and "USED %" in text.stdout
    assert as_json(cs("share", "--json"))["budgets"][0]["account"] == "budgeted"
    assert cs("account", "modify", "budgeted", "--limit", "co2=none").returncode == 0
    listed = {a["name"]: a for a in as_json(cs("account", "list", "--json"))}
    assert set(listed["budgeted"]["limits"]) == {"kwh"}
    for bad, words in (("co2=500/month", "co2 takes a unit"), ("co2=5kg/week", "use month, quarter"),
                       ("power=5kW/month", "unknown key 'power'")):
        proc = cs("account", "modify", "budgeted", "--limit", bad)
        assert proc.returncode == 2 and words in one_line_error(proc)


def test_config_check_takes_the_priority_weights_and_fair_share_settings_and_names_a_bad_one(cli_env, tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[priority]\nweight_qos = 5000\nweight_fair_share = 10000\n'
                    '[fair_share]\nhalf_life = "14d"\ncurrency = "kwh"\n')
    assert run(cli_env, "--config", str(good), "config", "check").returncode == 0
    bad = tmp_path / "bad.toml"
    bad.write_text('[fair_share]\ncurrency = "dollars"\n')
    proc = run(cli_env, "--config", str(bad), "config", "check")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    named = [line for line in proc.stderr.splitlines() if "currency must be one of" in line]
    assert len(named) == 1 and "[fair_share] currency must be one of gpu_hours, kwh, kgco2e" in named[0], proc.stderr
