"""`carbonsched simulate`: replay job and carbon traces through the daemon's own policies.

    carbonsched simulate --cluster FILE.toml --jobs FILE [--jobs-format F] --carbon ZONE=FILE ...
                         [--start ISO-DATE] [--slack DUR] --policy a,b,... [--forecast F]
                         [--truth perfect|noisy:SIGMA|profiles:FILE] [--[no-]learn]
                         [--estimate exact|class-mean|lognormal:SIGMA|user:K] [--[no-]correct-estimates]
                         [--interruptible SHARE [--interruptible-kind checkpoint|pause] [--min-run DUR]
                          [--resume-cost DUR] [--max-segments N]]
                         [--seed N] [--out DIR] [--json]
    carbonsched simulate --from-store [--since T] [--until T] [--db URL] --policy a,b,...
    carbonsched simulate                      # the bundled demo scenario (real data)

Prints a side-by-side table (or the JSON document with --json); with --out DIR it also writes
report.json, a CSV per job and per policy, and PNG plots there (nothing is written without it).
Only the standard library is imported at module level (the CLI starts fast); everything
else is imported in `run`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from scheduler.cli.common import EXIT_OK, EXIT_USAGE, CliError, db_url, register
from scheduler.settings import env_help

FORMATS = ("gaia", "alibaba", "llm", "generic")


def add_parser(subparsers) -> None:
    """Add the `simulate` verb and register `run` as its handler in scheduler.cli.common.VERBS."""
    s = subparsers.add_parser(
        "simulate", help="replay job and carbon traces through policies and compare them",
        description="Replay a job trace on a simulated cluster through the daemon's own policies, with "
                    "carbon traces per zone, and report carbon, energy, waits and deadlines side by side. "
                    "Without trace arguments it runs the bundled demo scenario.")
    _input_options(s.add_argument_group("inputs"))
    _shadow_options(s.add_argument_group("shadow mode (replay the production store)"))
    _model_options(s.add_argument_group("model"))
    _output_options(s.add_argument_group("output"))
    register("simulate", run)


def _input_options(g) -> None:
    """The trace, carbon and job-shaping options."""
    g.add_argument("--cluster", metavar="FILE.toml", help="cluster file: nodes with zone, GPUs and PUE")
    g.add_argument("--jobs", metavar="FILE", help="job trace (GAIA, Alibaba GPU v2023, LLM requests or generic CSV)")
    g.add_argument("--jobs-format", choices=FORMATS, help="trace format (default: detected from the header)")
    g.add_argument("--time-unit", choices=("s", "m", "h"),
                   help="unit of numeric trace times (default: detected for GAIA, seconds otherwise)")
    g.add_argument("--carbon", metavar="ZONE=FILE", action="append", default=[],
                   help="carbon-intensity trace of a zone (repeatable; repeat a zone to join years); "
                        "ZONE=store takes the zone's recorded actuals from the store (--db)")
    g.add_argument("--start", metavar="ISO-DATE",
                   help="put the trace's first arrival at this time (UTC if no offset)")
    g.add_argument("--slack", metavar="DUR", default="24h",
                   help="deadline = arrival + runtime + slack (default 24h; 'none' for no deadlines)")
    g.add_argument("--max-wait", metavar="DUR", help="a job must start within this time of its arrival")
    g.add_argument("--mix", metavar="CLASS=SHARE,...",
                   help="give generic jobs workload classes in these shares, e.g. llm-chat-8b=0.5,none=0.5")
    g.add_argument("--interruptible", metavar="SHARE", type=float, default=0.0,
                   help="this share of the jobs (0-1, seeded) may be cut into segments; "
                        "a generic trace's interruptible column wins for its jobs")
    g.add_argument("--interruptible-kind", choices=("checkpoint", "pause"), default="checkpoint",
                   help="checkpoint (GPUs freed between segments, may resume elsewhere) or pause (held, idle "
                        "power counted); default checkpoint")
    g.add_argument("--min-run", metavar="DUR", help="interruptible jobs: the shortest segment (default: one slot)")
    g.add_argument("--resume-cost", metavar="DUR", default="0s",
                   help="interruptible jobs: running time lost per resume (default 0s)")
    g.add_argument("--max-segments", metavar="N", type=int, default=4,
                   help="interruptible jobs: at most N segments (default 4)")
    g.add_argument("--llm-batch-prompts", type=int, default=1000, metavar="N",
                   help="LLM traces: at most N requests per batch job (default 1000)")
    g.add_argument("--llm-batch-window", default="15m", metavar="DUR",
                   help="LLM traces: a batch spans at most this long (default 15m)")
    g.add_argument("--llm-workload", default="llm-chat-8b", metavar="CLASS",
                   help="LLM traces: workload class of the batch jobs (default llm-chat-8b)")


def _shadow_options(sh) -> None:
    """The options of a replay of the production store."""
    sh.add_argument("--from-store", action="store_true",
                    help="replay the store's finished jobs and recorded intensity (read-only)")
    sh.add_argument("--since", metavar="T", help="jobs submitted from this time (ISO or a duration ago; default 7d)")
    sh.add_argument("--until", metavar="T", help="jobs submitted before this time (default now)")
    sh.add_argument("--db", help=env_help("database URL (default SQLite under the state dir)", "CARBONSCHED_DB"))
    sh.add_argument("--state-dir", help=env_help("state directory (for the default SQLite URL)",
                                                  "CARBONSCHED_STATE_DIR"))


def _model_options(m) -> None:
    """The policies, forecast, truth, estimates and the simulated daemon's settings."""
    m.add_argument("--policy", default=None, metavar="a,b,...",
                   help="policies to compare, the first is the baseline (default fifo,greedy,cpsat; also "
                        "edf, the deadline-aware carbon-blind baseline, and oracle); NAME:key=value sets a "
                        "policy parameter, e.g. cpsat:max_time_s=10 (the simulator gives cpsat 1 s per "
                        "planner call unless told), cpsat:lateness_g_per_gpu_h=500 (the price of lateness), "
                        "fifo:seed=2 (its tie-breaking seed)")
    m.add_argument("--fifo-seeds", type=int, default=3, metavar="N",
                   help="run a plain fifo with tie-breaking seeds 0..N-1 and report their mean and spread "
                        "(default 3; 1: seed 0 alone)")
    m.add_argument("--forecast", default="perfect", metavar="F",
                   help="forecast model: perfect, noisy:SIGMA (relative, e.g. noisy:0.1), persistence, "
                        "model (the project's own forecaster, as the daemon's), baseline (its profile + anomaly "
                        "fallback alone), stored; F+hourly (e.g. perfect+hourly) plans on hourly means of a "
                        "sub-hourly trace, emissions still at its own step; default perfect")
    m.add_argument("--truth", default="perfect", metavar="T",
                   help="how jobs really run: perfect (as the planner estimates), noisy:SIGMA (per workload "
                        "and GPU model a lognormal error on runtime and power, e.g. noisy:0.3), "
                        "profiles:FILE (TOML [[profile]] rows: workload, model, prompts_per_s, power_w); the "
                        "planner never sees it. Default perfect")
    m.add_argument("--estimate", default="exact", metavar="E",
                   help="what the planner is told of a runtime-given job's length (the job runs its real "
                        "length): exact, class-mean (GAIA: the mean of its queue, under/over 2 h), "
                        "lognormal:SIGMA (a per-job error, e.g. lognormal:0.5), user:K (the runtime x ~K "
                        "rounded up to 30m/1h/2h/4h/12h/1d, as users request); default exact")
    m.add_argument("--correct-estimates", action=argparse.BooleanOptionalAction, default=None,
                   help="learn real/estimated runtime per estimate class from finished jobs and correct "
                        "later estimates by it (default: on unless --estimate exact)")
    m.add_argument("--estimate-margin", action=argparse.BooleanOptionalAction, default=True,
                   help="with the correction, widen deadline margins by the learned estimate spread "
                        "(default on)")
    m.add_argument("--price-length-spread", action=argparse.BooleanOptionalAction, default=True,
                   help="with the correction, price each job at its expected grams over its class's learned "
                        "spread of lengths rather than at the corrected estimate alone (default on)")
    m.add_argument("--learn", action=argparse.BooleanOptionalAction, default=True,
                   help="fold finished jobs' measured runtime and energy into the planner's profiles, as "
                        "the daemon does (default on)")
    m.add_argument("--seed", type=int, default=0, help="seed of noise and failures (default 0)")
    m.add_argument("--plan-interval", metavar="DUR", help="planner tick (default 15m; the demo: 1h)")
    m.add_argument("--wake-on-submit", action=argparse.BooleanOptionalAction, default=None,
                   help="also plan when a job is submitted, as the daemon does (default on; the demo: off)")
    m.add_argument("--horizon", default="48h", metavar="DUR", help="planning horizon (default 48h)")
    m.add_argument("--full-replan", metavar="DUR",
                   help="incremental planning: between full re-plans this far apart, keep the earlier plans "
                        "and plan only new jobs (default: every tick re-plans every queued job)")
    m.add_argument("--gpu-mtbf", metavar="DUR", help="simulate GPU failures: mean time between failures per GPU")
    m.add_argument("--gpu-repair", default="4h", metavar="DUR", help="time a failed GPU is down (default 4h)")
    m.add_argument("--fair-share", action=argparse.BooleanOptionalAction, default=True,
                   help="order the trace's accounts by fair share of their decayed usage under contention, as "
                        "the daemon does (default on; off: QOS alone orders the queue)")


