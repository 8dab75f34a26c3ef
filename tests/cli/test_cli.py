"""The `carbonsched` command line, run as a real subprocess, for everything that needs no daemon.

Contract (see scheduler/cli/main.py): usage mistakes exit 2, an unreachable daemon exits 3, and a
user always gets one clear line on stderr, never a Python traceback.
"""

from __future__ import annotations

import re
import socket

import pytest

from cli_process import all_parsers, one_line_error, run


def options_text(help_text: str) -> str:
    """The options section of a --help, with line wrapping undone."""
    return " ".join(help_text.split("options:", 1)[1].split())


# -- help -----------------------------------------------------------------------------------

def test_top_level_help_names_the_environment_variable_of_each_global_flag(cli_env):
    proc = run(cli_env, "--help")
    assert proc.returncode == 0, proc.stderr
    text = options_text(proc.stdout)
    for flag, var in (("--socket", "CARBONSCHED_SOCKET"), ("--config", "CARBONSCHED_CONFIG")):
        assert re.search(rf"{flag} [^\[]*\[env: {var}\]", text), (flag, var, proc.stdout)


def test_top_level_help_lists_the_verbs(cli_env):
    out = run(cli_env, "--help").stdout
    for verb in ("daemon", "submit", "queue", "show", "cancel", "logs", "nodes", "plan", "db"):
        assert re.search(rf"^\s+{verb}\s", out, re.M), verb


def test_every_json_option_says_what_it_prints():
    missing = [sub.prog for sub in all_parsers() for a in sub._actions if "--json" in a.option_strings and not a.help]
    assert missing == []


DAEMON_FLAGS = [
    ("--db", "CARBONSCHED_DB"),
    ("--socket", "CARBONSCHED_SOCKET"),
    ("--state-dir", "CARBONSCHED_STATE_DIR"),
    ("--emulate", "CARBONSCHED_EMULATE"),
    ("--zone", "CARBONSCHED_ZONE"),
    ("--policy", "CARBONSCHED_POLICY"),
    ("--plan-interval", "CARBONSCHED_PLAN_INTERVAL"),
    ("--metrics-port", "CARBONSCHED_METRICS_PORT"),
]


def test_daemon_help_names_the_environment_variable_of_each_flag(cli_env):
    proc = run(cli_env, "daemon", "--help")
    assert proc.returncode == 0, proc.stderr
    text = options_text(proc.stdout)
    for flag, var in DAEMON_FLAGS:
        assert re.search(rf"{flag} [^\[]*\[env: {var}\]", text), (flag, var, proc.stdout)


def test_daemon_help_gives_the_default_plan_interval(cli_env):
    assert "default 15s" in options_text(run(cli_env, "daemon", "--help").stdout)


def test_db_help_names_the_database_environment_variable(cli_env):
    text = options_text(run(cli_env, "db", "--help").stdout)
    assert "[env: CARBONSCHED_DB]" in text


def test_no_verb_is_a_usage_error(cli_env):
    proc = run(cli_env)
    assert proc.returncode == 2
    assert "usage: carbonsched" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- submit: mistakes caught before talking to the daemon ----------------------------------

@pytest.mark.parametrize("args", [["submit"], ["submit", "--gpus", "2"], ["submit", "--"],
                                  ["submit", "--gpus", "2", "--"]])
def test_submit_without_a_command_exits_2_with_one_clear_line(cli_env, args):
    proc = run(cli_env, *args)
    assert proc.returncode == 2
    line = one_line_error(proc)
    assert "empty command" in line and "-- " in line
    assert proc.stdout == ""


@pytest.mark.parametrize(("flag", "value", "fragment"), [
    ("--est-runtime", "90 minutes", "malformed duration"),
    ("--time-limit", "-1h", "malformed duration"),
    ("--deadline", "tomorrow", "malformed time"),
    ("--max-delay", "a while", "malformed duration"),
])
def test_submit_with_a_malformed_time_exits_2_with_one_clear_line(cli_env, flag, value, fragment):
    cli_env["CARBONSCHED_SOCKET"] = "/nonexistent/carbonsched.sock"  # never reached
    proc = run(cli_env, "submit", f"{flag}={value}", "--", "true")
    assert proc.returncode == 2, proc.stderr
    line = one_line_error(proc)
    assert fragment in line and repr(value) in line


