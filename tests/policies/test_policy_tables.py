"""The policies' derived tables (seed profiles, the performance model's presets and fit) are
computed by the first process and loaded by later ones, never from a file others could
have written (scheduler/policy_tables.py)."""

from __future__ import annotations

import pickle
import subprocess
import sys

from daemon_harness import REPO

WARM = ("import logging, sys; logging.basicConfig(level=logging.WARNING, stream=sys.stderr)\n"
        "from scheduler.policy_tables import warm_policy_tables\n"
        "print(warm_policy_tables())\n"
        "from policies.model.energy import seed_profiles\n"
        "from policies.model.perf_model import fit, presets\n"
        "import pickle; sys.stdout.flush()\n"
        "sys.stdout.buffer.write(pickle.dumps((seed_profiles(), presets(), fit().input_tokens)))\n")


def warm(cache) -> tuple[str, tuple, str]:
    """How a fresh process got the tables, what it then had, and what it logged."""
    done = subprocess.run([sys.executable, "-c", WARM], capture_output=True, cwd=REPO, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "CARBONSCHED_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr.decode()
    how, _, rest = done.stdout.partition(b"\n")
    return how.decode(), pickle.loads(rest), done.stderr.decode()


def test_a_later_process_loads_exactly_what_the_first_computed(tmp_path):
    cache = tmp_path / "cache"
    how, computed, _ = warm(cache)
    assert how == "computed"
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    (table,) = cache.glob("policy-tables-*.pickle")
    assert oct(table.stat().st_mode & 0o777) == "0o600"
    how, loaded, _ = warm(cache)
    assert how == "loaded"
    assert repr(loaded) == repr(computed)  # repr: the training profiles hold NaN latencies


def test_a_table_that_others_could_write_is_never_loaded(tmp_path):
    cache = tmp_path / "cache"
    assert warm(cache)[0] == "computed"
    (table,) = cache.glob("policy-tables-*.pickle")
    table.chmod(0o666)  # anyone could have put code in this pickle
    how, _, logged = warm(cache)
    assert how == "computed" and "ignoring" in logged and "writable by others" in logged


def test_another_version_of_the_policies_never_reads_this_ones_table(tmp_path, monkeypatch):
    from scheduler import policy_tables

    key = policy_tables.tables_key()
    assert key == policy_tables.tables_key()  # stable
    monkeypatch.setattr(policy_tables, "FORMAT", policy_tables.FORMAT + 1)
    assert policy_tables.tables_key() != key


PROFILES_REFUSING_TO_FIT = (
    "import sys\n"
    "from policies.model import perf_model\n"
    "def refuse(*args, **kwargs):\n"
    "    raise AssertionError('carbonsched profiles fitted the model instead of loading the tables')\n"
    "perf_model._fit_step = refuse  # the fit's least squares\n"
    "perf_model.mlperf_speed = refuse  # the MLPerf results' stack speeds (the stack factors)\n"
    "from scheduler.cli.main import main\n"
    "sys.argv = ['carbonsched', '--socket', sys.argv[1], 'profiles']\n"
    "main()\n")


def test_carbonsched_profiles_loads_the_tables_and_fits_nothing(tmp_path):
    """`carbonsched profiles` is interactive: with the tables on disk it derives nothing (the
    fit and the stack speeds took most of its 1.7-2 s)."""
    cache = tmp_path / "cache"
    assert warm(cache)[0] == "computed"
    (tmp_path / "none.toml").write_text("")
    done = subprocess.run([sys.executable, "-c", PROFILES_REFUSING_TO_FIT, str(tmp_path / "absent.sock")],
                          capture_output=True, cwd=REPO, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "CARBONSCHED_CACHE_DIR": str(cache),
                               "CARBONSCHED_CONFIG": str(tmp_path / "none.toml")})
    assert done.returncode == 0, done.stderr.decode()
    assert b"llm-chat-8b " in done.stdout and b"learned figures unavailable" in done.stdout