def _output_options(o) -> None:
    """Where and how the report goes."""
    o.add_argument("--out", metavar="DIR", help="write report.json, a CSV of jobs per policy and the plots "
                   "into DIR (created); without it nothing is written")
    o.add_argument("--no-plots", action="store_true", help="with --out: skip the PNG plots")
    o.add_argument("--json", action="store_true", help="print the report as JSON")
    o.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: on a terminal, off with --json)")


def run(args, config: dict) -> int:
    """Run `carbonsched simulate`; raise scheduler.cli.common.CliError with one clear line on failure."""
    import logging


    logging.basicConfig(level=os.environ.get("CARBONSCHED_LOG_LEVEL", "WARNING").upper(),
                        format="%(levelname)s %(name)s: %(message)s")
    from scheduler.policy_tables import warm_policy_tables
    from scheduler.simulate.cluster import ClusterSpecError
    from scheduler.simulate.intensity import CarbonInputError
    from scheduler.simulate.traces import TraceFormatError

    warm_policy_tables()
    try:
        return _run(args, config)
    except (ClusterSpecError, CarbonInputError, TraceFormatError, ValueError) as e:
        raise CliError(str(e), EXIT_USAGE) from None


def _duration(text: str | None, flag: str) -> float | None:
    from scheduler.timeparse import parse_duration

    if text is None or str(text).strip().lower() in ("none", "off"):
        return None
    try:
        return parse_duration(text)
    except ValueError as e:
        raise CliError(f"{flag}: {e}", EXIT_USAGE) from None


