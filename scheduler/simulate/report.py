"""The simulation report: a side-by-side table, a JSON file, a CSV per job and PNG plots.

Files written to the output folder:

- `report.json`: {"policies": {NAME: metrics}, "comparison": {NAME: savings}, "scenario": ...}
- `jobs-<policy>.csv`: one row per job (times ISO 8601 UTC; the policy's label made portable,
  `file_stem`).
- `emissions.png`: cumulative kgCO2 over time per policy, over each zone's actual intensity.
- `gpu_usage.png`: GPU-hours by GPU model per policy (every model of the cluster, used or not).
- `waits.png`: the distribution (CDF) of waits per policy.
"""

from __future__ import annotations

import csv
import json
import logging
from datetime import datetime, timezone
from pathlib import Path

from policies.types import J_PER_KWH
from scheduler.simulate.intensity import HOUR_S
from scheduler.simulate.records import PolicyRun

log = logging.getLogger(__name__)

JOB_COLUMNS = ("id", "name", "submitted_at", "start", "end", "wait_s", "node", "zone", "model", "gpus",
               "gpu_ids", "runtime_s", "power_w", "pue", "energy_j", "gco2", "est_gco2", "prompts", "workload",
               "deadline", "late_s", "attempts", "state", "explanation")


def _iso(t: float | None) -> str:
    return "" if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat()


