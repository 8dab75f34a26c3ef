"""`carbonsched profiles`: what the performance model predicts per GPU model, and what this
cluster has learned.

    carbonsched profiles [--workload W] [--gpu MODEL ...] [--ttft-slo DUR] [--tpot-slo DUR]
                         [--latency-slo DUR] [--json] [--plot FILE.png] [--db URL]
    carbonsched profiles reset [--workload W] [--gpu MODEL] [--db URL]     (operators)

Without --workload, a summary over the model's preset workloads: J/prompt at the best
operating point per GPU model, its source, and the runs learned here. With --workload, per
GPU model the best operating point (batch limit, precision, TP degree), prompts/s, W,
J/prompt, J/token, TTFT/TPOT p95, memory, where each figure comes from and the power
model's uncertainty, and which latency limit bound the point; then the seed profile beside
the learned one with the number of runs behind it. `--plot` draws J/token against TPOT p95
per GPU model (the frontier). The best point is the one the planner picks: under the
workload's default SLOs (those a job that sets none is held to), each of which the SLO flags
(p95 limits: `40ms`, `2s`; a bare number is ms) replace, as they do for a job.

Learned profiles come from the daemon (GET /v1/profiles), or with `--db URL` from the store
directly. When neither answers, the model's figures are shown and the learned ones are
said to be unavailable: not an error.

`profiles reset` forgets what this cluster learned (of one workload, on one GPU model, or
all), so the planner goes back to the seeds (issue 48: a profile taught wrong by one user's
jobs). Root or an admin group only, through the daemon (a user gets a one-line refusal);
with --db, whoever can write the database. Only the standard library is imported at module level.
"""

from __future__ import annotations

import json
import os
import sys

from scheduler.cli.common import EXIT_USAGE, CliError, api_client, register


def add_parser(subparsers) -> None:
    """Add the `profiles` verb; registers its handler in scheduler.cli.common.VERBS."""
    p = subparsers.add_parser(
        "profiles", help="predicted and learned performance and energy per workload and GPU model",
        description="Per GPU model: the performance model's best operating point (batch, precision, TP) for "
                    "a workload, its prompts/s, W, J/prompt, J/token, TTFT/TPOT p95, memory and the source of "
                    "each figure; the seed profile beside the one learned from this cluster's runs.")
    p.add_argument("action", nargs="?", choices=["reset"],
                   help="reset: forget learned profiles (of --workload, on --gpu; default all), operators only")
    p.add_argument("--workload", metavar="W", help="one workload in detail (default: a summary of the presets)")
    p.add_argument("--gpu", metavar="MODEL", action="append",
                   help="GPU models to show, repeatable (default: MI300X MI325X MI355X A100 H100 H200 B200)")
    for flag, what in (("--ttft-slo", "time to first token"), ("--tpot-slo", "time per output token"),
                       ("--latency-slo", "per-prompt latency")):
        p.add_argument(flag, metavar="DUR", help=f"best point whose p95 {what} is at most DUR (40ms, 2s; "
                                                 "a bare number is ms; default: the workload's default "
                                                 "SLO, as the planner applies it)")
    p.add_argument("--json", action="store_true", help="JSON with stable keys")
    p.add_argument("--plot", metavar="FILE.png", help="draw J/token against TPOT p95 per GPU model (needs --workload)")
    p.add_argument("--db", help="read learned profiles from this database instead of asking the daemon (operators)")
    register("profiles", cmd_profiles)


# -- learned profiles: the daemon, or the store named by --db ---------------------------------