def test_submit_help_says_a_derived_time_limit_never_undercuts_the_users_estimate(cli_env):
    """Issue 24: a user predicts the limit from --help alone."""
    proc = run(cli_env, "submit", "--help")
    assert proc.returncode == 0, proc.stderr
    text = options_text(proc.stdout)
    assert "time_limit_factor (2) x the estimated runtime on the planned GPUs" in text
    assert "never less than time_limit_factor x --est-runtime" in text


def test_submit_env_of_an_unset_variable_exits_2(cli_env):
    cli_env.pop("CS_TEST_UNSET", None)
    proc = run(cli_env, "submit", "--env", "CS_TEST_UNSET", "--", "true")
    assert proc.returncode == 2
    assert "CS_TEST_UNSET" in one_line_error(proc)


# -- no daemon ------------------------------------------------------------------------------

CLIENT_VERBS = [["queue"], ["queue", "--json"], ["show", "1"], ["cancel", "1", "2"],
                ["logs", "1"], ["nodes"], ["plan"], ["submit", "--", "python", "run.py"]]


@pytest.mark.parametrize("args", CLIENT_VERBS, ids=lambda a: " ".join(a))
def test_client_verbs_with_a_missing_socket_exit_3_naming_the_socket(cli_env, tmp_path, args):
    sock = tmp_path / "run" / "carbonsched.sock"
    cli_env["CARBONSCHED_SOCKET"] = str(sock)
    proc = run(cli_env, *args)
    assert proc.returncode == 3, proc.stderr
    line = one_line_error(proc)
    assert str(sock) in line
    assert "carbonsched daemon" in line  # says what to start
    assert proc.stdout == ""


def test_the_socket_flag_overrides_the_environment(cli_env, tmp_path):
    cli_env["CARBONSCHED_SOCKET"] = str(tmp_path / "from-env.sock")
    flag_sock = tmp_path / "from-flag.sock"
    proc = run(cli_env, "--socket", str(flag_sock), "queue")
    assert proc.returncode == 3
    assert str(flag_sock) in one_line_error(proc)


def test_a_stale_socket_with_no_daemon_behind_it_exits_3(cli_env, tmp_path):
    """A socket file left behind by a daemon that died: connection refused."""
    path = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()
    assert path.exists()
    cli_env["CARBONSCHED_SOCKET"] = str(path)
    proc = run(cli_env, "queue")
    assert proc.returncode == 3
    assert str(path) in one_line_error(proc)


# -- db (no daemon: it talks to the database directly) --------------------------------------

def test_db_check_on_an_empty_database_fails_and_says_to_run_db_upgrade(cli_env, tmp_path):
    url = f"sqlite:///{tmp_path / 'cs.db'}"
    proc = run(cli_env, "db", "check", "--db", url)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "carbonsched db upgrade" in proc.stderr

    proc = run(cli_env, "db", "upgrade", "--db", url)
    assert proc.returncode == 0, proc.stderr
    proc = run(cli_env, "db", "check", "--db", url)
    assert proc.returncode == 0, proc.stderr
    assert "matches the models" in proc.stdout


def test_db_check_on_a_postgresql_database_that_does_not_exist_is_one_line(cli_env):
    """Not SQLAlchemy's message with its link: what the server said, in one line."""
    from sqlalchemy import make_url

    from databases import PG_ADMIN_URL, require_pg

    require_pg()
    url = make_url(PG_ADMIN_URL).set(database="carbonsched_no_such_db").render_as_string(hide_password=False)
    proc = run(cli_env, "db", "check", "--db", url)
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert 'database "carbonsched_no_such_db" does not exist' in line and "sqlalche.me" not in line


def test_db_url_comes_from_the_environment(cli_env, tmp_path):
    cli_env["CARBONSCHED_DB"] = f"sqlite:///{tmp_path / 'env.db'}"
    proc = run(cli_env, "db", "upgrade")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "env.db").exists()


# -- carbon-aware planning --------------------------------------------------------------------

@pytest.mark.parametrize(("policy", "fragment"), [("oracle", "simulat"), ("fastest", "unknown policy")])
def test_the_daemon_refuses_a_policy_it_cannot_run_before_starting_anything(cli_env, tmp_path, policy,
                                                                            fragment):
    state = tmp_path / "daemon-state"
    proc = run(cli_env, "daemon", "--policy", policy, "--state-dir", str(state), "--emulate", "1xH100")
    assert proc.returncode == 2, proc.stderr
    assert fragment in one_line_error(proc)
    assert not (state / "carbonsched.db").exists()


