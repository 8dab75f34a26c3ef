"""What every `carbonsched` verb shares: exit codes, `CliError`, the verb registry, and how a
verb finds its configuration, the daemon's socket and the database.

Verb modules (`carbon`, `report`, `simulate`, and the built-in verbs in `main`) register
their handlers in `VERBS`; `scheduler.cli.main` builds the parser from them and dispatches.
Nothing here imports `main` or a verb module, so the package has no import cycle.
Only the standard library is imported up front so user commands start fast.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable
from pathlib import Path

from scheduler import settings

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOT_FOUND, EXIT_FORBIDDEN, EXIT_CONFLICT = range(7)
# Every verb's --json says what it prints and where its keys are written down.
JSON_HELP = "print JSON instead of the table (its keys: docs/json-keys.md)"

Verb = Callable[[argparse.Namespace, dict], int]
VERBS: dict[str, Verb] = {}
"""Handler of each verb by name: `handler(args, config) -> exit code`."""


def register(verb: str, handler: Verb) -> None:
    """Make `handler` run `carbonsched VERB`; registering a verb twice is a programming error."""
    if VERBS.get(verb, handler) is not handler:
        raise ValueError(f"verb {verb!r} is registered twice")
    VERBS[verb] = handler


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


# -- configuration: flag > environment > config file > default ---------------------------

def config_path(path: str | None) -> str | None:
    """The config file in use: --config, $CARBONSCHED_CONFIG, else the default if it exists."""
    path = path or os.environ.get("CARBONSCHED_CONFIG")
    if path:
        return path
    for default in (settings.DEFAULT_CONFIG_PATH, Path("/etc/carbonsched/carbonsched.toml")):
        if default.exists():
            return str(default)
    return None


class UnreadableConfig(dict):
    """No settings, standing in for a config file this user cannot read: a root-only one
    (it may hold the daemon's secrets), or a missing one named by CARBONSCHED_CONFIG.

    A user's verbs need only the daemon's socket, so they go on with --socket,
    $CARBONSCHED_SOCKET or the default; verbs that need the daemon's settings (`daemon`,
    `agent`, `config`, `db`, the store's verbs) stop with `problem` (`require_config`)."""

    def __init__(self, problem: str) -> None:
        super().__init__()
        self.problem = problem


def require_config(config: dict) -> None:
    """CliError (one line naming the file) when the config file could not be read."""
    if isinstance(config, UnreadableConfig):
        raise CliError(config.problem)


def load_config(path: str | None) -> dict:
    """The config file's settings (its `[carbonsched]` table if it has one); {} without a file;
    an `UnreadableConfig` for a file this user may not read, or a missing file that only the
    environment names (--config naming a missing file is a mistake: CliError)."""
    named_by_flag = bool(path)
    path = config_path(path)
    if not path:
        return {}
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        if named_by_flag:
            raise CliError(f"config file {path} not found") from None
        return UnreadableConfig(f"config file {path} not found")
    except PermissionError:
        return UnreadableConfig(f"config file {path} is not readable by uid {os.geteuid()} "
                                "(it holds the daemon's settings: run this as root)")
    except IsADirectoryError:
        raise CliError(f"config file {path} is a directory") from None
    except tomllib.TOMLDecodeError as e:
        raise CliError(f"config file {path} is not valid TOML: {e}") from None
    return data.get("carbonsched", data)


def setting(args, config: dict, name: str, env: str | None, default=None):
    """One setting: the flag, else the environment variable, else the config file, else `default`."""
    value = getattr(args, name, None)
    if value is not None:
        return value
    if env and os.environ.get(env):
        return os.environ[env]
    if name in config:
        return config[name]
    return default


# -- where a verb finds the daemon and the store ------------------------------------------

def api_client(args, config):
    """A client of the daemon's API socket: --socket, $CARBONSCHED_SOCKET, config, default."""
    from scheduler.cli.client import Client, default_socket_path

    path = setting(args, config, "socket", "CARBONSCHED_SOCKET") or default_socket_path()
    return Client(path)


def state_dir(args, config) -> Path:
    """The state directory: --state-dir, $CARBONSCHED_STATE_DIR, config, default."""
    from scheduler.cli.client import default_state_dir

    value = setting(args, config, "state_dir", "CARBONSCHED_STATE_DIR")
    return Path(value) if value else default_state_dir()


def db_url(args, config) -> str:
    """The database URL: --db, $CARBONSCHED_DB, config `db`, the root-only file named by
    `db_file` ($CARBONSCHED_DB_FILE), the systemd credential `db`, else SQLite in the state
    directory."""
    from scheduler.store.engine import default_db_url

    url = setting(args, config, "db", "CARBONSCHED_DB")
    if url:
        return url
    require_config(config)  # the store is the daemon's: its settings decide where it is
    file = os.environ.get("CARBONSCHED_DB_FILE") or config.get("db_file")
    try:
        found = settings.secret_db_url(file)
    except ValueError as e:
        raise CliError(f"db_file: {e}" if file else str(e)) from None
    return found[0] if found else default_db_url(state_dir(args, config))


def missing_sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL when that file does not exist (opening it would create it
    and its directory), else None (it exists, it is in memory, or it is not SQLite)."""
    from scheduler.store.engine import normalize_url

    url = normalize_url(url)
    if not url.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        path = make_url(url).database
    except ArgumentError:
        return None
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    return None if Path(path).exists() else path


def open_existing_store(url: str, *, require_current: bool = True,
                        hint: str = "start the daemon, or give --db URL"):
    """The store at `url` for a read-only verb, which must never create anything: a SQLite
    file that does not exist is `no database at PATH` (exit 1, nothing written); a URL that
    cannot be opened or a schema at another revision is one clear line, never a traceback."""
    from sqlalchemy.exc import SQLAlchemyError

    from scheduler.store import SchemaError, Store

    missing = missing_sqlite_path(url)
    if missing is not None:
        raise CliError(f"no database at {missing} ({hint})", EXIT_ERROR)
    try:
        store = Store(url)
    except (SQLAlchemyError, ImportError, ValueError) as e:
        raise CliError(f"cannot open the database {url}: {str(e).splitlines()[0]}") from None
    if require_current:
        try:
            store.require_current(f"carbonsched db upgrade --db {store.url}")
        except SchemaError as e:
            store.dispose()
            raise CliError(str(e)) from None
        except SQLAlchemyError as e:
            store.dispose()
            raise CliError(f"cannot read the database {store.url}: {str(e).splitlines()[0]}") from None
    return store


def database_error_line(e: BaseException) -> str | None:
    """One line for an error the database driver raised (a server that is down, a database
    that does not exist, a refused login): what the driver said, first line only, without
    SQLAlchemy's prefix and its link; None for any other error."""
    module = type(e).__module__ or ""
    if not module.startswith("sqlalchemy"):
        return None
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)
    # psycopg: 'connection failed: connection to server at "h", port p failed: FATAL:  database "x" does not exist'
    first = first.split("FATAL:", 1)[-1].strip() if "FATAL:" in first else first
    return f"database error: {first}"
