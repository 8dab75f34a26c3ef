"""A scenario: the cluster, the jobs on the carbon data's calendar, and the carbon data.

`build_scenario` turns a `JobTrace` (offsets from its origin) into `QueuedJob`s:

- **Calendar**: the trace's first arrival is put at `start` (the --start option), or at the
  trace's own dates if it has them and the carbon data covers them, else at the first hour
  all zones have carbon data.
- **Deadlines**: a job's own deadline from the trace wins; otherwise deadline = arrival +
  runtime + slack, with the job's own slack (Alibaba LS pods: 0) or `slack_s` (--slack).
  The runtime here is the job's runtime on the fastest GPU model of the cluster that can
  take it, so the slack is what the operator promised on top of the best possible run.
- **Maximum wait** (`max_wait_s`, --max-wait): the start must fall within that time of the
  arrival (GAIA's "maximum wait"); None for no such limit.
- **Width**: jobs never span nodes (as in the daemon); a job wider than the widest node is
  narrowed to it with its GPU-hours kept (see `traces.clamp_widths`), and counted.
- **Interruptible jobs** (`interruptible`, --interruptible SHARE, issue 30): that share of
  the jobs (seeded, its own random stream, so the mix is unchanged) may be cut into
  segments, as `Interruptible` says (kind, minimum run, resume cost, most segments); a
  trace's own `interruptible` column wins for its jobs.
- **Workload mix** (`mix`, --mix CLASS=SHARE,...): jobs without a workload class are given
  one at random (seeded) in these shares ("none" keeps a job generic). A job given a class
  gets prompts = its reference runtime x GPUs x the class's H100 throughput, so its work on
  the reference GPU is unchanged while its runtime and power on other models follow that
  class's profiles.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from importlib import resources
from pathlib import Path

from policies.types import QueuedJob
from scheduler.qos import QosTable
from scheduler.simulate.cluster import ClusterSpec, load_cluster
from scheduler.simulate.intensity import CarbonInputError, ZoneIntensity, check_zones, common_start
from scheduler.simulate.tenancy import Tenant, account_shares, tenants_of
from scheduler.simulate.traces import JobTrace, clamp_widths, read_jobs, shift_origin

log = logging.getLogger(__name__)

DEFAULT_SLACK_S = 24 * 3600.0
REFERENCE_MODEL = "H100"


@dataclass
class Scenario:
    """What every policy of one simulation run is given (the same for all of them)."""

    cluster: ClusterSpec
    jobs: list[QueuedJob]
    carbon: dict[str, ZoneIntensity]
    origin: datetime
    trace: JobTrace
    names: dict[int, str] = field(default_factory=dict)
    notes: dict[str, object] = field(default_factory=dict)
    profiles: tuple = ()  # workload profiles for the energy model; () = the packaged seeds
    tenants: dict[int, Tenant] = field(default_factory=dict)  # job id -> its user, account, QOS
    shares: dict[str, int] = field(default_factory=dict)  # account -> raw fair-share shares

    def describe(self) -> dict[str, object]:
        first = min(j.submitted_at for j in self.jobs)
        last = max(j.submitted_at for j in self.jobs)
        return {
            "cluster": self.cluster.path, "cluster_summary": self.cluster.describe(),
            "jobs_file": self.trace.path, "jobs_format": self.trace.fmt, "jobs": len(self.jobs),
            "time_unit": self.trace.time_unit, "skipped": dict(self.trace.skipped),
            "first_arrival": first.isoformat(), "last_arrival": last.isoformat(),
            "carbon": {z: {"source": c.source, "signal": c.signal, "hours": c.n_hours,
                           "from": datetime.fromtimestamp(c.start_s, timezone.utc).isoformat(),
                           "until": datetime.fromtimestamp(c.end_s, timezone.utc).isoformat(),
                           "filled_hours": c.filled_hours}
                       for z, c in sorted(self.carbon.items())},
            **self.notes,
        }


def parse_mix(text: str | None) -> dict[str, float] | None:
    """`llm-chat-8b=0.5,train=0.2,none=0.3` -> shares by class (normalised)."""
    if not text:
        return None
    shares: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        try:
            share = float(value)
        except ValueError:
            share = -1.0
        if not sep or not name.strip() or share < 0:
            raise ValueError(f"bad --mix part {part.strip()!r}; expected CLASS=SHARE, e.g. llm-chat-8b=0.5")
        shares[name.strip()] = shares.get(name.strip(), 0.0) + share
    total = sum(shares.values())
    if total <= 0:
        raise ValueError("--mix shares add up to 0")
    return {k: v / total for k, v in shares.items()}


@dataclass(frozen=True)
class Interruptible:
    """Which jobs of a scenario may be interrupted, and how (`QueuedJob.interruptible`)."""

    share: float = 0.0  # of the jobs, drawn at random (seeded)
    kind: str = "checkpoint"  # or "pause"
    min_run_s: float | None = None
    resume_cost_s: float = 0.0
    max_segments: int = 4

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"--interruptible: a share from 0 to 1, got {self.share}")
        if self.kind not in ("checkpoint", "pause"):
            raise ValueError(f"--interruptible-kind: checkpoint or pause, got {self.kind!r}")
        if self.resume_cost_s < 0 or (self.min_run_s is not None and self.min_run_s < 0):
            raise ValueError("--min-run and --resume-cost are durations of 0 or more")
        if self.max_segments < 1:
            raise ValueError("--max-segments: 1 or more")

    def apply(self, job: QueuedJob, kind: str | None) -> QueuedJob:
        """The job as an interruptible one of `kind` with these knobs (None: unchanged)."""
        if kind is None:
            return job
        return replace(job, interruptible=kind, min_run_s=self.min_run_s, resume_cost_s=self.resume_cost_s,
                       max_segments=self.max_segments)


def build_scenario(
    cluster: ClusterSpec,
    trace: JobTrace,
    carbon: dict[str, ZoneIntensity],
    *,
    start: datetime | None = None,
    slack_s: float | None = DEFAULT_SLACK_S,
    max_wait_s: float | None = None,
    mix: dict[str, float] | None = None,
    seed: int = 0,
    profiles: tuple = (),
    interruptible: Interruptible | None = None,
    shares: dict[str, int] | None = None,
    qos: QosTable | None = None,
) -> Scenario:
    """Place a trace on the calendar of the carbon data and make the jobs (module docstring)."""
    from policies.model.energy import ProfileBook, seed_profiles

    check_zones(cluster.zones, carbon)
    book = ProfileBook(profiles or seed_profiles())
    capped = clamp_widths(trace, cluster.max_gpus_per_node())
    if capped:
        log.warning("%d jobs were wider than the widest node (%d GPUs of one model) and were narrowed "
                    "to it, keeping their GPU-hours", capped, cluster.max_gpus_per_node())
    moved: list[datetime] = []
    origin = _origin(trace, carbon, start, moved)
    if mix:
        unknown = [w for w in mix if w != "none" and book.get(w, REFERENCE_MODEL) is None]
        if unknown:
            raise ValueError(f"--mix: no {REFERENCE_MODEL} profile for {', '.join(unknown)}; "
                             f"known classes: {', '.join(book.workloads()) or 'none'}")
    cut = interruptible or Interruptible()
    jobs, names = _make_jobs(trace, origin, book, max_wait_s=max_wait_s, mix=mix, seed=seed, cut=cut)
    no_model = _give_deadlines(jobs, trace, cluster, origin, book, slack_s)
    if no_model:
        log.warning("%d jobs fit no GPU model of the cluster (memory or latency SLO); they will stay unplaced",
                    no_model)
    notes: dict[str, object] = {"origin": origin.isoformat(), "slack_s": slack_s, "max_wait_s": max_wait_s,
                                "narrowed_jobs": capped, "unfit_jobs": no_model, "mix": mix,
                                "interruptible_jobs": sum(1 for j in jobs if j.interruptible)}
    if moved:
        notes["moved_from"] = moved[0].isoformat()
    if interruptible is not None:
        notes["interruptible"] = {"share": cut.share, "kind": cut.kind, "min_run_s": cut.min_run_s,
                                  "resume_cost_s": cut.resume_cost_s, "max_segments": cut.max_segments}
    tenants = tenants_of(trace)
    account_table = account_shares(tenants, shares)
    jobs = with_qos_bounds(jobs, tenants, qos or QosTable())
    if len(account_table) > 1 or any(t.qos is not None for t in tenants.values()):
        notes["accounts"] = account_table
        notes["qos_jobs"] = {q: sum(1 for t in tenants.values() if t.qos == q)
                             for q in sorted({t.qos for t in tenants.values() if t.qos is not None})}
    return Scenario(cluster=cluster, jobs=jobs, carbon=carbon, origin=origin, trace=trace, names=names,
                    notes=notes, profiles=tuple(profiles), tenants=tenants, shares=account_table)


def with_qos_bounds(jobs: list[QueuedJob], tenants: dict[int, Tenant], table: QosTable) -> list[QueuedJob]:
    """The jobs with their QOS's bounds on carbon (`Qos.carbon_bounds`, as the daemon gives
    them); a job without a QOS keeps the scenario's slack alone. ValueError for a QOS the
    table does not know (naming the known ones)."""
    out = []
    for job in jobs:
        name = tenants.get(job.id, Tenant()).qos
        if name is None:
            out.append(job)
            continue
        try:
            level = table.get(name)
        except KeyError as e:
            raise ValueError(f"job {job.id} of the trace: {e.args[0]}") from None
        out.append(replace(job, **level.carbon_bounds(job.deadline is not None or job.max_delay_s is not None)))
    return out


def _origin(trace: JobTrace, carbon: dict[str, ZoneIntensity], start: datetime | None,
            moved: list[datetime]) -> datetime:
    """The calendar time of the trace's offset 0 (module docstring); an error where the whole
    trace lies outside the carbon data, a warning where part of it does. A trace moved from
    its own dates to the carbon data's start appends its own first arrival to `moved`."""
    carbon_start = common_start(carbon)
    origin = shift_origin(trace, start, carbon_start)
    if start is None and trace.origin is not None:
        first_at = origin + timedelta(seconds=trace.jobs[0].arrival_s)
        if not all(c.start_s <= first_at.timestamp() < c.end_s for c in carbon.values()):
            log.info("the trace's own dates (%s) are outside the carbon data: starting it at %s",
                     first_at.isoformat(), carbon_start.isoformat())
            origin = carbon_start - timedelta(seconds=trace.jobs[0].arrival_s)
            moved.append(first_at)
    first_s = (origin + timedelta(seconds=trace.jobs[0].arrival_s)).timestamp()
    last_s = (origin + timedelta(seconds=trace.jobs[-1].arrival_s)).timestamp()
    data_start = max(c.start_s for c in carbon.values())
    data_end = min(c.end_s for c in carbon.values())
    if last_s < data_start or first_s >= data_end:
        raise CarbonInputError(
            f"the trace ({_iso(first_s)} to {_iso(last_s)}) lies outside the carbon data "
            f"({_iso(data_start)} to {_iso(data_end)}); align it with --start")
    if first_s < data_start or last_s >= data_end:
        log.warning("part of the trace (%s to %s) lies outside the carbon data (%s to %s): the nearest "
                    "hour's intensity is used there", _iso(first_s), _iso(last_s), _iso(data_start),
                    _iso(data_end))
    return origin


