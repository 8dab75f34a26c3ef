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
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from sqlalchemy import Connection, String, and_, bindparam, case, func, literal, or_, select, type_coerce, update

from policies import Plan, Policy, QueuedJob, Snapshot
from policies.base import get_policy, parse_policy_spec
from policies.guard import fallback_chain, guarded, without
from policies.model import (SITE_BUDGET_PREFIX, Assignment, Estimate, GpuSlot, PowerCap, Profile, budget_of,
                            site_budget)
from policies.ramp import WINDOW_S as RAMP_WINDOW_S
from policies.ramp import RecentStart, stagger_starts
from policies.segments import horizon_for
from scheduler import interruptible
from scheduler.carbon_curves import DEFAULT_CARBON_TTL_S, CarbonCurves
from scheduler.carbon_signal import CarbonSignal
from scheduler.job_specs import BEGIN_REASON, HELD_REASON, OPERATOR_HELD_REASON
from scheduler.clock import utcnow
from scheduler.lifecycle import ACTIVE, TERMINAL, State, check_allowed, record_events
from scheduler.power_budget import ZoneBudget, caps_between, parse_zone_budget, ramps_of
from scheduler.profiles import learned_profiles
from scheduler.store import Store
from scheduler.store.models import gpus, job_dependencies, jobs, nodes

log = logging.getLogger(__name__)

WRITE_BATCH = 500
# ~100 plan rows and events take ~20-30 ms to write on SQLite, 500 up to ~140 ms: a submission
# waiting behind one write transaction would see that as latency (measured, bench/api_bench.py)
WRITE_BATCH_SQLITE = 100
# A planned start that moves earlier is written at once (the job may start sooner); one that
# slips later only when it slips by more than this share of its lead time (and 60 s): a
# queue behind a job running over its estimate would otherwise be rewritten every tick.
EARLIER_TOLERANCE_S = 1.0
LATER_TOLERANCE_S = 60.0
LATER_TOLERANCE_SHARE = 0.1


# A stored estimate is refreshed (without moving the plan) when the policy's new figure
# differs by more than this share: forecasts and learned profiles change under a plan.
ESTIMATE_REFRESH_SHARE = 0.1
MAX_CPSAT_TIME_LIMIT_S = 10.0
SIMULATION_ONLY = {"oracle": "it needs perfect knowledge of future arrivals and of the actual "
                             "carbon intensity; use it in `carbonsched simulate --policy oracle`"}


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
# jobs in ~1 s, cpsat's first plan in ~2 s; bench/README.md). The rest wait, with the reason.
MAX_PLANNED_JOBS = 5000


def make_policy(name: str, *, plan_interval_s: float = 15.0) -> Policy:
    """The daemon's policy by name, tuned to the plan interval.

    A time-limited solver (cpsat) gets min(10 s, interval / 2), so a tick finishes well
    before the next one is due. Simulation-only policies are refused with the reason.
    ValueError names the known policies for an unknown name.
    """
    if name in SIMULATION_ONLY:
        raise ValueError(f"policy {name!r} cannot run in the daemon: {SIMULATION_ONLY[name]}")
    spec = parse_policy_spec(name)
    policy = get_policy(spec.name, **spec.params)
    if hasattr(policy, "max_time_s") and "max_time_s" not in spec.params:
        policy = get_policy(spec.name, **{**spec.params,
                                          "max_time_s": max(0.1, min(MAX_CPSAT_TIME_LIMIT_S, plan_interval_s / 2))})
    # a policy that raises never fails a tick: jobs without any option are set aside first,
    # then cpsat -> greedy -> fifo (policies.guard)
    return guarded(policy, [get_policy(f) for f in fallback_chain(spec.name)])


def check_policy(name: str) -> str:
    """The name of the daemon's policy `name`, with the ValueError `make_policy` would raise
    for a bad one. A policy without parameters is not built: a daemon whose planner runs in
    a process of its own never plans, and building cpsat imports OR-Tools (about a second
    of CPU at every start)."""
    if name in SIMULATION_ONLY:
        raise ValueError(f"policy {name!r} cannot run in the daemon: {SIMULATION_ONLY[name]}")
    spec = parse_policy_spec(name)
    if spec.params:
        make_policy(name)  # a parameter is checked by the policy's constructor
    return spec.name


# -- site configuration: PUE and power caps ------------------------------------------------