def _start(text: str | None) -> datetime | None:

    if not text:
        return None
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CliError(f"--start {text!r}: expected an ISO 8601 date, e.g. 2022-10-19T16:00Z", EXIT_USAGE) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.astimezone(timezone.utc)


def _run(args, config: dict) -> int:
    from scheduler.simulate.estimates import EstimateError, parse_estimate
    from scheduler.simulate.report import table, write_report
    from scheduler.simulate.runner import parse_policies, run_policies
    from scheduler.simulate.scenario import DEMO_POLICIES
    from scheduler.simulate.truth import TruthError, parse_truth

    trace_args = [a for a in ("cluster", "jobs") if getattr(args, a)] + (["carbon"] if args.carbon else [])
    demo = not trace_args and not args.from_store
    settings = _settings(args, demo)
    try:
        parse_truth(args.truth, seed=args.seed)  # a bad spec or file fails before any work
        parse_estimate(args.estimate, seed=args.seed)
    except (TruthError, EstimateError) as e:
        raise CliError(str(e), EXIT_USAGE) from None
    policies = parse_policies(args.policy or _default_policies(DEMO_POLICIES if demo else "fifo,greedy,cpsat"))
    scenario, what = _scenario(args, config, trace_args, demo)

    progress = args.progress if args.progress is not None else (not args.json and sys.stderr.isatty())
    if not args.json:
        print(f"simulating {what}; policies {', '.join(p.label for p in policies)}; forecast {args.forecast}; "
              f"truth {args.truth}{' (learning)' if args.learn else ''}; estimate {args.estimate}",
              file=sys.stderr)
        for line in changed_lines(scenario):
            print(f"note: {line}", file=sys.stderr)
    if args.fifo_seeds < 1:
        raise CliError(f"--fifo-seeds must be at least 1 (got {args.fifo_seeds})", EXIT_USAGE)
    result = run_policies(scenario, policies, forecast=args.forecast, settings=settings, progress=progress,
                          fifo_seeds=args.fifo_seeds)
    out = _out_dir(args.out) if args.out else None
    info = scenario.describe()
    info.update({"policies": [p.label for p in policies],
                 "policy_params": {p.label: dict(p.params) for p in policies}, "forecast": args.forecast,
                 "seed": args.seed, "truth": args.truth, "learn": args.learn, "estimate": args.estimate,
                 "correct_estimates": args.correct_estimates, "estimate_margin": args.estimate_margin,
                 "price_length_spread": args.price_length_spread, "fifo_seeds": args.fifo_seeds,
                 "plan_interval_s": settings.plan_interval_s, "horizon_s": settings.horizon_s,
                 "full_replan_s": settings.full_replan_s, "wake_on_submit": settings.wake_on_submit, "fair_share": settings.fair_share,
                 "demo": demo, "from_store": bool(args.from_store)})
    doc = write_report(result.runs, result.summaries, result.comparison, info, out, scenario.names,
                       plots=not args.no_plots, models=tuple(scenario.cluster.gpus_by_model()))
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    else:
        print(table(result.summaries, result.comparison))
        if out is not None:
            print(f"\nreport written to {out}/ (report.json, jobs-<policy>.csv"
                  + ("" if args.no_plots else ", emissions.png, gpu_usage.png, waits.png") + ")")
    return EXIT_OK