def write_jobs_csv(run: PolicyRun, path: Path, names: dict[int, str]) -> None:
    """One row per job of one policy's run."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(JOB_COLUMNS)
        for r in run.records:
            j = r.job
            late = (max(0.0, r.end_s - r.deadline_s) if r.end_s is not None and r.deadline_s is not None else "")
            w.writerow([j.id, names.get(j.id, ""), _iso(r.arrival_s), _iso(r.start_s), _iso(r.end_s),
                        "" if r.start_s is None else round(r.start_s - r.arrival_s, 3), r.node or "",
                        r.zone or "", r.model or "", j.gpus, " ".join(map(str, r.gpu_ids)),
                        repr(r.runtime_s), repr(r.power_w), r.pue,
                        repr(r.energy_j), repr(r.gco2), "" if r.est_gco2 is None else round(r.est_gco2, 3),
                        j.prompts or "", j.workload or "", _iso(r.deadline_s), late, r.attempts, r.state,
                        r.explanation])


def cumulative_emissions(run: PolicyRun, grid_s: list[float]) -> list[float]:
    """Cumulative kgCO2 of a run at each time of `grid_s` (sorted), from its zone meters."""
    total = [0.0] * len(grid_s)
    for meter in run.meters.values():
        timeline = meter.timeline
        if not timeline:
            continue
        k = 0
        power = 0.0
        last = timeline[0][0]
        acc = 0.0
        for gi, t in enumerate(grid_s):
            while k < len(timeline) and timeline[k][0] <= t:
                at, _, p = timeline[k]  # facility power (GPU power x each job's PUE)
                acc += power * meter.intensity.integral_g_per_kwh_s(last, at) / J_PER_KWH
                power, last = p, at
                k += 1
            if t > last:
                acc += power * meter.intensity.integral_g_per_kwh_s(last, t) / J_PER_KWH
                last = t
            total[gi] += acc / 1000.0
    return total


def gpu_hours_by_model(runs: dict[str, PolicyRun], models: tuple[str, ...] = ()) -> dict[str, dict[str, float]]:
    """GPU-hours of finished work per policy and GPU model: every model of the cluster
    (`models`), a model a policy never used at zero rather than left out."""
    every = sorted(set(models) | {r.model for run in runs.values() for r in run.records if r.model})
    return {name: {m: sum(len(r.gpu_ids) * r.runtime_s for r in run.records if r.model == m and r.state == "done")
                   / 3600.0 for m in every} for name, run in runs.items()}


def write_plots(runs: dict[str, PolicyRun], out: Path, models: tuple[str, ...] = ()) -> list[Path]:
    """emissions.png, gpu_usage.png, waits.png (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files: list[Path] = []
    first = next(iter(runs.values()))
    start = min(r.start_s for r in runs.values())
    end = max(r.end_s for r in runs.values())
    step = HOUR_S if end - start <= 60 * 86400 else 6 * HOUR_S
    grid = [start + i * step for i in range(int((end - start) // step) + 2)]
    when = [datetime.fromtimestamp(t, timezone.utc) for t in grid]

    fig, ax = plt.subplots(figsize=(11, 5))
    ax2 = ax.twinx()
    for zone, meter in sorted(first.meters.items()):
        ax2.step(when, [meter.intensity.value_at(t) for t in grid], where="post", alpha=0.25, linewidth=1,
                 label=f"{zone} intensity")
    for name, run in runs.items():
        ax.plot(when, cumulative_emissions(run, grid), linewidth=2, label=name)
    ax.set_ylabel("cumulative emissions (kgCO2)")
    ax2.set_ylabel("actual carbon intensity (gCO2/kWh)")
    ax.set_xlabel("time (UTC)")
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    ax.set_title("Cumulative emissions per policy over carbon intensity")
    fig.autofmt_xdate()
    fig.tight_layout()
    files.append(out / "emissions.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    usage = gpu_hours_by_model(runs, models)
    models = sorted(next(iter(usage.values()), {}))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(models) * len(runs)), 4.5))
    width = 0.8 / max(1, len(runs))
    for i, (name, hours) in enumerate(usage.items()):
        ax.bar([x + i * width for x in range(len(models))], [hours[m] for m in models], width=width, label=name)
    ax.set_xticks([x + width * (len(runs) - 1) / 2 for x in range(len(models))], models)
    ax.set_ylabel("GPU-hours")
    ax.set_title("GPU-model usage per policy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    files.append(out / "gpu_usage.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, run in runs.items():
        waits = sorted((r.start_s - r.arrival_s) / 3600.0 for r in run.records if r.state == "done")
        if waits:
            ax.step(waits, [(i + 1) / len(waits) for i in range(len(waits))], where="post", label=name)
    ax.set_xlabel("wait (hours)")
    ax.set_ylabel("share of jobs")
    ax.set_title("Wait distribution (CDF)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    files.append(out / "waits.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)
    return files


def file_stem(label: str) -> str:
    """A policy label as a portable file-name part: `cpsat:max_time_s=0.25` ->
    `cpsat-max_time_s-0.25` (no `:` or `=`, which some file systems and shells refuse)."""
    return "".join(c if c.isalnum() or c in "._" else "-" for c in label).strip("-.") or "policy"


def write_report(runs: dict[str, PolicyRun], summaries: dict[str, dict], comparison: dict[str, dict],
                 scenario: dict, out: Path | None, names: dict[int, str], *, plots: bool = True,
                 models: tuple[str, ...] = ()) -> dict:
    """The JSON document of a run; with `out`, every report file written there (created)."""
    if out is None:
        return {"policies": summaries, "comparison": comparison, "scenario": scenario, "files": {}}
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    for name, run in runs.items():
        path = out / f"jobs-{file_stem(name)}.csv"
        write_jobs_csv(run, path, names)
        files[f"jobs-{name}"] = str(path)
    if plots:
        for p in write_plots(runs, out, models):
            files[p.stem] = str(p)
    doc = {"policies": summaries, "comparison": comparison, "scenario": scenario,
           "files": {**files, "report": str(out / "report.json")}}
    with open(out / "report.json", "w") as f:
        json.dump(doc, f, indent=2, default=str)
    return doc


def _fmt(value, digits: int = 2) -> str:
    """A number with `digits` decimals, more for small values so they never show as 0.0."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if value and abs(value) < 10 ** (1 - digits):
            return f"{value:.3g}"
        return f"{value:,.{digits}f}"
    return str(value)


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f} h"


def table(summaries: dict[str, dict], comparison: dict[str, dict]) -> str:
    """The side-by-side text table: one column per policy."""
    from scheduler.text_table import table as text_table

    names = list(summaries)
    rows: list[list[str]] = []

    def row(label: str, fn) -> None:
        rows.append([label] + [fn(summaries[n], comparison.get(n, {})) for n in names])

    row("kgCO2", lambda s, c: _fmt(s["kgco2"], 3) + (
        f" +-{s['seeds']['kgco2_sd']:.3f} ({s['seeds']['count']} seeds)" if s.get("seeds") else ""))
    row(f"vs {names[0]}", lambda s, c: "(base)" if s is summaries[names[0]] else
        "-" if c.get("vs_first_pct") is None else f"{-c['vs_first_pct']:+.1f}%")
    if any("of_oracle_savings_pct" in c for c in comparison.values()):
        row("of oracle savings", lambda s, c: "-" if "of_oracle_savings_pct" not in c
            else f"{c['of_oracle_savings_pct']:.1f}%")
    row("energy kWh (GPU)", lambda s, c: _fmt(s["energy_kwh"], 1))
    row("gCO2/prompt", lambda s, c: _fmt(s["gco2_per_prompt"], 4))
    row("gCO2/GPU-hour", lambda s, c: _fmt(s["gco2_per_gpu_hour"], 1))
    row("mean wait", lambda s, c: _hours(s["mean_wait_s"]))
    row("p95 wait", lambda s, c: _hours(s["p95_wait_s"]))
    row("deadline misses", lambda s, c: (f"{s['deadline_misses']:.1f}" if s.get("seeds") else f"{s['deadline_misses']}")
        + f" ({_hours(s['lateness_s'])} late)")
    row("energy estimate error", lambda s, c: "-" if s.get("estimate_error_pct") is None
        else f"{s['estimate_error_pct']:.1f}% (median)")
    row("runtime estimate", lambda s, c: s.get("estimate", "exact") + (
        "" if s.get("runtime_estimate_error_pct") is None
        else f" ({s['runtime_estimate_error_pct']:.0f}% off, median of {s['estimated_jobs']})"))
    if any(s.get("replanned_behind_overruns") for s in summaries.values()):
        row("re-planned behind overruns", lambda s, c: str(s.get("replanned_behind_overruns", 0)))
    row("finished/jobs", lambda s, c: f"{s['finished']}/{s['jobs']}")
    models = sorted({m for s in summaries.values() for m in s["gpu_utilization"]})
    for m in models:
        row(f"util {m}", lambda s, c, m=m: f"{100 * s['gpu_utilization'].get(m, 0.0):.1f}%")
    row("cost $ (capex+energy)", lambda s, c: _fmt(s["cost_usd"], 0))
    row("planner s/call (p95)", lambda s, c: f"{s['planner_mean_s']:.3f} ({s['planner_p95_s']:.3f})")
    if any(s.get("planner_full_calls", s["planner_calls"]) != s["planner_calls"] for s in summaries.values()):
        row("full re-plans / calls",
            lambda s, c: f"{s.get('planner_full_calls', s['planner_calls'])} / {s['planner_calls']}")
    row("planner calls", lambda s, c: str(s["planner_calls"]))
    row("sim wall s", lambda s, c: f"{s['wall_s']:.1f}")
    return text_table(["metric"] + names, rows)
