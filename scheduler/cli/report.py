"""`carbonsched report` and `carbonsched export`: fleet carbon reports and the energy
disclosure document; and the carbon receipt that `carbonsched show JOB` appends.

    carbonsched report [--since T] [--until T] [--by user|account|workload|model|zone|day|node]
                       [--format table|csv|json] [--json] [--plot FILE.png] [--db URL]
    carbonsched export [--since T] [--until T | --period P] [--by system|account] [--format json|csv]
                       [--out FILE] [--db URL]

`export --by account` is a statement per account: its usage in every currency and what it is
charged (times the QOS usage factors); `--period` names a month (2026-11), a quarter
(2026-Q4) or a date range (2026-11-01..2026-12-31).

T is an ISO date/time (UTC when it has no offset) or a duration back from now (`7d`); the
default period is the last 30 days. Both verbs ask the daemon, which shows a user only
their own jobs and root or an admin group everyone's, exactly like `queue`. With `--db URL`
an operator reads the store directly instead (whoever can read the database sees every
job). Only the standard library is imported at module level.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from datetime import datetime, timezone

from scheduler.cli.common import EXIT_USAGE, CliError, api_client, register
from scheduler.text_table import significant, small_grams

GROUPINGS = ("user", "account", "workload", "model", "zone", "day", "node")


def add_parser(subparsers) -> None:
    """Add the `report` and `export` verbs; registers their handlers in scheduler.cli.common.VERBS."""
    r = subparsers.add_parser(
        "report", help="fleet energy, CO2, cost and savings over a period, grouped",
        description="Jobs that ended in the period: GPU-hours, kWh, kgCO2, gCO2/prompt, tokens/J, "
                    "$ (GPU list price amortized + energy) and savings against running at once.")
    r.add_argument("--since", metavar="T", help="start: ISO date/time or a duration back from now, e.g. 7d "
                                                "(default 30d)")
    r.add_argument("--until", metavar="T", help="end (default now)")
    r.add_argument("--by", choices=GROUPINGS, default="user", help="group by (default user)")
    r.add_argument("--format", dest="fmt", choices=("table", "csv", "json"), default="table")
    r.add_argument("--json", action="store_true", help="same as --format json")
    r.add_argument("--plot", metavar="FILE.png", help="also draw the daily emissions and intensity")
    r.add_argument("--db", help="read this database directly instead of asking the daemon (operators)")

    e = subparsers.add_parser(
        "export", help="energy and emissions disclosure document for a period (JSON or CSV)",
        description="Energy (IT and facility) and emissions per system (node, GPU model, zone) with the "
                    "methodology: measurement methods, signal, PUE, data sources and licences.")
    e.add_argument("--since", metavar="T", help="start: ISO date/time or a duration back from now (default 30d)")
    e.add_argument("--until", metavar="T", help="end (default now)")
    e.add_argument("--period", metavar="P", help="instead of --since/--until: a month (2026-11), a quarter "
                                                 "(2026-Q4) or a date range (2026-11-01..2026-12-31), UTC")
    e.add_argument("--by", choices=("system", "account"), default="system",
                   help="system: the disclosure document (default); account: each account's statement, its "
                        "usage and what it is charged (x QOS usage factor)")
    e.add_argument("--format", dest="fmt", choices=("json", "csv"), default="json")
    e.add_argument("--out", metavar="FILE", help="write here instead of standard output")
    e.add_argument("--db", help="read this database directly instead of asking the daemon (operators)")

    register("report", cmd_report)
    register("export", cmd_export)


# -- getting the data -------------------------------------------------------------------------

class _Site:
    """The config file's PUE per node's site (scheduler.site.SiteConfig), parsed on first use:
    a report over jobs already priced never needs it."""

    def __init__(self, config: dict) -> None:
        self._config = config
        self._site = None

    def pue(self, zone: str | None, node: str | None = None) -> float:
        if self._site is None:
            from scheduler.site import SiteConfig

            self._site = SiteConfig.from_config(self._config)
        return self._site.pue(zone, node)


def _direct(args, config: dict):
    """An Accountant over the store named by --db, configured like the daemon."""
    from scheduler.accounting.accountant import Accountant
    from scheduler.accounting.config import AccountingConfig
    from scheduler.cli.common import open_existing_store

    store = open_existing_store(args.db)
    from scheduler.qos import qos_table

    return store, Accountant(store, site=_Site(config), carbon_config=config,
                             config=AccountingConfig.from_config(config),
                             usage_factors=qos_table(config).usage_factors())


def _period(args) -> None:
    """`--period P` as --since/--until (refused beside them, or malformed: one line, exit 2)."""
    if not getattr(args, "period", None):
        return
    if args.since or args.until:
        raise CliError("give --period or --since/--until, not both", EXIT_USAGE)
    from scheduler.budgets import BudgetError, named_period

    try:
        start, end = named_period(args.period)
    except BudgetError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    args.since, args.until = start.isoformat(), end.isoformat()


def _fetch(args, config: dict, what: str, by: str | None = None) -> dict:
    _period(args)
    query = {k: v for k, v in (("since", args.since), ("until", args.until), ("by", by)) if v}
    if args.db:
        from scheduler.accounting.reports import parse_period

        store, acc = _direct(args, config)
        try:
            since, until = parse_period(args.since, args.until, datetime.now(timezone.utc))
            if what == "report":
                return acc.report(since, until, by=by or "user")
            return acc.statement(since, until) if by == "account" else acc.export(since, until)
        except ValueError as e:
            raise CliError(str(e), EXIT_USAGE) from None
        finally:
            store.dispose()

    return api_client(args, config).request("GET", f"/{what}", query=query)


# -- report -----------------------------------------------------------------------------------

def _check_plot_path(path: str) -> None:
    """Refuse a plot path that cannot be written before anything is printed (issue 28)."""
    import os

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(f"--plot {path}: no directory {folder}", EXIT_USAGE)
    if not os.access(folder, os.W_OK):
        raise CliError(f"--plot {path}: cannot write into {folder}", EXIT_USAGE)
    if not path.lower().endswith((".png", ".svg", ".pdf")):
        raise CliError(f"--plot {path}: give a .png, .svg or .pdf file", EXIT_USAGE)


def cmd_report(args, config: dict) -> int:
    fmt = "json" if args.json else args.fmt
    if args.plot:
        _check_plot_path(args.plot)
    data = _fetch(args, config, "report", args.by)
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif fmt == "csv":
        sys.stdout.write(report_csv(data))
    else:
        print(report_table(data))
        if args.by == "account" and data["groups"]:
            print(charged_table(data))
    if args.plot:
        daily = data if args.by == "day" else _fetch(args, config, "report", "day")
        plot_daily(daily, args.plot)
        if fmt == "table":
            print(f"plot: {args.plot}")
    return 0


FIGURES = ("jobs", "completed", "deadline_misses", "gpu_hours", "energy_kwh", "facility_energy_kwh", "kgco2",
           "intensity_g_per_kwh", "gco2_per_prompt", "prompts", "tokens", "tokens_per_j", "usd", "usd_per_mtok",
           "counterfactual_kgco2", "saving_kgco2", "saving_pct", "jobs_measured", "jobs_with_gco2",
           "jobs_modelled", "modelled_energy_kwh", "embodied_kgco2e", "embodied_gpu_kgco2e", "embodied_host_kgco2e",
           "embodied_unknown_gpu_hours", "sci_gco2_per_prompt", "sci_operational_gco2_per_prompt",
           "sci_embodied_gco2_per_prompt")


def _num(v, fmt: str) -> str:
    """`v` in `fmt`; a "g" format never turns into exponent notation (`significant`: a
    demo's 0.0000482 kg saved printed as 4.82e-05)."""
    if v is None:
        return "-"
    if fmt.startswith(".") and fmt.endswith("g"):
        return significant(v, int(fmt[1:-1]))
    return format(v, fmt)


def report_table(data: dict) -> str:
    from policies.pricing.counterfactual import RULE_SHORT
    from scheduler.cli.output import local_time
    from scheduler.text_table import table

    tokens = any(g.get("tokens") for g in data["groups"])
    sci = any(g.get("sci_gco2_per_prompt") is not None for g in [*data["groups"], data["total"]])
    headers = [data["by"].upper(), "JOBS", "GPU-H", "KWH", "KGCO2", "G/KWH", "GCO2/PROMPT", "EMBODIED KG"]
    if sci:
        headers.append("SCI G/PROMPT")
    if tokens:
        headers += ["TOK/J", "$/MTOK"]
    headers += ["USD", "SAVED KGCO2"]

    def row(name: str, g: dict) -> list[str]:
        kwh = _num(g["energy_kwh"], ".4g") + ("*" if g.get("jobs_modelled") else "")
        cells = [name, str(g["jobs"]), _num(g["gpu_hours"], ".4g"), kwh,
                 _num(g["kgco2"], ".4g"), _num(g["intensity_g_per_kwh"], ".0f"), _num(g["gco2_per_prompt"], ".3g"),
                 _num(g.get("embodied_kgco2e"), ".4g") + ("+?" if g.get("embodied_unknown_gpu_hours")
                                                           and g.get("embodied_kgco2e") is not None else "")]
        if sci:
            cells.append(_num(g.get("sci_gco2_per_prompt"), ".3g"))
        if tokens:
            cells += [_num(g["tokens_per_j"], ".3g"), _num(g["usd_per_mtok"], ".3g")]
        saved = "-" if g["saving_kgco2"] is None else (
            _num(g["saving_kgco2"], ".3g") + (f" ({g['saving_pct']:.0f}%)" if g["saving_pct"] is not None else ""))
        return cells + [_num(g["usd"], ".4g"), saved]

    rows = [row("-" if g["group"] is None else str(g["group"]), g) for g in data["groups"]]
    rows.append(row("TOTAL", data["total"]))
    a = data["assumptions"]
    lines = [f"carbon report {local_time(data['since'], True)} .. {local_time(data['until'], True)}, "
             f"by {data['by']} ({data['scope']})", "",
             table(headers, rows) if data["groups"] else "no jobs ended in this period", ""]
    lines.append(f"$: GPU list price over {a['gpu_lifetime_years']:g} years + energy x PUE at "
                 f"${a['energy_price_usd_per_kwh']:g}/kWh"
                 + (" (zone prices: " + ", ".join(f"{z} ${p:g}" for z, p in a["zone_energy_price_usd_per_kwh"].items())
                    + ")" if a["zone_energy_price_usd_per_kwh"] else "")
                 + "; saved: against " + RULE_SHORT + " (measured gCO2 x the plan's if-now / chosen estimates)")
    total = data["total"]
    lines.append(embodied_note(total, sci))
    if total.get("jobs_modelled"):
        lines.append(f"*: MODELLED, not measured: {total['jobs_modelled']} of {total['jobs']} job(s) ran on "
                     f"emulated GPUs; their energy ({significant(total['modelled_energy_kwh'], 4)} kWh) and gCO2 come from "
                     "the emulator's power model")
    sources = {k: total.get(k) for k in ("prompts_source", "tokens_source")}
    if any(v and v != "reported" for v in sources.values()):
        lines.append("GCO2/PROMPT, TOK/J, $/MTOK: prompts " + (sources["prompts_source"] or "-") + ", tokens "
                     + (sources["tokens_source"] or "-") + " (reported: by the jobs' metrics files; declared: "
                     "at submit)")
    mixed = [g for g in [*data["groups"], total] if g.get("signal") == "mixed"]
    if mixed:
        parts = "; ".join(("TOTAL" if g is total else str(g["group"])) + ": " + ", ".join(
            f"{_num(v['kgco2'], '.4g')} kg at {_num(v['intensity_g_per_kwh'], '.0f')} g/kWh ({sig})"
            for sig, v in g["by_signal"].items()) for g in mixed)
        lines.append("KGCO2 by signal where average and marginal grams meet (never added): " + parts)
    if data["jobs_without_gco2"]:
        why = "; ".join(f"{u['jobs']} in {u['zone'] or 'no zone'}: {u['why']}" for u in data.get("unpriced") or [])
        lines.append(f"{data['jobs_without_gco2']} job(s) are unpriced, left out of KGCO2 and savings "
                     f"('-': unknown, not zero)" + (f": {why}" if why else
                                                    " (not measured, or no intensity data for their run)"))
    return "\n".join(lines)


def charged_table(data: dict) -> str:
    """`report --by account`: what each account is charged, its usage times the QOS factors."""
    from scheduler.text_table import table

    rows = []
    for g in data["groups"]:
        c = g.get("charged") or {}
        kg = c.get("kgco2e")
        rows.append([str(g["group"]), _num(c.get("gpu_hours"), ".4g"), _num(c.get("energy_kwh"), ".4g"),
                     _num(kg, ".4g") if kg is not None or not c.get("kgco2e_by_signal") else
                     ", ".join(f"{_num(v, '.4g')} ({s})" for s, v in c["kgco2e_by_signal"].items()),
                     _num(c.get("embodied_kgco2e"), ".4g")])
    factors = ", ".join(f"{q} x{f:g}" for q, f in (data.get("usage_factors") or {}).items())
    return ("\ncharged (usage x QOS usage factor" + (f": {factors}" if factors else "") + ")\n"
            + table(["ACCOUNT", "GPU-H", "KWH", "KGCO2", "EMBODIED KG"], rows))


def embodied_note(total: dict, sci: bool) -> str:
    """The report's line on embodied carbon: what the column is, that KGCO2 leaves it out,
    and the GPU-hours without a figure."""
    unknown = total.get("embodied_unknown_gpu_hours") or 0.0
    return ("KGCO2: operational (energy x grid intensity x PUE); EMBODIED KG: the GPU-hours' share of making the "
            "GPUs (and host, where a figure exists; see `export` for each figure's source), never added to KGCO2"
            + (f"; the embodied carbon of {significant(unknown, 4)} GPU-h on models without a figure is unknown, "
               "not zero ('-', or '+?' after a partial sum)" if unknown else "")
            + ("; SCI G/PROMPT: operational + embodied per prompt, the one figure adding both" if sci else ""))


def report_csv(data: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([data["by"], *FIGURES])
    for g in [*data["groups"], {**data["total"], "group": "TOTAL"}]:
        w.writerow(["" if g["group"] is None else g["group"], *("" if g.get(k) is None else g[k] for k in FIGURES)])
    return buf.getvalue()


def plot_daily(data: dict, path: str) -> None:
    """Draw `daily_figure` into `path` (PNG)."""
    import matplotlib.pyplot as plt

    fig = daily_figure(data)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def daily_figure(data: dict):
    """Bars of the fleet's kgCO2 per day and a line of its mean intensity (g/kWh), over the
    report's period (in the title). A day whose energy is partly modelled (not measured) has
    a hatched bar; an unpriced day is a gap, never a zero bar. The legend sits below the
    axes, where it hides no bar or point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    days = [g for g in data["groups"] if g["group"] is not None]
    fig, ax = plt.subplots(figsize=(9, 4.6))
    x = list(range(len(days)))
    bars = ax.bar(x, [g["kgco2"] if g["kgco2"] is not None else float("nan") for g in days], color="#5b8c5a")
    modelled = [bool(g.get("jobs_modelled")) for g in days]
    for bar, is_modelled in zip(bars, modelled):
        if is_modelled:
            bar.set_hatch("///")
            bar.set_edgecolor("#2f4f2f")
    ax.set_ylim(bottom=0)
    if not any(g["kgco2"] is not None for g in days):
        ax.text(0.5, 0.5, "no priced emissions in this period" + (
            f" ({data['jobs_without_gco2']} unpriced job(s))" if data.get("jobs_without_gco2") else ""),
            transform=ax.transAxes, ha="center", va="center")
    ax.set_ylabel("kgCO2 per day")
    ax.set_xticks(x, [g["group"] for g in days], rotation=45, ha="right", fontsize=8)
    ax2 = ax.twinx()
    intensity = [g["intensity_g_per_kwh"] if g["intensity_g_per_kwh"] is not None else float("nan") for g in days]
    line, = ax2.plot(x, intensity, color="#c0504d", marker="o")
    ax2.set_ylabel("mean intensity, gCO2/kWh")
    known = [v for v in intensity if v == v]
    ax2.set_ylim(0, max(known) * 1.15 if known and max(known) > 0 else 1.0)
    period = f"{data['since'][:16]} to {data['until'][:16]} UTC" if data.get("since") else ""
    ax.set_title(f"carbonsched: daily emissions and intensity ({data['scope']})\n{period}", fontsize=10)
    handles = [Patch(color="#5b8c5a", label="kgCO2 (measured energy)"), line]
    labels = ["kgCO2 (measured energy)", "mean intensity, gCO2/kWh"]
    if any(modelled):
        handles.append(Patch(facecolor="#5b8c5a", edgecolor="#2f4f2f", hatch="///"))
        labels.append("kgCO2, energy partly modelled")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    return fig


# -- export -----------------------------------------------------------------------------------

EXPORT_COLUMNS = ("period_start", "period_end", "node", "gpu_model", "zone", "jobs", "gpu_hours", "it_energy_kwh",
                  "facility_energy_kwh", "emissions_kgco2e", "emissions_kgco2e_average", "emissions_kgco2e_marginal",
                  "intensity_g_per_kwh", "pue", "signal",
                  "measurement_shares", "intensity_basis_shares", "jobs_without_measurement",
                  "jobs_without_emissions", "energy", "jobs_modelled", "modelled_energy_kwh", "prompts",
                  "prompts_source", "gco2_per_prompt", "tokens", "tokens_source", "gco2_per_1k_tokens",
                  "tokens_per_j", "usd_per_mtok", "embodied_kgco2e", "embodied_gpu_kgco2e", "embodied_host_kgco2e",
                  "embodied_unknown_gpu_hours", "embodied_basis", "sci_gco2_per_prompt",
                  "sci_operational_gco2_per_prompt", "sci_embodied_gco2_per_prompt",
                  "data_sources", "generated_at", "generator")


def export_csv(doc: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(EXPORT_COLUMNS)
    sources = ";".join(f"{s['source']} ({s['licence']})" for s in doc["methodology"]["data_sources"])
    for s in doc["systems"]:
        cells = {
            **s, "period_start": doc["period"]["start"], "period_end": doc["period"]["end"],
            "pue": ";".join(f"{p:g}" for p in s["pue"]), "signal": ";".join(s["signal"]),
            **{f"emissions_kgco2e_{sig}": kg for sig, kg in s.get("emissions_kgco2e_by_signal", {}).items()},
            "measurement_shares": ";".join(f"{k}={v:.4f}" for k, v in s["measurement_shares"].items()),
            "intensity_basis_shares": ";".join(f"{k}={v:.4f}" for k, v in s["intensity_basis_shares"].items()),
            "data_sources": sources, "generated_at": doc["generated_at"],
            "generator": f"{doc['generator']['name']} {doc['generator']['version']}",
        }
        w.writerow(["" if cells.get(c) is None else cells[c] for c in EXPORT_COLUMNS])
    return buf.getvalue()


def statement_csv(doc: dict) -> str:
    """`export --by account --format csv`: one row per account."""
    from scheduler.accounting.statements import statement_csv_rows

    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(statement_csv_rows(doc))
    return buf.getvalue()


def cmd_export(args, config: dict) -> int:
    by_account = args.by == "account"
    doc = _fetch(args, config, "export", "account" if by_account else None)
    if args.fmt == "json":
        text = json.dumps(doc, indent=2) + "\n"
    else:
        text = statement_csv(doc) if by_account else export_csv(doc)
    if not args.out:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise CliError(f"--out {args.out}: {e.strerror}") from None
    if by_account:
        print(f"wrote {args.out}: {len(doc['accounts'])} account(s)", file=sys.stderr)
        return 0
    kg = ", ".join(f"{v:.3f} kgCO2e ({sig} signal)" for sig, v in
                   doc["totals"].get("emissions_kgco2e_by_signal", {}).items() if v is not None) \
        or "emissions unknown"
    unpriced = doc["totals"].get("jobs_without_emissions")
    print(f"wrote {args.out}: {len(doc['systems'])} system(s), {doc['totals']['it_energy_kwh']:.3f} kWh, "
          f"{kg}" + (f" ({unpriced} job(s) unpriced)" if unpriced else ""), file=sys.stderr)
    return 0


# -- the receipt under `show` -----------------------------------------------------------------

def fetch_receipt(client, job_id: int) -> dict | None:
    """The job's carbon receipt from the daemon; None from a daemon without receipts."""
    from scheduler.cli.client import ApiError

    try:
        return client.request("GET", "/receipt", query={"job": str(job_id)})
    except ApiError as e:
        if e.status == 404 and "unknown API call" in str(e.message):
            return None
        raise


def _g(v: float | None) -> str:
    """Grams at a precision that says something: kg from 10 kg, µg under a milligram (a
    prompt's share of a small job: 0.623 µg, not 0.000000623 g)."""
    if v is None:
        return "-"
    if abs(v) >= 10_000:
        return f"{v / 1000:.3f} kg"
    return f"{v:.2f} g" if abs(v) >= 1 else small_grams(v)


def usd(v: float) -> str:
    """Dollars: cents from a cent up, three significant digits below ($0.000312, not $0.0003)."""
    return f"${v:,.2f}" if abs(v) >= 0.01 or v == 0 else f"${significant(v)}"


def embodied_lines(r: dict) -> list[tuple[str, str]]:
    """The receipt's embodied carbon (its own line, never added into gCO2) and, where the job
    counts prompts, the SCI-style total per prompt with both its parts."""
    e = r.get("embodied")
    if not e:
        return []
    if e["gco2"] is None:
        why = e["gpu_source"] if e["gpu_basis"] == "unknown" else "the run's GPU-hours are not known"
        lines = [("embodied", f"unknown, not zero ({why})")]
    else:
        host = (f" + host {_g(e['host_gco2'])} ({e['host_basis']})" if e["host_included"]
                else " (host share unknown, not included)")
        lines = [("embodied", f"{_g(e['gco2'])} = GPU {_g(e['gpu_gco2'])} ({e['gpu_basis']}){host}: "
                              f"{significant(e['gpu_hours'])} GPU-h of {r['gpu_model']} over a "
                              f"{e['lifetime_years']:g}-year life; not added to gCO2")]
    sci = r.get("sci")
    if sci:
        lines.append(("SCI per prompt", f"{_g(sci['gco2_per_prompt'])} = operational {_g(sci['operational_gco2_per_prompt'])}"
                                        f" ({sci['signal'] or '-'}) + embodied {_g(sci['embodied_gco2_per_prompt'])}"))
    return lines


def receipt_text(r: dict) -> str:
    """The receipt as lines for people (times local)."""
    from scheduler.cli.output import local_time, power_limit_text
    from scheduler.timeparse import format_duration

    m = r["measurement"]
    energy = "-" if r["energy_j"] is None else f"{r['energy_j']:,.0f} J = {significant(r['energy_kwh'])} kWh"
    basis = r.get("intensity_basis")
    intensity = "-" if r["intensity_g_per_kwh"] is None else f"{r['intensity_g_per_kwh']:.0f} gCO2/kWh"
    lines = [
        ("energy", f"{energy} ({m['description']})"),
        ("gCO2", _g(r["gco2"]) + (f" = energy x {intensity} x PUE {r['pue']:g}" if r["gco2"] is not None else
                                   f" (unknown, not zero: no intensity data for zone {r['zone'] or '-'} over the "
                                   "run yet; `carbonsched carbon zones` lists the zones with data)"
                                   if r["energy_j"] is not None else "")),
        ("signal", f"{r['signal'] or '-'} intensity of {r['zone'] or '-'}"
                   + (f" from {', '.join(r['intensity_sources'])}" if r["intensity_sources"] else "")
                   + (f"; basis {basis}" if basis else "")
                   + (f", {r['weighting']}-weighted" if r.get("weighting") else "")),
    ]
    others = {sig: g for sig, g in (r.get("operational_gco2_by_signal") or {}).items()
              if sig != r["signal"] and g is not None}
    for sig, g in others.items():
        lines.append((f"{sig} signal", f"{_g(g)} (the same run at {r['zone']}'s recorded {sig} intensity; "
                                       "a different quantity, never added to gCO2)"))
    for gap in r["intensity_gaps"]:
        lines.append(("gap", f"{local_time(gap['start'], True)} .. {local_time(gap['end'], True)} "
                             + ("priced at the static yearly mean" if gap["filled_by"] == "static" else "unpriced")))
    if r["gco2_per_prompt"] is not None:
        lines.append(("per prompt", _g(r["gco2_per_prompt"])
                      + f" ({r['prompts']:,} prompts, {r.get('prompts_source') or 'declared'})"))
    if r["gco2_per_1k_tokens"] is not None:
        lines.append(("per 1k tokens", _g(r["gco2_per_1k_tokens"])
                      + f" ({r['tokens']:,} output tokens, {r.get('tokens_source') or 'declared'})"
                      + (f"; {significant(r['tokens_per_j'])} tokens/J" if r["tokens_per_j"] else "")
                      + (f"; ${significant(r['usd_per_mtok'])}/Mtok" if r.get("usd_per_mtok") else "")))
    lines += embodied_lines(r)
    cf = r["counterfactual"]
    scaled = cf["gco2"] is not None and cf.get("estimate_gco2") is not None and cf["gco2"] != cf["estimate_gco2"]
    lines.append(("if run at once", _g(cf["gco2"]) + (
        f" ({'modelled' if m.get('modelled') else 'measured'}, scaled by the plan's estimates: the job "
        "alone at submission on the earliest free, fastest GPUs vs its plan)" if scaled
        else " (plan estimate: the job alone at submission on the earliest free, fastest GPUs)"
        if cf["gco2"] is not None else "")))
    if r["saving_gco2"] is not None:
        lines.append(("saved", _g(r["saving_gco2"]) + (f" ({r['saving_pct']:.0f}%)" if r["saving_pct"] is not None
                                                       else "")))
    if r.get("gco2_if_started_at_submit") is not None:
        lines.append(("at submit time", _g(r["gco2_if_started_at_submit"])
                      + " (this energy at the recorded intensity of the submission time)"))
    if r.get("cost_usd") is not None:
        lines.append(("cost", f"{usd(r['cost_usd'])} (GPU amortization + energy)"))
    point = r.get("operating_point")
    lines += [
        ("ran on", f"{r['gpus'] or '-'} x {r['gpu_model'] or '-'} on {r['node'] or '-'} ({r['zone'] or '-'})"),
        *([("operating point", f"batch {point['max_batch']} {str(point['precision']).upper()} TP{point['tp']}"
            + (f" ({point['why']})" if point.get("why") else ""))] if point else []),
        *([("power limit", power_limit_text(
            r["power_limit"]["planned_w"], r["power_limit"]["applied_w"], r["power_limit"]["note"],
            r["power_limit"]["estimate_uncapped"]["gco2"], r["power_limit"]["estimate_capped"]["gco2"]))]
          if r.get("power_limit") else []),
        ("waited", format_duration(r["wait_s"]) + f", ran {format_duration(r['runtime_s'])}"),
        ("deadline", "none" if r["deadline"] is None else
         f"{local_time(r['deadline'], True)}: " + (
             "met" if r["deadline_met"] else
             f"not met (the job ended {r['state']})" if r.get("state") not in (None, "COMPLETED") else "MISSED")),
    ]
    width = max(len(k) for k, _ in lines)
    return "carbon receipt:\n" + "\n".join(f"  {k.rjust(width)}: {v}" for k, v in lines)