@dataclass(frozen=True)
class SiteConfig:
    """PUE per node's site (with zone and global defaults) and GPU power caps per zone.

    PUE belongs to a data centre, not to a grid zone: one zone can hold several sites with
    different PUEs. A node's PUE is, first found: its own `[nodes.NAME] pue`, the PUE of
    the `[sites.S]` listing it, its zone's `[zones.Z] pue`, `[site] pue`, 1.0.

    ```toml
    [site]
    pue = 1.3                # every node without a more specific value (default 1.0)
    [zones.DE]
    pue = 1.15               # default of the zone's nodes
    power_cap_w = 40000      # at most this much GPU power at once in the zone
    [sites.fra-dc2]          # a data centre: its PUE and its nodes
    pue = 1.08
    nodes = ["de-gpu-1", "de-gpu-2"]
    power_cap_w = 30000      # optional: the site's own feed (also power_windows, power_events,
                             # power_schedule, static_power_w, ramp_w_per_min, as for a zone)
    [nodes.de-gpu-9]
    pue = 1.4                # one node's own value
    ```
    (Inside `[carbonsched]` when the file uses that table.) ValueError on a bad value.
    """

    site_pue: float = 1.0
    zone_pue: Mapping[str, float] = field(default_factory=dict)
    # power budgets by key (`policies.model.budget_of`): a zone's (`DE`: its nodes outside any
    # budgeted site) or a site's (`site:fra-dc2`: the nodes it lists), with their windows
    budgets: Mapping[str, ZoneBudget] = field(default_factory=dict)
    node_pue: Mapping[str, float] = field(default_factory=dict)  # [nodes.NAME] pue
    sites_pue: Mapping[str, float] = field(default_factory=dict)  # [sites.S] pue
    site_of: Mapping[str, str] = field(default_factory=dict)  # node -> its [sites.S]
    # What operators allow of GPU power limits: `[power]` (policies.power_cap.CapBounds).
    caps: Any = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> SiteConfig:
        config = config or {}
        site = config.get("site") or {}
        zones = config.get("zones") or {}
        if not isinstance(site, Mapping):
            raise ValueError("config [site]: expected a table")
        if not isinstance(zones, Mapping):
            raise ValueError("config [zones]: expected a table of zones, e.g. [zones.DE]")
        site_pue = _pue(site.get("pue", 1.0), "site.pue")
        unknown = sorted(set(site) - {"pue"})
        if unknown:
            raise ValueError(f"config [site]: unknown key(s) {', '.join(unknown)} (known: pue)")
        pue: dict[str, float] = {}
        budgets: dict[str, ZoneBudget] = {}
        for zone, zc in zones.items():
            if not isinstance(zc, Mapping):
                raise ValueError(f"config zones.{zone}: expected a table with pue and/or power_cap_w")
            known = ("pue", "power_cap_w", "power_windows", "power_events", "power_schedule", "static_power_w",
                     "ramp_w_per_min")
            unknown = sorted(set(zc) - set(known))
            if unknown:
                raise ValueError(f"config zones.{zone}: unknown key(s) {', '.join(unknown)} "
                                 f"(known: {', '.join(known)})")
            if "pue" in zc:
                pue[str(zone)] = _pue(zc["pue"], f"zones.{zone}.pue")
            budget = parse_zone_budget(str(zone), zc)
            if budget is not None:
                budgets[str(zone)] = budget
        sites_pue, site_of, site_budgets = _sites(config.get("sites") or {})
        node_pue = _nodes(config.get("nodes") or {})
        from policies.power_cap import CapBounds

        return cls(site_pue=site_pue, zone_pue=pue, budgets={**budgets, **site_budgets}, node_pue=node_pue,
                   sites_pue=sites_pue, site_of=site_of, caps=CapBounds.from_config(config))

    def budget_of_node(self, node: str | None) -> str | None:
        """The budget key of `node`'s site when that site has a power budget (`site:NAME`);
        None: the node draws against its zone's budget, if any."""
        site = self.site_of.get(node) if node is not None else None
        key = site_budget(site) if site is not None else None
        return key if key in self.budgets else None

    def budget_nodes(self, key: str) -> tuple[str, ...] | None:
        """The nodes of a site's budget (`site:NAME`); None for a zone's budget (it covers
        its zone's nodes that are in no budgeted site)."""
        if not key.startswith(SITE_BUDGET_PREFIX):
            return None
        site = key[len(SITE_BUDGET_PREFIX):]
        return tuple(sorted(n for n, s in self.site_of.items() if s == site))

    def site_budget_nodes(self) -> dict[str, tuple[str, ...]]:
        """Each site budget's key and its nodes (what the governor measures it over)."""
        return {k: members for k in self.budgets if (members := self.budget_nodes(k)) is not None}

    def pue(self, zone: str | None, node: str | None = None) -> float:
        """The PUE of `node` (in `zone`): its own, its site's, its zone's, else the default."""
        own = self.node_site_pue(node)
        if own is not None:
            return own
        return self.zone_pue.get(zone, self.site_pue) if zone is not None else self.site_pue

    def node_site_pue(self, node: str | None) -> float | None:
        """The PUE set for `node` itself or for its site; None when only defaults apply."""
        if node is None:
            return None
        if node in self.node_pue:
            return self.node_pue[node]
        site = self.site_of.get(node)
        return self.sites_pue.get(site) if site is not None else None

    def pue_source(self, zone: str | None, node: str | None = None) -> str:
        """Where `pue(zone, node)` comes from, in the config's words (for receipts and exports)."""
        if node is not None and node in self.node_pue:
            return f"nodes.{node}"
        if node is not None and self.site_of.get(node) in self.sites_pue:
            return f"sites.{self.site_of[node]}"
        if zone is not None and zone in self.zone_pue:
            return f"zones.{zone}"
        return "site"

    def power_caps(self, budgets: Iterable[str] | None = None, now: datetime | None = None,
                   horizon_s: float = 0.0) -> tuple[PowerCap, ...]:
        """The power budgets with these keys (zones' and `site:NAME`s; all configured when
        None) as PowerCaps: the caps always in force, and with `now` each daily window that
        overlaps the next `horizon_s` (`scheduler.power_budget`)."""
        if now is None:
            wanted = None if budgets is None else set(budgets)
            return tuple(PowerCap(zone=z, cap_w=b.cap_w) for z, b in sorted(self.budgets.items())
                         if b.cap_w is not None and (wanted is None or z in wanted))
        return caps_between(self.budgets, budgets, now, now + timedelta(seconds=horizon_s))


