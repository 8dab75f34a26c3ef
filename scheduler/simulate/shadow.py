"""Shadow mode: replay the production store's own history with other policies.

"What if we had run cpsat last week": the store's finished jobs (submit time, GPUs, memory,
deadline, latency SLO, workload class, prompts, measured runtime and the GPU model they ran
on), its nodes and GPUs (zone, model) and its recorded actual intensity per zone become a
scenario. Only reads, in one read transaction: the store is never written.

- Jobs: COMPLETED jobs submitted in [since, until) (default: the last 7 days) that ran
  (have start and end times). A generic job's measured runtime on the model it ran on is
  turned back into its runtime on the reference GPU with the energy model's own scaling,
  so on that model the replay runs exactly as long as the real run did; a workload job
  with prompts keeps its prompts (its runtime follows the profiles, learned ones included).
- Cluster: the store's nodes and GPUs (drained and unhealthy GPUs included: the question is
  what the fleet could have done), PUE 1.0, unless a cluster file is given.
- Carbon: the recorded actual intensity of each zone (signal as recorded; a zone with both
  signals uses the average one), as hourly values.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

from sqlalchemy import select

from scheduler import carbon_table
from scheduler.simulate.cluster import ClusterSpec, cluster_from_dict
from scheduler.simulate.intensity import CarbonInputError, ZoneIntensity, from_hourly
from scheduler.simulate.scenario import Scenario, build_scenario
from scheduler.simulate.traces import JobTrace, TraceJob
from scheduler.store import Store

log = logging.getLogger(__name__)

DEFAULT_LOOKBACK_S = 7 * 86400.0


def store_scenario(store: Store, *, since: datetime | None = None, until: datetime | None = None,
                   cluster: ClusterSpec | None = None, slack_s: float | None = 24 * 3600.0) -> Scenario:
    """Read the store's history (read-only) into a Scenario; ValueError if there is nothing to replay."""
    from policies.model.energy import ProfileBook, job_shape, seed_profiles
    from policies.types import QueuedJob
    from scheduler.jobs.history import completed_submitted_in
    from scheduler.store.models import gpus, nodes

    now = datetime.now(timezone.utc)
    until = until or now
    since = since or until - timedelta(seconds=DEFAULT_LOOKBACK_S)
    with store.read() as conn:
        rows = completed_submitted_in(conn, since, until)
        gpu_rows = conn.execute(select(gpus.c.id, gpus.c.node_name, gpus.c.index, gpus.c.model)
                                .order_by(gpus.c.node_name, gpus.c.index)).all()
        node_zone = dict(conn.execute(select(nodes.c.name, nodes.c.zone)).all())
        try:
            from scheduler.profiles import learned_profiles

            learned = learned_profiles(conn)
        except ImportError:
            learned = ()
        if cluster is None:
            cluster = _store_cluster(gpu_rows, node_zone)
        zones = cluster.zones
        intensity_rows = carbon_table.replay_actuals(conn, zones)
    if not rows:
        raise ValueError(f"no completed jobs submitted between {since.isoformat()} and {until.isoformat()} "
                         "in the store: nothing to replay (widen --since)")
    carbon = _store_carbon(intensity_rows, zones)
    profiles = seed_profiles() + tuple(learned)
    book = ProfileBook(profiles)
    model_of_gpu = {r.id: r.model for r in gpu_rows}
    origin = rows[0].submitted_at
    trace_jobs: list[TraceJob] = []
    modelled: list[tuple[float, float]] = []  # (measured, modelled) runtimes of jobs run by their prompts
    for r in rows:
        if r.started_at is None or r.ended_at is None:
            continue
        measured_s = max(1.0, (r.ended_at - r.started_at).total_seconds())
        ran_on = next((model_of_gpu[g] for g in (r.gpu_ids or []) if g in model_of_gpu), None)
        est = measured_s
        if ran_on is not None and not (r.workload and r.prompts):
            unit = QueuedJob(id=r.id, gpus=r.gpus, gpu_mem_gib=r.gpu_mem_gib, submitted_at=r.submitted_at,
                             est_runtime_s=1000.0, workload=r.workload)
            est = measured_s * 1000.0 / job_shape(unit, ran_on, book, 1000.0).runtime_s
        elif ran_on is not None:  # the simulator runs it by its prompts: say where that is far off
            unit = QueuedJob(id=r.id, gpus=r.gpus, gpu_mem_gib=r.gpu_mem_gib, submitted_at=r.submitted_at,
                             est_runtime_s=None, workload=r.workload, prompts=r.prompts)
            modelled.append((measured_s, job_shape(unit, ran_on, book, measured_s).runtime_s))
        trace_jobs.append(TraceJob(
            arrival_s=(r.submitted_at - origin).total_seconds(), gpus=r.gpus, est_runtime_s=est,
            workload=r.workload, prompts=r.prompts, gpu_mem_gib=r.gpu_mem_gib or 0.0,
            latency_slo_ms=r.latency_slo_ms,
            deadline_s=(r.deadline - origin).total_seconds() if r.deadline else None,
            name=f"{r.id}:{r.name}"))
    trace = JobTrace(path=f"store {store.url}", fmt="store", jobs=trace_jobs, origin=origin)
    scenario = build_scenario(cluster, trace, carbon, slack_s=slack_s, profiles=profiles)
    scenario.profiles = profiles
    scenario.notes.update({"since": since.isoformat(), "until": until.isoformat(),
                           "learned_profiles": len(learned)})
    far = [(m, p) for m, p in modelled if not 0.5 <= p / m <= 2.0]
    if far:
        scenario.notes["runtime_by_prompts"] = {
            "jobs": len(far), "measured_s": sorted(m for m, _ in far), "modelled_s": [p for _, p in sorted(far)]}
    return scenario


