"""The planner: store -> Snapshot -> policy -> store.

A tick reads the queue and the GPUs, the carbon forecast of every zone the GPUs are in,
the site's PUE and power caps, and the workload profiles (seeded + learned here), asks the
policy for a plan, and writes back only what changed, in small transactions so
submissions are never held up behind a big plan.

Carbon comes from the store only (`CarbonSignals.forecast`: imported traces, provider
forecasts fetched by the daemon's refresh job, the own forecast, the static table); a tick
never waits on a provider. A zone with no value at all gets no curve and is planned
carbon-blind, which the tick logs once and the policy's explanations say. Curves are
cached for `carbon_ttl_s` (and at most until the next slot starts), so a tick over a long
queue does not re-read the forecasts every time a submission wakes it; but every tick
first reads the zones' data versions (`CarbonSignals.data_versions`, one small query),
and any change to a zone's carbon data since (a `carbonsched carbon import` in another
process, a provider refresh) rebuilds the curves, so the next plan sees it.

A PLANNED job whose start falls before the next tick (now + plan interval) is pinned: the
policy keeps its GPUs and start, so the agent can start it without the plan moving under
it. Everything else is re-planned every tick, unless `full_replan_s` is set (incremental
planning, as `carbonsched simulate --full-replan` models it): then a tick less than
`full_replan_s` (monotonic) after the last full one passes the stored plans of the other
PLANNED jobs as `Snapshot.keep`, so the policy keeps each one that still fits (node and
start; GPU ids on that node may change) and plans only new and displaced jobs around them.
The first tick, and one at least every `full_replan_s`, re-plans every queued job.
A full re-plan passes the stored plans of the PLANNED jobs it re-plans as
`Snapshot.previous`: cpsat tries them first, so each tick's search goes on from the last
tick's answer. `preview()` (`carbonsched plan`) is always a full re-plan.

The site's PUE and budgets come in as `scheduler.site.SiteConfig`, the policy from
`scheduler.daemon.policy_factory`; every read and write of the store is in
`scheduler.daemon.plan_store` (nodes, GPUs) and
`scheduler.jobs.store` (the jobs: queue, running jobs, plans).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import Connection

from policies import Plan, Policy, QueuedJob, Snapshot
from policies.solvers.guard import without
from policies.model.margin import OVERRUN_BUSY_S
from policies.types import Assignment, GpuSlot, Profile, budget_of
from policies.pricing.ramp import WINDOW_S as RAMP_WINDOW_S
from policies.solvers.finish import finish_plan
from policies.pricing.ramp import RecentStart
from policies.problem.segments import horizon_for
from scheduler import interruptible
from scheduler.carbon_curves import DEFAULT_CARBON_TTL_S, CarbonCurves
from scheduler.carbon_signal import CarbonSignal
from scheduler.clock import utcnow
from scheduler.daemon.plan_store import disk_full_notes, read_gpus, read_nodes
from scheduler.daemon.wait_reasons import with_wait_reasons
from scheduler.job_specs import wait_word
from scheduler.jobs.job import queued_job
from scheduler.jobs.store import (QueueRead, current_plans, note_waiting, read_queue, read_running, recent_starts,
                                  write_plan)
from scheduler.lifecycle import State
from scheduler.power_budget import ramps_of
from scheduler.profiles import learned_profiles
from scheduler.site import SiteConfig
from scheduler.standing import Standing
from scheduler.store import Store

log = logging.getLogger(__name__)

# A planned start that moves earlier is written at once (the job may start sooner); one that
# slips later only when it slips by more than this share of its lead time (and 60 s): a
# queue behind a job running over its estimate would otherwise be rewritten every tick.
EARLIER_TOLERANCE_S = 1.0
LATER_TOLERANCE_S = 60.0
LATER_TOLERANCE_SHARE = 0.1


# A stored estimate is refreshed (without moving the plan) when the policy's new figure
# differs by more than this share: forecasts and learned profiles change under a plan.
ESTIMATE_REFRESH_SHARE = 0.1


@dataclass(frozen=True)
class TickStats:
    jobs: int
    planned: int
    moved: int
    withdrawn: int
    duration_s: float
    refreshed: int = 0
    pinned: int = 0
    blind_zones: tuple[str, ...] = ()
    skipped: bool = False  # nothing changed since the last plan: the policy was not run
    full: bool = True  # every queued job was re-planned (False: incremental, `kept` plans kept)
    kept: int = 0  # earlier plans the policy kept, node and start as they were (incremental ticks)


# A tick whose snapshot (queue, GPUs, carbon curves, profiles, site) is the same as the last
# planned one does not run the policy again (cpsat would spend its whole time limit to find
# the same plan), but the plan is re-made at least this often as time moves on. A full
# re-plan that is due is never skipped after an incremental plan: equal fingerprints vouch
# only for plans of the same kind.
REPLAN_AT_LEAST_S = 300.0

# A tick plans at most this many queued jobs (pinned ones always, then by deadline and
# submission): the planner's time stays bounded whatever one user queues (greedy plans 5,000
# jobs in ~1 s, cpsat's first plan in ~2 s; docs/benchmarks.md). The rest wait, with the reason.
MAX_PLANNED_JOBS = 5000


class Planner:
    """Builds snapshots from the store, runs the policy, writes the plan back.

    `carbon` is the carbon signal (`scheduler.carbon_signal.CarbonSignal`; default: the store's
    `scheduler.carbon.CarbonSignals` with the default configuration); `site` gives PUE and power caps; `plan_interval_s` is the tick
    period, which decides which PLANNED jobs are pinned. `full_replan_s` (None: every tick
    is full) turns on incremental planning between full re-plans that far apart;
    `monotonic` is the clock that spaces them (and the forced re-plans and carbon cache).
    """

    def __init__(self, store: Store, policy: Policy, *, node_timeout_s: float = 60.0,
                 default_runtime_s: float = 3600.0, clock=utcnow, carbon: CarbonSignal | None = None,
                 site: SiteConfig | None = None, plan_interval_s: float = 15.0,
                 slot_s: float = 900.0, horizon_s: float = 48 * 3600.0,
                 carbon_ttl_s: float = DEFAULT_CARBON_TTL_S, full_replan_s: float | None = None,
                 monotonic: Callable[[], float] = time.monotonic, max_jobs: int = MAX_PLANNED_JOBS,
                 standing: Standing | None = None) -> None:
        if full_replan_s is not None and not (full_replan_s > 0 and math.isfinite(full_replan_s)):
            raise ValueError(f"full_replan_s must be a positive number of seconds (got {full_replan_s!r})")
        self.store = store
        self.policy = policy
        self.node_timeout_s = node_timeout_s
        self.default_runtime_s = default_runtime_s
        self._clock = clock
        self.site = site or SiteConfig()
        self.plan_interval_s = plan_interval_s
        self.slot_s = slot_s
        self.horizon_s = horizon_s
        self.full_replan_s = full_replan_s
        self.max_jobs = max_jobs
        # each job's priority and its QOS's bounds on carbon (None: every job equal, unbounded)
        self.standing = standing
        self._qos_held: dict[int, str] = {}  # jobs a QOS's GPU limit holds back this tick, and why
        self._monotonic = monotonic
        if carbon is None:
            from scheduler.carbon import CarbonSignals

            carbon = CarbonSignals(store, clock=clock, track_status=False)
        self.curves = CarbonCurves(carbon, slot_s=slot_s, horizon_s=horizon_s, ttl_s=carbon_ttl_s,
                                   monotonic=monotonic)
        self._seed: tuple[Profile, ...] | None = None
        self._last_fingerprint: int | None = None
        self._disk_full: str | None = None  # nodes short of disk space (disk_full_notes), per snapshot
        self._last_planned_at = -math.inf
        self._last_planned_full = True  # whether the policy's last run re-planned every job
        self._last_full_at = -math.inf  # monotonic time of the last full re-plan

    def seed_profiles(self) -> tuple[Profile, ...]:
        if self._seed is None:
            from policies.model.energy import seed_profiles

            self._seed = tuple(seed_profiles())
        return self._seed

    def snapshot(self, conn: Connection, *, incremental: bool = False) -> tuple[Snapshot, QueueRead]:
        """The world as the policy sees it, and the queued rows by id (for the write-back).

        `incremental`: `keep` holds the stored plans of the PLANNED jobs that are not pinned
        (start at or after the next tick, GPUs set); the policy keeps those that still fit.
        Otherwise those plans are `previous`: where a full re-plan starts from.
        """
        now = self._clock()
        node_rows, running = read_nodes(conn), read_running(conn)
        learned = learned_profiles(conn)
        book = _book(self.seed_profiles() + learned)
        slots = self._slots(read_gpus(conn), node_rows, running, now, book)
        queued = read_queue(conn, now)
        self._disk_full = disk_full_notes(conn)
        pinned, keep, previous = self._stored_plans(conn, queued, slots, now, incremental)
        zones = sorted({s.zone for s in slots})
        carbon = self.curves.for_zones(zones, now)
        jobs_ = _seeded(self._queued_jobs(conn, queued, pinned, now, slots), slots, book, learned,
                        self.default_runtime_s)
        # interruptible jobs' windows may stretch it (policies.problem.segments.horizon_for)
        horizon_s = horizon_for(jobs_, now, self.horizon_s, self.slot_s)
        snapshot = Snapshot(
            now=now,
            jobs=jobs_,
            gpus=tuple(slots),
            default_runtime_s=self.default_runtime_s,
            carbon={z: zc.curve for z, zc in carbon.items() if zc.curve is not None},
            pue={z: self.site.pue(z) for z in zones},  # zone defaults; a GPU's own site: GpuSlot.pue
            profiles=self.seed_profiles() + learned,
            power_caps=self.site.power_caps({budget_of(s) for s in slots}, now, horizon_s),
            slot_s=self.slot_s,
            horizon_s=horizon_s,
            pinned=pinned,
            keep=keep,
            previous=previous,
            caps=self.site.caps,
        )
        return snapshot, queued

    def _slots(self, gpu_rows: list, node_rows: dict, running: dict, now: datetime, book) -> list[GpuSlot]:
        """Every GPU as the policy sees it: healthy while its node's heartbeat is fresh, busy
        until its running job is expected to end, with its site's PUE and budget."""
        fresh_after = now - timedelta(seconds=self.node_timeout_s)
        slots = []
        for g in gpu_rows:
            node = node_rows.get(g.node_name)
            alive = node is not None and node.last_heartbeat is not None and node.last_heartbeat >= fresh_after
            busy_until = None
            if g.job_id is not None:
                busy_until = self._expected_end(running.get(g.job_id), now, book, g.model)
            slots.append(GpuSlot(id=g.id, node=g.node_name, zone=node.zone if node else "?",
                                 index=g.index, model=g.model, memory_gib=g.memory_gib,
                                 healthy=bool(g.healthy) and alive, busy_until=busy_until,
                                 drained=bool(g.drained), pue=self.site.node_site_pue(g.node_name),
                                 power_limit_w=_standing_limit_w(g, running.get(g.job_id)),
                                 budget=self.site.budget_of_node(g.node_name)))
        return slots

    def _stored_plans(self, conn: Connection, queued: QueueRead, slots: list[GpuSlot], now: datetime,
                      incremental: bool) -> tuple[dict[int, Assignment], dict[int, Assignment], dict[int, Assignment]]:
        """The stored plans a tick starts from: (pinned, keep, previous). Pinned: PLANNED jobs
        starting before the next tick on usable GPUs. The other PLANNED jobs' plans are `keep`
        on an incremental tick, else `previous` (cpsat tries them first)."""
        usable = {s.id for s in slots if s.healthy and not s.drained}
        pin_before = now + timedelta(seconds=self.plan_interval_s)
        pinned_ids = {r.id for r in queued.values()
                      if r.state == State.PLANNED.value and r.planned_start is not None
                      and r.planned_start < pin_before and r.planned_gpu_ids
                      and all(g in usable for g in r.planned_gpu_ids)}
        pinned = current_plans(conn, pinned_ids)
        keep: dict[int, Assignment] = {}
        previous: dict[int, Assignment] = {}
        if incremental:
            keep = current_plans(conn, {r.id for r in queued.values()
                                        if r.state == State.PLANNED.value and r.id not in pinned_ids
                                        and r.planned_start is not None and r.planned_start >= pin_before
                                        and r.planned_node and r.planned_gpu_ids})
        else:  # a full re-plan starts from the stored plans (cpsat tries them first)
            previous = {r.id: Assignment(r.id, r.planned_node, tuple(r.planned_gpu_ids), r.planned_start)
                        for r in queued.values()
                        if r.state == State.PLANNED.value and r.id not in pinned_ids
                        and r.planned_start is not None and r.planned_node and r.planned_gpu_ids}
        return pinned, keep, previous

    def _queued_jobs(self, conn: Connection, queued: QueueRead, pinned: dict[int, Assignment], now: datetime,
                     slots: list[GpuSlot]) -> tuple[QueuedJob, ...]:
        """The queued jobs as the policy's (`scheduler.jobs.job.queued_job`), each with its
        priority and its QOS's bounds on carbon (`scheduler.standing`)."""
        self._qos_held = {}
        if self.standing is None:
            return tuple(queued_job(j, self.default_runtime_s, now=now, pinned=j.id in pinned)
                         for j in queued.values())
        order, self._qos_held = self.standing.plan_order(conn, list(queued.values()), now,
                                                         sum(1 for s in slots if s.healthy))
        ranked = {b.job_id: b.priority for b in order}
        levels = self.standing.qos
        return tuple(queued_job(j, self.default_runtime_s, now=now, pinned=j.id in pinned,
                                priority=ranked.get(j.id, 0.0), qos=levels.levels.get(j.qos))
                     for j in queued.values() if j.id not in self._qos_held)

    def blind_zones(self, snapshot: Snapshot) -> list[str]:
        """Zones of the snapshot's GPUs planned without a carbon curve."""
        return sorted({g.zone for g in snapshot.gpus} - set(snapshot.carbon))

    def _expected_end(self, job, now: datetime, book=None, model: str | None = None) -> datetime:
        """When a running job's GPUs are expected free: its planned runtime stretched by the
        deadline margin of its estimate (policies.model.margin), so that jobs planned after it keep
        their deadlines when it runs somewhat long."""
        if job is None or job.started_at is None:
            return now + timedelta(seconds=OVERRUN_BUSY_S)
        planned_end = _segmented_end(job)
        if planned_end is not None:  # an interruptible job frees its GPUs when its plan says
            return planned_end if planned_end > now else now + timedelta(seconds=OVERRUN_BUSY_S)
        runtime = (job.est_runtime_planned_s or job.est_runtime_s or job.time_limit_s
                   or self.default_runtime_s)
        if book is not None and model is not None and job.est_runtime_planned_s:
            from policies.model.margin import job_margin

            runtime *= job_margin(job, model, book)
        end = job.started_at + timedelta(seconds=runtime)
        # Running past its estimate: it is still busy; assume it ends soon.
        return end if end > now else now + timedelta(seconds=OVERRUN_BUSY_S)

    def preview(self) -> tuple[Snapshot, Plan]:
        """What the policy would do now (a full re-plan), without writing anything."""
        with self.store.read() as conn:
            snapshot, _ = self.snapshot(conn)
        snapshot, waiting = self.bounded(snapshot)
        plan = with_wait_reasons(snapshot, self._finished(snapshot, self.policy.plan(snapshot)))
        return snapshot, replace(plan, unplaced={**plan.unplaced, **waiting})

    def _finished(self, snapshot: Snapshot, plan: Plan) -> Plan:
        """The policy's plan as it is committed (`policies.solvers.finish`): operating points, power
        limits, the seed-profile note, and starts held back by the budgets' ramp limits (a
        zone's or a site's), the jobs that started in the last minute counted."""
        return finish_plan(snapshot, plan, ramps_w_per_min=ramps_of(self.site.budgets),
                           recent=lambda: self._recent_starts(snapshot.now))

    def _recent_starts(self, now: datetime) -> list[RecentStart]:
        """The jobs that started in the last minute (`policies.pricing.ramp.WINDOW_S`) with their
        budget and planned power."""
        since = now - timedelta(seconds=RAMP_WINDOW_S)
        with self.store.read() as conn:
            return [RecentStart(self.site.budget_of_node(r.name) or r.zone, r.started_at,
                                (r.est_energy_j or 0.0) / r.est_runtime_planned_s)
                    for r in recent_starts(conn, since) if r.est_runtime_planned_s]

    def bounded(self, snapshot: Snapshot) -> tuple[Snapshot, dict[int, str]]:
        """The snapshot with at most `max_jobs` queued jobs (pinned first, then by deadline,
        then submission), and the reason of each job left for a later tick."""
        if len(snapshot.jobs) <= self.max_jobs:
            return snapshot, {}
        order = sorted(snapshot.jobs, key=lambda j: (not j.pinned, j.deadline is None,
                                                      j.deadline or j.submitted_at, j.submitted_at, j.id))
        rest = {j.id for j in order[self.max_jobs:]}
        why = (f"waiting: {len(snapshot.jobs)} jobs are queued and a tick plans the first {self.max_jobs} "
               "by deadline")
        return without(snapshot, rest), {i: why for i in rest}

    def full_replan_due(self) -> bool:
        """Whether the next tick re-plans every queued job (always without `full_replan_s`)."""
        return (self.full_replan_s is None
                or self._monotonic() - self._last_full_at >= self.full_replan_s)

    def tick(self) -> TickStats:
        started = time.perf_counter()
        full = self.full_replan_due()
        with self.store.read() as conn:
            snapshot, queued = self.snapshot(conn, incremental=not full)
        note_waiting(self.store, queued.waiting)
        snapshot, waiting = self.bounded(snapshot)
        waiting = {**waiting, **self._qos_held}
        fingerprint = _fingerprint(snapshot)
        mono = self._monotonic()
        # Skip only when the last run of the policy saw the same snapshot and was of a kind that
        # gives this tick's plan: after an incremental run a due full re-plan still runs (else
        # it could wait on an unchanged queue until REPLAN_AT_LEAST_S); after a full run an
        # incremental one would keep exactly the plans it wrote.
        if (fingerprint == self._last_fingerprint and mono - self._last_planned_at < REPLAN_AT_LEAST_S
                and (self._last_planned_full or not full)):
            return TickStats(jobs=len(queued), planned=0, moved=0, withdrawn=0,
                             duration_s=time.perf_counter() - started, skipped=True, full=full)
        plan = with_wait_reasons(snapshot, self._finished(snapshot, self.policy.plan(snapshot)))
        if waiting:
            plan = replace(plan, unplaced={**plan.unplaced, **waiting})
        self._last_fingerprint, self._last_planned_at, self._last_planned_full = fingerprint, mono, full
        if full:
            self._last_full_at = mono
        placed = plan.by_job()
        kept = sum(1 for job_id, k in snapshot.keep.items()
                   if (a := placed.get(job_id)) is not None and a.node == k.node and a.start_at == k.start_at)
        counts = write_plan(self.store, self._changes(queued, plan, snapshot.now), self._clock)
        stats = TickStats(jobs=len(queued), planned=counts["plan"], moved=counts["move"],
                          withdrawn=counts["withdraw"], duration_s=time.perf_counter() - started,
                          refreshed=counts["refresh"], pinned=sum(j.pinned for j in snapshot.jobs),
                          blind_zones=tuple(self.blind_zones(snapshot)), full=full, kept=kept)
        if stats.planned or stats.moved or stats.withdrawn:
            log.info("planner (%s, %s): %d queued, %d newly planned, %d moved, %d withdrawn, %d pinned, "
                     "%d of %d earlier plans kept in %.3fs", self.policy.name, "full" if full else "incremental",
                     stats.jobs, stats.planned, stats.moved, stats.withdrawn, stats.pinned, stats.kept,
                     len(snapshot.keep), stats.duration_s)
        return stats

    def _changes(self, queued: QueueRead, plan: Plan, now: datetime) -> list[tuple]:
        """What a plan changes in the store, `(kind, row, assignment, why)` per queued job
        (`scheduler.jobs.store.write_plan`): a pending job planned, a plan moved or withdrawn, a
        kept plan's estimate refreshed, an unplaced job's reason updated."""
        placed = plan.by_job()
        writes = []
        for job_id, row in queued.items():
            a = placed.get(job_id)
            if a is None:
                why = str(plan.unplaced.get(job_id, "not placed by the policy"))  # a Deferral is a str too
                if self._disk_full:  # nodes that take no jobs for want of disk space (issue 48)
                    why = f"{why}; {self._disk_full}"
                if row.state == State.PLANNED.value:
                    writes.append(("withdraw", row, None, why))
                elif row.reason != why:
                    writes.append(("reason", row, None, why))
                continue
            if row.state == State.PENDING.value:
                writes.append(("plan", row, a, a.explanation))
            elif _plan_changed(row, a, now):
                writes.append(("move", row, a, a.explanation))
            elif _estimate_changed(row, a) or wait_word(row.reason) != wait_word(a.explanation):
                writes.append(("refresh", row, a, a.explanation))
        return writes


