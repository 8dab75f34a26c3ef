"""`carbonsched` command line: the parser, the built-in verbs (daemon, agent, submit, queue,
show, cancel, logs, nodes, plan, db, config, drain, resume) and the dispatch to every verb
registered in `scheduler.cli.common.VERBS` (also `carbon`, `report`, `export`, `simulate`,
`profiles`, `account`, `user`).

Exit codes (for scripts): 0 ok · 1 error · 2 bad usage or request · 3 daemon unreachable ·
4 no such job · 5 not allowed (another user's job) · 6 conflict (e.g. job already ended).
Only the standard library is imported up front so user commands start fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from scheduler import settings
from scheduler.cli import accounts, carbon, profiles, report, simulate, standing
from scheduler.cli.common import (JSON_HELP, EXIT_CONFLICT, EXIT_ERROR, EXIT_FORBIDDEN, EXIT_NOT_FOUND, EXIT_OK,
                                  EXIT_UNREACHABLE, EXIT_USAGE, VERBS, CliError, UnreadableConfig, api_client,
                                  config_path, db_url, load_config, register, require_config)
from scheduler.settings import env_help

# -- argument parsing --------------------------------------------------------------------

class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr, exit 2 (the README's
    promise): `carbonsched: submit: argument --gpus: invalid int value: 'abc' (carbonsched
    submit --help)`, instead of argparse's usage block."""

    def error(self, message: str):  # type: ignore[override]
        words = self.prog.split()[1:]  # "carbonsched submit" -> ["submit"]
        where = f"{' '.join(words)}: " if words else ""
        hint = f"{self.prog} --help" if words else "usage: carbonsched [--socket PATH] [--config FILE] VERB ...; " \
                                                   "carbonsched --help lists the verbs"
        print(f"carbonsched: {where}{message} ({hint})", file=sys.stderr)
        sys.exit(EXIT_USAGE)


GLOBAL_OPTIONS = ("--socket", "--config")


