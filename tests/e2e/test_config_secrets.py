"""Issue 48 finding 2: the daemon's secrets stay out of the config file every user reads.

The CLI must never need them: a user whose CLI cannot read the config (0600, or a missing
file named by CARBONSCHED_CONFIG) still reaches the daemon over its socket. Secrets live in
root-only files named by `*_file` keys (`db_file`, `[carbon] electricitymaps_token_file`,
`watttime_password_file`) or in systemd credentials ($CREDENTIALS_DIRECTORY, LoadCredential=
in `systemd/credentials.conf`), and `config check` (and the daemon and agents, which run the
same check) refuses a config that other users can read and that holds a secret inline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from daemon_harness import DaemonProcess, database_for, readable_code_copy, world_dir
from scheduler.carbon_config import CarbonConfig
from scheduler.settings import AGENT, DAEMON, ConfigErrors, resolve
from suite_hygiene import make_user, remove_user

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cret-pw-48"
URL = f"postgresql+psycopg://carbonsched:{PASSWORD}@127.0.0.1/carbonsched"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`carbonsched ARGS` as root (the caller), without the caller's CARBONSCHED_* settings."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CARBONSCHED_") and k != "CREDENTIALS_DIRECTORY"}
    base.update(env or {}, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "scheduler", *args], capture_output=True, text=True,
                          env=base, cwd=ROOT, timeout=60)


def one_line(proc: subprocess.CompletedProcess) -> str:
    """stderr is exactly one `carbonsched: ...` line, no traceback and no `unexpected error`."""
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("carbonsched: "), proc.stderr
    return lines[0]


@pytest.fixture
def etc():
    """A directory every user can enter (as /etc/carbonsched is), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="carbonsched-etc-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write(path: Path, text: str, mode: int) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


# -- a user's CLI without the daemon's config ---------------------------------------------------

@pytest.fixture(scope="module")
def user():
    if os.geteuid() != 0:
        pytest.skip("making a throwaway user and running the CLI as it needs root")
    name = make_user()
    yield name
    remove_user(name)