def _seeded(queued: tuple[QueuedJob, ...], slots: list[GpuSlot], book, learned: tuple[Profile, ...],
            default_runtime_s: float) -> tuple[QueuedJob, ...]:
    """The queue with each job that this cluster's learned profiles alone would leave
    unplaceable on every GPU model of the fleet, where the seed profiles fit it, marked to be
    planned with the seeds (issue 48; `policies.pricing.feasibility.learned_refusal`, as admission
    asks it at submit). Only jobs of a workload with learned profiles are asked."""
    from policies.pricing.feasibility import gpu_kinds, learned_refusal

    workloads = {p.workload for p in learned}
    if not workloads or not any(j.workload in workloads for j in queued):
        return queued
    kinds = gpu_kinds(slots)
    answers: dict[tuple, str | None] = {}  # one answer per job shape: a queue has few
    out = []
    for j in queued:
        if j.workload not in workloads:
            out.append(j)
            continue
        key = (j.workload, j.gpus, j.gpu_mem_gib, j.ttft_slo_ms, j.tpot_slo_ms, j.latency_slo_ms, j.time_limit_s,
               j.prompts, j.est_runtime_s)
        if key not in answers:
            answers[key] = learned_refusal(j, kinds, book, default_runtime_s)
        out.append(j if answers[key] is None else replace(j, seed_profile=answers[key]))
    return tuple(out)


