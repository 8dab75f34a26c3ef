"""Text tables and the PNG plot of the planner benchmark (the output layer)."""

from __future__ import annotations

from pathlib import Path

from bench.planner.run import SizeResult, Target


def _f(x: float | None, fmt: str, none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def _pct(x: float | None, fmt: str) -> str:
    """A percentage in a column as wide as `fmt` plus the sign: "-" (no figure) keeps the width."""
    return format(x, fmt) + "%" if x is not None else "-".rjust(len(format(0.0, fmt)) + 1)


def size_table(s: SizeResult) -> str:
    f = s.facts
    lines = [
        f"== {s.label}: {s.jobs} jobs, {s.gpus} GPUs ({f['nodes']} nodes, {f['gpus_busy_at_now']} busy, "
        f"{f['gpus_unhealthy']} unhealthy), {len(f['models'])} models, zones {', '.join(f['zones'])}, "
        f"from {f['now']}, load {f['load']:.2f}, {f['jobs_over_80_gib']} jobs > 80 GiB, "
        f"{f['slo_jobs']} with an SLO; compile {s.compile_s:.2f} s",
        f"{'policy':<12} {'wall s':>7} {'CPU s':>7} {'peak MB':>8} {'(+base)':>8} {'t CO2':>9} "
        f"{'vs fifo':>8} {'vs greedy':>9} {'gap LP':>8} {'misses':>6} {'viol':>5}",
    ]
    fifo, greedy = s.run("fifo"), s.run("greedy")
    for r in s.runs:
        if r.error:
            lines.append(f"{r.label:<12} FAILED: {r.error}")
            continue
        lines.append(
            f"{r.label:<12} {_f(r.wall_s, '7.2f')} {_f(r.cpu_s, '7.2f')} {_f(r.peak_rss_mb, '8.0f')} "
            f"{_f(r.peak_over_baseline_mb, '+8.0f')} {_f(r.gco2 / 1e6 if r.gco2 is not None else None, '9.4f')} "
            f"{_pct(r.vs(fifo), '+7.1f')} {_pct(r.vs(greedy), '+8.1f')} {_f(s.gap_pct(r), '+7.1f')}"
            f"{'%' if s.bound_covers(r) else '*'} "
            f"{r.deadline_misses:>6} {len(r.violations):>5}")
    lp = s.lp
    state = "converged" if lp["converged"] else f"DID NOT CONVERGE ({lp['status']}); best Lagrangian bound"
    lines.append(f"{'LP bound':<12} {lp['wall_s']:7.1f} {'':>7} {'':>8} {'':>8} {lp['bound_g'] / 1e6:9.4f}   "
                 f"{state}; {lp['rounds']} rounds, {lp['columns']} columns")
    if "rounded_plan_g" in lp:
        lines.append(f"{'LP rounded':<12} {'':>7} {'':>7} {'':>8} {'':>8} {lp['rounded_plan_g'] / 1e6:9.4f}   "
                     f"a feasible plan from the LP ({lp['rounded_plan_placed']} of {s.jobs} jobs placed)")
    if "mip" in lp and "skipped" in lp["mip"]:
        lines.append(f"{'MIP bound':<12} skipped: {lp['mip']['skipped']}")
    elif "mip" in lp:
        mip = lp["mip"]
        best = "none" if mip["best_g"] is None else f"{mip['best_g'] / 1e6:.4f} t"
        lines.append(f"{'MIP bound':<12} {mip['wall_s']:7.1f} {'':>7} {'':>8} {'':>8} {mip['bound_g'] / 1e6:9.4f}   "
                     f"proven by {mip['solver']} ({mip['status']}; best integer plan {best}): "
                     + ("the integer model's optimum is at least this" if mip["bound_g"] >= lp["bound_g"] else
                        "weaker than the LP bound (SCIP's root LP did not finish in time: give it more)"))
    for b, other in sorted(lp.get("by_late_budget", {}).items()):
        if b != lp.get("late_budget", 0):
            state_b = "converged" if other["converged"] else f"DID NOT CONVERGE ({other['status']})"
            lines.append(f"{f'LP, {b} late':<12} {other['wall_s']:7.1f} {'':>7} {'':>8} {'':>8} "
                         f"{other['bound_g'] / 1e6:9.4f}   {state_b}; the bound of plans with {b} unforced misses")
    if len(lp.get("by_late_budget", {})) > 1:
        lines.append("  each plan's gap is to the LP with as many late jobs allowed as it has unforced misses")
    for note in lp["notes"]:
        lines.append(f"  LP: {note}")
    uncovered = [r.label for r in s.runs if not r.error and not s.bound_covers(r)]
    if uncovered:
        lines.append(f"  * {', '.join(uncovered)}: more unforced deadline misses than the bound allows "
                     f"({s.lp.get('late_budget', 0)}), so not bounded by it: the gap is for information only")
    if s.forced_misses:
        lines.append(f"  {s.forced_misses} jobs no plan can start in time (no window, or running jobs hold the GPUs "
                     "they need until after it): forced misses")
    return "\n".join(lines)


def targets_table(targets: list[Target]) -> str:
    lines = ["== targets"]
    for t in targets:
        value = "-" if t.value is None else f"{t.value:.2f}"
        lines.append(f"{'PASS' if t.passed else 'FAIL'}  {t.size:<10} {t.what:<40} {value:>9} {t.unit} "
                     f"(target {t.limit:g}){'  ' + t.note if t.note else ''}")
    return "\n".join(lines)


def replan_table(label: str, rows: list[dict], bounds: dict[int, float], forced: int, greedy_g: float | None) -> str:
    """One line per tick; each schedule's gap is to the LP allowing as many late jobs as it
    misses deadlines beyond the `forced` misses (`bounds`: late budget -> bound), `*` when
    the single-shot runs solved no such LP (then the smallest budget's, for information)."""
    lines = [f"== re-planning every 15 min, {label}",
             f"{'tick':>4} {'started':>7} {'replanned':>9} {'wall s':>7} {'t CO2':>9} {'vs greedy':>9} "
             f"{'gap LP':>7} {'misses':>6} {'viol':>5}"]
    for r in rows:
        vs = None if not greedy_g else 100 * (r["gco2"] - greedy_g) / greedy_g
        budget = max(0, r["deadline_misses"] - forced)
        bound_g = bounds.get(budget, bounds[min(bounds)] if bounds else None)
        gap = None if not bound_g else 100 * (r["gco2"] - bound_g) / bound_g
        mark = "*" if bounds and budget not in bounds else " "
        lines.append(f"{r['tick']:>4} {r['started']:>7} {r['replanned']:>9} {r['wall_s']:7.1f} "
                     f"{r['gco2'] / 1e6:9.4f} {_pct(vs, '+8.1f')} {_pct(gap, '+6.1f')}{mark}{r['deadline_misses']:>5} "
                     f"{r['violations']:>5}")
    return "\n".join(lines)


def plot(sizes: list[SizeResult], path: Path) -> None:
    """gCO2 per policy, one panel per size, with the LP bound as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 4.2), squeeze=False)
    for ax, s in zip(axes[0], sizes):
        runs = [r for r in s.runs if r.gco2 is not None]
        labels = [r.label for r in runs]
        values = [r.gco2 / 1e6 for r in runs]
        bars = ax.bar(labels, values, color=["#999999", "#4c72b0", "#55a868", "#2f7d4a"][:len(runs)])
        bound = s.lp.get("bound_g")
        if bound:
            ax.axhline(bound / 1e6, color="#c44e52", linestyle="--",
                       label="LP bound" + ("" if s.lp["converged"] else " (not converged)"))
            for b, r in zip(bars, runs):
                ax.annotate(f"+{s.gap_pct(r):.0f}%", (b.get_x() + b.get_width() / 2, b.get_height()),
                            ha="center", va="bottom", fontsize=8)
            ax.legend(loc="lower right", fontsize=8)
        ax.set_title(f"{s.jobs} jobs, {s.gpus} GPUs")
        ax.set_ylabel("t CO2 (whole queue)")
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle("carbonsched planner benchmark: gCO2 by policy vs the LP lower bound")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