def _global_options_after_verbs(parser: argparse.ArgumentParser) -> None:
    """Let the global --socket and --config follow any verb too (`carbonsched queue --socket
    X`, `config check --config X`): each sub-parser that has no option of that name gets one
    whose default is SUPPRESS, so given after the verb it sets the same attribute and left
    out it does not reset the value given before the verb."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for sub in set(action.choices.values()):
            have = {o for a in sub._actions for o in a.option_strings}
            if "--socket" not in have:
                sub.add_argument("--socket", default=argparse.SUPPRESS,
                                 help=env_help("daemon API socket (also before the verb)", "CARBONSCHED_SOCKET"))
            if "--config" not in have:
                sub.add_argument("--config", default=argparse.SUPPRESS,
                                 help=env_help("TOML config file (also before the verb)", "CARBONSCHED_CONFIG"))
            _global_options_after_verbs(sub)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("carbonsched")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _latency_ms(text: str) -> float:
    """argparse type of a latency limit: a duration (2s, 40ms) or a bare number of ms."""
    try:
        value = _milliseconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive duration (got {text!r})")
    return value


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number (got {text!r})") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more (got {text!r})")
    return n


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and below 1 (got {text}); a whole GPU is --gpus 1")
    return value


def _gpu_mem(text: str) -> float:
    from scheduler.job_specs import parse_gpu_mem_gib

    try:
        return parse_gpu_mem_gib(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="carbonsched",
                      description="Energy- and carbon-aware batch scheduler for GPU clusters.")
    p.add_argument("--version", action="version", version=f"carbonsched {_version()}")
    p.add_argument("--socket", help=env_help("daemon API socket", "CARBONSCHED_SOCKET"))
    p.add_argument("--config", help=env_help("TOML config file (default /etc/carbonsched/config.toml)",
                                              "CARBONSCHED_CONFIG"))
    sub = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    d = sub.add_parser("daemon", help="run the head-node daemon (API, planner, local agent)")
    settings.add_flags(d, settings.DAEMON)

    a = sub.add_parser("agent", help="run the node agent of a GPU node (multi-node clusters)")
    settings.add_flags(a, settings.AGENT)

    for verb, what in (("drain", "close GPUs to new jobs (running jobs finish); root/admins"),
                       ("resume", "open drained GPUs to new jobs again; root/admins")):
        dr = sub.add_parser(verb, help=what)
        dr.add_argument("target", help="a node name (all its GPUs), NODE:VENDOR:INDEX as `nodes` prints a GPU "
                                       "(e.g. vm:amd:1), NODE:INDEX where the node has one vendor, or a GPU UUID")
        if verb == "drain":
            dr.add_argument("--reason", help="why (logged with your uid)")
        dr.add_argument("--json", action="store_true", help=JSON_HELP)

    cf = sub.add_parser("config", help="check the configuration offline (as the daemon does at start)")
    cf_sub = cf.add_subparsers(dest="config_cmd", metavar="CMD", required=True)
    cfc = cf_sub.add_parser("check", help="report every problem in the config file and environment, "
                                         "with its key")
    cfc.add_argument("--for", dest="scope", choices=[settings.DAEMON, settings.AGENT, "both"], default="both",
                     help="check the settings of the daemon, the agent or both (default both)")
    cfs = cf_sub.add_parser("show", help="the effective settings and where each comes from")
    cfs.add_argument("--for", dest="scope", choices=[settings.DAEMON, settings.AGENT], default=settings.DAEMON)
    cfs.add_argument("--json", action="store_true", help=JSON_HELP)

    s = sub.add_parser("submit", help="queue a job: carbonsched submit [options] -- CMD [ARG...]")
    s.add_argument("--gpus", type=_positive_int, default=1, help="GPUs on one node (default 1)")
    s.add_argument("--gpu-mem", metavar="SIZE", type=_gpu_mem, default=0.0, help="GPU memory needed per GPU: GiB, "
                   "or with a unit as Slurm's --mem (80, 80G, 80GB, 40960M), matched against each GPU's "
                   "nominal capacity (the data sheet's: 80 fits an H100 80GB, whose driver "
                   "reports 79.6 GiB)")
    s.add_argument("--gpu-fraction", metavar="F", type=_fraction, help="a slice of one GPU instead of whole GPUs: "
                   "at least this share of a GPU (0 < F < 1), from a MIG instance, an AMD compute partition "
                   "or a share the operator declared; refused when no GPU of the fleet offers one")
    s.add_argument("--mig", metavar="PROFILE", help="a slice of one GPU instead of whole GPUs: an NVIDIA MIG "
                   "instance of this profile (e.g. 1g.10gb); refused when no GPU of the fleet has one")
    s.add_argument("--deadline", metavar="DUR|ISO", help="finish by: a duration from now (6h) or an ISO time")
    s.add_argument("--latency-slo", metavar="DUR", type=_latency_ms,
                   help="p95 per-prompt latency limit, e.g. 2s (a bare number: ms): time to first token plus "
                        "the decode time of a p95-long output")
    s.add_argument("--ttft-slo", metavar="DUR", help="p95 time-to-first-token limit, e.g. 2s (a bare number: ms)")
    s.add_argument("--tpot-slo", metavar="DUR", help="p95 time-per-output-token limit, e.g. 40ms (a bare number: "
                                                     "ms); a preset's default applies where none is given")
    s.add_argument("--workload", metavar="CLASS",
                   help="workload: a preset (llm-inference, llm-chat-8b, llm-chat-70b, llm-code, llm-reason, eval, "
                        "mlperf-llama2-70b; finetune, train: no latency model) or a model by size, "
                        "llm:70b, llm:70b,fp8, llm:params=47,active=13,in=2048,out=512,precision=fp8; a class "
                        "of your own without a model: custom:NAME (other names are refused, with suggestions)")
    s.add_argument("--prompts", type=int, help="number of prompts the job serves (for gCO2/prompt; "
                                               "the job may report the real count, see docs/using/reporting.md)")
    s.add_argument("--tokens", type=int, help="output tokens the job generates (for gCO2 per 1k tokens)")
    s.add_argument("--est-runtime", metavar="DUR", help="expected runtime, e.g. 90m")
    s.add_argument("--max-delay", metavar="DUR", help="start within this long of submission, e.g. 4h "
                                                      "(default: any time that meets the deadline)")
    s.add_argument("--time-limit", metavar="DUR",
                   help="hard limit: the job is stopped (TIMEOUT) when it runs longer, and no GPU on which it "
                        "is estimated to run longer is chosen. Default, with --est-runtime: the daemon's "
                        "time_limit_factor (2) x the estimated runtime on the planned GPUs, and never less than "
                        "time_limit_factor x --est-runtime (longer on a slower GPU, never shorter on a faster one); "
                        "with neither, the QOS's default, else the daemon's default_time_limit (24h)")
    accounts.add_submit_options(s)
    s.add_argument("--retries", type=int, default=0, help="re-queue up to N times if the job is lost")
    s.add_argument("--name", help="job name (default: the program name)")
    s.add_argument("--env", action="append", default=[], metavar="VAR[=VALUE]",
                   help="pass an environment variable (repeatable); PATH and LANG always pass")
    s.add_argument("--hold", action="store_true", help="queue it held: not planned until `carbonsched release`")
    s.add_argument("--begin", metavar="DUR|ISO", help="not planned before this time: a duration from now (2h) or "
                                                      "an ISO time (local if no zone)")
    s.add_argument("--dependency", "-d", metavar="TYPE:JOB[:JOB...][,...]",
                   help="wait for other jobs: afterok (they COMPLETED), afterany (they ended), afternotok "
                        "(they ended otherwise), e.g. afterok:12:13,afterany:14")
    s.add_argument("--array", "-a", metavar="SPEC",
                   help="a job array: one job per index, e.g. 0-99, 1,3,5, 0-20:5; %%N runs at most N at once "
                        "(0-99%%8). Each task gets CARBONSCHED_ARRAY_TASK_ID; all share one --deadline")
    s.add_argument("--output", "-o", metavar="PATH",
                   help="write the job's stdout here instead of carbonsched's log (%%j job id, %%A array id, "
                        "%%a array index, %%u user); written by the job as you, on its node")
    s.add_argument("--error", "-e", metavar="PATH", help="the same for stderr (default: with --output, the same "
                                                         "file as stdout)")
    s.add_argument("--chdir", "-D", metavar="DIR", help="the job's working directory (default: the current one)")
    s.add_argument("--interruptible", choices=("checkpoint", "pause"),
                   help="the job may run in segments that follow the green hours: checkpoint (it saves its state "
                        "when told, by --checkpoint-signal and $CARBONSCHED_CHECKPOINT_FILE, and exits 75 to be "
                        "resumed later, maybe on other GPUs) or pause (stopped and continued in place; its GPUs "
                        "stay held and their idle power is counted)")
    s.add_argument("--checkpoint-signal", metavar="SIG", help="the signal that asks a checkpoint job to save its "
                                                               "state and exit 75 (default SIGUSR1)")
    s.add_argument("--checkpoint-grace", metavar="DUR", help="how long a checkpoint job has to exit after being "
                                                              "asked before it is killed (default 60s)")
    s.add_argument("--min-run", metavar="DUR", help="the shortest useful segment of an interruptible job, e.g. 30m")
    s.add_argument("--resume-cost", metavar="DUR", help="the time each resume loses (reload, warm-up), e.g. 1m")
    s.add_argument("--max-segments", type=int, metavar="N", help="cut an interruptible job into at most N "
                                                                  "segments (default 4)")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")

    q = sub.add_parser("queue", help="list jobs (active ones unless --all)")
    q.add_argument("--all", action="store_true", help="include finished jobs")
    q.add_argument("--state", action="append", help="only these states (repeatable)")
    q.add_argument("--user", "-u", action="append", metavar="USER[,USER]",
                   help="only jobs of these users (names or uids; others' jobs only for root/admins)")
    q.add_argument("--name", "-n", action="append", metavar="NAME", help="only jobs of this name (* and ? match "
                                                                          "any text / one character; repeatable)")
    q.add_argument("--since", "-S", metavar="DUR|ISO", help="only jobs submitted since: ISO time or a duration "
                                                            "back (7d); finished ones included")
    q.add_argument("--until", "-E", metavar="DUR|ISO", help="only jobs submitted before this")
    q.add_argument("--array", type=int, metavar="JOB", help="only the tasks of this job array")
    q.add_argument("--format", "-o", dest="fields", metavar="FIELD,...",
                   help="the columns to print, any key of `queue --json` (e.g. id,name,state,held,dependency,"
                        "array_task_id); FIELD:WIDTH truncates")
    q.add_argument("--noheader", action="store_true", help="with --format: no header line (for scripts)")
    q.add_argument("--json", action="store_true", help=JSON_HELP)

    for verb, what in (("hold", "keep pending jobs from being planned (a planned one goes back to pending)"),
                       ("release", "let held jobs be planned again")):
        hr = sub.add_parser(verb, help=what)
        hr.add_argument("jobs", type=int, nargs="+")
        hr.add_argument("--json", action="store_true", help=JSON_HELP)

    sh = sub.add_parser("show", help="one job in detail, with its history")
    sh.add_argument("job", type=int)
    sh.add_argument("--json", action="store_true", help=JSON_HELP)

    c = sub.add_parser("cancel", help="cancel jobs (running ones get SIGTERM, then SIGKILL)")
    c.add_argument("jobs", type=int, nargs="+")
    c.add_argument("--json", action="store_true", help=JSON_HELP)

    lg = sub.add_parser("logs", help="print a job's output")
    lg.add_argument("job", type=int)
    lg.add_argument("--stderr", action="store_true", help="print stderr instead of stdout")
    lg.add_argument("--tail-bytes", type=int, help="only the last N bytes")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing new output until the job ends")

    n = sub.add_parser("nodes", help="nodes and their GPUs")
    n.add_argument("--json", action="store_true", help=JSON_HELP)

    pl = sub.add_parser("plan", help="what the policy would do now")
    pl.add_argument("--json", action="store_true", help=JSON_HELP)

    db = sub.add_parser("db", help="database schema: upgrade or check")
    db.add_argument("action", choices=["upgrade", "check"])
    db.add_argument("--db", help=env_help("database URL", "CARBONSCHED_DB"))
    db.add_argument("--state-dir", help=env_help("state directory (for the default SQLite URL)",
                                                  "CARBONSCHED_STATE_DIR"))
    carbon.add_parser(sub)
    simulate.add_parser(sub)
    report.add_parser(sub)
    profiles.add_parser(sub)
    accounts.add_parser(sub)
    standing.add_parser(sub)
    _global_options_after_verbs(p)
    return p


# -- verbs -------------------------------------------------------------------------------

def _setup_logging(level: str) -> None:
    import logging

    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


def _cap_bounds(whole):
    from policies.pricing.power_cap import CapBounds

    return CapBounds.from_config(whole)


def _register_config_tables() -> None:
    """Nested config tables are checked by the code that owns them."""
    from scheduler.accounting.config import AccountingConfig
    from scheduler.carbon_config import CarbonConfig
    from scheduler.qos import check_qos_config
    from scheduler.site import SiteConfig
    from scheduler.standing import check_standing_config
    from scheduler.slurm.config import SlurmConfig

    def owner_check(build):
        def check(table, whole) -> list[str]:
            try:
                build(whole)
            except (ValueError, TypeError) as e:
                return [str(e)]
            return []
        return check

    site = owner_check(SiteConfig.from_config)
    site_tables = ("site", "zones", "sites", "nodes")  # checked together, reported by the first present
    for name in site_tables:
        settings.register_table(name, lambda table, whole, name=name: site(table, whole) if name == next(
            t for t in site_tables if t in whole) else [])
    settings.register_table("carbon", owner_check(lambda whole: CarbonConfig.from_config(
        {"carbon": whole.get("carbon", {})})))
    settings.register_table("accounting", owner_check(AccountingConfig.from_config))
    settings.register_table("power", owner_check(_cap_bounds))
    settings.register_table("slurm", owner_check(SlurmConfig.from_config))
    settings.register_table("qos", check_qos_config)
    for name in ("priority", "fair_share"):  # each table's own mistakes, reported once
        settings.register_table(name, lambda table, whole, name=name: check_standing_config(name, table))


def resolve_settings(args, config, scope: str) -> settings.Resolved:
    """Effective settings of `scope`; every problem in one CliError, one line each."""
    require_config(config)
    _register_config_tables()
    if scope == settings.DAEMON and getattr(args, settings.dest("socket"), None) is None and args.socket:
        setattr(args, settings.dest("socket"), args.socket)  # the global --socket counts too
    try:
        return settings.resolve(scope, args, config, config_path=config_path(args.config))
    except settings.ConfigErrors as e:
        if len(e.errors) == 1:
            raise CliError(e.errors[0], EXIT_USAGE) from None
        raise CliError(f"{len(e.errors)} configuration problems:\n  " + "\n  ".join(e.errors),
                       EXIT_USAGE) from None


def cmd_agent(args, config) -> int:
    from scheduler.cli.client import default_state_dir
    from scheduler.node.agent import default_node_name
    from scheduler.node.main import AgentRunConfig, AgentRunner
    from scheduler.process import DaemonError
    from scheduler.slurm.config import SlurmConfig

    r = resolve_settings(args, config, settings.AGENT)
    _setup_logging(r["log_level"])
    if not r["db"]:
        raise CliError("the agent needs the cluster database: --db postgresql+psycopg://... "
                       "(or CARBONSCHED_DB, `db_file` in the config naming a root-only file with the URL, "
                       "or the systemd credential `db`)", EXIT_USAGE)
    try:
        cfg = AgentRunConfig(
            db_url=r["db"], state_dir=r["state_dir"] or default_state_dir(),
            node=r["node"] or default_node_name(), zone=r["zone"], emulate=r["emulate"], truth=r["truth"],
            sample_hz=r["sample_hz"], dispatch_interval_s=r["dispatch_interval"],
            metrics_port=r["metrics_port"], metrics_addr=r["metrics_addr"], grace_s=r["grace"], node_static_w=r["node_static_w"],
            min_free_disk_mib=r["min_free_disk_mib"], gpu_shares=r["gpu_shares"],
            log_dir=r["log_dir"], output_limit_bytes=int(r["job_output_limit_mib"] * 2**20),
            executor=r["executor"],
            slurm=SlurmConfig.from_config(config) if r["executor"] == "slurm" else None,
        )
        AgentRunner(cfg).run()
    except (DaemonError, ValueError) as e:
        raise CliError(str(e)) from None
    return EXIT_OK


def cmd_daemon(args, config) -> int:
    from scheduler.accounting.config import AccountingConfig
    from scheduler.cli.client import default_state_dir
    from scheduler.daemon.api import UidLimits
    from scheduler.daemon.main import Daemon, DaemonConfig
    from scheduler.daemon.policy_factory import check_policy
    from scheduler.process import DaemonError
    from scheduler.qos import qos_table
    from scheduler.site import SiteConfig
    from scheduler.slurm.config import SlurmConfig
    from scheduler.standing import standing_settings
    from scheduler.store.engine import default_db_url

    r = resolve_settings(args, config, settings.DAEMON)
    _setup_logging(r["log_level"])
    state_dir = r["state_dir"] or default_state_dir()
    sock = r["socket"]
    if not sock:
        sock = "/run/carbonsched/carbonsched.sock" if os.geteuid() == 0 else str(state_dir / "carbonsched.sock")
    try:
        cfg = DaemonConfig(
            db_url=r["db"] or default_db_url(state_dir),
            socket_path=Path(sock),
            state_dir=state_dir,
            emulate=r["emulate"],
            truth=r["truth"],
            zone=r["zone"],
            policy=r["policy"],
            plan_interval_s=r["plan_interval"],
            full_replan_s=r["full_replan"],
            dispatch_interval_s=r["dispatch_interval"],
            admin_groups=r["admin_groups"],
            time_limit_factor=r["time_limit_factor"],
            default_time_limit_s=r["default_time_limit"], qos=qos_table(config),
            standing=standing_settings(config),
            grace_s=r["grace"],
            local_agent=r["local_agent"],
            sample_hz=r["sample_hz"],
            metrics_port=r["metrics_port"],
            metrics_addr=r["metrics_addr"],
            node_lost_after_s=r["node_lost_after"],
            sample_retention_s=r["sample_retention"],
            node_static_w=r["node_static_w"],
            min_free_disk_mib=r["min_free_disk_mib"], gpu_shares=r["gpu_shares"],
            log_dir=r["log_dir"], output_limit_bytes=int(r["job_output_limit_mib"] * 2**20),
            api_limits=UidLimits(rate_per_s=r["api_rate_per_uid"], burst=r["api_burst_per_uid"],
                                 max_inflight=r["api_max_inflight_per_uid"],
                                 max_connections=r["api_max_connections_per_uid"],
                                 max_expensive_inflight=r["api_max_expensive_per_uid"],
                                 max_active=r["api_max_active_per_uid"]),
            max_queued_per_user=r["max_queued_per_user"],
            max_submit_stored_bytes=int(r["max_submit_stored_mib"] * 2**20),
            max_stored_bytes_per_user=int(r["max_stored_mib_per_user"] * 2**20),
            job_retention_s=r["job_retention"],
            carbon=dict(config.get("carbon", {})),
            site=SiteConfig.from_config(config),
            accounting=AccountingConfig.from_config(config),
            planner_process=r["planner_process"],
            executor=r["executor"],
            slurm=SlurmConfig.from_config(config) if r["executor"] == "slurm" else None,
        )
        if r["node"]:
            cfg.node = r["node"]
        try:  # a policy the daemon cannot run is refused before anything starts
            check_policy(cfg.policy)
        except ValueError as e:
            raise CliError(f"--policy: {e}", EXIT_USAGE) from None
        Daemon(cfg).run()
    except (DaemonError, ValueError) as e:
        raise CliError(str(e)) from None
    return EXIT_OK


def cmd_drain(args, config) -> int:
    body = {"target": args.target}
    if getattr(args, "reason", None):
        body["reason"] = args.reason
    result = api_client(args, config).request("POST", f"/{args.verb}", body)
    if args.json:
        _print_json(result)
    else:
        gpus = ", ".join(g.get("name", f"{g['node']}:{g['index']}") + (f" (job {g['running_job']} finishes first)"
                                                         if g["running_job"] and result["drained"] else "")
                         for g in result["gpus"])
        print(f"{'drained' if result['drained'] else 'resumed'} {len(result['gpus'])} GPU(s): {gpus}")
    return EXIT_OK


def cmd_config(args, config) -> int:
    require_config(config)
    path = config_path(args.config)
    if args.config_cmd == "show":
        r = resolve_settings(args, config, args.scope)
        _fill_derived_paths(r, args.scope)
        rows = [{"key": k, "value": settings.BY_KEY[k].format(v) if not args.json else
                 (str(v) if isinstance(v, Path) else settings.BY_KEY[k].shown(v)), "source": r.sources[k]}
                for k, v in r.values.items()]
        if args.json:
            _print_json({"config_file": path, "settings": rows})
        else:
            from scheduler.text_table import table

            print(f"config file: {path or '(none)'}")
            print(table(["SETTING", "VALUE", "FROM"], [[x["key"], x["value"], x["source"]] for x in rows]))
        return EXIT_OK
    _register_config_tables()
    scopes = [settings.DAEMON, settings.AGENT] if args.scope == "both" else [args.scope]
    errors: list[str] = []
    for scope in scopes:
        try:
            settings.resolve(scope, args, config, config_path=path)
        except settings.ConfigErrors as e:
            errors.extend(x for x in e.errors if x not in errors)
    if errors:
        for x in errors:
            print(f"carbonsched: {x}", file=sys.stderr)
        return EXIT_USAGE
    warnings = _zone_warnings(args, config, scopes, path)
    for w in warnings:
        print(f"carbonsched: warning: {w}", file=sys.stderr)
    print(f"config OK: {path or 'no config file; defaults and environment'} ({', '.join(scopes)})"
          + (f", {len(warnings)} warning(s)" if warnings else ""))
    return EXIT_OK


def _zone_warnings(args, config, scopes: list[str], path: str | None) -> list[str]:
    """What `config check` warns about: a zone nothing can price (the default `local`)."""
    from scheduler.zone_check import zone_without_data

    zones = {settings.resolve(scope, args, config, config_path=path)["zone"] for scope in scopes}
    return [w for w in (zone_without_data(z, config) for z in sorted(zones)) if w]


def _fill_derived_paths(r: settings.Resolved, scope: str) -> None:
    """`config show` prints the paths the process will really use, not "(unset)" for the ones
    derived from others (state dir, socket, SQLite URL), exactly as `daemon` derives them."""
    from scheduler.cli.client import default_state_dir
    from scheduler.store.engine import default_db_url

    def derive(key: str, value) -> None:
        if key in r.values and r.values[key] is None:
            r.values[key] = value
            r.sources[key] = "derived"

    state = r.values.get("state_dir") or default_state_dir()
    derive("state_dir", state)
    derive("log_dir", Path(state) / "logs")
    if scope == settings.DAEMON:
        derive("socket", Path("/run/carbonsched/carbonsched.sock") if os.geteuid() == 0
               else Path(state) / "carbonsched.sock")
        derive("db", default_db_url(Path(state)))


def cmd_submit(args, config) -> int:
    from scheduler.timeparse import iso, parse_duration, parse_time

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CliError("empty command: give it after --, e.g. carbonsched submit --gpus 1 -- python run.py",
                       EXIT_USAGE)
    cwd = os.path.abspath(args.chdir) if args.chdir else os.getcwd()
    body: dict = {"argv": command, "gpus": args.gpus, "gpu_mem_gib": args.gpu_mem,
                  "cwd": cwd, "max_retries": args.retries}
    if args.gpu_fraction is not None:
        body["gpu_fraction"] = args.gpu_fraction
    if args.mig is not None:
        body["mig_profile"] = args.mig
    try:
        _slurm_habits(args, body, cwd)
        if args.est_runtime:
            body["est_runtime_s"] = parse_duration(args.est_runtime)
        if args.time_limit:
            body["time_limit_s"] = parse_duration(args.time_limit)
        body.update(accounts.submit_fields(args))  # --account, --qos, --time
        if args.max_delay:
            body["max_delay_s"] = parse_duration(args.max_delay)
        if args.interruptible:
            body["interruptible"] = args.interruptible
        for key, value in (("checkpoint_grace_s", args.checkpoint_grace), ("min_run_s", args.min_run),
                           ("resume_cost_s", args.resume_cost)):
            if value is not None:
                body[key] = parse_duration(value)
        if args.checkpoint_signal is not None:
            body["checkpoint_signal"] = args.checkpoint_signal
        if args.max_segments is not None:
            body["max_segments"] = args.max_segments
        if args.deadline:
            body["deadline"] = iso(parse_time(args.deadline, datetime.now(timezone.utc)))
        for key, value, flag in (("ttft_slo_ms", args.ttft_slo, "--ttft-slo"),
                                 ("tpot_slo_ms", args.tpot_slo, "--tpot-slo")):
            if value is not None:
                try:
                    body[key] = _milliseconds(value)
                except ValueError as e:
                    raise ValueError(f"{flag}: {e}") from None
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    for key, value in (("latency_slo_ms", args.latency_slo), ("workload", args.workload),
                       ("prompts", args.prompts), ("tokens", args.tokens), ("name", args.name)):
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
    result = api_client(args, config).submit(**body)
    warning = result.get("warning")  # accepted, but it waits: e.g. only drained GPUs can run it
    if args.json:
        _print_json({"id": result["id"], **({"warning": warning} if warning else {}),
                     **({"array_job_id": result["array_job_id"], "ids": result["ids"]} if "ids" in result else {})})
    elif "ids" in result:
        print(f"submitted job array {result['id']}: {len(result['ids'])} tasks (jobs {result['ids'][0]}-"
              f"{result['ids'][-1]}, indices {result['array']})")
    else:
        print(f"submitted job {result['id']}" + (" (held)" if args.hold else ""))
    if warning:
        print(f"carbonsched: warning: job {result['id']}: {warning}", file=sys.stderr)
    return EXIT_OK


def _slurm_habits(args, body: dict, cwd: str) -> None:
    """--hold, --begin, --dependency, --array, --output/--error into the request (issue 28);
    checked here too, so a mistake is one line before anything reaches the daemon."""
    from scheduler.job_specs import check_log_pattern, parse_array, parse_dependency
    from scheduler.timeparse import iso, parse_time

    if args.hold:
        body["hold"] = True
    if args.begin:
        try:
            body["begin"] = iso(parse_time(args.begin, datetime.now(timezone.utc)))
        except ValueError as e:
            raise ValueError(f"--begin: {e}") from None
    if args.dependency:
        parse_dependency(args.dependency)
        body["dependency"] = args.dependency
    if args.array:
        parse_array(args.array)
        body["array"] = args.array
    for flag, key, value in (("--output", "stdout_path", args.output), ("--error", "stderr_path", args.error)):
        if value:
            body[key] = check_log_pattern(os.path.join(cwd, value), flag)


def _milliseconds(text: str) -> float:
    """A latency limit in ms: a duration (40ms, 2s) or a bare number of milliseconds."""
    from scheduler.timeparse import parse_duration

    import re

    if re.fullmatch(r"\s*\d+(\.\d+)?\s*", text):
        return float(text)
    return parse_duration(text) * 1000.0


def cmd_queue(args, config) -> int:
    from scheduler.timeparse import iso, parse_past

    states = [s.upper() for v in (args.state or []) for s in v.split(",")]
    filters: dict = {"users": [u for v in (args.user or []) for u in v.split(",") if u] or None,
                     "names": args.name or None, "array": args.array}
    now = datetime.now(timezone.utc)
    for key in ("since", "until"):
        text = getattr(args, key)
        if text:
            try:
                filters[key] = iso(parse_past(text, now))
            except ValueError as e:
                raise CliError(f"--{key}: {e}", EXIT_USAGE) from None
    client = api_client(args, config)
    if args.json:  # the daemon's JSON as is: no decode and re-encode of thousands of jobs
        sys.stdout.buffer.write(client.jobs_raw(include_done=args.all, states=states or None, **filters) + b"\n")
        return EXIT_OK
    jobs = client.jobs(include_done=args.all, states=states or None, **filters)
    from scheduler.cli import output

    if args.fields:
        try:
            print(output.jobs_fields(jobs, args.fields, header=not args.noheader))
        except ValueError as e:
            raise CliError(f"--format: {e}", EXIT_USAGE) from None
    else:
        print(output.jobs_table(jobs))
    return EXIT_OK


def cmd_hold(args, config) -> int:
    client = api_client(args, config)
    results = client.hold(args.jobs) if args.verb == "hold" else client.release(args.jobs)
    if args.json:
        _print_json(results)
    else:
        for r in results:
            state = "held" if r["held"] else "released"
            print(f"job {r['id']}: {state}" + ("" if r["changed"] else f" (it was {state} already)"))
    return EXIT_OK


def cmd_show(args, config) -> int:
    client = api_client(args, config)
    job = client.job(args.job)
    receipt = report.fetch_receipt(client, args.job) if job.get("ended_at") else None
    if args.json:
        _print_json({**job, "receipt": receipt})
    else:
        from scheduler.cli import output

        print(output.job_detail(job))
        if receipt is not None:
            print("\n" + report.receipt_text(receipt))
    return EXIT_OK


def exit_code_of_status(status: int) -> int:
    """The CLI's exit status for the daemon's HTTP status of a refusal."""
    return {400: EXIT_USAGE, 403: EXIT_FORBIDDEN, 404: EXIT_NOT_FOUND, 409: EXIT_CONFLICT,
            411: EXIT_USAGE, 413: EXIT_USAGE, 422: EXIT_USAGE, 503: EXIT_UNREACHABLE}.get(status, EXIT_ERROR)


def cmd_cancel(args, config) -> int:
    """Cancel what can be cancelled and name the rest on stderr (as scancel); the exit status
    is the first refusal's (e.g. 4: no such job) when any id was refused."""
    results = api_client(args, config).cancel(args.jobs)
    if args.json:
        _print_json(results)
    verb = {"CANCELLED": "cancelled", "CANCELLING": "cancelling (stopping the process)"}
    code = EXIT_OK
    for r in results:
        if "error" in r:
            print(f"job {r['id']}: {r['error']}", file=sys.stderr)
            code = code or exit_code_of_status(r["status"])
        elif not args.json:
            print(f"job {r['id']}: {verb.get(r['state'], r['state'])}")
    return code