def as_user(user: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`carbonsched ARGS` as the throwaway `user`, with the system Python (as a user has)."""
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
    base = {k: v for k, v in os.environ.items() if not k.startswith("CARBONSCHED_")}
    base.update(env or {}, PYTHONPATH=str(readable_code_copy()))
    return subprocess.run(["runuser", "-u", user, "--", python, "-m", "scheduler", *args],
                          capture_output=True, text=True, env=base, cwd="/", timeout=60)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_user_who_cannot_read_the_config_still_reaches_the_socket(etc, user, how):
    """At 0600 every user's CLI used to fail with `unexpected error: PermissionError`."""
    config = write(etc / "config.toml", f'db = "{URL}"\n', 0o600)
    sock = etc / "absent.sock"  # nobody listens: the CLI got past the config to the socket
    args = ("--config", str(config)) if how == "flag" else ()
    env = {"CARBONSCHED_CONFIG": str(config)} if how == "env" else {}
    proc = as_user(user, *args, "--socket", str(sock), "queue", env=env)
    line = one_line(proc)
    assert proc.returncode == 3, proc.stderr  # unreachable, as without any config
    assert str(sock) in line and PASSWORD not in line


def test_a_user_without_the_config_named_by_the_environment_still_reaches_the_socket(etc, user):
    proc = as_user(user, "--socket", str(etc / "absent.sock"), "queue",
                   env={"CARBONSCHED_CONFIG": str(etc / "gone.toml")})
    assert proc.returncode == 3 and str(etc / "absent.sock") in one_line(proc)


def test_an_unreadable_config_says_so_when_the_daemon_is_unreachable(etc, user):
    """The socket the config names is unknown to the user: the one line says why."""
    config = write(etc / "config.toml", f'socket = "{etc}/elsewhere.sock"\n', 0o600)
    proc = as_user(user, "--config", str(config), "nodes",
                   env={"CARBONSCHED_SOCKET": str(etc / "absent.sock")})
    line = one_line(proc)
    assert proc.returncode == 3 and "not readable" in line and str(config) in line


def test_verbs_that_need_the_config_name_the_file_they_cannot_read(etc, user):
    config = write(etc / "config.toml", 'zone = "DE"\n', 0o600)
    proc = as_user(user, "--config", str(config), "config", "check")
    line = one_line(proc)
    assert proc.returncode == 1 and str(config) in line and "not readable" in line


@pytest.mark.slow
def test_a_root_daemon_reads_its_db_url_from_db_file_and_serves_a_user_who_cannot_read_the_config(user):
    """The whole finding: the URL with its password is in a root-only file named by the
    root-only config; the daemon uses it, and a user's CLI (which reads neither) submits."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    root = world_dir("cs-secrets-")
    with database_for("postgresql", root) as plain:
        url = make_url(plain).set(password=PASSWORD).render_as_string(hide_password=False)  # trust auth
        d = DaemonProcess(root, None)
        write(root / "db.url", url + "\n", 0o600)
        write(d.config, f'grace = "1s"\ndb_file = "{root / "db.url"}"\n', 0o600)
        try:
            d.start()
            env = {"CARBONSCHED_CONFIG": str(d.config)}
            proc = as_user(user, "--socket", str(d.socket), "submit", "--json", "--", "true", env=env)
            assert proc.returncode == 0, proc.stderr + d.log()
            job = json.loads(proc.stdout)["id"]
            assert d.wait_states([job], timeout_s=120)[job]["state"] == "COMPLETED"
            engine = create_engine(plain)  # the daemon's store is the database the file names
            try:
                with engine.connect() as conn:
                    owner = conn.execute(text("SELECT owner_name FROM jobs WHERE id = :id"), {"id": job}).scalar()
                assert owner == user
            finally:
                engine.dispose()
            assert PASSWORD not in d.log()
        finally:
            d.cleanup()


# -- `config check` refuses inline secrets in a config others can read ---------------------------

INLINE = {
    "db": f'db = "{URL}"\n',
    "electricitymaps_token": f'[carbon]\nelectricitymaps_token = "{PASSWORD}"\n',
    "watttime_password": f'[carbon]\nwatttime_username = "u"\nwatttime_password = "{PASSWORD}"\n',
}


@pytest.mark.parametrize("key", sorted(INLINE))
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604], ids=oct)
def test_config_check_refuses_an_inline_secret_in_a_config_others_can_read(etc, key, mode):
    config = write(etc / "config.toml", INLINE[key], mode)
    proc = cli("--config", str(config), "config", "check")
    line = one_line(proc)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"`{key}`" in line and str(config) in line and f"{key}_file" in line
    assert PASSWORD not in proc.stdout + proc.stderr


@pytest.mark.parametrize("key", sorted(INLINE))
def test_the_same_secret_in_a_root_only_config_passes(etc, key):
    config = write(etc / "config.toml", INLINE[key], 0o600)
    proc = cli("--config", str(config), "config", "check")
    assert proc.returncode == 0 and "config OK" in proc.stdout, proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr


def test_a_db_url_without_a_password_is_no_secret(etc):
    config = write(etc / "config.toml", 'db = "postgresql+psycopg://carbonsched@127.0.0.1/carbonsched"\n', 0o644)
    proc = cli("--config", str(config), "config", "check")
    assert proc.returncode == 0 and "config OK" in proc.stdout, proc.stderr


def test_the_daemon_refuses_to_start_on_the_same_problem(etc):
    config = write(etc / "config.toml", INLINE["db"], 0o644)
    proc = cli("--config", str(config), "daemon", "--state-dir", str(etc / "state"))
    assert proc.returncode == 2 and "`db`" in one_line(proc)
    assert not (etc / "state").exists()


# -- secrets from root-only files and systemd credentials -----------------------------------------

def test_db_file_gives_the_url_and_config_show_hides_its_password(etc):
    secret = write(etc / "db.url", URL + "\n", 0o600)
    config = write(etc / "config.toml", f'db_file = "{secret}"\n', 0o644)
    assert cli("--config", str(config), "config", "check").returncode == 0
    proc = cli("--config", str(config), "config", "show", "--json")
    assert proc.returncode == 0, proc.stderr
    db = {x["key"]: x for x in json.loads(proc.stdout)["settings"]}["db"]
    assert db["value"].startswith("postgresql+psycopg://carbonsched:***@127.0.0.1")
    assert str(secret) in db["source"] and PASSWORD not in proc.stdout


def test_the_store_verbs_read_db_file_too(etc):
    """`db check` (and `carbon`, `simulate`, which find the store the same way) use the file."""
    missing = etc / "nowhere" / "store.db"
    secret = write(etc / "db.url", f"sqlite:///{missing}\n", 0o600)
    config = write(etc / "config.toml", f'db_file = "{secret}"\n', 0o644)
    proc = cli("--config", str(config), "db", "check")
    assert proc.returncode == 1 and f"no database at {missing}" in one_line(proc)
    assert not missing.parent.exists()


def test_resolve_reads_db_file_for_the_daemon_and_the_agent(etc):
    secret = write(etc / "db.url", URL + "\n", 0o600)
    for scope in (DAEMON, AGENT):
        r = resolve(scope, None, {"db_file": str(secret)}, {})
        assert r["db"] == URL and "db_file" in r.sources["db"]


def test_an_inline_db_or_the_environment_beats_a_credential_and_both_keys_is_an_error(etc):
    creds = etc / "creds"
    creds.mkdir()
    write(creds / "db", URL, 0o600)
    r = resolve(DAEMON, None, {}, {"CREDENTIALS_DIRECTORY": str(creds)})
    assert r["db"] == URL and r.sources["db"] == "systemd credential `db`"
    r = resolve(DAEMON, None, {}, {"CREDENTIALS_DIRECTORY": str(creds), "CARBONSCHED_DB": "sqlite:///x.db"})
    assert r["db"] == "sqlite:///x.db"
    with pytest.raises(ConfigErrors) as e:
        resolve(DAEMON, None, {"db": "sqlite:///x.db", "db_file": str(creds / "db")}, {})
    assert any("`db`" in x and "`db_file`" in x for x in e.value.errors), e.value.errors


@pytest.mark.parametrize("problem", ["missing", "empty", "readable by others"])
def test_a_bad_secret_file_is_one_line_naming_its_key(etc, problem):
    secret = etc / "db.url"
    if problem == "empty":
        write(secret, "\n", 0o600)
    elif problem == "readable by others":
        write(secret, URL, 0o644)
    config = write(etc / "config.toml", f'db_file = "{secret}"\n', 0o644)
    proc = cli("--config", str(config), "config", "check")
    line = one_line(proc)
    assert proc.returncode == 2 and "`db_file`" in line and str(secret) in line
    assert PASSWORD not in proc.stdout + proc.stderr


def test_provider_secrets_come_from_files_or_credentials(etc):
    token = write(etc / "em.token", "em-token\n", 0o600)
    password = write(etc / "wt.password", "wt-password\n", 0o600)
    cfg = CarbonConfig.from_config({"carbon": {"electricitymaps_token_file": str(token),
                                               "watttime_username": "u",
                                               "watttime_password_file": str(password)}}, env={})
    assert (cfg.electricitymaps_token, cfg.watttime_password) == ("em-token", "wt-password")
    creds = etc / "creds"
    creds.mkdir()
    write(creds / "electricitymaps_token", "cred-token", 0o600)
    write(creds / "watttime_password", "cred-password", 0o600)
    cfg = CarbonConfig.from_config({}, env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert (cfg.electricitymaps_token, cfg.watttime_password) == ("cred-token", "cred-password")
    with pytest.raises(ValueError, match="electricitymaps_token_file"):
        CarbonConfig.from_config({"carbon": {"electricitymaps_token_file": str(etc / "gone")}}, env={})


def test_the_credentials_drop_in_loads_only_secrets_the_code_reads_and_passes_verify(tmp_path):
    from scheduler.credentials import CREDENTIALS

    text = (ROOT / "systemd" / "credentials.conf").read_text()
    lines = [x for x in text.splitlines() if x and not x.startswith("#")]
    assert lines[0] == "[Service]"
    names = {x.split("=", 1)[1].split(":", 1)[0] for x in lines[1:] if x.startswith("LoadCredential=")}
    assert names and names <= set(CREDENTIALS)
    assert "credentials.conf" in (ROOT / "README.md").read_text()
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed (apt-get install systemd); CI requires it")
    exe = Path(sys.executable).with_name("carbonsched")
    unit = (ROOT / "systemd" / "carbonsched.service").read_text().replace("/usr/local/bin/carbonsched", str(exe))
    merged = unit.replace("[Install]", "\n".join(lines[1:]) + "\n\n[Install]")
    (tmp_path / "carbonsched.service").write_text(merged)
    out = subprocess.run([tool, "verify", str(tmp_path / "carbonsched.service")], capture_output=True,
                         text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0 and "carbonsched.service" not in out.stdout + out.stderr, out.stderr