def _settings(args, demo: bool):
    """The simulated daemon's settings from the options (`SimSettings`)."""
    from scheduler.simulate.settings import SimSettings

    # The demo plans hourly (the carbon data's own step) so that it finishes in about a minute.
    plan_interval = _duration(args.plan_interval or ("1h" if demo else "15m"), "--plan-interval")
    wake = args.wake_on_submit if args.wake_on_submit is not None else not demo
    horizon = _duration(args.horizon, "--horizon")
    if not plan_interval or not horizon:
        raise CliError("--plan-interval and --horizon must be positive durations", EXIT_USAGE)
    return SimSettings(plan_interval_s=plan_interval, wake_on_submit=wake,
                       horizon_s=horizon, gpu_mtbf_s=_duration(args.gpu_mtbf, "--gpu-mtbf"),
                       full_replan_s=_duration(args.full_replan, "--full-replan"),
                       gpu_repair_s=_duration(args.gpu_repair, "--gpu-repair") or 0.0, seed=args.seed,
                       truth=args.truth, learn=args.learn, estimate=args.estimate,
                       correct_estimates=args.correct_estimates, estimate_margin=args.estimate_margin,
                       price_length_spread=args.price_length_spread, fair_share=args.fair_share)


def _scenario(args, config: dict, trace_args: list[str], demo: bool):
    """The scenario to replay (the store's history, the bundled demo or the trace files) and
    a phrase saying what it is."""
    from scheduler.simulate.scenario import Interruptible, build_scenario, parse_mix

    slack_s = _duration(args.slack, "--slack")
    max_wait_s = _duration(args.max_wait, "--max-wait")
    mix = parse_mix(args.mix)
    try:
        cut = Interruptible(share=args.interruptible, kind=args.interruptible_kind,
                            min_run_s=_duration(args.min_run, "--min-run"),
                            resume_cost_s=_duration(args.resume_cost, "--resume-cost") or 0.0,
                            max_segments=args.max_segments)
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None

    if args.from_store:
        if trace_args and trace_args != ["cluster"]:
            raise CliError("--from-store replays the store's own jobs and intensity: leave out --jobs and --carbon",
                           EXIT_USAGE)
        scenario = _store_scenario(args, config)
        return scenario, f"the store's job history ({len(scenario.jobs)} jobs)"
    if demo:
        from scheduler.simulate.scenario import demo_inputs

        cluster, trace, carbon, start = demo_inputs()
        scenario = build_scenario(cluster, trace, carbon, start=_start(args.start) or start, slack_s=slack_s,
                                  max_wait_s=max_wait_s, mix=mix, seed=args.seed, interruptible=cut)
        return scenario, (f"the bundled demo: {len(scenario.jobs)} PAI jobs on {cluster.describe()}, "
                          f"Electricity Maps 2022 carbon")
    missing = [a for a in ("cluster", "jobs", "carbon") if a not in trace_args]
    if missing:
        raise CliError(f"missing {', '.join('--' + m for m in missing)} (or give no trace arguments "
                       "for the bundled demo)", EXIT_USAGE)
    cluster, trace, carbon = _file_inputs(args, config)
    scenario = build_scenario(cluster, trace, carbon, start=_start(args.start), slack_s=slack_s,
                              max_wait_s=max_wait_s, mix=mix, seed=args.seed, interruptible=cut)
    return scenario, f"{len(scenario.jobs)} jobs from {args.jobs} on {cluster.describe()}"