def test_the_daemon_help_names_cpsat_as_the_default_policy(cli_env):
    proc = run(cli_env, "daemon", "--help")
    assert "default cpsat" in options_text(proc.stdout)


def test_the_plan_table_totals_planned_against_run_now_grams():
    from scheduler.cli.output import plan_table

    plan = [
        {"job": 1, "node": "gb1", "gpus": [0], "start": "2026-12-01T02:00:00Z", "gco2": 30.0,
         "gco2_if_now": 90.0, "reason": "H200 in GB at 02:00", "model": "H200", "zone": "GB"},
        {"job": 2, "node": "de1", "gpus": [0, 1], "start": "2026-12-01T03:00:00Z", "gco2": 10.0,
         "gco2_if_now": 10.0, "reason": "runs now", "model": "H100", "zone": "DE",
         "deadline_miss": True},
        {"job": 3, "node": "lab", "gpus": [0], "start": "2026-12-01T03:00:00Z", "gco2": 50.0,
         "gco2_if_now": 50.0, "reason": "priced blind", "model": "A100", "zone": "LAB",
         "priced_blind_g_per_kwh": 300.0},
        {"job": 4, "node": None, "gpus": None, "start": None, "gco2": None, "gco2_if_now": None,
         "reason": "needs 16 GPUs of one model on one node"},
    ]
    lines = plan_table(plan).splitlines()
    assert lines[0].split() == ["JOB", "NODE", "GPU@ZONE", "GPUS", "START", "GCO2", "IF_NOW", "REASON"]
    assert "H200@GB" in lines[1] and "30.0 g" in lines[1] and "90.0 g" in lines[1]
    assert "DEADLINE-MISS" in lines[2]
    total = lines[-1]
    assert total.startswith("total: 90.0 g planned vs 150.0 g if run now (saving 40.0%)")
    assert "over 3 of 4 jobs" in total and "1 priced blind at 300 g/kWh" in total and "1 not placed" in total


def test_show_prints_the_explanation_the_estimates_per_prompt_and_the_saving():
    from scheduler.cli.output import job_detail

    job = {"id": 7, "name": "infer", "state": "PLANNED", "reason": "planned", "owner": "alice",
           "owner_uid": 1000, "argv": ["python", "infer.py"], "cwd": "/tmp", "gpus_requested": 1,
           "gpu_mem_gib": 0.0, "gpus": [0], "gpu_model": "H200", "node": "gb1", "workload": "llm",
           "prompts": 1000, "est_runtime_s": None, "time_limit_s": None, "deadline": None,
           "submitted_at": "2026-12-01T00:00:00Z", "planned_start": "2026-12-01T02:00:00Z",
           "started_at": None, "ended_at": None, "exit_code": None, "energy_j": None, "gco2": None,
           "explanation": "H200 in GB at 02:00: 41 g vs 118 g now on MI300X in DE (deadline binds)",
           "est_energy_j": 7.2e6, "est_gco2": 41.0, "est_gco2_per_prompt": 0.041,
           "est_gco2_if_now": 118.0, "est_gco2_if_now_per_prompt": 0.118, "binding": "deadline",
           "deadline_miss": True, "max_delay_s": 7200.0, "est_runtime_planned_s": 3600.0}
    text = job_detail(job)
    assert "H200 in GB at 02:00: 41 g vs 118 g now" in text
    assert "41.0 g (0.041 g/prompt)" in text
    assert "118.0 g (0.118 g/prompt); the plan saves 65%" in text
    assert "binding: deadline" in text
    assert "DEADLINE" in text and "2.00 kWh" in text


def test_show_gives_reported_work_beside_declared_and_divides_by_the_reported_prompts():
    from scheduler.cli.output import job_detail

    job = {"id": 8, "name": "batch", "state": "COMPLETED", "reason": "exit code 0", "owner": "alice",
           "owner_uid": 1000, "argv": ["python", "batch.py"], "cwd": "/tmp", "gpus_requested": 1,
           "gpu_mem_gib": 0.0, "gpus": [0], "gpu_model": "H100", "node": "de1", "workload": "llm-inference",
           "prompts": 1000, "tokens": 50000, "reported_prompts": 1200, "reported_input_tokens": 60000,
           "reported_output_tokens": 48000, "est_runtime_s": 60.0, "time_limit_s": 120.0, "deadline": None,
           "submitted_at": "2026-12-01T00:00:00Z", "planned_start": "2026-12-01T00:00:00Z",
           "started_at": "2026-12-01T00:00:00Z", "ended_at": "2026-12-01T00:01:00Z", "exit_code": 0,
           "energy_j": 3.6e6, "energy_method": "counter", "gco2": 120.0, "gco2_per_prompt": 0.1,
           "prompts_source": "reported", "explanation": "-", "est_energy_j": None, "est_gco2": None,
           "est_gco2_if_now": None, "binding": None, "deadline_miss": False}
    text = job_detail(job)
    assert ("work: 1,200 prompts, 60,000 input tokens, 48,000 output tokens (reported); "
            "1,000 prompts, 50,000 output tokens (declared)") in text
    assert "120.0 g (0.1 g/prompt, reported)" in text