def fetch_learned(args, config: dict) -> tuple[list[dict] | None, str | None]:
    """(learned profiles as `scheduler.profiles.learned_view` gives them, None) or, when no
    daemon or database answers, (None, why): learned figures are optional here."""
    if args.db:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import SQLAlchemyError

        from scheduler.profiles import learned_view
        from scheduler.store import Store
        from scheduler.store.engine import SchemaError

        try:
            url = make_url(args.db)
            if url.get_backend_name() == "sqlite" and url.database and not os.path.exists(url.database):
                return None, f"no database file at {url.database}"  # opening it would create one
            store = Store(args.db)
        except (SQLAlchemyError, ValueError) as e:
            return None, f"cannot open the database: {type(e).__name__}: {e}"
        try:
            store.require_current(f"carbonsched db upgrade --db {args.db}")
            with store.read() as conn:
                return learned_view(conn), None
        except SchemaError as e:
            return None, str(e)
        except SQLAlchemyError as e:
            return None, f"cannot read the database: {type(e).__name__}: {str(e).splitlines()[0]}"
        finally:
            store.dispose()

    from scheduler.cli.client import ApiError, DaemonUnreachable

    try:
        return api_client(args, config).request("GET", "/profiles")["profiles"], None
    except DaemonUnreachable as e:
        return None, str(e)
    except ApiError as e:
        if e.status == 404:
            return None, "the daemon is older than this command and does not serve learned profiles"
        if e.status == 503:  # the daemon answers but cannot reach its database
            return None, f"the daemon cannot read its store now ({e.message})"
        raise


# -- the verb ---------------------------------------------------------------------------------

def parse_slo_ms(flag: str, text: str | None) -> float | None:
    """A latency limit in ms: a duration (`40ms`, `2s`) or a bare number of ms."""
    if text is None:
        return None
    from scheduler.timeparse import parse_duration

    try:
        ms = float(text) if text.strip().replace(".", "", 1).isdigit() else parse_duration(text) * 1000
    except ValueError as e:
        raise CliError(f"{flag}: {e}", EXIT_USAGE) from None
    if not ms > 0:
        raise CliError(f"{flag}: must be more than 0 (got {text!r})", EXIT_USAGE)
    return ms


def cmd_reset(args, config: dict) -> int:
    """`profiles reset`: through the daemon (operators only), or with --db in the store."""
    if args.gpu and len(args.gpu) > 1:
        raise CliError("profiles reset takes one --gpu MODEL (or none: every GPU model)", EXIT_USAGE)
    model = args.gpu[0] if args.gpu else None
    if args.db:
        from sqlalchemy.exc import SQLAlchemyError

        from scheduler.profiles import reset_profiles
        from scheduler.store import Store
        from scheduler.store.engine import SchemaError

        store = Store(args.db)
        try:
            store.require_current(f"carbonsched db upgrade --db {args.db}")
            n = store.transact(lambda conn: reset_profiles(conn, args.workload, model))
        except SchemaError as e:
            raise CliError(str(e)) from None
        except SQLAlchemyError as e:
            raise CliError(f"cannot reset profiles in the database: {type(e).__name__}: "
                           f"{str(e).splitlines()[0]}") from None
        finally:
            store.dispose()
        result = {"reset": n, "workload": args.workload, "model": model}
    else:
        result = api_client(args, config).request("POST", "/profiles/reset",
                                                  {"workload": args.workload, "model": model})
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        what = f"{args.workload or 'every workload'} on {model or 'every GPU model'}"
        print(f"reset {result['reset']} learned profile(s) ({what}); the planner uses the seed profiles for them")
    return 0