def _store_cluster(gpu_rows, node_zone: dict[str, str]) -> ClusterSpec:
    by_node: dict[str, list[str]] = {}
    for g in gpu_rows:
        by_node.setdefault(g.node_name, []).append(g.model)
    if not by_node:
        raise ValueError("the store has no GPUs: give a cluster file with --cluster")
    nodes = []
    for name, models in sorted(by_node.items()):
        spec = ",".join(f"1x{m}" for m in models)
        nodes.append({"name": name, "zone": node_zone.get(name, "local"), "gpus": spec})
    return cluster_from_dict({"node": nodes}, "<store>")


def store_carbon(store: Store, zones: list[str]) -> dict[str, ZoneIntensity]:
    """The recorded actual intensity of `zones` from the store (read-only), hourly, and the
    forecasts stored for them with their issue times (for `--forecast stored`)."""
    from scheduler.simulate.issued import IssuedForecasts

    with store.read() as conn:
        rows = carbon_table.replay_actuals(conn, zones)
        forecast_rows = carbon_table.replay_forecasts(conn, zones)
    out = _store_carbon(rows, zones)
    for zone, z in out.items():
        mine = [(r.issued_at.timestamp(), r.at.timestamp(),
                 int(r.duration_s), float(r.gco2_per_kwh))
                for r in forecast_rows if r.zone == zone and r.signal == z.signal]
        if mine:
            z.issued = IssuedForecasts.from_rows(mine)
    return out


def _store_carbon(rows, zones: list[str]) -> dict[str, ZoneIntensity]:
    from telemetry.grid.forecast import hourly_means

    by_zone: dict[str, dict[str, list[tuple[float, int, float]]]] = {}
    for r in rows:
        by_zone.setdefault(r.zone, {}).setdefault(r.signal, []).append(
            (r.at.timestamp(), int(r.duration_s), float(r.gco2_per_kwh)))
    missing = [z for z in zones if z not in by_zone]
    if missing:
        raise CarbonInputError(f"the store has no recorded actual intensity for zone(s) {', '.join(missing)}: "
                               "import traces with `carbonsched carbon import`")
    out: dict[str, ZoneIntensity] = {}
    for zone in zones:
        signals = by_zone[zone]
        signal = "average" if "average" in signals else next(iter(signals))
        out[zone] = from_hourly(zone, hourly_means(signals[signal]), signal=signal, source="store actuals")
    from scheduler.simulate.intensity import check_signals

    check_signals(out)
    return out