def test_the_queue_table_shows_why_each_pending_job_waits_in_a_last_reason_column():
    """As squeue's REASON: the planner's reason for a PENDING job, nothing for the others."""
    from scheduler.cli.output import jobs_table

    def job(id_, state, reason):
        return {"id": id_, "name": "j", "owner": "alice", "state": state, "gpus": None, "gpu_model": None,
                "node": None, "gpus_requested": 1, "submitted_at": None, "started_at": None, "planned_start": None,
                "ended_at": None, "exit_code": None, "energy_j": None, "gco2": None, "est_gco2": None,
                "reason": reason}

    header, pending, running = jobs_table([job(1, "PENDING", "fits no GPU model: H100 (slo)"),
                                           job(2, "RUNNING", "claimed by node vm")]).splitlines()
    assert header.split()[-1] == "REASON"
    assert pending.endswith("  fits no GPU model: H100 (slo)")
    assert "claimed" not in running


def test_the_queue_table_gives_a_planned_job_behind_other_work_squeues_word_only():
    """A PLANNED job's reason is its plan's long explanation (`show` prints it); `queue` gives
    only the word for whose work it waits behind, and nothing for a job that waits for carbon."""
    from scheduler.cli.output import jobs_table

    def job(id_, reason):
        return {"id": id_, "name": "j", "owner": "alice", "state": "PLANNED", "gpus": None, "gpu_model": None,
                "node": None, "gpus_requested": 1, "submitted_at": None, "started_at": None, "planned_start": None,
                "ended_at": None, "exit_code": None, "energy_j": None, "gco2": None, "est_gco2": None,
                "reason": reason}

    plan = "greedy: 1xH100 in DE at 13:00: 322 g vs 318 g now on H100 in DE (capacity binds)"
    _, behind, busy, carbon = jobs_table([
        job(1, f"{plan}; waits: the GPUs free for it now are planned for jobs of a higher priority (Priority)"),
        job(2, f"{plan}; waits: the GPUs that fit it are busy with running jobs until 13:00 (Resources)"),
        job(3, "greedy: 1xH100 in DE at 03:00: 200 g vs 318 g now on H100 in DE (cheapest forecast slot)"),
    ]).splitlines()
    assert behind.endswith("  (Priority)") and busy.endswith("  (Resources)")
    assert "slot" not in carbon and not carbon.rstrip().endswith(")")


def test_show_gives_the_exact_runtime_not_the_difference_of_whole_seconds():
    """The demo's job ran 4.4 s from 16:35:11.9 to 16:35:16.3: `show` said 5s (16 - 11), its
    receipt 4s."""
    from scheduler.cli.output import job_detail
    from scheduler.job_view import _seconds_raw

    assert _seconds_raw("2026-12-02 16:35:11.900000", "2026-12-02 16:35:16.300000") == pytest.approx(4.4)
    job = {"id": 7, "name": "r", "state": "COMPLETED", "reason": "exit code 0", "owner": "alice",
           "owner_uid": 1000, "argv": ["true"], "cwd": "/tmp", "gpus_requested": 1, "gpu_mem_gib": 0.0,
           "gpus": [0], "gpu_model": "H100", "node": "n", "workload": None, "prompts": None,
           "est_runtime_s": None, "time_limit_s": None, "deadline": None, "submitted_at": "2026-12-02T16:35:11Z",
           "planned_start": "2026-12-02T16:35:11Z", "started_at": "2026-12-02T16:35:11Z",
           "ended_at": "2026-12-02T16:35:16Z", "runtime_s": 4.4, "exit_code": 0, "energy_j": None, "gco2": None,
           "explanation": "-", "est_energy_j": None, "est_gco2": None, "est_gco2_if_now": None, "binding": None,
           "deadline_miss": False}
    assert "runtime: 4s" in job_detail(job)
