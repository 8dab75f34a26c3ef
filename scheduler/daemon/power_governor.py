"""The head node's power governor: measured GPU power of each budgeted zone or site within its cap.

A budget is a zone's (its nodes in no budgeted site) or a `[sites.S]`'s (the nodes it lists),
keyed as in `policies.types.budget_of`; "zone" below means either.

The planner keeps *planned* power within each zone's budget (`scheduler.power_budget`), but a
plan is an estimate: a job can draw more than its profile said, a window can begin while
jobs run. Every sampling period the governor sums the newest reading of each GPU of a
budgeted zone (`gpu_samples`, written by the agents about once a second), adds the static
power the site draws besides its GPUs (`[zones.Z] static_power_w`), and compares the sum with
the cap in force now. Over the cap, it lowers the power limit of running jobs there, the ones
with the most slack first (no deadline, then the latest deadline), each no lower than the
operators' floor (`[power] min_cap_fraction` of the GPU's default limit, and the board's
minimum), until the power is `MARGIN` below the cap (readings jitter). With room again (below the cap by `HEADROOM`), it
raises them back towards their planned limit, the ones with the least slack first.

It acts through the store: a running job's `planned_power_limit_w` is its limit now, which
its agent applies on its next tick (`Agent._follow_power_limit`, a job event each time); a
job's default limit comes back when it ends, as for any capped job. Every action is a job
event and counted in the metrics (`carbonsched_governor_actions_total`, the measured power
and cap per zone). What it lowered it remembers in memory only: after a daemon restart those
jobs stay at their lowered limit until they end (never above the budget).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from sqlalchemy import Connection, select

from policies.types import budget_text
from policies.pricing.power_cap import CapBounds
from scheduler.jobs.store import running_power_limits, set_planned_power_limit
from scheduler.lifecycle import State, record_events
from scheduler.power_budget import ZoneBudget
from scheduler.store import Store
from scheduler.store.models import gpus, nodes
from scheduler.store.telemetry_models import gpu_samples

log = logging.getLogger(__name__)

FRESH_S = 5.0  # readings older than this do not count (a GPU without one counts its last heartbeat power)
MARGIN = 0.02  # over the cap, limits are lowered to reach (1 - MARGIN) x the cap: readings jitter
HEADROOM = 0.05  # raise limits again only below (1 - HEADROOM) x the cap
STEP_W = 1.0  # limits are set in whole watts
SETTLE_TIMEOUT_S = 10.0  # a zone acted on is judged again after this long even without the result


@dataclass(frozen=True)
class GovernorAction:
    """One change of a running job's power limit."""

    zone: str
    job_id: int
    from_w: float | None  # None: the default limit
    to_w: float | None
    measured_w: float
    cap_w: float | None  # None: no cap in force (a window ended)


@dataclass
class ZoneReading:
    """What the governor saw of one zone in one period (also for the metrics)."""

    measured_w: float
    cap_w: float
    gpus: int
    stale: int  # GPUs without a fresh reading
    oldest_fresh_s: float | None = None  # the oldest of the GPUs' newest readings (epoch s)
    static_w: float = 0.0  # the site's draw besides its GPUs, included in measured_w


@dataclass
class _RunningJob:
    id: int
    deadline: datetime | None
    gpu_ids: list[int]
    limit_w: float | None  # its limit now (planned_power_limit_w; None: default)
    applied_w: float | None  # the limit its agent set (power_limit_w)
    draw_w: float  # measured, summed over its GPUs
    default_w: float  # per GPU
    floor_w: float  # per GPU