def _make_jobs(trace: JobTrace, origin: datetime, book, *, max_wait_s: float | None,
               mix: dict[str, float] | None, seed: int, cut: Interruptible) -> tuple[list[QueuedJob], dict[int, str]]:
    """The trace's jobs as QueuedJobs (ids 1..N) on the calendar, with their workload class
    from the mix and their interruptibility drawn (each from its own seeded stream), and
    each job's name by id."""
    rng = random.Random(seed)
    cut_rng = random.Random(f"interruptible:{seed}")  # its own stream: the mix's draws are unchanged
    jobs: list[QueuedJob] = []
    names: dict[int, str] = {}
    for i, tj in enumerate(trace.jobs):
        job_id = i + 1
        arrival = origin + timedelta(seconds=tj.arrival_s)
        job = QueuedJob(id=job_id, gpus=tj.gpus, gpu_mem_gib=tj.gpu_mem_gib, submitted_at=arrival,
                        est_runtime_s=tj.est_runtime_s, latency_slo_ms=tj.latency_slo_ms,
                        workload=tj.workload, prompts=tj.prompts, max_delay_s=max_wait_s)
        if mix and job.workload is None and job.est_runtime_s is not None:
            workload = _choose(rng, mix)
            if workload != "none":
                pps = book.get(workload, REFERENCE_MODEL).prompts_per_s
                job = replace(job, workload=workload,
                              prompts=max(1, round(job.est_runtime_s * job.gpus * pps)))
        kind = getattr(tj, "interruptible", None)
        if kind is None and cut.share > 0 and cut_rng.random() < cut.share:
            kind = cut.kind
        jobs.append(cut.apply(job, kind))
        names[job_id] = tj.name
    return jobs, names


