"""Every setting of the daemon and the agent in one table: its TOML key, flag, environment
variable, type, default and meaning.

A value comes from the flag, else the environment variable, else the config file, else the
default. `resolve` checks every value it uses and reports all problems at once, each with the
key and where the value came from, so an operator fixes a config file in one pass instead of
meeting one traceback per restart. `carbonsched config check` runs the same checks offline.
Nested tables (`[carbon]`, `[site]`, `[zones.Z]`) are checked by the code that owns them.
"""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.timeparse import format_duration, parse_duration

DAEMON, AGENT = "daemon", "agent"
DEFAULT_CONFIG_PATH = Path("/etc/carbonsched/config.toml")


class ConfigErrors(ValueError):
    """One or more settings are wrong; `errors` lists each with its key and source."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


# -- value parsers: text or TOML value in, typed value out, ValueError with a reason -------

def _duration(v: Any) -> float:
    seconds = parse_duration(str(v))
    if seconds <= 0:
        raise ValueError(f"must be a positive duration (got {v!r})")
    return seconds


def _number(minimum: float | None = None, maximum: float | None = None) -> Callable[[Any], float]:
    def parse(v: Any) -> float:
        if isinstance(v, bool):
            raise ValueError(f"must be a number (got {v!r})")
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"must be a number (got {v!r})") from None
        if x != x or (minimum is not None and x < minimum) or (maximum is not None and x > maximum):
            lo = "" if minimum is None else f">= {minimum:g}"
            hi = "" if maximum is None else f"<= {maximum:g}"
            raise ValueError(f"must be {' and '.join(p for p in (lo, hi) if p)} (got {v!r})")
        return x
    return parse


def _integer(minimum: int, maximum: int) -> Callable[[Any], int]:
    def parse(v: Any) -> int:
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            raise ValueError(f"must be a whole number (got {v!r})")
        try:
            x = int(v)
        except (TypeError, ValueError):
            raise ValueError(f"must be a whole number (got {v!r})") from None
        if not minimum <= x <= maximum:
            raise ValueError(f"must be between {minimum} and {maximum} (got {x})")
        return x
    return parse


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"must be true or false (got {v!r})")


def _text(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"must be a non-empty string (got {v!r})")
    return v.strip()


def _zone(v: Any) -> str:
    from scheduler.zone_check import validate_zone

    return validate_zone(v)


def _groups(v: Any) -> list[str]:
    import grp

    items = v.split(",") if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(g, str) and g.strip() for g in items):
        raise ValueError(f"must be a list of group names (got {v!r})")
    names = [g.strip() for g in items]
    for name in names:  # caught by `config check`, not only when the daemon starts
        try:
            grp.getgrnam(name)
        except KeyError:
            raise ValueError(f"group {name!r} does not exist on this host") from None
    return names


def _duration_at_least(minimum_s: float, why: str) -> Callable[[Any], float]:
    def parse(v: Any) -> float:
        seconds = _duration(v)
        if seconds < minimum_s:
            raise ValueError(f"must be at least {format_duration(minimum_s)} (got {v!r}): {why}")
        return seconds
    return parse


def _duration_at_most(maximum_s: float) -> Callable[[Any], float]:
    def parse(v: Any) -> float:
        seconds = _duration(v)
        if seconds > maximum_s:
            raise ValueError(f"must be at most {format_duration(maximum_s)} (got {v!r})")
        return seconds
    return parse


def _db_url(v: Any) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from scheduler.store.engine import normalize_url

    url = normalize_url(_text(v))
    try:
        backend = make_url(url).get_backend_name()
    except ArgumentError:
        raise ValueError(f"is not a database URL (got {v!r}); e.g. postgresql+psycopg://user@host/db") from None
    if backend not in ("sqlite", "postgresql"):
        raise ValueError(f"must be a SQLite or PostgreSQL URL (got {backend})")
    return url


def _db_file(v: Any) -> Path:
    """A root-only file holding the database URL, with its password (issue 48)."""
    from scheduler.credentials import read_secret

    path = _path(v)
    _db_url_of(read_secret(path), str(path))
    return path


def _db_url_of(secret: str, where: str) -> str:
    """The database URL held in a secret file, never echoed in an error (it has a password)."""
    try:
        return _db_url(secret)
    except ValueError:
        raise ValueError(f"{where} holds no SQLite or PostgreSQL URL "
                         "(e.g. postgresql+psycopg://role:PASSWORD@host/db)") from None


def _fleet(v: Any) -> str:
    from scheduler.fleet_spec import parse_emulated_fleet

    parse_emulated_fleet(_text(v))
    return _text(v)


def _truth(v: Any) -> str:
    from scheduler.simulate.truth import parse_truth

    parse_truth(_text(v))
    return _text(v)


def _executor(v: Any) -> str:
    name = _text(v).lower()
    if name not in ("local", "slurm"):
        raise ValueError(f"must be local or slurm (got {v!r})")
    return name


def _policy(v: Any) -> str:
    """A policy name with optional parameters, `cpsat` or `cpsat:lateness_g_per_gpu_h=500`."""
    from policies.base import get_policy, parse_policy_spec, policy_names

    text = _text(v).strip()
    name, _, rest = text.partition(":")
    name = name.lower()
    usable = [n for n in policy_names() if n != "oracle"]
    if name == "oracle":
        raise ValueError("oracle needs perfect knowledge of the future: it exists only in `carbonsched simulate`")
    if name not in usable:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(usable)}")
    spec = name + (":" + rest if rest else "")
    parsed = parse_policy_spec(spec)
    get_policy(parsed.name, **parsed.params)  # ValueError for a bad parameter, at start-up
    return spec


def _log_level(v: Any) -> str:
    level = _text(v).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError(f"must be DEBUG, INFO, WARNING, ERROR or CRITICAL (got {v!r})")
    return level


def _path(v: Any) -> Path:
    return Path(_text(v)).expanduser()


@dataclass(frozen=True)
class Setting:
    key: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    scopes: frozenset[str]
    metavar: str | None = None
    show: Callable[[Any], str] | None = None  # how a parsed value is printed (durations)
    public: Callable[[Any], Any] | None = None  # what `config show` may print (a URL without password)

    @property
    def env(self) -> str:
        return "CARBONSCHED_" + self.key.upper()

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def is_bool(self) -> bool:
        return self.parse is _bool

    def format(self, value: Any) -> str:
        if value is None:
            return "(unset)"
        value = self.shown(value)
        return self.show(value) if self.show else str(value)

    def shown(self, value: Any) -> Any:
        """The value as it may be printed: secrets (a database password) hidden."""
        return self.public(value) if self.public is not None and value is not None else value


def _hide_password(url: str) -> str:
    from scheduler.credentials import hide_password

    return hide_password(url)


_BOTH = frozenset({DAEMON, AGENT})
_HEAD = frozenset({DAEMON})
_NODE = frozenset({AGENT})
_dur = format_duration

SETTINGS: tuple[Setting, ...] = (
    Setting("db", _db_url, None, "database URL (default: SQLite under the state dir; an agent needs "
            "the cluster's PostgreSQL); a URL with a password belongs in db_file, not in a config "
            "other users can read", _BOTH, "URL", public=_hide_password),
    Setting("db_file", _db_file, None, "a root-only file (mode 0600) holding the database URL with its "
            "password (default: the systemd credential `db`, if given)", _BOTH, "FILE"),
    Setting("state_dir", _path, None, "state directory: SQLite store, job logs, run records (default "
            "/var/lib/carbonsched as root, else ~/.local/state/carbonsched)", _BOTH, "DIR"),
    Setting("log_dir", _path, None, "job logs (stdout, stderr, metrics files); put it on a disk apart from "
            "the state dir so a full log disk never stops the store (default STATE_DIR/logs)", _BOTH, "DIR"),
    Setting("socket", _path, None, "API socket path (default /run/carbonsched/carbonsched.sock as root, "
            "else STATE_DIR/carbonsched.sock)", _HEAD, "PATH"),
    Setting("node", _text, None, "name of this node (default: host name)", _BOTH, "NAME"),
    Setting("zone", _zone, "local", "carbon zone of this node, e.g. DE or US-CAL-CISO (the default `local` has "
            "no carbon data: set the real one)", _BOTH, "ZONE"),
    Setting("emulate", _fleet, None, "emulate a GPU fleet where none exists, e.g. 4xMI300X,2xH100; "
            "partition layouts after a colon: 1xH100:mig=1g.10gb*7, 2xMI300X:partition=QPX:nps=NPS4",
            _BOTH, "SPEC"),
    Setting("truth", _truth, None, "with --emulate: how jobs really run on the emulated GPUs, hidden "
            "from the planner: perfect, noisy:SIGMA or profiles:FILE; jobs are told their pace by "
            "CARBONSCHED_EMULATED_S_PER_PROMPT (default: none, GPUs draw 70-95 percent of TDP)", _BOTH, "SPEC"),
    Setting("executor", _executor, "local", "how jobs run: local (supervised processes on this node) "
            "or slurm (handed to Slurm; see the [slurm] table)", _BOTH, "NAME"),
    Setting("policy", _policy, "cpsat", "planning policy: cpsat, greedy, edf or fifo, with options as NAME:key=value "
            "(e.g. cpsat:lateness_g_per_gpu_h=500)", _HEAD, "NAME"),
    Setting("plan_interval", _duration, 15.0, "planner period (a submit also wakes it)", _HEAD, "DUR", _dur),
    Setting("full_replan", _duration, None, "incremental planning: between full re-plans at most this "
            "far apart, a tick keeps the earlier plans that still fit and plans only the other jobs "
            "around them (default: every tick re-plans every queued job)", _HEAD, "DUR", _dur),
    Setting("dispatch_interval", _duration, 1.0, "how often an agent starts due jobs", _BOTH, "DUR", _dur),
    Setting("planner_process", _bool, True, "plan in a child process so long ticks never stall the API",
            _HEAD),
    Setting("local_agent", _bool, None, "run an agent inside the daemon (default: on for SQLite or "
            "with --emulate)", _HEAD),
    Setting("sample_hz", _number(0.1, 100), 1.0, "GPU power sampling rate, Hz", _BOTH, "HZ"),
    Setting("metrics_port", _integer(0, 65535), None, "serve Prometheus metrics on this TCP port",
            _BOTH, "PORT"),
    Setting("metrics_addr", _text, "127.0.0.1", "address the metrics port listens on (0.0.0.0 or :: for "
            "a Prometheus on another host)", _BOTH, "ADDR"),
    Setting("log_level", _log_level, "INFO", "log level", _BOTH, "LEVEL"),
    Setting("admin_groups", _groups, [], "groups whose members see and cancel every job and drain "
            "GPUs (comma-separated in env/flag)", _HEAD, "GROUP,..."),
    Setting("time_limit_factor", _number(1.0, 100.0), 2.0, "time limit = this x the runtime estimated "
            "on the planned GPUs, never less than this x --est-runtime, unless --time-limit is given", _HEAD, "X"),
    Setting("default_time_limit", _duration_at_most(30 * 86400.0), 86400.0, "the time limit of a job given "
            "none (no --time, --time-limit or --est-runtime) whose QOS sets no default_time_limit; "
            "every job has a finite limit", _HEAD, "DUR", _dur),
    Setting("grace", _duration, 10.0, "SIGTERM -> SIGKILL grace on cancel and timeout", _BOTH, "DUR", _dur),
    Setting("node_lost_after", _duration_at_least(30.0, "shorter, healthy nodes that miss a heartbeat or "
            "restart their agent would have their running jobs declared LOST"), 300.0, "a silent node's running jobs are declared LOST (or "
            "re-queued) after this; longer than any agent restart", _HEAD, "DUR", _dur),
    Setting("sample_retention", _duration, 3600.0, "raw power samples are kept this long, then minute "
            "roll-ups", _HEAD, "DUR", _dur),
    Setting("node_static_w", _number(0.0, 100_000.0), 0.0, "node power besides the GPUs (CPUs, fans, "
            "NICs), shared among jobs by GPU count; 0 leaves it out", _BOTH, "W"),
    Setting("gpu_shares", _integer(1, 64), 1, "declare each GPU of this node without hardware partitioning "
            "(no MIG mode) shareable by time slicing into N shares of 1/N of it, its memory divided "
            "alike, for submit --gpu-fraction; such a GPU takes no whole-GPU job (default 1: whole GPUs)",
            _BOTH, "N"),
    Setting("min_free_disk_mib", _number(0.0, 1e9), 256.0, "below this free space for job logs or the "
            "state dir a node takes no new jobs (their REASON says so)", _BOTH, "MIB"),
    Setting("job_output_limit_mib", _number(0.001, 1e9), 1024.0, "stdout and stderr one job may write to "
            "its logs; past it the rest is discarded, a marker says so and `show` lists the cut streams",
            _BOTH, "MIB"),
    Setting("api_rate_per_uid", _number(1.0, 1e6), 1000.0, "API requests per second one uid may make "
            "(token bucket)", _HEAD, "N"),
    Setting("api_burst_per_uid", _number(1.0, 1e7), 2000.0, "API request burst one uid may make", _HEAD, "N"),
    Setting("api_max_inflight_per_uid", _integer(1, 10_000), 32, "API requests one uid may have in "
            "progress at once", _HEAD, "N"),
    Setting("api_max_connections_per_uid", _integer(1, 100_000), 256, "API connections one uid may hold "
            "open", _HEAD, "N"),
    Setting("api_max_active_per_uid", _integer(1, 1_000), 3, "API requests of one uid worked on at once; "
            "its others wait their turn (so one user's flood cannot take the daemon's CPU from the others)",
            _HEAD, "N"),
    Setting("api_max_expensive_per_uid", _integer(1, 1_000), 2, "job listings, reports, exports and plan "
            "previews one uid may have in progress at once", _HEAD, "N"),
    Setting("max_queued_per_user", _integer(1, 10_000_000), 5000, "jobs one user may have waiting "
            "(PENDING or PLANNED; every array task counts); a submit beyond it is refused (429)", _HEAD, "N"),
    Setting("max_submit_stored_mib", _number(0.01, 1e6), 16.0, "what one submit may store: its command, "
            "environment and paths, times its array tasks; more is refused (413)", _HEAD, "MIB"),
    Setting("max_stored_mib_per_user", _number(0.01, 1e9), 1024.0, "what one user's jobs may store "
            "(commands, environments, paths) until purged; a submit beyond it is refused (429)", _HEAD, "MIB"),
    Setting("job_retention", _duration, 30 * 86400.0, "finished jobs keep their command, environment and "
            "copied output this long, then are purged (their accounting records stay)", _HEAD, "DUR", _dur),
)
BY_KEY = {s.key: s for s in SETTINGS}
# Tables checked by their owners: name -> fn(table, whole config) returning error strings.
TABLES: dict[str, Callable[[Any, Mapping], list[str]]] = {}


def register_table(name: str, check: Callable[[Any, Mapping], list[str]]) -> None:
    """Let the owner of a nested config table (`[carbon]`, `[site]`) check it."""
    TABLES[name] = check


def env_help(text: str, var: str) -> str:
    """A flag's help text naming the environment variable that also sets it."""
    return f"{text} [env: {var}]"