SITE_BUDGET_KEYS = ("power_cap_w", "power_windows", "power_events", "power_schedule", "static_power_w",
                    "ramp_w_per_min")


def _sites(table: object) -> tuple[dict[str, float], dict[str, str], dict[str, ZoneBudget]]:
    """`[sites.S] pue = X, nodes = [...]` and optionally a power budget of the site's own
    (`power_cap_w` and the other keys of a zone's): PUE per site, the site of each node and
    the budgets by key (`site:S`)."""
    if not isinstance(table, Mapping):
        raise ValueError("config [sites]: expected a table of sites, e.g. [sites.fra-dc2]")
    pue: dict[str, float] = {}
    site_of: dict[str, str] = {}
    budgets: dict[str, ZoneBudget] = {}
    known = ("pue", "nodes", *SITE_BUDGET_KEYS)
    for site, sc in table.items():
        if not isinstance(sc, Mapping):
            raise ValueError(f"config sites.{site}: expected a table with pue and nodes")
        unknown = sorted(set(sc) - set(known))
        if unknown:
            raise ValueError(f"config sites.{site}: unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})")
        budget = parse_zone_budget(str(site), {k: sc[k] for k in SITE_BUDGET_KEYS if k in sc}, where=f"sites.{site}")
        if budget is not None:
            budgets[site_budget(str(site))] = budget
        if "pue" not in sc and budget is None:
            raise ValueError(f"config sites.{site}.pue: missing (a site has its PUE, a power budget of its own "
                             f"(power_cap_w, ...) or both)")
        if "pue" in sc:
            pue[str(site)] = _pue(sc["pue"], f"sites.{site}.pue")
        members = sc.get("nodes", [])
        if not isinstance(members, list) or not all(isinstance(n, str) and n.strip() for n in members):
            raise ValueError(f"config sites.{site}.nodes: a list of node names (got {members!r})")
        for n in members:
            if n.strip() in site_of:
                raise ValueError(f"config sites.{site}.nodes: node {n.strip()!r} is already in site "
                                 f"{site_of[n.strip()]!r}; a node is in one site")
            site_of[n.strip()] = str(site)
        if budget is not None and not members:
            raise ValueError(f"config sites.{site}.nodes: a site with a power budget lists its nodes")
    return pue, site_of, budgets


def _nodes(table: object) -> dict[str, float]:
    """`[nodes.NAME] pue = X`: a node's own PUE."""
    if not isinstance(table, Mapping):
        raise ValueError("config [nodes]: expected a table of nodes, e.g. [nodes.gpu-7]")
    out: dict[str, float] = {}
    for node, nc in table.items():
        if not isinstance(nc, Mapping):
            raise ValueError(f"config nodes.{node}: expected a table with pue")
        unknown = sorted(set(nc) - {"pue"})
        if unknown:
            raise ValueError(f"config nodes.{node}: unknown key(s) {', '.join(unknown)} (known: pue)")
        if "pue" in nc:
            out[str(node)] = _pue(nc["pue"], f"nodes.{node}.pue")
    return out