def _give_deadlines(jobs: list[QueuedJob], trace: JobTrace, cluster: ClusterSpec, origin: datetime, book,
                    slack_s: float | None) -> int:
    """Give each job (in place) the trace's deadline or arrival + its shortest runtime on a
    model that can take it + slack; return how many jobs fit no model at all."""
    from policies.model.energy import fits, shape_arrays

    models = sorted(cluster.gpus_by_model())
    memory = {m: _memory(cluster, m) for m in models}
    # each job's shortest runtime on a model that can take it (all models if none can), at once
    runtime = shape_arrays(jobs, models, book, 3600.0).runtime_s
    no_model = 0
    for i, (tj, job) in enumerate(zip(trace.jobs, jobs)):
        usable = [c for c, m in enumerate(models) if fits(job, m, memory[m], book) is None]
        if not usable:
            no_model += 1
            usable = list(range(len(models)))
        best_runtime = float(runtime[i, usable].min())
        if tj.deadline_s is not None:
            deadline = origin + timedelta(seconds=tj.deadline_s)
        else:
            slack = tj.slack_s if tj.slack_s is not None else slack_s
            deadline = None if slack is None else job.submitted_at + timedelta(seconds=best_runtime + slack)
        if deadline is not None:
            jobs[i] = replace(job, deadline=deadline)
    return no_model