def changed_lines(scenario) -> list[str]:
    """What the replay changed from its inputs, for the header: a trace moved from its own
    dates to the carbon data's, jobs run by their prompts at a runtime far from the measured."""
    from scheduler.timeparse import format_duration

    notes, out = scenario.notes, []
    if notes.get("moved_from"):
        out.append(f"the trace's own dates (from {notes['moved_from'][:16]}Z) lie outside the carbon data: "
                   f"replayed from {scenario.origin.isoformat()[:16]}Z, where the carbon data starts")
    far = notes.get("runtime_by_prompts")
    if far:
        measured, modelled = far["measured_s"], far["modelled_s"]
        mid = len(measured) // 2
        out.append(f"{far['jobs']} job(s) run by their prompts at the model's runtime, far from what they "
                   f"measured (median {format_duration(measured[mid])} measured, "
                   f"{format_duration(modelled[mid])} modelled): drop --prompts at submit, or read their "
                   "figures as the model's")
    return out


def _file_inputs(args, config: dict):
    """The cluster, job trace and carbon of --cluster, --jobs and --carbon (ZONE=store from
    the store)."""
    from scheduler.simulate.cluster import load_cluster
    from scheduler.simulate.intensity import load_carbon
    from scheduler.simulate.traces import read_jobs

    cluster = load_cluster(args.cluster)
    files = [c for c in args.carbon if c.partition("=")[2].strip() != "store"]
    from_store = [c.partition("=")[0].strip() for c in args.carbon if c.partition("=")[2].strip() == "store"]
    carbon = load_carbon(files) if files else {}
    if from_store:
        carbon.update(_carbon_from_store(args, config, from_store))
        from scheduler.simulate.intensity import check_signals

        check_signals(carbon)
    _check_workload(args.llm_workload)
    window = _duration(args.llm_batch_window, "--llm-batch-window")
    trace = read_jobs(args.jobs, fmt=args.jobs_format, time_unit=args.time_unit,
                      llm_batch_prompts=args.llm_batch_prompts, llm_batch_window_s=window or 900.0,
                      llm_workload=args.llm_workload)
    return cluster, trace, carbon


def _check_workload(workload: str) -> None:
    from policies.model.energy import ProfileBook, seed_profiles

    known = ProfileBook(seed_profiles()).workloads()
    if workload not in known:
        raise ValueError(f"--llm-workload {workload!r} has no profile; known classes: {', '.join(known)}")


def _default_policies(preferred: str) -> str:
    from policies.base import policy_names

    known = set(policy_names())
    chosen = [p for p in preferred.split(",") if p.split(":")[0] in known]
    return ",".join(chosen or ["fifo"])


def _out_dir(text: str) -> Path:
    """The report folder of --out, created."""
    path = Path(text)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"cannot create the report folder {path}: {e.strerror}") from None
    return path.resolve()


def _with_store(args, config: dict, use):
    """`use(store)` on the store named by --db / the config, with clear errors; closed after."""
    from sqlalchemy.exc import SQLAlchemyError

    from scheduler.cli.common import open_existing_store

    url = db_url(args, config)
    store = open_existing_store(url)  # read only: a missing SQLite file is refused, not created
    try:
        return use(store)
    except SQLAlchemyError as e:
        raise CliError(f"database {url}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    finally:
        store.dispose()


def _carbon_from_store(args, config: dict, zones: list[str]) -> dict:
    """`--carbon ZONE=store`: that zone's recorded actual intensity from the store (--db)."""
    from scheduler.simulate.shadow import store_carbon

    return _with_store(args, config, lambda store: store_carbon(store, zones))


def _past(text: str, now: datetime, flag: str) -> datetime:
    """A moment in the past (`scheduler.timeparse.parse_past`); a usage error naming `flag`."""
    from scheduler.timeparse import parse_past

    try:
        return parse_past(text, now)
    except ValueError as e:
        raise CliError(f"{flag}: {e}", EXIT_USAGE) from None


def _store_scenario(args, config: dict):
    from scheduler.simulate.shadow import store_scenario

    now = datetime.now(timezone.utc)
    since = _past(args.since, now, "--since") if args.since else None
    until = _past(args.until, now, "--until") if args.until else None

    def scenario(store):
        cluster = None
        if args.cluster:
            from scheduler.simulate.cluster import load_cluster

            cluster = load_cluster(args.cluster)
        return store_scenario(store, since=since, until=until, cluster=cluster,
                              slack_s=_duration(args.slack, "--slack"))

    return _with_store(args, config, scenario)