def _pue(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"config {name}: a number >= 1.0 (got {value!r})")
    if not 1.0 <= value <= 5.0:
        raise ValueError(f"config {name}: a PUE is between 1.0 and 5.0 (got {value!r}): it is "
                         "facility power over IT power")
    return float(value)


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
                 monotonic: Callable[[], float] = time.monotonic, max_jobs: int = MAX_PLANNED_JOBS) -> None:
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
            from policies.energy import seed_profiles

            self._seed = tuple(seed_profiles())
        return self._seed

    def snapshot(self, conn: Connection, *, incremental: bool = False) -> tuple[Snapshot, QueueRead]:
        """The world as the policy sees it, and the queued rows by id (for the write-back).

        `incremental`: `keep` holds the stored plans of the PLANNED jobs that are not pinned
        (start at or after the next tick, GPUs set); the policy keeps those that still fit.
        Otherwise those plans are `previous`: where a full re-plan starts from.
        """
        now = self._clock()
        fresh_after = now - timedelta(seconds=self.node_timeout_s)
        node_rows = {r.name: r for r in conn.execute(select(nodes))}
        running = {r.id: r for r in conn.execute(
            select(jobs.c.id, jobs.c.started_at, jobs.c.est_runtime_s, jobs.c.time_limit_s,
                   jobs.c.est_runtime_planned_s, jobs.c.workload, jobs.c.power_limit_w,
                   jobs.c.interruptible, jobs.c.planned_segments, jobs.c.planned_interrupt_at,
                   jobs.c.checkpoint_grace_s)
            .where(jobs.c.state == State.RUNNING.value))}
        learned = learned_profiles(conn)
        book = _book(self.seed_profiles() + learned)
        slots = []
        for g in conn.execute(select(gpus).order_by(gpus.c.node_name, gpus.c.vendor, gpus.c.index)):
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
        queued = _read_queue(conn, now)
        usable = {s.id for s in slots if s.healthy and not s.drained}
        self._disk_full = disk_full_notes(conn)
        pin_before = now + timedelta(seconds=self.plan_interval_s)
        pinned_ids = {r.id for r in queued.values()
                      if r.state == State.PLANNED.value and r.planned_start is not None
                      and r.planned_start < pin_before and r.planned_gpu_ids
                      and all(g in usable for g in r.planned_gpu_ids)}
        pinned = _current_plans(conn, pinned_ids)
        keep: dict[int, Assignment] = {}
        previous: dict[int, Assignment] = {}
        if incremental:
            keep = _current_plans(conn, {r.id for r in queued.values()
                                         if r.state == State.PLANNED.value and r.id not in pinned_ids
                                         and r.planned_start is not None and r.planned_start >= pin_before
                                         and r.planned_node and r.planned_gpu_ids})
        else:  # a full re-plan starts from the stored plans (cpsat tries them first)
            previous = {r.id: Assignment(r.id, r.planned_node, tuple(r.planned_gpu_ids), r.planned_start)
                        for r in queued.values()
                        if r.state == State.PLANNED.value and r.id not in pinned_ids
                        and r.planned_start is not None and r.planned_node and r.planned_gpu_ids}
        zones = sorted({s.zone for s in slots})
        carbon = self.curves.for_zones(zones, now)
        # A job submitted while this snapshot was read (after `now` was taken: a loaded host,
        # or a row committed between the clock and the query) is released now, not at the
        # next 15-minute slot its later submission time would round up to.
        jobs_ = tuple(QueuedJob(r.id, r.gpus, r.gpu_mem_gib, min(r.submitted_at, now), self._runtime_estimate(r),
                                r.deadline, r.latency_slo_ms, r.workload, r.prompts,
                                max_delay_s=r.max_delay_s, pinned=r.id in pinned,
                                # an explicit --time-limit binds; a derived one follows the plan
                                time_limit_s=r.time_limit_s if r.time_limit_factor is None else None,
                                time_limit_factor=r.time_limit_factor, gco2_if_now=r.est_gco2_if_now,
                                ttft_slo_ms=r.ttft_slo_ms, tpot_slo_ms=r.tpot_slo_ms,
                                **_interruptible_fields(r))
                      for r in queued.values())
        jobs_ = _seeded(jobs_, slots, book, learned, self.default_runtime_s)
        # interruptible jobs' windows may stretch it (policies.segments.horizon_for)
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

    def blind_zones(self, snapshot: Snapshot) -> list[str]:
        """Zones of the snapshot's GPUs planned without a carbon curve."""
        return sorted({g.zone for g in snapshot.gpus} - set(snapshot.carbon))

    def _runtime_estimate(self, r: "QueuedRow") -> float | None:
        """The runtime the job is planned with (`policies.feasibility.planning_runtime_s`)."""
        from policies.feasibility import planning_runtime_s

        return planning_runtime_s(r.est_runtime_s, r.time_limit_s, self.default_runtime_s)

    def _expected_end(self, job, now: datetime, book=None, model: str | None = None) -> datetime:
        """When a running job's GPUs are expected free: its planned runtime stretched by the
        deadline margin of its estimate (policies.margin), so that jobs planned after it keep
        their deadlines when it runs somewhat long."""
        if job is None or job.started_at is None:
            return now + timedelta(seconds=60)
        planned_end = _segmented_end(job)
        if planned_end is not None:  # an interruptible job frees its GPUs when its plan says
            return planned_end if planned_end > now else now + timedelta(seconds=60)
        runtime = (job.est_runtime_planned_s or job.est_runtime_s or job.time_limit_s
                   or self.default_runtime_s)
        if book is not None and model is not None and job.est_runtime_planned_s:
            from policies.margin import job_margin

            runtime *= job_margin(job, model, book)
        end = job.started_at + timedelta(seconds=runtime)
        # Running past its estimate: it is still busy; assume it ends soon.
        return end if end > now else now + timedelta(seconds=60)

    def preview(self) -> tuple[Snapshot, Plan]:
        """What the policy would do now (a full re-plan), without writing anything."""
        with self.store.read() as conn:
            snapshot, _ = self.snapshot(conn)
        snapshot, waiting = self.bounded(snapshot)
        plan = self._ramped(snapshot, _with_points(snapshot, self.policy.plan(snapshot)))
        return snapshot, replace(plan, unplaced={**plan.unplaced, **waiting})

    def _ramped(self, snapshot: Snapshot, plan: Plan) -> Plan:
        """The plan with starts held back by the budgets' ramp limits (`policies.ramp`; a
        zone's or a site's), the jobs that started in the last minute counted (their planned
        power)."""
        ramps = ramps_of(self.site.budgets)
        if not ramps:
            return plan
        since = snapshot.now - timedelta(seconds=RAMP_WINDOW_S)
        with self.store.read() as conn:
            rows = conn.execute(
                select(nodes.c.name, nodes.c.zone, jobs.c.started_at, jobs.c.est_energy_j,
                       jobs.c.est_runtime_planned_s)
                .join(nodes, nodes.c.name == jobs.c.node)
                .where(jobs.c.state == State.RUNNING.value, jobs.c.started_at >= since))
            recent = [RecentStart(self.site.budget_of_node(r.name) or r.zone, r.started_at,
                                  (r.est_energy_j or 0.0) / r.est_runtime_planned_s)
                      for r in rows if r.est_runtime_planned_s]
        return stagger_starts(plan, snapshot.now, {g.id: budget_of(g) for g in snapshot.gpus}, ramps, recent,
                              pinned=snapshot.pinned)

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
        self._note_waiting(queued.waiting)
        snapshot, waiting = self.bounded(snapshot)
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
        plan = self._ramped(snapshot, _with_points(snapshot, self.policy.plan(snapshot)))
        if waiting:
            plan = replace(plan, unplaced={**plan.unplaced, **waiting})
        self._last_fingerprint, self._last_planned_at, self._last_planned_full = fingerprint, mono, full
        if full:
            self._last_full_at = mono
        placed = plan.by_job()
        kept = sum(1 for job_id, k in snapshot.keep.items()
                   if (a := placed.get(job_id)) is not None and a.node == k.node and a.start_at == k.start_at)
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
            elif _plan_changed(row, a, snapshot.now):
                writes.append(("move", row, a, a.explanation))
            elif _estimate_changed(row, a):
                writes.append(("refresh", row, a, a.explanation))
        counts = {"plan": 0, "move": 0, "withdraw": 0, "reason": 0, "refresh": 0}
        # SQLite has one writer at a time: smaller batches let submissions in between them
        size = WRITE_BATCH_SQLITE if self.store.dialect == "sqlite" else WRITE_BATCH
        for i in range(0, len(writes), size):
            batch = writes[i:i + size]
            for kind, n in self.store.transact(lambda conn: _apply(conn, batch, self._clock())).items():
                counts[kind] += n
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

    def _note_waiting(self, waiting: dict[int, tuple[str | None, str]]) -> None:
        """Store why each job the planner leaves alone waits (held, --begin, a dependency,
        an array throttle), so `queue`'s REASON says it as squeue does."""
        changed = [{"b_id": job_id, "b_reason": why} for job_id, (stored, why) in waiting.items() if stored != why]
        if not changed:
            return
        stmt = (update(jobs).where(jobs.c.id == bindparam("b_id"), jobs.c.state == State.PENDING.value)
                .values(reason=bindparam("b_reason")))
        self.store.transact(lambda conn: conn.execute(stmt, changed))


