"""Ramp limits: how fast a site's load may grow (issue 29).

A utility contract or the site's own electrical design may bound how much new load a site
takes on per minute (`[zones.Z] ramp_w_per_min`): a GPU cluster whose jobs start at the same
second swings megawatts at once, and a carbon-aware planner makes that likelier, since every
flexible job wants the same green slot. Slots are 15 minutes, so the slot planner cannot see
this; `stagger_starts` is applied to every policy's plan afterwards (the daemon's planner
and the simulator alike): in each zone with a ramp limit, the planned starts, in order, are
held back until the power of the jobs starting within 60 seconds of each start, those that
started in the last minute included (`RecentStart`), stays within the limit, so no 60-second
window holds more (a conservative rule: a start may wait a little longer than the least the
limit needs, never less). A job that alone
draws more than the limit starts when nothing else has started in the minute before it (it
cannot be started in parts). A held-back job keeps its GPUs and runs as long as planned, so
its estimate ends as much later and its explanation says so; jobs whose start falls in the
current tick (pinned: about to be claimed) are counted, never moved.

Power is each plan's estimate (`energy_j / runtime_s`, IT power: the limit is of the GPUs'
draw, as budgets are before static power).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import NamedTuple

from policies.types import Assignment, Plan

WINDOW_S = 60.0  # the limit is per minute


class RecentStart(NamedTuple):
    """A job that started shortly before the plan: its zone, start and power (W)."""

    zone: str
    at: datetime
    power_w: float


def assignment_power_w(a: Assignment) -> float:
    """An assignment's planned power (W), from its estimate; 0 when it has none."""
    e = a.estimate
    if e.energy_j and e.runtime_s:
        return float(e.energy_j) / float(e.runtime_s)
    return 0.0


def stagger_starts(plan: Plan, now: datetime, zone_of_gpu: Mapping[int, str], ramps_w_per_min: Mapping[str, float],
                   recent: Iterable[RecentStart] = (), pinned: Iterable[int] = ()) -> Plan:
    """The plan with starts held back so that, in each zone of `ramps_w_per_min`, no 60 s
    window sees more new power than its limit (module docstring). Starts keep their order."""
    if not ramps_w_per_min or not plan.assignments:
        return plan
    fixed = set(pinned)
    by_zone: dict[str, list[int]] = {}
    for i, a in enumerate(plan.assignments):
        zone = zone_of_gpu.get(a.gpu_ids[0]) if a.gpu_ids else None
        if zone in ramps_w_per_min:
            by_zone.setdefault(zone, []).append(i)
    out = list(plan.assignments)
    recent = list(recent)
    for zone, idx in by_zone.items():
        limit = float(ramps_w_per_min[zone])
        starts = [(r.at, r.power_w) for r in recent if r.zone == zone]
        starts += [(max(out[i].start_at, now), assignment_power_w(out[i])) for i in idx if out[i].job_id in fixed]
        last = now
        for i in sorted((i for i in idx if out[i].job_id not in fixed),
                        key=lambda i: (max(out[i].start_at, now), out[i].job_id)):
            a = out[i]
            power = assignment_power_w(a)
            planned = max(a.start_at, now)
            t = earliest_start(starts, max(planned, last), power, limit)
            starts.append((t, power))
            last = t
            if t > planned:
                out[i] = _held_back(a, t, zone, limit)
    return replace(plan, assignments=tuple(out))


def earliest_start(starts: list[tuple[datetime, float]], t: datetime, power_w: float, limit_w: float) -> datetime:
    """The first time from `t` at which `power_w` may start: the starts within 60 s of it
    (before or after) and it stay within `limit_w`, so every 60 s window does. Over the limit
    alone: once no other start is within 60 s."""
    while True:
        near = [(s, w) for s, w in starts if abs((t - s).total_seconds()) < WINDOW_S]
        if not near or sum(w for _, w in near) + power_w <= limit_w + 1e-6:
            return t
        before = [s for s, _ in near if s <= t]
        # wait until the oldest start that still counts drops out (or past one yet to come)
        t = (min(before) if before else max(s for s, _ in near)) + timedelta(seconds=WINDOW_S)


def _held_back(a: Assignment, t: datetime, zone: str, limit_w: float) -> Assignment:
    delay = t - a.start_at
    e = a.estimate
    estimate = replace(e, finish_at=e.finish_at + delay if e.finish_at is not None else None)
    segments = tuple((s + delay, f + delay) for s, f in a.segments)
    note = (f"; start held back {delay.total_seconds():.0f} s by {zone}'s ramp limit "
            f"({limit_w / 1000:g} kW of new load a minute)")
    return replace(a, start_at=t, estimate=estimate, segments=segments, explanation=a.explanation + note)