def _standing_limit_w(g, running_job) -> float | None:
    """The power limit a GPU has for planning: what the driver enforces, except while a job of
    ours runs on it at a limit the agent set for that job only (then the GPU's default)."""
    if running_job is not None and running_job.power_limit_w is not None and g.power_limit_default_w:
        return g.power_limit_default_w
    return g.power_limit_w


def _fingerprint(snapshot: Snapshot) -> int:
    """What a plan depends on, except the clock: equal fingerprints, equal plans."""
    return hash((snapshot.jobs, snapshot.gpus, tuple(sorted(snapshot.carbon.items())),
                 tuple(sorted(snapshot.pue.items())), snapshot.profiles, snapshot.power_caps,
                 tuple(sorted(snapshot.pinned.items())), snapshot.default_runtime_s))


def plan_rows(snapshot: Snapshot, plan: Plan, blind_zones: Iterable[str] = ()) -> list[dict]:
    """A plan as `carbonsched plan --json` shows it, one object per queued job, by job id.

    DESIGN.md's `job, node, gpus, start, gco2, gco2_if_now, reason`, plus the GPU model and
    zone, estimated energy, runtime, finish and gCO2 per prompt, the binding constraint,
    whether the deadline is missed, whether the zone is planned carbon-blind and the
    intensity it is priced blind at (`policies.pricing.blind`), the time limit (an explicit one, or
    one derived from the runtime on the chosen GPUs), and whether the job is pinned (it
    starts before the next tick, so its plan no longer moves).
    Unplaced jobs have nulls and the reason. GPUs are node-local indices.
    """
    from scheduler.timeparse import iso

    by_id = {g.id: g for g in snapshot.gpus}
    pinned = {j.id for j in snapshot.jobs if j.pinned}
    queued = {j.id: j for j in snapshot.jobs}
    blind = set(blind_zones)
    out = []
    for a in plan.assignments:
        first = by_id.get(a.gpu_ids[0]) if a.gpu_ids else None
        e = a.estimate
        out.append({"job": a.job_id, "node": a.node,
                    "gpus": [by_id[g].index if g in by_id else g for g in a.gpu_ids],
                    "start": iso(a.start_at), "gco2": e.gco2, "gco2_if_now": e.gco2_if_now,
                    "reason": a.explanation,
                    "model": first.model if first else None, "zone": first.zone if first else None,
                    "carbon_blind": bool(first and first.zone in blind),
                    "finish": iso(e.finish_at) if e.finish_at else None, "runtime_s": e.runtime_s,
                    "energy_j": e.energy_j, "prompts": e.prompts, "gco2_per_prompt": e.gco2_per_prompt,
                    "binding": e.binding, "deadline_miss": bool(e.deadline_miss),
                    "pinned": a.job_id in pinned, "priced_blind_g_per_kwh": e.blind_g_per_kwh,
                    "time_limit_s": e.time_limit_s if e.time_limit_s is not None
                    else getattr(queued.get(a.job_id), "time_limit_s", None),
                    "operating_point": operating_point_json(e.max_batch, e.precision, e.tp),
                    # the GPU power limit chosen (W per GPU; null: the default), and the same
                    # placement's estimate at the default limit
                    "power_limit_w": e.power_limit_w, "gco2_uncapped": e.uncapped_gco2,
                    "energy_j_uncapped": e.uncapped_energy_j, "runtime_s_uncapped": e.uncapped_runtime_s})
    out += [{"job": job_id, "node": None, "gpus": None, "start": None, "gco2": None,
             "gco2_if_now": None, "reason": why, "model": None, "zone": None, "carbon_blind": False,
             "finish": None, "runtime_s": None, "energy_j": None, "prompts": None,
             "gco2_per_prompt": None, "binding": None, "deadline_miss": False, "pinned": False,
             "priced_blind_g_per_kwh": None, "time_limit_s": getattr(queued.get(job_id), "time_limit_s", None),
             "operating_point": None, "power_limit_w": None, "gco2_uncapped": None,
             "energy_j_uncapped": None, "runtime_s_uncapped": None}
            for job_id, why in plan.unplaced.items()]
    return sorted(out, key=lambda p: p["job"])


