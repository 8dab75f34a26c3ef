"""The simulated cluster's power against its budgets.

`SitePower` holds a meter (`records.ZoneMeter`) per zone and per [sites.S] budget, routes each
change of a job's power to them, and answers what the budgets ask of a tick: the caps in force over its
horizon (constant caps, daily windows, dated events: `scheduler.power_budget`) and the ramp
limits on new load (`policies.pricing.ramp`), as the daemon's planner applies them.
"""

from __future__ import annotations

from datetime import timedelta

from policies.types import J_PER_KWH
from policies.pricing.ramp import WINDOW_S as RAMP_WINDOW_S
from policies.pricing.ramp import RecentStart
from scheduler.power_budget import caps_between, ramps_of
from scheduler.simulate.cluster import ClusterSpec
from scheduler.simulate.intensity import ZoneIntensity
from scheduler.simulate.records import JobRecord, ZoneMeter, at


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

    def recent_starts(self, now_s: float, records: list[JobRecord]) -> list[RecentStart]:
        """The jobs that started in the last minute (`policies.pricing.ramp.WINDOW_S`) with their
        budget and planned power, as the daemon's planner counts them against the ramp limits."""
        return [RecentStart(self.budget_of[r.gpu_ids[0]] or r.zone if r.gpu_ids else r.zone,
                            at(r.run_start_s), r.planned_power_w) for r in records
                if r.state == "running" and r.run_start_s is not None and now_s - r.run_start_s < RAMP_WINDOW_S]

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