def add_flags(parser: argparse.ArgumentParser, scope: str) -> None:
    """One flag per setting of `scope`, with its environment variable in the help."""
    for s in SETTINGS:
        if scope not in s.scopes:
            continue
        default = "" if s.default in (None, []) else f" (default {s.format(s.default)})"
        text = env_help(f"{s.help}{default}", s.env)
        if s.is_bool:
            parser.add_argument(s.flag, dest=dest(s.key), action=argparse.BooleanOptionalAction,
                                default=None, help=text)
        else:
            parser.add_argument(s.flag, dest=dest(s.key), metavar=s.metavar, default=None, help=text)


def dest(key: str) -> str:
    """The argparse attribute of a setting's flag (prefixed: `--socket` also exists globally)."""
    return "opt_" + key


@dataclass
class Resolved:
    """Effective settings of one scope: values by key and where each came from."""

    values: dict[str, Any]
    sources: dict[str, str]
    config_path: str | None

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


def resolve(scope: str, args: argparse.Namespace | None, config: Mapping[str, Any],
            environ: Mapping[str, str] | None = None, *, config_path: str | None = None) -> Resolved:
    """Every setting of `scope` from flag, env, config file or default; ConfigErrors lists all
    problems (unknown keys in the file included) with key and source."""
    environ = os.environ if environ is None else environ
    errors = check_file(config, config_path)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    where_file = f"config key `{{}}` in {config_path}" if config_path else "config key `{}`"
    for s in SETTINGS:
        if scope not in s.scopes:
            continue
        flag_value = getattr(args, dest(s.key), None) if args is not None else None
        if flag_value is not None:
            raw, source = flag_value, f"flag {s.flag}"
        elif environ.get(s.env):
            raw, source = environ[s.env], f"env {s.env}"
        elif s.key in config:
            raw, source = config[s.key], where_file.format(s.key)
        else:
            values[s.key], sources[s.key] = s.default, "default"
            continue
        try:
            values[s.key] = s.parse(raw)
        except ValueError as e:
            if not source.startswith("config key"):  # the file's own errors come from check_file
                errors.append(f"{source}: {e}")
            continue
        sources[s.key] = source
    errors.extend(_db_from_secret(values, sources, environ))
    if errors:
        raise ConfigErrors(errors)
    return Resolved(values, sources, config_path)