def disk_full_notes(conn: Connection, most: int = 3) -> str | None:
    """Why nodes take no jobs for want of disk space (their agents' words: how much is free
    where), for the REASON of the jobs left waiting; None when no node is short."""
    rows = conn.execute(select(gpus.c.node_name, gpus.c.unhealthy_reason).distinct()
                        .where(gpus.c.healthy.is_(False), gpus.c.unhealthy_reason.like("disk full:%"))
                        .order_by(gpus.c.node_name)).all()
    if not rows:
        return None
    by_node = {node: why for node, why in rows}
    named = [f"node {node} takes no jobs: {why}" for node, why in list(by_node.items())[:most]]
    more = f" (and {len(by_node) - most} more nodes)" if len(by_node) > most else ""
    return "; ".join(named) + more


def _with_points(snapshot: Snapshot, plan: Plan) -> Plan:
    """The plan with each job's operating point on its GPUs, in its estimate and explanation,
    and the GPU power limit chosen with it where operators allow caps (policies.power_cap);
    a job planned with its seed profiles says why (`_seeded`)."""
    from policies.operating_point import annotate
    from policies.power_cap import choose_caps

    plan = choose_caps(snapshot, annotate(snapshot, plan))
    seeded = {j.id: j.seed_profile for j in snapshot.jobs if j.seed_profile is not None}
    if not seeded:
        return plan
    return replace(plan, assignments=tuple(
        replace(a, explanation=f"{a.explanation}; planned with the seed profile: {seeded[a.job_id]}".lstrip("; "))
        if a.job_id in seeded else a for a in plan.assignments))


