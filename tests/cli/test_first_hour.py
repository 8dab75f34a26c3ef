"""What a new user and operator meet in their first hour (issue 28), run as real `carbonsched`
subprocesses without a daemon: usage mistakes are one line, global options work after the
verb, read-only verbs never create a database, durations are taken everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_process import one_line_error, run


# -- 6: every usage mistake is one line, argparse's own included ------------------------------

@pytest.mark.parametrize("args", [
    ["submit", "--est-runtime", "-3h", "--", "true"],
    ["submit", "--gpus", "abc", "--", "true"],
    ["submit", "--gpus", "0", "--", "true"],
    ["submit", "--latency-slo", "fast", "--", "true"],
    ["cancel", "abc"],
    ["show", "abc"],
    ["report", "--by", "gpu"],
    ["export", "--format", "xml"],
    ["carbon", "show"],
    ["nosuchverb"],
    [],
], ids=lambda a: " ".join(a) or "no verb")
def test_argparse_mistakes_are_one_line_naming_the_verb_and_exit_2(cli_env, args):
    proc = run(cli_env, *args)
    assert proc.returncode == 2, proc.stderr
    line = one_line_error(proc)
    assert "--help" in line  # says where to read more
    if args and args[0] in ("submit", "cancel", "show", "report", "export", "carbon"):
        assert line.startswith(f"carbonsched: {args[0]}")
    assert proc.stdout == ""


def test_version_prints_the_installed_version(cli_env):
    proc = run(cli_env, "--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("carbonsched ") and len(proc.stdout.split()) >= 2


# -- 4: global options work after the verb too ---------------------------------------------

@pytest.mark.parametrize("args", [["queue"], ["nodes"], ["show", "1"], ["cancel", "1"], ["plan"],
                                  ["logs", "1"], ["report"], ["carbon", "zones"]],
                         ids=lambda a: " ".join(a))
def test_the_socket_option_after_the_verb_is_the_socket_used(cli_env, tmp_path, args):
    sock = tmp_path / "after-the-verb.sock"
    cli_env["CARBONSCHED_SOCKET"] = str(tmp_path / "from-env.sock")
    proc = run(cli_env, *args, "--socket", str(sock))
    if args == ["carbon", "zones"]:  # reads the store, not the daemon: the option is accepted
        assert "unrecognized" not in proc.stderr
        return
    assert proc.returncode == 3, proc.stderr
    assert str(sock) in one_line_error(proc)


def test_the_config_option_after_the_verb_is_the_config_read(cli_env, tmp_path):
    config = tmp_path / "mine.toml"
    config.write_text('plan_interval = "-5s"\n')
    proc = run(cli_env, "config", "check", "--config", str(config))
    assert proc.returncode == 2, proc.stderr
    assert "plan_interval" in proc.stderr
    proc = run(cli_env, "config", "show", "--config", str(tmp_path / "missing.toml"))
    assert proc.returncode == 1 and "missing.toml not found" in one_line_error(proc)


def test_an_option_before_the_verb_is_kept_when_the_verb_does_not_repeat_it(cli_env, tmp_path):
    sock = tmp_path / "before.sock"
    proc = run(cli_env, "--socket", str(sock), "queue")
    assert proc.returncode == 3 and str(sock) in one_line_error(proc)


# -- 5: read-only verbs never create a database or a directory ------------------------------

@pytest.mark.parametrize("verb", [["db", "check"], ["report"], ["export"], ["simulate", "--from-store"],
                                  ["carbon", "zones"], ["carbon", "show", "--zone", "DE"]],
                         ids=lambda a: " ".join(a))
def test_a_read_only_verb_on_a_missing_sqlite_file_says_no_database_and_writes_nothing(cli_env, tmp_path,
                                                                                       verb):
    db = tmp_path / "new-dir" / "cs.db"
    args = [*verb, "--db", f"sqlite:///{db}"] if verb[0] in ("db", "report", "export", "simulate") else verb
    if verb[0] == "carbon":
        cli_env["CARBONSCHED_DB"] = f"sqlite:///{db}"
    proc = run(cli_env, *args)
    assert proc.returncode == 1, proc.stderr
    line = one_line_error(proc)
    assert f"no database at {db}" in line
    assert not db.parent.exists()


def test_db_check_in_a_new_state_dir_creates_neither_the_directory_nor_a_database(cli_env, tmp_path):
    state = tmp_path / "brand-new-state"
    proc = run(cli_env, "db", "check", "--state-dir", str(state))
    assert proc.returncode == 1
    assert "no database at" in one_line_error(proc)
    assert not state.exists()


def test_db_upgrade_still_creates_the_database(cli_env, tmp_path):
    db = tmp_path / "new" / "cs.db"
    assert run(cli_env, "db", "upgrade", "--db", f"sqlite:///{db}").returncode == 0
    assert db.exists()
    proc = run(cli_env, "db", "check", "--db", f"sqlite:///{db}")
    assert proc.returncode == 0, proc.stderr


def test_a_bad_database_url_is_one_line_not_an_unexpected_error(cli_env):
    proc = run(cli_env, "report", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "unexpected error" not in line and "the database postgresql" in line


# -- 9: durations everywhere -----------------------------------------------------------------

@pytest.mark.parametrize(("value", "ms"), [("2s", 2000.0), ("1500", 1500.0), ("250ms", 250.0)])
def test_submit_latency_slo_takes_a_duration_or_bare_milliseconds(value, ms):
    from scheduler.cli.main import build_parser

    args = build_parser().parse_args(["submit", "--latency-slo", value, "--", "true"])
    assert args.latency_slo == ms


@pytest.mark.parametrize("value", ["nan", "inf", "-2s", "0"])
def test_submit_latency_slo_refuses_what_is_no_positive_duration(cli_env, value):
    proc = run(cli_env, "submit", f"--latency-slo={value}", "--", "true")
    assert proc.returncode == 2
    assert "--latency-slo" in one_line_error(proc)


@pytest.mark.parametrize(("value", "gib"), [("80", 80.0), ("80GB", 80.0), ("80G", 80.0), ("80gib", 80.0),
                                          ("40960M", 40.0), ("0.5T", 512.0), ("7.5", 7.5)])
def test_submit_gpu_mem_takes_gib_or_a_size_with_its_unit_as_slurm_mem(value, gib):
    from scheduler.cli.main import build_parser

    args = build_parser().parse_args(["submit", "--gpu-mem", value, "--", "true"])
    assert args.gpu_mem == gib


@pytest.mark.parametrize("value", ["80 apples", "-1", "GB", "1e9"])
def test_submit_gpu_mem_refuses_what_is_no_size_in_one_line(cli_env, value):
    proc = run(cli_env, "submit", f"--gpu-mem={value}", "--", "true")
    assert proc.returncode == 2
    line = one_line_error(proc)
    assert "--gpu-mem" in line and "e.g. 80, 80GB or 40960M" in line


# -- 1: the zone is a real choice ----------------------------------------------------------

@pytest.mark.parametrize("zone", ["not a zone!", "DE;rm", "-x", "a" * 65])
def test_a_malformed_zone_id_is_a_configuration_error(cli_env, zone):
    cli_env["CARBONSCHED_ZONE"] = zone
    proc = run(cli_env, "config", "check")
    assert proc.returncode == 2
    assert "zone" in proc.stderr and "is not a zone id" in proc.stderr


def test_config_check_warns_that_the_default_zone_has_no_carbon_data_and_names_the_known_zones(cli_env):
    proc = run(cli_env, "config", "check")
    assert proc.returncode == 0
    assert "1 warning(s)" in proc.stdout
    warning = one_line_error(proc)
    assert "warning: the default zone 'local' has no carbon data" in warning
    assert "DE" in warning and "US-CAL-CISO" in warning and "carbonsched carbon import" in warning


@pytest.mark.parametrize("zone", ["DE", "US-CAL-CISO"])
def test_config_check_is_quiet_for_a_zone_with_a_yearly_mean(cli_env, zone):
    cli_env["CARBONSCHED_ZONE"] = zone
    proc = run(cli_env, "config", "check")
    assert proc.returncode == 0 and proc.stderr == "" and "warning" not in proc.stdout


def test_a_zone_of_ones_own_is_fine_once_it_has_a_static_value_or_a_provider():
    from scheduler.zone_check import zone_without_data

    assert zone_without_data("site-a", {}) is not None
    assert zone_without_data("site-a", {"carbon": {"static": {"site-a": 300.0}}}) is None
    assert zone_without_data("site-a", {"carbon": {"zones": {"site-a": {"provider": "csv"}}}}) is None
    assert zone_without_data("site-a", {}, zones_with_data={"site-a"}) is None


# -- 10: the smaller ones ------------------------------------------------------------------

def _job(**kw) -> dict:
    base = {"id": 1, "name": "j", "owner": "root", "state": "COMPLETED", "gpus": None, "gpus_requested": 1,
            "submitted_at": None, "started_at": None, "planned_start": None, "ended_at": None, "exit_code": 0,
            "energy_j": None, "gco2": None, "est_gco2": None}
    return {**base, **kw}


def test_the_energy_column_of_queue_has_one_unit():
    from scheduler.cli.output import jobs_table

    text = jobs_table([_job(id=1, energy_j=158.0), _job(id=2, energy_j=7200.0)])
    cells = [line.split()[-3:-1] for line in text.splitlines()[1:]]
    assert cells == [["0.04", "Wh"], ["2.00", "Wh"]]


@pytest.mark.parametrize(("g", "text"), [(140.0, "140 g"), (1400.0, "1,400 g"), (3.25, "3.25 g"),
                                         (0.0128, "0.01 g"), (0.00042, "0.00042 g")])
def test_grams_in_explanations_never_use_exponents(g, text):
    from policies.types import grams

    assert grams(g) == text and "e+" not in grams(g) and "e-" not in grams(g)


def test_a_failed_job_did_not_meet_its_deadline():
    from scheduler.cli.report import receipt_text

    receipt = {"measurement": {"description": "counter"}, "energy_j": None, "energy_kwh": None,
               "intensity_g_per_kwh": None, "gco2": None, "signal": None, "zone": "DE", "intensity_sources": [],
               "intensity_gaps": [], "gco2_per_prompt": None, "gco2_per_1k_tokens": None,
               "counterfactual": {"gco2": None}, "saving_gco2": None, "gpus": 1, "gpu_model": "H100",
               "node": "n", "wait_s": 1.0, "runtime_s": 1.0, "deadline": "2026-12-01T12:00:00Z",
               "deadline_met": False, "state": "FAILED"}
    line = next(x for x in receipt_text(receipt).splitlines() if "deadline:" in x)
    assert "not met (the job ended FAILED)" in line and ": met" not in line


def test_a_small_job_s_receipt_says_its_figures_at_a_precision_that_says_something():
    """A tiny job's receipt: no "0.0000 kWh", no "$0.0000", no "0.000000623 g/prompt"."""
    from scheduler.cli.report import receipt_text

    receipt = {"measurement": {"description": "counter"}, "energy_j": 17.3, "energy_kwh": 17.3 / 3.6e6,
               "intensity_g_per_kwh": 130.0, "gco2": 0.000623, "pue": 1.0, "signal": "average", "zone": "DE",
               "intensity_sources": [], "intensity_gaps": [], "gco2_per_prompt": 6.23e-7, "prompts": 1000,
               "gco2_per_1k_tokens": None, "counterfactual": {"gco2": None}, "saving_gco2": None,
               "cost_usd": 0.000312, "gpus": 1, "gpu_model": "H100", "node": "n", "wait_s": 1.0, "runtime_s": 1.0,
               "deadline": None}
    lines = {k.strip(): v.strip() for k, _, v in (x.partition(":") for x in receipt_text(receipt).splitlines())}
    assert lines["energy"].startswith("17 J = 0.00000481 kWh")
    assert lines["gCO2"].startswith("623 µg = energy x 130 gCO2/kWh")
    assert lines["per prompt"].startswith("0.623 µg (1,000 prompts")
    assert lines["cost"].startswith("$0.000312 ")