def _choose(rng: random.Random, mix: dict[str, float]) -> str:
    x = rng.random()
    acc = 0.0
    for name, share in mix.items():
        acc += share
        if x < acc:
            return name
    return next(reversed(mix))


def _memory(cluster: ClusterSpec, model: str) -> float:
    from policies.model.catalog import lookup

    return lookup(model).memory_gib


def _iso(t_s: float) -> str:
    return datetime.fromtimestamp(t_s, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


# -- the bundled demo ---------------------------------------------------------------------------

DEMO_ZONES = {"DE": "DE-LU.csv", "GB": "GB.csv", "US-CAL-CISO": "US-CAL-CISO.csv", "SG": "SG.csv"}
DEMO_START = datetime(2022, 10, 19, 16, 0, tzinfo=timezone.utc)
DEMO_POLICIES = "fifo,greedy,cpsat:max_time_s=0.25"


def demo_dir() -> Path:
    """The folder of the bundled demo scenario (real data; see its SOURCE.md)."""
    return Path(str(resources.files("scheduler.simulate").joinpath("data")))


def demo_inputs() -> tuple[ClusterSpec, JobTrace, dict[str, ZoneIntensity], datetime]:
    """The demo's cluster, jobs, carbon and start: real PAI jobs on a 4-zone cluster."""
    from scheduler.simulate.intensity import load_zone_files

    d = demo_dir()
    cluster = load_cluster(d / "demo-cluster.toml")
    trace = read_jobs(d / "pai_demo.csv", fmt="gaia", time_unit="s")
    carbon = {zone: load_zone_files(zone, [d / name]) for zone, name in DEMO_ZONES.items()}
    return cluster, trace, carbon, DEMO_START
