"""The simulated cluster's power against its budgets.

`ZoneMeter` integrates a zone's (or a [sites.S] budget's) GPU power over time and its emissions
at the zone's actual intensity; `SitePower` holds the meters, routes each change of a job's
power to them, and answers what the budgets ask of a tick: the caps in force over its
horizon (constant caps, daily windows, dated events: `scheduler.power_budget`) and the ramp
limits on new load (`policies.ramp`), as the daemon's planner applies them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from policies.energy import J_PER_KWH
from policies.model import Plan, Snapshot, budget_of
from policies.ramp import WINDOW_S as RAMP_WINDOW_S
from policies.ramp import RecentStart, stagger_starts
from scheduler.power_budget import ZoneBudget, caps_between, ramps_of
from scheduler.simulate.cluster import ClusterSpec
from scheduler.simulate.intensity import ZoneIntensity
from scheduler.simulate.records import EPS_S, JobRecord, at


@dataclass
class ZoneMeter:
    """Integrates a zone's simulated GPU power over time, and its emissions at actual intensity.

    The nodes of one zone may sit in sites with different PUEs: each change of power carries
    its node's PUE, and the meter integrates the facility power (GPU power x PUE) beside the
    GPU power. `pue` is the zone's default, for changes that name none.
    """

    zone: str
    pue: float
    intensity: ZoneIntensity
    power_w: float = 0.0
    facility_w: float = 0.0
    last_s: float = 0.0
    energy_j: float = 0.0
    facility_j: float = 0.0
    gco2: float = 0.0
    peak_w: float = 0.0
    over_cap_s: float = 0.0
    cap_w: float | None = None
    budget: ZoneBudget | None = None  # with daily windows: the cap in force changes with the time
    # (time, GPU power after the change, facility power after the change)
    timeline: list[tuple[float, float, float]] = field(default_factory=list)
    # GPU power under this meter's budget: all of it, but in a zone that holds budgeted sites
    # only its nodes outside them (the sites' power is held to their own budgets)
    budget_w: float = 0.0

    def advance(self, now_s: float) -> None:
        dt = now_s - self.last_s
        if dt > 0 and self.power_w:
            self.energy_j += self.power_w * dt
            self.facility_j += self.facility_w * dt
            self.gco2 += self.facility_w * self.intensity.integral_g_per_kwh_s(self.last_s, now_s) / J_PER_KWH
        if dt > 0 and self.budget_w:
            if self.budget is not None:
                self.over_cap_s += self._over_budget_s(self.last_s, now_s)
            elif self.cap_w is not None and self.budget_w > self.cap_w + EPS_S:
                self.over_cap_s += dt
        self.last_s = now_s

    def _over_budget_s(self, start_s: float, end_s: float) -> float:
        """Seconds of [start, end) at constant power over the cap in force, piece by piece
        between the windows' edges."""
        start, end = (datetime.fromtimestamp(t, timezone.utc) for t in (start_s, end_s))
        edges = [start, *self.budget.changes_between(start, end), end]
        over = 0.0
        for a, b in zip(edges, edges[1:]):
            cap = self.budget.gpu_cap_at(a)  # the site's cap less its static power
            if cap is not None and self.budget_w > cap + EPS_S:
                over += (b - a).total_seconds()
        return over

    def change(self, now_s: float, delta_w: float, pue: float | None = None, budgeted: bool = True) -> None:
        """`delta_w` more GPU power from `now_s` (`budgeted`: under this meter's budget)."""
        self.advance(now_s)
        self.power_w += delta_w
        self.facility_w += delta_w * (self.pue if pue is None else pue)
        if budgeted:
            self.budget_w += delta_w
            if abs(self.budget_w) < 1e-6:
                self.budget_w = 0.0
        if abs(self.power_w) < 1e-6:
            self.power_w = self.facility_w = 0.0
        self.peak_w = max(self.peak_w, self.power_w)
        self.timeline.append((now_s, self.power_w, self.facility_w))


def grams(power_w: float, pue: float, intensity: ZoneIntensity, start_s: float, end_s: float) -> float:
    """gCO2 of a constant GPU power at `pue` over [start_s, end_s], at the zone's actual intensity."""
    return power_w * pue * intensity.integral_g_per_kwh_s(start_s, end_s) / J_PER_KWH


class SitePower:
    """The meters of every zone and [sites.S] budget, and the budgets' caps and ramp limits."""

    def __init__(self, cluster: ClusterSpec, carbon: dict[str, ZoneIntensity], budget_of_gpu: list[str | None]) -> None:
        pue = cluster.pue
        self.power_caps = cluster.power_caps
        caps = {c.zone: c.cap_w for c in cluster.power_caps if c.start is None and c.end is None}
        self.meters = {z: ZoneMeter(zone=z, pue=pue.get(z, 1.0), intensity=carbon[z], cap_w=caps.get(z),
                                    budget=cluster.budgets.get(z))
                       for z in cluster.zones}
        # a [sites.S] budget's own meter (its power, cap and time over it; never in the totals:
        # its power and carbon are in its zone's meter)
        self.site_meters = {k: ZoneMeter(zone=k, pue=1.0, intensity=carbon[zone], cap_w=caps.get(k),
                                         budget=cluster.budgets.get(k))
                            for k, zone in cluster.site_zones().items()}
        self.budget_of = budget_of_gpu  # each GPU's site budget (`site:NAME`), None: its zone's
        self.budgets = cluster.budgets
        self.ramps = ramps_of(cluster.budgets)

    def caps_at(self, now_s: float, horizon_s: float) -> tuple:
        """The power caps a tick at `now_s` plans with: the constant ones, and each budget's
        windows and events over the horizon (`scheduler.power_budget.caps_between`)."""
        if not self.budgets:
            return self.power_caps
        now = at(now_s)
        windows = tuple(c for c in caps_between(self.budgets, None, now, now + timedelta(seconds=horizon_s))
                        if c.start is not None)
        return self.power_caps + windows

    def ramped(self, snap: Snapshot, plan: Plan, now_s: float, records: list[JobRecord]) -> Plan:
        """The plan with starts held back by the ramp limits (`policies.ramp`), counting the
        jobs that started in the last minute, as the daemon's planner does."""
        recent = [RecentStart(self.budget_of[r.gpu_ids[0]] or r.zone if r.gpu_ids else r.zone,
                              at(r.run_start_s), r.planned_power_w) for r in records
                  if r.state == "running" and r.run_start_s is not None and now_s - r.run_start_s < RAMP_WINDOW_S]
        return stagger_starts(plan, snap.now, {g.id: budget_of(g) for g in snap.gpus}, self.ramps, recent,
                              pinned=snap.pinned)

    def meter(self, r: JobRecord, now_s: float, delta_w: float, pue: float) -> None:
        """A change of `r`'s power: on its zone's meter, and on its site's where its site has a
        budget of its own (then not against its zone's)."""
        site = self.budget_of[r.gpu_ids[0]] if r.gpu_ids else None
        self.meters[r.zone].change(now_s, delta_w, pue, budgeted=site is None)
        if site is not None:
            self.site_meters[site].change(now_s, delta_w, pue)

    def close(self, end_s: float) -> None:
        """Bring every meter up to the end of the run."""
        for m in (*self.meters.values(), *self.site_meters.values()):
            m.advance(end_s)