@pytest.mark.parametrize(("usd", "text"), [(0.0, "$0.00"), (0.004, "$0.004"), (0.0123, "$0.01"), (1234.5, "$1,234.50")])
def test_dollars_are_cents_or_three_significant_digits_below_a_cent(usd, text):
    from scheduler.cli.report import usd as dollars

    assert dollars(usd) == text


def test_show_says_any_gpu_memory_rather_than_at_least_zero():
    from scheduler.cli.output import job_detail

    job = _job(gpu_mem_gib=0.0, owner_uid=0, argv=["true"], cwd="/", latency_slos=None)
    gpus = next(x for x in job_detail(job).splitlines() if x.strip().startswith("gpus:"))
    assert gpus.split(":", 1)[1].strip() == "1 (any GPU memory)"
    job80 = _job(gpu_mem_gib=80.0, owner_uid=0, argv=["true"], cwd="/")
    assert "1 x >= 80 GiB" in job_detail(job80)


def test_config_show_prints_the_paths_the_daemon_will_use_not_unset(cli_env, tmp_path):
    cli_env["CARBONSCHED_STATE_DIR"] = str(tmp_path / "st")
    proc = run(cli_env, "config", "show", "--json")
    assert proc.returncode == 0, proc.stderr
    import json

    rows = {r["key"]: r for r in json.loads(proc.stdout)["settings"]}
    assert rows["db"]["value"] == f"sqlite:///{tmp_path / 'st' / 'carbonsched.db'}"
    assert rows["db"]["source"] == "derived"
    assert rows["socket"]["value"].endswith("carbonsched.sock")
    assert not (tmp_path / "st").exists()