def cmd_logs(args, config) -> int:
    client = api_client(args, config)
    stream = "stderr" if args.stderr else "stdout"
    if not args.follow:
        # The daemon answers in bounded chunks: read on from next_offset to the size the
        # first answer gave (what the job writes meanwhile is for --follow).
        r = client.logs(args.job, stream, args.tail_bytes)
        end = r["size"]
        while True:
            sys.stdout.write(r["text"])
            sys.stdout.flush()
            offset = r.get("next_offset", r["size"])
            if offset >= end or not r["text"]:
                return EXIT_OK
            r = client.logs(args.job, stream, offset=offset)
    return _follow(client, args.job, stream, args.tail_bytes)


def _follow(client, job_id: int, stream: str, tail_bytes: int | None, poll_s: float = 1.0) -> int:
    """`logs --follow`: print what there is, then what the job adds, until it has ended and
    everything it wrote has been printed (like `tail -f` that stops with the job)."""
    import time

    from scheduler.cli.client import ApiError

    offset = None
    while True:
        job = client.job(job_id)
        try:
            r = client.logs(job_id, stream, tail_bytes if offset is None else None, offset=offset)
        except ApiError as e:
            if e.status != 409:  # 409: not started yet, keep waiting
                raise
            r = None
        if r is not None:
            sys.stdout.write(r["text"])
            sys.stdout.flush()
            offset = r.get("next_offset", r["size"])
        if job["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "LOST"):
            if r is not None and not r["text"]:
                return EXIT_OK
            if r is None:
                return EXIT_OK
            continue  # one more read: what it wrote last
        if r is None or offset >= r["size"]:  # else the next chunk is there already
            time.sleep(poll_s)


def cmd_nodes(args, config) -> int:
    nodes = api_client(args, config).nodes()
    if args.json:
        _print_json(nodes)
    else:
        from scheduler.cli import output

        print(output.nodes_table(nodes))
    return EXIT_OK


def cmd_plan(args, config) -> int:
    plan = api_client(args, config).plan()
    if args.json:
        _print_json(plan)
    else:
        from scheduler.cli import output

        print(output.plan_table(plan))
    return EXIT_OK


def cmd_db(args, config) -> int:
    import logging

    logging.basicConfig(level="WARNING", format="%(levelname)s %(name)s: %(message)s")
    from scheduler.cli.common import open_existing_store
    from scheduler.store import Store

    url = db_url(args, config)
    # `check` only reads: a missing SQLite file is "no database at PATH", never created
    store = Store(url) if args.action == "upgrade" else open_existing_store(
        url, require_current=False, hint=f"create it: carbonsched db upgrade --db {url}")
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


for _verb, _handler in {"daemon": cmd_daemon, "agent": cmd_agent, "submit": cmd_submit, "queue": cmd_queue,
                         "show": cmd_show, "cancel": cmd_cancel, "logs": cmd_logs, "nodes": cmd_nodes,
                         "plan": cmd_plan, "db": cmd_db, "config": cmd_config, "drain": cmd_drain,
                         "resume": cmd_drain, "hold": cmd_hold, "release": cmd_hold}.items():
    register(_verb, _handler)


def _print_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=None if isinstance(data, list) and len(data) > 50 else 2))
    sys.stdout.write("\n")


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    from scheduler.cli.client import ApiError, DaemonUnreachable

    config: dict = {}
    try:
        config = load_config(args.config)
        code = VERBS[args.verb](args, config)
    except CliError as e:
        print(f"carbonsched: {e}", file=sys.stderr)
        code = e.code
    except DaemonUnreachable as e:
        hint = ""
        if isinstance(config, UnreadableConfig):  # the socket it names, if any, is unknown here
            hint = f" ({config.problem}; give --socket or CARBONSCHED_SOCKET)"
        print(f"carbonsched: {e}{hint}", file=sys.stderr)
        code = EXIT_UNREACHABLE
    except ApiError as e:
        print(f"carbonsched: {e.message}", file=sys.stderr)
        code = exit_code_of_status(e.status)
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        code = EXIT_OK
    except Exception as e:  # the last line of defence: one clear line, never a traceback
        if os.environ.get("CARBONSCHED_DEBUG"):
            raise
        from scheduler.cli.common import database_error_line

        line = database_error_line(e)
        print(f"carbonsched: {line} (check --db or the config's database URL)" if line else
              f"carbonsched: unexpected error: {type(e).__name__}: {' '.join(str(e).split())} "
              "(set CARBONSCHED_DEBUG=1 for a traceback)", file=sys.stderr)
        code = EXIT_ERROR
    sys.exit(code)