@dataclass
class PowerGovernor:
    """Holds each budgeted zone's measured GPU power within its cap in force now."""

    store: Store
    budgets: Mapping[str, ZoneBudget]  # by key: a zone id or `site:NAME`
    bounds: CapBounds = field(default_factory=CapBounds)
    # the nodes of each site budget (`site:NAME`); a zone's budget covers its other nodes
    site_nodes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
    on_action: Callable[[GovernorAction], None] | None = None
    lowered: dict[int, float | None] = field(default_factory=dict)  # job -> its limit before we lowered it
    last: dict[str, ZoneReading] = field(default_factory=dict)
    # A zone acted on waits for the result before it is judged again: until its agents have
    # applied the new limits and every GPU has a reading from after that (acting again on
    # readings from before would cut, or raise, twice for one excess).
    # (jobs acted on, when their limits were seen applied, when the governor acted)
    _settling: dict[str, tuple[set[int], float | None, float]] = field(default_factory=dict)

    def tick(self) -> list[GovernorAction]:
        """One period: read every budgeted zone, lower or raise limits; the changes made."""
        now = self.clock()
        actions: list[GovernorAction] = []
        governed: set[int] = set()
        for zone, budget in sorted(self.budgets.items()):
            cap = budget.cap_at(now)
            reading, running = self._running(zone, now)
            reading.static_w = budget.static_w
            reading.measured_w += budget.static_w  # the site's draw: its GPUs and the rest
            governed.update(j.id for j in running)
            if cap is None:
                if any(j.id in self.lowered for j in running):
                    actions += self._raise(zone, running, None, 0.0)
                continue
            reading.cap_w = cap
            self.last[zone] = reading
            if self._still_settling(zone, running, reading, now):
                continue
            if reading.measured_w > cap:
                done = self._lower(zone, running, cap, reading.measured_w)
            elif reading.measured_w < cap * (1 - HEADROOM) and any(j.id in self.lowered for j in running):
                done = self._raise(zone, running, cap, reading.measured_w)
            else:
                done = []
            if done:
                self._settling[zone] = ({a.job_id for a in done}, None, now.timestamp())
            actions += done
        for job_id in set(self.lowered) - governed:  # ended (or no longer governable)
            del self.lowered[job_id]
        for a in actions:
            if self.on_action is not None:
                self.on_action(a)
        return actions

    def _still_settling(self, zone: str, running: list[_RunningJob], reading: ZoneReading, now: datetime) -> bool:
        if zone not in self._settling:
            return False
        acted, applied_at, acted_at = self._settling[zone]
        if now.timestamp() - acted_at > SETTLE_TIMEOUT_S:
            log.warning("power governor: %s: the limits set %.0f s ago have not shown in its readings "
                        "(an agent down?); judging it again", budget_text(zone), now.timestamp() - acted_at)
            del self._settling[zone]
            return False
        live = {j.id: j for j in running if j.id in acted}
        if applied_at is None:
            if any(j.applied_w != j.limit_w for j in live.values()):
                return True  # an agent has not set it yet
            self._settling[zone] = (acted, now.timestamp(), acted_at)
            return True
        if reading.oldest_fresh_s is not None and reading.oldest_fresh_s < applied_at:
            return True  # some GPU's newest reading is from before the limits were set
        del self._settling[zone]
        return False

    # -- reading ------------------------------------------------------------------------

    def _running(self, zone: str, now: datetime) -> tuple[ZoneReading, list[_RunningJob]]:
        now_s = now.timestamp()
        with self.store.read() as conn:
            rows = list(conn.execute(
                select(gpus.c.id, gpus.c.model, gpus.c.job_id, gpus.c.power_w, gpus.c.power_limit_default_w,
                       gpus.c.power_limit_min_w, gpus.c.power_limit_w)
                .join(nodes, nodes.c.name == gpus.c.node_name)
                .where(self._members(zone), gpus.c.healthy.is_(True))))
            ids = [r.id for r in rows]
            fresh: dict[int, tuple[float, float]] = {}
            if ids:
                for s in conn.execute(
                        select(gpu_samples.c.gpu_id, gpu_samples.c.t_s, gpu_samples.c.power_w)
                        .where(gpu_samples.c.gpu_id.in_(ids),
                               gpu_samples.c.minute_s >= int((now_s - FRESH_S) // 60) * 60,
                               gpu_samples.c.t_s >= now_s - FRESH_S, gpu_samples.c.power_w.is_not(None))):
                    if s.gpu_id not in fresh or s.t_s > fresh[s.gpu_id][0]:
                        fresh[s.gpu_id] = (s.t_s, float(s.power_w))
            job_ids = sorted({r.job_id for r in rows if r.job_id is not None})
            job_rows = running_power_limits(conn, job_ids)
        draw = {r.id: fresh[r.id][1] if r.id in fresh else float(r.power_w or 0.0) for r in rows}
        reading = ZoneReading(measured_w=sum(draw.values()), cap_w=0.0, gpus=len(rows),
                              stale=sum(1 for r in rows if r.id not in fresh),
                              oldest_fresh_s=min((t for t, _ in fresh.values()), default=None))
        by_job: dict[int, list] = {}
        for r in rows:
            if r.job_id in job_rows:
                by_job.setdefault(r.job_id, []).append(r)
        running = []
        for job_id, grows in by_job.items():
            j = job_rows[job_id]
            if j.power_limit_note:  # its GPUs refused a limit: nothing to govern there
                continue
            default = min(float(g.power_limit_default_w or g.power_limit_w or 0.0) for g in grows)
            if default <= 0:
                continue
            _, min_fraction = self.bounds.for_model(grows[0].model)
            floor = max(min_fraction * default, max(float(g.power_limit_min_w or 0.0) for g in grows))
            running.append(_RunningJob(job_id, j.deadline, [g.id for g in grows], j.planned_power_limit_w,
                                       j.power_limit_w, sum(draw[g.id] for g in grows), default, floor))
        return reading, running

    def _members(self, key: str):
        """The nodes a budget covers, as a condition on `nodes`."""
        if key in self.site_nodes:
            return nodes.c.name.in_(self.site_nodes[key])
        in_sites = sorted({n for members in self.site_nodes.values() for n in members})
        return (nodes.c.zone == key) & nodes.c.name.not_in(in_sites) if in_sites else nodes.c.zone == key

    # -- acting -------------------------------------------------------------------------

    def _lower(self, zone: str, running: list[_RunningJob], cap: float, measured: float) -> list[GovernorAction]:
        excess = measured - cap * (1 - MARGIN)
        far = datetime.max.replace(tzinfo=timezone.utc)
        out = []
        for j in sorted(running, key=lambda j: (j.deadline is not None, -(j.deadline or far).timestamp(), j.id)):
            if excess <= 0:
                break
            k = len(j.gpu_ids)
            per_gpu_draw = j.draw_w / k
            now_limit = j.limit_w if j.limit_w is not None else j.default_w
            target = max(j.floor_w, min(now_limit, per_gpu_draw) - excess / k)
            target = float(int(target / STEP_W) * STEP_W) if target > j.floor_w else j.floor_w
            if target >= now_limit - STEP_W / 2:
                continue  # at its floor already
            excess -= k * max(0.0, per_gpu_draw - target)
            self.lowered.setdefault(j.id, j.limit_w)
            out.append(self._set(zone, j, target, measured, cap, "lowered"))
        if excess > 0:
            log.warning("power governor: %s draws %.0f W over its %.0f W cap with every governable "
                        "job at its floor", budget_text(zone), excess, cap)
        return out

    def _raise(self, zone: str, running: list[_RunningJob], cap: float | None,
               measured: float) -> list[GovernorAction]:
        room = float("inf") if cap is None else cap * (1 - HEADROOM) - measured
        far = datetime.max.replace(tzinfo=timezone.utc)
        out = []
        for j in sorted(running, key=lambda j: (j.deadline is None, (j.deadline or far).timestamp(), j.id)):
            if j.id not in self.lowered or room <= 0:
                continue
            k = len(j.gpu_ids)
            planned = self.lowered[j.id]
            ceiling = planned if planned is not None else j.default_w
            now_limit = j.limit_w if j.limit_w is not None else j.default_w
            target = min(ceiling, now_limit + room / k)
            if target >= ceiling - STEP_W / 2:
                self.lowered.pop(j.id)
                new = planned
            else:
                new = float(int(target / STEP_W) * STEP_W)
                if new <= now_limit + STEP_W / 2:
                    continue
            room -= k * ((new if new is not None else j.default_w) - now_limit)
            out.append(self._set(zone, j, new, measured, cap, "raised"))
        return out

    def _set(self, zone: str, j: _RunningJob, to_w: float | None, measured: float, cap: float | None,
             verb: str) -> GovernorAction:
        now = self.clock()
        limit_text = f"{to_w:g} W per GPU" if to_w is not None else "its default"
        against = (f"measured {measured:.0f} W against its cap of {cap:.0f} W" if cap is not None
                   else "has no cap in force now")
        reason = f"power governor: {budget_text(zone)} {against}; limit {verb} to {limit_text} on {len(j.gpu_ids)} GPU(s)"

        def tx(conn: Connection) -> None:
            set_planned_power_limit(conn, j.id, to_w)
            record_events(conn, [{"job_id": j.id, "from_state": State.RUNNING.value,
                                  "to_state": State.RUNNING.value, "actor_uid": None, "at": now,
                                  "reason": reason}])

        self.store.transact(tx)
        log.info("job %s: %s", j.id, reason)
        return GovernorAction(zone, j.id, j.limit_w, to_w, measured, cap)


def governor_period_s(sample_hz: float) -> float:
    """The governor runs once per sampling period of the agents (at most 1 s apart)."""
    return min(1.0, 1.0 / max(sample_hz, 1e-3))