def _db_from_secret(values: dict[str, Any], sources: dict[str, str], environ: Mapping[str, str]) -> list[str]:
    """Without a `db` URL from a flag, the environment or the config: the URL from `db_file`,
    else from the systemd credential `db`. Problems are returned, naming the source."""
    if "db" not in values or values["db"] is not None:
        return []
    path = values.get("db_file")
    try:  # db_file was parsed already; it is read again for the URL, in case it changed since
        found = secret_db_url(path, environ)
    except ValueError as e:
        return [f"{sources['db_file']}: {e}" if path is not None else str(e)]
    if found is not None:
        values["db"], where = found
        sources["db"] = f"{where} ({sources['db_file']})" if path is not None else where
    return []


def secret_db_url(db_file: Path | str | None, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The database URL from the root-only file `db_file`, else from the systemd credential
    `db`, with where it came from; None without either. ValueError (never showing the URL)
    for a file or credential that is missing, unreadable, exposed or holds no URL."""
    from scheduler.credentials import credential_path, read_credential, read_secret

    if db_file is not None:
        return _db_url_of(read_secret(db_file), str(db_file)), f"file {db_file}"
    secret = read_credential("db", environ)
    if secret is None:
        return None
    return _db_url_of(secret, f"systemd credential `db` ({credential_path('db', environ)})"), "systemd credential `db`"


def check_file(config: Mapping[str, Any], config_path: str | None = None) -> list[str]:
    """Problems with a config file's contents alone: unknown keys, bad values, bad tables."""
    from scheduler.credentials import exposed_secrets

    errors: list[str] = exposed_secrets(config, config_path)
    prefix = f"{config_path}: " if config_path else ""
    if "db" in config and "db_file" in config:
        errors.append(f"{prefix}config keys `db` and `db_file` are both set: keep one (`db_file` for a URL "
                      "with a password)")
    known = set(BY_KEY) | set(TABLES)
    for key, value in config.items():
        if key in TABLES:
            errors.extend(f"{prefix}[{key}] {e}" for e in TABLES[key](value, config))
            continue
        s = BY_KEY.get(key)
        if s is None:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean `{close[0]}`?" if close else ""
            errors.append(f"{prefix}unknown config key `{key}`{hint}")
            continue
        try:
            s.parse(value)
        except ValueError as e:
            errors.append(f"{prefix}config key `{key}`: {e}")
    return errors
