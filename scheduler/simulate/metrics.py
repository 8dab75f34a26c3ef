"""Metrics of one policy's run: carbon, energy, waits, deadlines, utilisation, cost, planner time.

Definitions (the report and the JSON use these names):

- `kgco2`: emissions of all GPU energy drawn (site meters: simulated power x PUE x actual
  intensity, integrated over time), including work lost to GPU failures.
- `energy_kwh`: GPU (IT) energy, the integral of simulated power; `facility_energy_kwh`
  adds the PUE.
- `gco2_per_prompt`: emissions of the jobs that serve prompts over their prompts (None when
  no job has prompts).
- waits: start - submit of finished jobs (mean and 95th percentile, nearest-rank).
- `deadline_misses`: finished jobs ending after their deadline, plus unfinished jobs with a
  deadline; `lateness_s`: the summed lateness of the finished ones.
- `gpu_utilization`: per GPU model, busy GPU-seconds over (GPUs x the simulated span from
  the first arrival to the last finish).
- cost: `capex_usd` = busy GPU-seconds x the model's list price / the amortisation life
  (cluster file, default 4 years); `energy_cost_usd` = facility kWh x the zone's price.
- planner: time per call of `policy.plan` (mean, p95, max) and the number of calls.
- `forecast`, `truth`, `estimate`: the models the run used (what the planner believed of
  carbon, how jobs really ran, what it was told of their lengths); `runtime_estimate_error_pct`:
  median |estimate / real - 1| of the `estimated_jobs` (None with exact lengths);
  `replanned_behind_overruns`: committed jobs taken back and planned again because the job
  before them on their GPUs ran past its plan.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from policies.model.catalog import lookup
from policies.types import J_PER_KWH
from scheduler.simulate.cluster import ClusterSpec
from scheduler.simulate.records import PolicyRun

YEAR_S = 365.0 * 86400.0


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(pct / 100.0 * len(s)) - 1))
    return s[k]


def summarize(run: PolicyRun, cluster: ClusterSpec) -> dict:
    """The metrics of one run as a plain dict (JSON-ready)."""
    done = [r for r in run.records if r.state == "done"]
    unfinished = [r for r in run.records if r.state != "done"]
    gco2 = sum(m.gco2 for m in run.meters.values())
    energy_j = sum(m.energy_j for m in run.meters.values())
    facility_j = sum(m.facility_j for m in run.meters.values())
    waits = [r.start_s - r.arrival_s for r in done]
    prompt_jobs = [r for r in done if r.job.prompts]
    prompts = sum(r.job.prompts for r in prompt_jobs)
    late = [r.end_s - r.deadline_s for r in done if r.deadline_s is not None and r.end_s > r.deadline_s + 1e-6]
    misses = len(late) + sum(1 for r in unfinished if r.deadline_s is not None)

    span_start = min((r.arrival_s for r in run.records), default=run.start_s)
    span_end = max((r.end_s for r in done), default=run.end_s)
    span_s = max(1.0, span_end - span_start)
    busy_by_model: dict[str, float] = defaultdict(float)
    capex = 0.0
    for r in done:
        gpu_s = len(r.gpu_ids) * r.runtime_s
        busy_by_model[r.model] += gpu_s
        capex += gpu_s * lookup(r.model).list_price_usd / (cluster.amortization_years * YEAR_S)
    counts = cluster.gpus_by_model()
    utilization = {m: busy_by_model.get(m, 0.0) / (n * span_s) for m, n in sorted(counts.items())}
    energy_cost = sum(m.facility_j / J_PER_KWH * cluster.energy_price_usd_per_kwh.get(z, 0.0)
                      for z, m in run.meters.items())
    plan_times = [t.plan_s for t in run.ticks]
    return {
        "jobs": len(run.records),
        "finished": len(done),
        "unfinished": len(unfinished),
        "kgco2": gco2 / 1000.0,
        "energy_kwh": energy_j / J_PER_KWH,
        "facility_energy_kwh": facility_j / J_PER_KWH,
        "gco2_per_prompt": (sum(r.gco2 for r in prompt_jobs) / prompts) if prompts else None,
        "gco2_per_gpu_hour": gco2 / (sum(busy_by_model.values()) / 3600.0) if busy_by_model else None,
        "prompts": prompts,
        "mean_wait_s": sum(waits) / len(waits) if waits else None,
        "p95_wait_s": percentile(waits, 95),
        "max_wait_s": max(waits) if waits else None,
        "deadline_misses": misses,
        "lateness_s": sum(late),
        # GPU-hours late: what the price of lateness (policies.pricing.lateness) charges
        "late_gpu_h": sum(len(r.gpu_ids) * (r.end_s - r.deadline_s) for r in done
                          if r.deadline_s is not None and r.end_s > r.deadline_s + 1e-6) / 3600.0,
        "gpu_hours": {m: v / 3600.0 for m, v in sorted(busy_by_model.items())},
        "gpu_utilization": utilization,
        "capex_usd": capex,
        "energy_cost_usd": energy_cost,
        "cost_usd": capex + energy_cost,
        "planner_calls": len(plan_times),
        "planner_mean_s": sum(plan_times) / len(plan_times) if plan_times else 0.0,
        "planner_p95_s": percentile(plan_times, 95) or 0.0,
        "planner_max_s": max(plan_times, default=0.0),
        "planner_total_s": sum(plan_times),
        "planner_full_calls": sum(t.full for t in run.ticks),
        "planner_full_s": sum(t.plan_s for t in run.ticks if t.full),
        "rejected_assignments": run.rejected_assignments,
        "gpu_failures": run.gpu_failures,
        "planner_failures": run.planner_failures,
        "restarts": sum(max(0, r.attempts - 1) for r in run.records),
        "lost_energy_kwh": sum(r.lost_energy_j for r in run.records) / J_PER_KWH,
        # issue 30: jobs that ran in more than one segment, the segments run, a pause's idle energy
        "interrupted_jobs": sum(1 for r in done if len(r.segment_log) > 1),
        "segments": sum(len(r.segment_log) for r in done),
        "pause_idle_energy_kwh": sum(r.idle_energy_j for r in run.records) / J_PER_KWH,
        "zones": {z: {"kgco2": m.gco2 / 1000.0, "energy_kwh": m.energy_j / J_PER_KWH, "peak_power_w": m.peak_w,
                      "power_cap_w": m.cap_w, "over_cap_s": m.over_cap_s}
                  for z, m in sorted(run.meters.items())},
        # [sites.S] budgets: the power held to each (also counted in its zone's row above)
        "sites": {k.removeprefix("site:"): {"peak_power_w": m.peak_w, "power_cap_w": m.cap_w,
                                             "over_cap_s": m.over_cap_s}
                  for k, m in sorted(run.site_meters.items())},
        "forecast": run.forecast,
        "truth": run.truth,
        "estimate": run.estimate,
        # how far the planner's first runtime estimate was from the real runtime (jobs whose
        # length is an estimate; median |estimate / real - 1|, %) and how many such jobs
        "estimated_jobs": sum(1 for r in run.records if r.real is not None),
        "runtime_estimate_error_pct": _runtime_estimate_error_pct(run.records),
        "replanned_behind_overruns": run.replanned_behind_overruns,
        # how wrong the planner's energy estimate was at commit (median over finished jobs)
        "estimate_error_pct": _estimate_error_pct(done),
        "span_s": span_s,
        "events": run.events,
        "wall_s": run.wall_s,
        "events_per_s": run.events / run.wall_s if run.wall_s > 0 else None,
        # the simulator's own cost, without the policy's planning time
        "simulator_s": max(0.0, run.wall_s - sum(plan_times)),
        "events_per_s_simulator": (run.events / (run.wall_s - sum(plan_times))
                                   if run.wall_s - sum(plan_times) > 1e-9 else None),
    }


def compare(summaries: dict[str, dict]) -> dict[str, dict]:
    """Savings of each policy vs the first, and the share of the oracle's savings achieved.

    `vs_first_pct`: (first - this) / first x 100 of kgCO2 (positive = less carbon).
    `of_oracle_savings_pct`: (first - this) / (first - oracle) x 100, when `oracle` ran and
    saved anything.
    """
    names = list(summaries)
    if not names:
        return {}
    base = summaries[names[0]]["kgco2"]
    oracle_label = next((n for n in names if n.split(":")[0] == "oracle"), None)
    oracle = summaries[oracle_label]["kgco2"] if oracle_label else None
    out: dict[str, dict] = {}
    for name in names:
        kg = summaries[name]["kgco2"]
        entry = {"vs_first_pct": (base - kg) / base * 100.0 if base else None}
        if oracle is not None and base - oracle > 1e-12:
            entry["of_oracle_savings_pct"] = (base - kg) / (base - oracle) * 100.0
        out[name] = entry
    return out


def _runtime_estimate_error_pct(records: list) -> float | None:
    """Median |estimated / real runtime - 1| (%) of the jobs planned with an estimate (None: none)."""
    errors = [abs(r.estimated_job.est_runtime_s / r.real.est_runtime_s - 1.0) * 100.0 for r in records
              if r.real is not None and r.estimated_job is not None and r.real.est_runtime_s]
    return statistics.median(errors) if errors else None


def _estimate_error_pct(done: list) -> float | None:
    """Median |actual / planned - 1| of the finished jobs' energy, in % (0 with a perfect truth)."""
    errors = [abs(r.runtime_s * r.power_w / (r.planned_runtime_s * r.planned_power_w) - 1.0) * 100.0
              for r in done if r.planned_runtime_s > 0 and r.planned_power_w > 0]
    return statistics.median(errors) if errors else None