def cmd_profiles(args, config: dict) -> int:
    if args.action == "reset":  # before the model's imports: any user's python runs it (stdlib only)
        return cmd_reset(args, config)
    from scheduler.policy_tables import warm_policy_tables

    warm_policy_tables()  # the model's fit from the cache: seconds of fitting saved
    from scheduler import profile_view
    from scheduler.profile_view import FLEET_GPUS, NoLatencyModel, Slo, UnknownWorkload

    gpus = tuple(dict.fromkeys(args.gpu)) if args.gpu else FLEET_GPUS  # each once, in the order given
    unknown = [g for g in gpus if g not in profile_view.perf_model.parts()]
    if unknown:
        raise CliError(f"unknown GPU model {', '.join(unknown)}; known: "
                       f"{', '.join(profile_view.perf_model.parts())}", EXIT_USAGE)
    if args.plot and not args.workload:
        raise CliError("--plot draws one workload's frontier: give --workload W", EXIT_USAGE)
    slo = Slo(parse_slo_ms("--ttft-slo", args.ttft_slo), parse_slo_ms("--tpot-slo", args.tpot_slo),
              parse_slo_ms("--latency-slo", args.latency_slo))
    learned, note = fetch_learned(args, config)
    try:
        if args.workload:
            view = profile_view.workload_view(args.workload, learned, gpus=gpus, learned_note=note, slo=slo)
        else:
            view = profile_view.summary_view(learned, gpus=gpus, learned_note=note, slo=slo)
    except (UnknownWorkload, NoLatencyModel) as e:
        raise CliError(str(e), EXIT_USAGE) from None
    if args.json:
        sys.stdout.write(json.dumps(view, indent=2) + "\n")
    else:
        print(workload_text(view) if args.workload else summary_text(view))
    if args.plot:
        w = profile_view.resolve(args.workload, learned)
        if w is None:
            raise CliError(f"{args.workload}: no model preset, so no frontier to plot (learned figures only)",
                           EXIT_USAGE)
        plot_frontier(w, [g for g in gpus if g in profile_view.perf_model.parts()], args.plot, slo)
        if not args.json:
            print(f"plot: {args.plot}")
    return 0


# -- text -------------------------------------------------------------------------------------

def _num(v: float | None, fmt: str) -> str:
    if v is None:
        return "-"
    if fmt == ".3g" and abs(v) >= 999.5:  # 3 significant digits, never an exponent
        return f"{v:,.0f}"
    return format(v, fmt)


def _point(e: dict) -> str:
    p = e.get("point")
    return "-" if not p else f"{p['max_batch']}/{p['precision']}/{p['tp']}"


def _power_source(e: dict) -> str:
    """Where the power figure comes from, with the power model's uncertainty where it is one."""
    kind = e.get("sources", {}).get("power")
    if kind is None:
        return "-"
    if kind in ("measured", "nominal") or e.get("power_uncertainty_rel") is None:
        return kind
    return f"{kind} +-{e['power_uncertainty_rel'] * 100:.0f}%"


def _learned_lines(view: dict) -> list[str]:
    if not view["learned_available"]:
        return [f"learned figures unavailable (the model's are shown): {view['learned_note']}"]
    return []