def test_the_daemon_warns_once_at_start_when_its_zone_has_no_carbon_data(store, caplog, tmp_path):
    import logging

    from scheduler.carbon import CarbonSignals
    from scheduler.carbon_config import CarbonConfig
    from scheduler.daemon.main import _warn_if_zone_has_no_data

    signals = CarbonSignals(store, CarbonConfig.from_config({}), track_status=False)
    with caplog.at_level(logging.WARNING, logger="scheduler.daemon.main"):
        _warn_if_zone_has_no_data("local", {"carbon": {}}, signals)
        _warn_if_zone_has_no_data("DE", {"carbon": {}}, signals)  # a built-in yearly mean prices it
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "the default zone 'local' has no carbon data" in warnings[0]
    caplog.clear()
    trace = tmp_path / "xx.csv"
    trace.write_text("time,gco2_per_kwh,zone\n2022-01-01T00:00:00Z,350,XX\n")
    signals.writes.import_file(trace)
    with caplog.at_level(logging.WARNING, logger="scheduler.daemon.main"):
        _warn_if_zone_has_no_data("XX", {"carbon": {}}, signals)  # imported data prices it
    assert caplog.records == []


# -- 8: `make test` in a clone other users cannot enter ----------------------------------

def test_commands_run_as_another_user_read_a_copy_of_the_code_everyone_can_read():
    import stat

    from daemon_harness import REPO, readable_code_copy

    copy = readable_code_copy()
    assert not str(copy).startswith(str(REPO))
    for path in [copy, *copy.rglob("*")]:
        mode = path.stat().st_mode
        assert mode & stat.S_IROTH and (not path.is_dir() or mode & stat.S_IXOTH), path
        assert all(p.stat().st_mode & stat.S_IXOTH for p in path.parents if p != Path("/")), path
    assert (copy / "scheduler" / "cli" / "main.py").read_bytes() == (REPO / "scheduler" / "cli" / "main.py").read_bytes()