def _seeded(queued: tuple[QueuedJob, ...], slots: list[GpuSlot], book, learned: tuple[Profile, ...],
            default_runtime_s: float) -> tuple[QueuedJob, ...]:
    """The queue with each job that this cluster's learned profiles alone would leave
    unplaceable on every GPU model of the fleet, where the seed profiles fit it, marked to be
    planned with the seeds (issue 48; `policies.feasibility.learned_refusal`, as admission
    asks it at submit). Only jobs of a workload with learned profiles are asked."""
    from policies.feasibility import gpu_kinds, learned_refusal

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
    intensity it is priced blind at (`policies.blind`), the time limit (an explicit one, or
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


_PLAN_COLUMNS = (jobs.c.id, jobs.c.planned_node, jobs.c.planned_gpu_ids, jobs.c.planned_start,
                 jobs.c.est_energy_j, jobs.c.est_gco2, jobs.c.est_gco2_if_now,
                 jobs.c.est_runtime_planned_s, jobs.c.prompts, jobs.c.binding, jobs.c.deadline_miss,
                 jobs.c.explanation, jobs.c.planned_max_batch, jobs.c.planned_precision, jobs.c.planned_tp,
                 jobs.c.planned_power_limit_w, jobs.c.est_uncapped_energy_j, jobs.c.est_uncapped_gco2,
                 jobs.c.est_uncapped_runtime_s, jobs.c.planned_segments)
# Ids per IN (...) query: a kept queue holds thousands of plans, and SQLite caps bound parameters.
READ_BATCH = 900


def _current_plans(conn: Connection, job_ids: set[int]) -> dict[int, Assignment]:
    """The stored plans of `job_ids` as Assignments (pinned jobs, and kept plans)."""
    if not job_ids:
        return {}
    out = {}
    ids = sorted(job_ids)
    rows = (r for i in range(0, len(ids), READ_BATCH)
            for r in conn.execute(select(*_PLAN_COLUMNS).where(jobs.c.id.in_(ids[i:i + READ_BATCH]))))
    for r in rows:
        finish = (r.planned_start + timedelta(seconds=r.est_runtime_planned_s)
                  if r.est_runtime_planned_s else None)
        out[r.id] = Assignment(
            job_id=r.id, node=r.planned_node, gpu_ids=tuple(r.planned_gpu_ids), start_at=r.planned_start,
            estimate=Estimate(finish_at=finish, energy_j=r.est_energy_j, gco2=r.est_gco2,
                              gco2_if_now=r.est_gco2_if_now, runtime_s=r.est_runtime_planned_s,
                              prompts=r.prompts, binding=r.binding, deadline_miss=bool(r.deadline_miss),
                              max_batch=r.planned_max_batch, precision=r.planned_precision, tp=r.planned_tp,
                              power_limit_w=r.planned_power_limit_w, uncapped_energy_j=r.est_uncapped_energy_j,
                              uncapped_gco2=r.est_uncapped_gco2, uncapped_runtime_s=r.est_uncapped_runtime_s),
            explanation=r.explanation or "",
            segments=tuple(interruptible.segments_from_json(r.planned_segments)))
    return out


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


def _interruptible_fields(r: "QueuedRow") -> dict:
    """The issue-30 fields of a queued job as the policy sees them (policies.model.QueuedJob).
    A job that ignored a checkpoint request runs its rest in one piece: asking it again would
    lose its work again."""
    kind = r.interruptible if not r.checkpoints_ignored else None
    if kind is None:
        return {"done_fraction": float(r.done_fraction or 0.0), "resume_count": int(r.resume_count or 0),
                "resume_cost_s": float(r.resume_cost_s or 0.0) if r.resume_count else 0.0}
    return {"interruptible": kind, "min_run_s": r.min_run_s, "resume_cost_s": float(r.resume_cost_s or 0.0),
            "max_segments": int(r.max_segments or interruptible.DEFAULT_MAX_SEGMENTS),
            "done_fraction": float(r.done_fraction or 0.0), "resume_count": int(r.resume_count or 0)}


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


class QueuedRow(NamedTuple):
    """A PENDING or PLANNED job as the planner reads it each tick."""

    id: int
    state: str
    gpus: int
    gpu_mem_gib: float
    submitted_at: datetime
    est_runtime_s: float | None
    deadline: datetime | None
    latency_slo_ms: float | None
    workload: str | None
    prompts: int | None
    planned_node: str | None
    planned_gpu_ids: list | None
    planned_start: datetime | None
    plan_rev: int
    reason: str | None
    max_delay_s: float | None
    est_gco2: float | None
    deadline_miss: bool | None
    time_limit_s: float | None
    time_limit_factor: float | None  # set: the limit is derived and follows the plan
    est_gco2_if_now: float | None  # the counterfactual fixed when the job was first planned
    ttft_slo_ms: float | None
    tpot_slo_ms: float | None
    planned_max_batch: int | None
    planned_precision: str | None
    planned_tp: int | None
    planned_power_limit_w: float | None
    # Interruptible jobs (issue 30).
    interruptible: str | None
    min_run_s: float | None
    resume_cost_s: float | None
    max_segments: int | None
    done_fraction: float | None
    resume_count: int | None
    checkpoints_ignored: int | None
    planned_segments: list | None


_QUEUE_TIMES = {"submitted_at", "deadline", "planned_start"}


def _waits(now: datetime) -> list[tuple[Any, Any]]:
    """Each reason a queued job is left alone for now (issue 28), as (SQL condition, the
    REASON `queue` shows), in the order squeue would name them: held by an operator
    (JobHeldAdmin, issue 48) or by its owner (JobHeldUser), before
    its `--begin` time (BeginTime), waiting on a dependency that is not satisfied yet
    (Dependency; afterok: the job COMPLETED; afterany: it ended; afternotok: it ended
    otherwise; one that can never be satisfied keeps the job waiting, as in Slurm), or a
    task of an array beyond its `%N` throttle (JobArrayTaskLimit: only the N lowest-index
    active tasks of an array are plannable, so at most N of them run at once)."""
    dep_job = jobs.alias("dep_job")
    ended = [s.value for s in TERMINAL]
    unsatisfied = (select(literal(1)).select_from(job_dependencies.join(dep_job, dep_job.c.id ==
                                                                        job_dependencies.c.on_job_id, isouter=True))
                   .where(job_dependencies.c.job_id == jobs.c.id,
                          or_(dep_job.c.id.is_(None),
                              and_(job_dependencies.c.kind == "afterok", dep_job.c.state != State.COMPLETED.value),
                              and_(job_dependencies.c.kind == "afterany", dep_job.c.state.not_in(ended)),
                              and_(job_dependencies.c.kind == "afternotok",
                                   or_(dep_job.c.state.not_in(ended), dep_job.c.state == State.COMPLETED.value))))
                   .exists())
    sibling = jobs.alias("sibling")
    ahead = (select(func.count()).select_from(sibling)
             .where(sibling.c.array_job_id == jobs.c.array_job_id, sibling.c.array_task_id < jobs.c.array_task_id,
                    sibling.c.state.in_([s.value for s in ACTIVE]))
             .scalar_subquery())
    # every condition is true or false, never NULL: NOT(NULL) would drop every ordinary job
    return [
        (and_(jobs.c.held_at.is_not(None), jobs.c.hold_kind == "operator"), literal(OPERATOR_HELD_REASON)),
        (jobs.c.held_at.is_not(None), literal(HELD_REASON)),
        (and_(jobs.c.begin_at.is_not(None), jobs.c.begin_at > now), literal(BEGIN_REASON)),
        (and_(jobs.c.dependency.is_not(None), unsatisfied),
         literal("waiting on its dependency ") + jobs.c.dependency + literal(" (Dependency)")),
        (and_(jobs.c.array_max_running.is_not(None), ahead >= jobs.c.array_max_running),
         literal("array throttle: at most ") + type_coerce(jobs.c.array_max_running, String)
         + literal(" tasks at once (JobArrayTaskLimit)")),
    ]


class QueueRead(dict):
    """The plannable queue, id -> QueuedRow (what a tick writes back to), and `waiting`: the
    PENDING jobs the planner leaves alone for now (`_waits`), id -> (the reason stored, the
    reason they wait), from the same read."""

    def __init__(self, rows: dict[int, QueuedRow], waiting: dict[int, tuple[str | None, str]]) -> None:
        super().__init__(rows)
        self.waiting = waiting


def _read_queue(conn: Connection, now: datetime | None = None) -> QueueRead:
    """The queue, read fast: a tick reads thousands of rows, so on SQLite times and JSON come
    back as raw text and are parsed here with the C parsers instead of per-value processors.
    Jobs not yet plannable (`_waits`) are left out of it, and come back in `waiting` with the
    reason they wait: one pass, each wait's condition evaluated once a row."""
    raw = conn.dialect.name == "sqlite"
    cols = []
    for name in QueuedRow._fields:
        col = jobs.c[name]
        if raw and (name in _QUEUE_TIMES or name == "planned_gpu_ids"):
            col = type_coerce(col, String).label(name)
        cols.append(col)
    waits = case(*_waits(now or datetime.now(timezone.utc))).label("waits")  # NULL: plannable
    q = (select(*cols, waits).where(jobs.c.state.in_([State.PENDING.value, State.PLANNED.value]))
         .order_by(jobs.c.id))
    out: dict[int, QueuedRow] = {}
    waiting: dict[int, tuple[str | None, str]] = {}
    for r in conn.execute(q):
        why = r[-1]
        if raw:
            r = QueuedRow(r[0], r[1], r[2], r[3], _utc(r[4]), r[5], _utc(r[6]), r[7], r[8], r[9],
                          r[10], json.loads(r[11]) if r[11] else None, _utc(r[12]), *r[13:-1])
        else:
            r = QueuedRow(*r[:-1])
        if why is None:
            out[r.id] = r
        elif r.state == State.PENDING.value:
            waiting[r.id] = (r.reason, why)
    return QueueRead(out, waiting)


def _utc(text: str | None) -> datetime | None:
    """A stored naive-UTC SQLite timestamp as an aware datetime."""
    return None if text is None else datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


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


_ESTIMATE_FIELDS = ("explanation", "est_energy_j", "est_gco2", "est_gco2_if_now",
                    "est_runtime_planned_s", "binding", "deadline_miss", "reason", "time_limit_s",
                    "planned_max_batch", "planned_precision", "planned_tp", "planned_power_limit_w",
                    "est_uncapped_energy_j", "est_uncapped_gco2", "est_uncapped_runtime_s",
                    "planned_segments", "planned_interrupt_at", "planned_resume_at")
_PLAN_FIELDS = ("planned_node", "planned_gpu_ids", "planned_start", "plan_rev", "state") + _ESTIMATE_FIELDS
_UPDATE_PLAN = (update(jobs).where(jobs.c.id == bindparam("b_id"))
                .values({f: bindparam(f"b_{f}") for f in _PLAN_FIELDS}))
_UPDATE_ESTIMATE = (update(jobs).where(jobs.c.id == bindparam("b_id"))
                    .values({f: bindparam(f"b_{f}") for f in _ESTIMATE_FIELDS}))
_UPDATE_REASON = update(jobs).where(jobs.c.id == bindparam("b_id")).values(reason=bindparam("b_reason"))


def _apply(conn: Connection, batch: list, now) -> dict[str, int]:
    """Write one batch of plan changes in bulk: a few statements, not a few per job.

    The batch's rows are re-read inside the write transaction (locked FOR UPDATE on
    PostgreSQL; SQLite write transactions are exclusive), and only rows still in the state
    and plan revision the plan was made from are written, so a job cancelled or claimed
    meanwhile is left alone.
    """
    check_allowed(State.PENDING, State.PLANNED)
    check_allowed(State.PLANNED, State.PENDING)
    ids = [row.id for _, row, _, _ in batch]
    q = select(jobs.c.id, jobs.c.state, jobs.c.plan_rev).where(jobs.c.id.in_(ids))
    if conn.dialect.name == "postgresql":
        q = q.with_for_update()
    current = {r.id: (r.state, r.plan_rev) for r in conn.execute(q)}
    updates, reasons, estimates, events = [], [], [], []
    done = {"plan": 0, "move": 0, "withdraw": 0, "reason": 0, "refresh": 0}
    for kind, row, a, why in batch:
        if current.get(row.id) != (row.state, row.plan_rev):
            continue
        if kind == "reason":
            reasons.append({"b_id": row.id, "b_reason": why})
        elif kind == "refresh":
            row_values = _plan_row(row, a, State.PLANNED, why)
            estimates.append({k: row_values[k] for k in ("b_id", *(f"b_{f}" for f in _ESTIMATE_FIELDS))})
        elif kind == "withdraw":
            updates.append(_plan_row(row, None, State.PENDING, why))
            events.append(_event(row.id, State.PLANNED, State.PENDING, why, now))
        else:
            updates.append(_plan_row(row, a, State.PLANNED, why))
            if kind == "plan":
                events.append(_event(row.id, State.PENDING, State.PLANNED, why, now))
        done[kind] += 1
    if updates:
        conn.execute(_UPDATE_PLAN, updates)
    if reasons:
        conn.execute(_UPDATE_REASON, reasons)
    if estimates:
        conn.execute(_UPDATE_ESTIMATE, estimates)
    record_events(conn, events)
    return done


def _plan_row(row, a, state: State, why: str) -> dict:
    """The columns a plan (or its withdrawal, `a` None) writes. The "if run now" counterfactual,
    once set, is kept (the policy hands it back; a withdrawn job keeps it for its next plan),
    and a derived time limit follows the plan's runtime on its chosen GPUs."""
    limit = a.estimate.time_limit_s if a is not None and a.estimate.time_limit_s is not None else row.time_limit_s
    if_now = a.estimate.gco2_if_now if a is not None and row.est_gco2_if_now is None else row.est_gco2_if_now
    return {"b_id": row.id, "b_state": state.value, "b_reason": why, "b_plan_rev": row.plan_rev + 1,
            "b_time_limit_s": limit,
            "b_planned_node": a.node if a else None,
            "b_planned_gpu_ids": list(a.gpu_ids) if a else None,
            "b_planned_start": a.start_at if a else None,
            "b_explanation": a.explanation if a else None,
            "b_est_energy_j": a.estimate.energy_j if a else None,
            "b_est_gco2": a.estimate.gco2 if a else None,
            "b_est_gco2_if_now": if_now,
            "b_est_runtime_planned_s": a.estimate.runtime_s if a else None,
            "b_binding": a.estimate.binding if a else None,
            "b_deadline_miss": bool(a.estimate.deadline_miss) if a else False,
            "b_planned_max_batch": a.estimate.max_batch if a else None,
            "b_planned_precision": a.estimate.precision if a else None,
            "b_planned_tp": a.estimate.tp if a else None,
            "b_planned_power_limit_w": a.estimate.power_limit_w if a else None,
            "b_est_uncapped_energy_j": a.estimate.uncapped_energy_j if a else None,
            "b_est_uncapped_gco2": a.estimate.uncapped_gco2 if a else None,
            "b_est_uncapped_runtime_s": a.estimate.uncapped_runtime_s if a else None,
            # An interruptible job's segments (issue 30): the agent asks it to checkpoint at
            # planned_interrupt_at; a pause job is stopped and continued by planned_segments.
            "b_planned_segments": interruptible.segments_to_json(a.segments) if a else None,
            "b_planned_interrupt_at": a.interrupt_at if a else None,
            "b_planned_resume_at": a.resume_at if a else None}


def _event(job_id: int, src: State, dst: State, why: str, now) -> dict:
    return {"job_id": job_id, "from_state": src.value, "to_state": dst.value, "actor_uid": None,
            "reason": why, "at": now}


def _book(profiles):
    """The planner's ProfileBook over `profiles` (imported here: the module loads without numpy)."""
    from policies.energy import ProfileBook

    return ProfileBook(profiles)
