"""`carbonsched` command line: parse arguments, call the daemon or the store, print.

Exit codes (for scripts): 0 ok · 1 error · 2 bad usage or request · 3 daemon unreachable ·
4 no such job · 5 not allowed (another user's job) · 6 conflict (e.g. job already ended).
Only the standard library is imported up front so user commands start fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from datetime import datetime, timezone
from pathlib import Path

from scheduler import cli_carbon

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOT_FOUND, EXIT_FORBIDDEN, EXIT_CONFLICT = range(7)


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


# -- configuration: flag > environment > config file > default ---------------------------

def _env_help(text: str, var: str) -> str:
    return f"{text} [env: {var}]"


def load_config(path: str | None) -> dict:
    path = path or os.environ.get("CARBONSCHED_CONFIG")
    if not path:
        default = Path("/etc/carbonsched/carbonsched.toml")
        if not default.exists():
            return {}
        path = str(default)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise CliError(f"config file {path} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise CliError(f"config file {path} is not valid TOML: {e}") from None
    return data.get("carbonsched", data)


def setting(args, config: dict, name: str, env: str | None, default=None):
    value = getattr(args, name, None)
    if value is not None:
        return value
    if env and os.environ.get(env):
        return os.environ[env]
    if name in config:
        return config[name]
    return default


# -- argument parsing --------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="carbonsched",
                                description="Energy- and carbon-aware batch scheduler for GPU clusters.")
    p.add_argument("--socket", help=_env_help("daemon API socket", "CARBONSCHED_SOCKET"))
    p.add_argument("--config", help=_env_help("TOML config file (default /etc/carbonsched/carbonsched.toml)",
                                              "CARBONSCHED_CONFIG"))
    sub = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    d = sub.add_parser("daemon", help="run the head-node daemon (API, planner, local agent)")
    d.add_argument("--db", help=_env_help("database URL (default SQLite under the state dir)", "CARBONSCHED_DB"))
    d.add_argument("--socket", dest="socket_sub", help=_env_help("API socket path", "CARBONSCHED_SOCKET"))
    d.add_argument("--state-dir", help=_env_help("state directory", "CARBONSCHED_STATE_DIR"))
    d.add_argument("--emulate", metavar="SPEC", help=_env_help("emulate a GPU fleet, e.g. 4xMI300X,2xH100",
                                                             "CARBONSCHED_EMULATE"))
    d.add_argument("--zone", help=_env_help("carbon zone of this node (default: local)", "CARBONSCHED_ZONE"))
    d.add_argument("--node", help=_env_help("name of the local node (default: host name)", "CARBONSCHED_NODE"))
    d.add_argument("--policy", help=_env_help("planning policy (default fifo)", "CARBONSCHED_POLICY"))
    d.add_argument("--plan-interval", metavar="DUR",
                   help=_env_help("planner period (default 15s; a submit also wakes it)", "CARBONSCHED_PLAN_INTERVAL"))
    d.add_argument("--dispatch-interval", metavar="DUR",
                   help=_env_help("agent period (default 1s)", "CARBONSCHED_DISPATCH_INTERVAL"))
    d.add_argument("--metrics-port", type=int, help=_env_help("serve Prometheus metrics on this port",
                                                              "CARBONSCHED_METRICS_PORT"))
    d.add_argument("--sample-hz", type=float, help=_env_help("GPU power sampling rate of the local agent "
                                                             "(default 1)", "CARBONSCHED_SAMPLE_HZ"))
    d.add_argument("--planner-process", action=argparse.BooleanOptionalAction, default=None,
                   help="plan in a child process so long ticks never stall the API (default: on)")
    d.add_argument("--local-agent", action=argparse.BooleanOptionalAction, default=None,
                   help="run an agent in the daemon (default: on for SQLite or with --emulate)")
    d.add_argument("--log-level", default=os.environ.get("CARBONSCHED_LOG_LEVEL", "INFO"),
                   help=_env_help("log level", "CARBONSCHED_LOG_LEVEL"))

    a = sub.add_parser("agent", help="run the node agent of a GPU node (multi-node clusters)")
    a.add_argument("--db", help=_env_help("database URL shared with the daemon", "CARBONSCHED_DB"))
    a.add_argument("--node", help=_env_help("node name (default: host name)", "CARBONSCHED_NODE"))
    a.add_argument("--zone", help=_env_help("carbon zone of this node", "CARBONSCHED_ZONE"))
    a.add_argument("--state-dir", help=_env_help("state directory", "CARBONSCHED_STATE_DIR"))
    a.add_argument("--emulate", metavar="SPEC", help=_env_help("emulate a GPU fleet, e.g. 8xMI300X",
                                                             "CARBONSCHED_EMULATE"))
    a.add_argument("--sample-hz", type=float, help=_env_help("GPU power sampling rate (default 1)",
                                                             "CARBONSCHED_SAMPLE_HZ"))
    a.add_argument("--dispatch-interval", metavar="DUR",
                   help=_env_help("how often to look for due jobs (default 1s)", "CARBONSCHED_DISPATCH_INTERVAL"))
    a.add_argument("--metrics-port", type=int, help=_env_help("serve Prometheus metrics on this port",
                                                              "CARBONSCHED_METRICS_PORT"))
    a.add_argument("--log-level", default=os.environ.get("CARBONSCHED_LOG_LEVEL", "INFO"),
                   help=_env_help("log level", "CARBONSCHED_LOG_LEVEL"))

    s = sub.add_parser("submit", help="queue a job: carbonsched submit [options] -- CMD [ARG...]")
    s.add_argument("--gpus", type=int, default=1, help="GPUs on one node (default 1)")
    s.add_argument("--gpu-mem", metavar="GIB", type=float, default=0.0, help="GPU memory needed per GPU, GiB")
    s.add_argument("--deadline", metavar="DUR|ISO", help="finish by: a duration from now (6h) or an ISO time")
    s.add_argument("--latency-slo", metavar="MS", type=float, help="per-request latency objective, ms")
    s.add_argument("--workload", metavar="CLASS", help="workload class, e.g. llm-inference, finetune")
    s.add_argument("--prompts", type=int, help="number of prompts the job serves (for gCO2/prompt)")
    s.add_argument("--est-runtime", metavar="DUR", help="expected runtime, e.g. 90m")
    s.add_argument("--time-limit", metavar="DUR", help="hard limit (default: est-runtime x 2)")
    s.add_argument("--retries", type=int, default=0, help="re-queue up to N times if the job is lost")
    s.add_argument("--name", help="job name (default: the program name)")
    s.add_argument("--env", action="append", default=[], metavar="VAR[=VALUE]",
                   help="pass an environment variable (repeatable); PATH and LANG always pass")
    s.add_argument("--json", action="store_true")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")

    q = sub.add_parser("queue", help="list jobs (active ones unless --all)")
    q.add_argument("--all", action="store_true", help="include finished jobs")
    q.add_argument("--state", action="append", help="only these states (repeatable)")
    q.add_argument("--json", action="store_true")

    sh = sub.add_parser("show", help="one job in detail, with its history")
    sh.add_argument("job", type=int)
    sh.add_argument("--json", action="store_true")

    c = sub.add_parser("cancel", help="cancel jobs (running ones get SIGTERM, then SIGKILL)")
    c.add_argument("jobs", type=int, nargs="+")
    c.add_argument("--json", action="store_true")

    lg = sub.add_parser("logs", help="print a job's output")
    lg.add_argument("job", type=int)
    lg.add_argument("--stderr", action="store_true", help="print stderr instead of stdout")
    lg.add_argument("--tail-bytes", type=int, help="only the last N bytes")

    n = sub.add_parser("nodes", help="nodes and their GPUs")
    n.add_argument("--json", action="store_true")

    pl = sub.add_parser("plan", help="what the policy would do now")
    pl.add_argument("--json", action="store_true")

    db = sub.add_parser("db", help="database schema: upgrade or check")
    db.add_argument("action", choices=["upgrade", "check"])
    db.add_argument("--db", help=_env_help("database URL", "CARBONSCHED_DB"))
    db.add_argument("--state-dir", help=_env_help("state directory (for the default SQLite URL)",
                                                  "CARBONSCHED_STATE_DIR"))
    cli_carbon.add_parser(sub)
    return p


# -- verbs -------------------------------------------------------------------------------

def _client(args, config):
    from scheduler.client import Client, default_socket_path

    path = setting(args, config, "socket", "CARBONSCHED_SOCKET") or default_socket_path()
    return Client(path)


def _state_dir(args, config) -> Path:
    from scheduler.client import default_state_dir

    value = setting(args, config, "state_dir", "CARBONSCHED_STATE_DIR")
    return Path(value) if value else default_state_dir()


def _db_url(args, config) -> str:
    from scheduler.store.engine import default_db_url

    return setting(args, config, "db", "CARBONSCHED_DB") or default_db_url(_state_dir(args, config))


def _setup_logging(level: str) -> None:
    import logging

    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


def _number_setting(args, config, name: str, env: str, default: float) -> float:
    value = setting(args, config, name, env, default)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise CliError(f"{name.replace('_', '-')} must be a number (got {value!r})", EXIT_USAGE) from None


def _port_setting(args, config) -> int | None:
    value = setting(args, config, "metrics_port", "CARBONSCHED_METRICS_PORT")
    if value is None:
        return None
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise CliError(f"metrics port must be a number (got {value!r})", EXIT_USAGE) from None
    if not 0 <= port <= 65535:
        raise CliError(f"metrics port {port} is out of range", EXIT_USAGE)
    return port


def cmd_agent(args, config) -> int:
    from scheduler.agent import default_node_name
    from scheduler.daemon import AgentRunConfig, AgentRunner, DaemonError
    from scheduler.timeparse import parse_duration

    _setup_logging(args.log_level)
    db = setting(args, config, "db", "CARBONSCHED_DB")
    if not db:
        raise CliError("the agent needs the cluster database: --db postgresql+psycopg://... "
                       "(or CARBONSCHED_DB)", EXIT_USAGE)
    try:
        cfg = AgentRunConfig(
            db_url=db, state_dir=_state_dir(args, config),
            node=setting(args, config, "node", "CARBONSCHED_NODE") or default_node_name(),
            zone=setting(args, config, "zone", "CARBONSCHED_ZONE", "local"),
            emulate=setting(args, config, "emulate", "CARBONSCHED_EMULATE"),
            sample_hz=_number_setting(args, config, "sample_hz", "CARBONSCHED_SAMPLE_HZ", 1.0),
            dispatch_interval_s=parse_duration(
                setting(args, config, "dispatch_interval", "CARBONSCHED_DISPATCH_INTERVAL", "1s")),
            metrics_port=_port_setting(args, config),
            grace_s=parse_duration(str(config.get("grace", "10s"))),
            node_static_w=float(config.get("node_static_w", 0.0)),
        )
        AgentRunner(cfg).run()
    except (DaemonError, ValueError) as e:
        raise CliError(str(e)) from None
    return EXIT_OK


def cmd_daemon(args, config) -> int:
    from scheduler.daemon import Daemon, DaemonConfig, DaemonError
    from scheduler.timeparse import parse_duration

    _setup_logging(args.log_level)
    state_dir = _state_dir(args, config)
    if args.socket_sub:
        args.socket = args.socket_sub
    sock = setting(args, config, "socket", "CARBONSCHED_SOCKET")
    if not sock:
        sock = "/run/carbonsched/carbonsched.sock" if os.geteuid() == 0 else str(state_dir / "carbonsched.sock")
    try:
        cfg = DaemonConfig(
            db_url=_db_url(args, config),
            socket_path=Path(sock),
            state_dir=state_dir,
            emulate=setting(args, config, "emulate", "CARBONSCHED_EMULATE"),
            zone=setting(args, config, "zone", "CARBONSCHED_ZONE", "local"),
            policy=setting(args, config, "policy", "CARBONSCHED_POLICY", "fifo"),
            plan_interval_s=parse_duration(setting(args, config, "plan_interval", "CARBONSCHED_PLAN_INTERVAL", "15s")),
            dispatch_interval_s=parse_duration(
                setting(args, config, "dispatch_interval", "CARBONSCHED_DISPATCH_INTERVAL", "1s")),
            admin_groups=list(config.get("admin_groups", [])),
            time_limit_factor=float(config.get("time_limit_factor", 2.0)),
            grace_s=parse_duration(str(config.get("grace", "10s"))),
            local_agent=args.local_agent,
            sample_hz=_number_setting(args, config, "sample_hz", "CARBONSCHED_SAMPLE_HZ", 1.0),
            metrics_port=_port_setting(args, config),
            node_lost_after_s=parse_duration(str(config.get("node_lost_after", "5m"))),
            sample_retention_s=parse_duration(str(config.get("sample_retention", "1h"))),
            node_static_w=float(config.get("node_static_w", 0.0)),
            carbon=dict(config.get("carbon", {})),
            planner_process=bool(args.planner_process if args.planner_process is not None
                                 else config.get("planner_process", True)),
        )
        node = setting(args, config, "node", "CARBONSCHED_NODE")
        if node:
            cfg.node = node
        if cfg.plan_interval_s <= 0 or cfg.dispatch_interval_s <= 0:
            raise ValueError("intervals must be positive")
        Daemon(cfg).run()
    except (DaemonError, ValueError) as e:
        raise CliError(str(e)) from None
    return EXIT_OK


def cmd_submit(args, config) -> int:
    from scheduler.timeparse import iso, parse_duration, parse_time

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CliError("empty command: give it after --, e.g. carbonsched submit --gpus 1 -- python run.py",
                       EXIT_USAGE)
    body: dict = {"argv": command, "gpus": args.gpus, "gpu_mem_gib": args.gpu_mem,
                  "cwd": os.getcwd(), "max_retries": args.retries}
    try:
        if args.est_runtime:
            body["est_runtime_s"] = parse_duration(args.est_runtime)
        if args.time_limit:
            body["time_limit_s"] = parse_duration(args.time_limit)
        if args.deadline:
            body["deadline"] = iso(parse_time(args.deadline, datetime.now(timezone.utc)))
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    for key, value in (("latency_slo_ms", args.latency_slo), ("workload", args.workload),
                       ("prompts", args.prompts), ("name", args.name)):
        if value is not None:
            body[key] = value
    env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in os.environ}
    for item in args.env:
        key, eq, value = item.partition("=")
        if eq:
            env[key] = value
        elif key in os.environ:
            env[key] = os.environ[key]
        else:
            raise CliError(f"--env {key}: not set in your environment; use --env {key}=VALUE", EXIT_USAGE)
    body["env"] = env
    result = _client(args, config).submit(**body)
    if args.json:
        _print_json({"id": result["id"]})
    else:
        print(f"submitted job {result['id']}")
    return EXIT_OK


def cmd_queue(args, config) -> int:
    states = [s.upper() for v in (args.state or []) for s in v.split(",")]
    client = _client(args, config)
    if args.json:  # the daemon's JSON as is: no decode and re-encode of thousands of jobs
        sys.stdout.buffer.write(client.jobs_raw(include_done=args.all, states=states or None) + b"\n")
        return EXIT_OK
    jobs = client.jobs(include_done=args.all, states=states or None)
    from scheduler import output

    print(output.jobs_table(jobs))
    return EXIT_OK


def cmd_show(args, config) -> int:
    job = _client(args, config).job(args.job)
    if args.json:
        _print_json(job)
    else:
        from scheduler import output

        print(output.job_detail(job))
    return EXIT_OK


def cmd_cancel(args, config) -> int:
    results = _client(args, config).cancel(args.jobs)
    if args.json:
        _print_json(results)
    else:
        for r in results:
            verb = {"CANCELLED": "cancelled", "CANCELLING": "cancelling (stopping the process)"}
            print(f"job {r['id']}: {verb.get(r['state'], r['state'])}")
    return EXIT_OK


def cmd_logs(args, config) -> int:
    r = _client(args, config).logs(args.job, "stderr" if args.stderr else "stdout", args.tail_bytes)
    sys.stdout.write(r["text"])
    sys.stdout.flush()
    return EXIT_OK


def cmd_nodes(args, config) -> int:
    nodes = _client(args, config).nodes()
    if args.json:
        _print_json(nodes)
    else:
        from scheduler import output

        print(output.nodes_table(nodes))
    return EXIT_OK


def cmd_plan(args, config) -> int:
    plan = _client(args, config).plan()
    if args.json:
        _print_json(plan)
    else:
        from scheduler import output

        print(output.plan_table(plan))
    return EXIT_OK


def cmd_db(args, config) -> int:
    import logging

    logging.basicConfig(level="WARNING", format="%(levelname)s %(name)s: %(message)s")
    from scheduler.store import Store

    store = Store(_db_url(args, config))
    try:
        if args.action == "upgrade":
            before = store.schema_revision()
            store.upgrade()
            after = store.schema_revision()
            print(f"database {store.url}: {before or 'empty'} -> {after}" if before != after
                  else f"database {store.url} is already at {after}")
            return EXIT_OK
        problems = store.check()
        if problems:
            for p in problems:
                print(f"schema check failed: {p}", file=sys.stderr)
            print(f"fix: carbonsched db upgrade --db {store.url}", file=sys.stderr)
            return EXIT_ERROR
        print(f"database {store.url} is at {store.schema_revision()} and matches the models")
        return EXIT_OK
    finally:
        store.dispose()


VERBS = {"daemon": cmd_daemon, "agent": cmd_agent, "submit": cmd_submit, "queue": cmd_queue, "show": cmd_show,
         "cancel": cmd_cancel, "logs": cmd_logs, "nodes": cmd_nodes, "plan": cmd_plan, "db": cmd_db}


def _print_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=None if isinstance(data, list) and len(data) > 50 else 2))
    sys.stdout.write("\n")


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    from scheduler.client import ApiError, DaemonUnreachable

    try:
        config = load_config(args.config)
        code = VERBS[args.verb](args, config)
    except CliError as e:
        print(f"carbonsched: {e}", file=sys.stderr)
        code = e.code
    except DaemonUnreachable as e:
        print(f"carbonsched: {e}", file=sys.stderr)
        code = EXIT_UNREACHABLE
    except ApiError as e:
        print(f"carbonsched: {e.message}", file=sys.stderr)
        code = {400: EXIT_USAGE, 403: EXIT_FORBIDDEN, 404: EXIT_NOT_FOUND, 409: EXIT_CONFLICT,
                411: EXIT_USAGE, 413: EXIT_USAGE, 422: EXIT_USAGE,
                503: EXIT_UNREACHABLE}.get(e.status, EXIT_ERROR)
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        code = EXIT_OK
    except Exception as e:  # the last line of defence: one clear line, never a traceback
        if os.environ.get("CARBONSCHED_DEBUG"):
            raise
        print(f"carbonsched: unexpected error: {type(e).__name__}: {e} "
              "(set CARBONSCHED_DEBUG=1 for a traceback)", file=sys.stderr)
        code = EXIT_ERROR
    sys.exit(code)