def workload_text(view: dict) -> str:
    """`profiles --workload W` for people: the model's table, then seed vs learned."""
    from scheduler.text_table import table

    w = view["workload"]
    lines: list[str] = []
    if w.get("kind") is None:
        lines.append(f"{w['name']}: no preset of the performance model; learned figures only")
    else:
        nominal = " NOMINAL: " + view["source_kinds"]["nominal"] if w["nominal"] else ""
        alias = f" (= {w['alias_of']})" if w["alias_of"] else ""
        unit = "sample" if w["kind"] == "train" else "prompt"
        lines.append(f"{w['name']}{alias}: {w['total_params_b']:g}B parameters ({w['active_params_b']:g}B active), "
                     f"{w['precision']}, {w['mean_input_tokens']:.0f} input / {w['mean_output_tokens']:.0f} output "
                     f"tokens per {unit}.{nominal}")
        if w["note"]:
            lines.append(f"  {w['note']}")
        limit = _limit_text(view)
        lines += ["", f"best operating point per GPU model, as the planner picks it (lowest J/{unit} that fits "
                      f"in memory, {limit}); {unit.upper()}S/S and W for the TP group", ""]
        rows = []
        for e in view["gpus"]:
            if "fits" not in e:
                continue
            if not e["fits"]:
                rows.append([e["gpu"], "-", "-", "-", "-", "-", "-", "-", _num(e["memory_needed_gib"], ".0f") + "/"
                             + _num(e["memory_available_gib"], ".0f"), f"none: {e['why']}", "-", "-"])
                continue
            rows.append([e["gpu"], _point(e), _num(e["prompts_per_s"], ".3g"), _num(e["power_w"], ".0f"),
                         _num(e["j_per_prompt"], ".3g"), _num(e["j_per_token"], ".3g"),
                         _num(e["ttft_p95_ms"], ".0f"), _num(e["tpot_p95_ms"], ".1f"),
                         f"{e['memory_needed_gib']:.0f}/{e['memory_available_gib']:.0f}", e["source"],
                         _power_source(e), _bound(e)])
        lines.append(table(["GPU", "BATCH/PREC/TP", f"{unit.upper()}S/S", "W", f"J/{unit.upper()}", "J/TOKEN", "TTFT P95 MS",
                            "TPOT P95 MS", "MEM GIB", "SOURCE", "POWER", "BOUND BY"], rows))
        used = sorted({e["source"] for e in view["gpus"] if e.get("source")}
                      | {e["sources"]["power"] for e in view["gpus"] if e.get("sources", {}).get("power")})
        lines.append("")
        lines += [f"  {k}: {view['source_kinds'][k]}" for k in used if k in view["source_kinds"]]
        lines.append("  MEM GIB: needed/usable per GPU (weights/TP + KV cache of every sequence at its mean "
                     "context, input + output/2; usable: 90 % of the memory)")
        lines.append("  BOUND BY: the latency limit that ruled out a cheaper point (-: none did)")
        lines += _stack_lines(view)

    lines += ["", "seed vs learned here (per GPU" + ("; the seeds are NOMINAL: no sourced figure)" if w.get("nominal")
                                                  else ")")]
    if not view["learned_available"]:
        lines += _learned_lines(view)
        return "\n".join(lines)
    rows = []
    for e in view["gpus"]:
        seed, got = e.get("seed"), e.get("learned")
        if got is None:
            continue
        rows.append([e["gpu"], _pair(seed, got, "prompts_per_s", ".3g"), _pair(seed, got, "power_w", ".0f"),
                     _pair(seed, got, "j_per_prompt", ".3g"), str(e["runs"]),
                     "-" if e["rel_uncertainty"] is None else f"+-{e['rel_uncertainty'] * 100:.0f}%"])
    if not rows:
        lines.append(f"no runs of {w['name']} learned yet: the planner uses the seed profiles")
    else:
        lines.append(table(["GPU", "PROMPTS/S SEED>LEARNED", "W SEED>LEARNED", "J/PROMPT SEED>LEARNED", "RUNS",
                            "+-PROMPTS/S"], rows))
        lines.append("  RUNS: completed runs folded in (0: corrected by this workload's runs on other GPU models); "
                     "+-: standard error of the median (2 runs or more)")
    return "\n".join(lines)


def _limit_text(view: dict) -> str:
    """The limits the best points meet, e.g. "TTFT p95 <= 2000 ms, TPOT p95 <= 100 ms (the
    workload's default SLOs)"; which of them are defaults, and which were asked for."""
    applied = view.get("slo_applied_text")
    if not applied:
        return "no latency limit"
    defaulted = view.get("slo_defaulted") or []
    if not defaulted:
        return applied
    names = ", ".join(SLO_LABELS[n] for n in defaulted)
    if view.get("slo_text"):
        return f"{applied}; {names}: the workload's default"
    return f"{applied}: the workload's default SLOs"


SLO_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "latency": "latency"}


def _bound(e: dict) -> str:
    """The limits that bound an entry's point, e.g. "TPOT"; "-" for none."""
    return ", ".join(SLO_LABELS[n] for n in e.get("slo_binding") or ()) or "-"


def _stack_lines(view: dict) -> list[str]:
    """The serving-stack factor each GPU model's figures run at (fitted on MLPerf results)."""
    stacks = view.get("stacks") or {}
    if not stacks:
        return []
    return ["  serving stack (divides the software-set step terms, not HBM streaming):"] + \
        [f"    {', '.join(gpus)}: {label}" for label, gpus in stacks.items()]


def _pair(seed: dict | None, learned: dict, key: str, fmt: str) -> str:
    return f"{_num(seed.get(key) if seed else None, fmt)} > {_num(learned.get(key), fmt)}"