def operating_point_json(max_batch: int | None, precision: str | None, tp: int | None) -> dict | None:
    """A plan's operating point as `show --json` and `plan --json` print it (None: none)."""
    if max_batch is None:
        return None
    return {"max_batch": max_batch, "precision": precision, "tp": tp}


def preview_rows(planner: Planner) -> list[dict]:
    """What `planner`'s policy would do now, as `plan_rows`; writes nothing."""
    snapshot, plan = planner.preview()
    return plan_rows(snapshot, plan, planner.blind_zones(snapshot))


# A re-plan that moves an interruptible job's segment boundaries by less than this keeps the
# stored segments (a policy planning from `now` shifts them a little every tick).
SEGMENT_TOLERANCE_S = 60.0


def segments_moved(stored: list | None, segments: tuple) -> bool:
    """Whether a plan's segments differ from the stored ones: another count, or a boundary
    more than SEGMENT_TOLERANCE_S away."""
    old = interruptible.segments_from_json(stored)
    new = list(segments) if len(segments) > 1 else []
    if len(old) != len(new):
        return True
    return any(abs((x - y).total_seconds()) > SEGMENT_TOLERANCE_S
               for (a0, a1), (b0, b1) in zip(old, new) for x, y in ((a0, b0), (a1, b1)))