def summary_text(view: dict) -> str:
    """`profiles` for people: J/prompt per preset and GPU model, with the runs learned here."""
    from scheduler.text_table import table

    letters = {"measured": "m", "corrected": "m", "fitted": "f", "roofline": "r", "nominal": "n",
               "roofline+correction": "r+", "fitted+correction": "f+"}
    gpus = [g["gpu"] for g in view["workloads"][0]["gpus"]] if view["workloads"] else []
    rows = []
    for item in view["workloads"]:
        w = item["workload"]
        name = w["name"] + (f" (= {w['alias_of']})" if w.get("alias_of") else "")
        if w.get("nominal"):
            name += " NOMINAL"
        cells = []
        by_gpu = {g["gpu"]: g for g in item["gpus"]}
        for g in gpus:
            e = by_gpu.get(g)
            if e is None or not e.get("fits"):
                cells.append("-")
            else:
                bound = "*" if e.get("slo_binding") else ""
                cells.append(f"{_num(e['j_per_prompt'], '.3g')} {letters.get(e['source'], '?')}{bound}")
        learned = ", ".join(f"{m} {n}" for m, n in sorted(item["learned_runs"].items()))
        rows.append([name, *cells, _short_limits(item.get("slo_applied")), learned or "-"])
    asked = f"; asked for: {view['slo_text']}" if view["slo_text"] else ""
    lines = ["J per prompt (per sample for training) at each GPU model's best operating point, as the planner "
             f"picks it: under each workload's default SLOs (LIMITS){asked} "
             "(carbonsched profiles --workload W for the point and every figure)", "",
             table(["WORKLOAD", *gpus, "LIMITS (P95)", "LEARNED RUNS"], rows), "",
             "  m measured (the fit x this GPU's measured correction), f fitted, r roofline (the fit on a GPU "
             "never measured), + with the measured correction of a GPU it dominates, n nominal "
             "(no sourced figure: training at a nominal MFU); * a latency limit ruled out a cheaper point; "
             "- no operating point fits or meets the limits"]
    lines += _stack_lines(view)
    lines += _learned_lines(view)
    return "\n".join(lines)


def _short_limits(applied: dict | None) -> str:
    """E.g. "TTFT 2000 ms, TPOT 100 ms"; "-" for none (training)."""
    if not applied:
        return "-"
    return ", ".join(f"{label} {applied[k]:g} ms" for k, label in (("ttft_p95_ms", "TTFT"), ("tpot_p95_ms", "TPOT"),
                                                                    ("latency_p95_ms", "latency"))
                     if applied.get(k) is not None) or "-"


# -- plot -------------------------------------------------------------------------------------

def plot_frontier(w, gpus: list[str], path: str, slo=None) -> None:
    """J/token against TPOT p95 per GPU model: each model's frontier (`profile_view.frontier_curve`),
    one line each, log axes; the best operating point (lowest J/prompt, under `slo` and the
    workload's default SLOs: `profile_view.planner_slo`) marked, and the TPOT limit drawn as
    a vertical line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scheduler.profile_view import Slo, frontier_curve, is_nominal, model_figures, planner_slo

    train = is_nominal(w)
    slo = slo if slo is not None else Slo()
    applied, _ = planner_slo(w, slo)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for gpu in gpus:
        curve = frontier_curve(w, gpu)
        if not curve:
            continue
        line, = ax.plot([x for x, _ in curve], [y for _, y in curve], marker="o", markersize=3, label=gpu)
        best = model_figures(w, gpu, slo)
        if best["fits"] and not train:
            ax.plot([best["tpot_p95_ms"]], [best["j_per_token"]], marker="*", markersize=12, color=line.get_color())
    if applied.tpot_p95_ms is not None:
        ax.axvline(applied.tpot_p95_ms, color="black", linestyle="--", linewidth=1,
                   label=f"TPOT p95 limit {applied.tpot_p95_ms:g} ms")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training step time, ms (nominal)" if train else "TPOT p95, ms per output token")
    ax.set_ylabel("energy per token, J/token" + (" (nominal)" if train else ""))
    title = f"carbonsched: energy vs latency frontier, {w.name} ({w.precision})"
    ax.set_title(title + (": NOMINAL, no sourced figure" if train else "") + "\n"
                 + ("" if train else "* lowest J/prompt; ") + "operating points over batch limit and TP degree",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="GPU model")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