def _segmented_end(job) -> datetime | None:
    """When a running interruptible job frees its GPUs by its plan: a checkpoint job at its
    checkpoint request (plus the grace it has to exit), a pause job at its last segment's end
    (it holds its GPUs through the pauses). None: not segmented."""
    if getattr(job, "interruptible", None) is None:
        return None
    if job.interruptible == interruptible.CHECKPOINT and job.planned_interrupt_at is not None:
        return job.planned_interrupt_at + timedelta(seconds=job.checkpoint_grace_s or 0.0)
    segments = interruptible.segments_from_json(job.planned_segments)
    if job.interruptible == interruptible.PAUSE and len(segments) > 1:
        return segments[-1][1]
    return None


def _plan_changed(row, a, now: datetime) -> bool:
    if row.planned_node != a.node or list(row.planned_gpu_ids or []) != list(a.gpu_ids):
        return True
    if row.planned_start is None:
        return True
    shift_s = (a.start_at - row.planned_start).total_seconds()
    if shift_s < -EARLIER_TOLERANCE_S:
        return True
    lead_s = max(0.0, (row.planned_start - now).total_seconds())
    return shift_s > max(LATER_TOLERANCE_S, LATER_TOLERANCE_SHARE * lead_s)


def _estimate_changed(row, a) -> bool:
    """Whether a plan that stays put carries an estimate worth rewriting (the forecast or a
    learned profile moved it), so `show` and `queue` do not show stale figures."""
    if bool(row.deadline_miss) != bool(a.estimate.deadline_miss):
        return True
    if (row.planned_max_batch, row.planned_precision, row.planned_tp) != (a.estimate.max_batch, a.estimate.precision,
                                                                          a.estimate.tp):
        return True
    if row.planned_power_limit_w != a.estimate.power_limit_w:
        return True
    if segments_moved(row.planned_segments, a.segments):
        return True
    old, new = row.est_gco2, a.estimate.gco2
    if (old is None) != (new is None):
        return True
    if old is None or new is None:
        return False
    return abs(new - old) > ESTIMATE_REFRESH_SHARE * max(abs(old), 1e-9)


def _book(profiles):
    """The planner's ProfileBook over `profiles` (imported here: the module loads without numpy)."""
    from policies.model.energy import ProfileBook

    return ProfileBook(profiles)
