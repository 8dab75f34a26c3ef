"""GPU power budgets per zone's site, with their daily windows (issue 29).

A site's electrical feed, its contract or a demand-response programme bounds the GPU power it
may draw. The budget of a zone is configured with the zone:

```toml
[zones.DE]
power_cap_w = 20000          # always in force (optional)
[[zones.DE.power_windows]]   # a daily window (UTC) with its own cap: demand response, a tariff
start = "17:00"
end = "19:00"                # an end before the start runs past midnight
cap_w = 12000
```

In force at a time is the lowest of the caps that cover it. The planner sees each window of
its horizon as a `policies.model.PowerCap` (the policies keep planned power within the lowest
cap of every slot); the head node's governor (`scheduler.daemon.power_governor`) holds the
measured power to the cap in force now. The budget is per grid zone: one zone is one site's
feed here; several sites in one zone with budgets of their own are not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone

from policies.model import PowerCap


@dataclass(frozen=True)
class PowerWindow:
    """A daily window [start, end) in UTC with its own cap (W of GPU power)."""

    start: time
    end: time
    cap_w: float

    def spans_on(self, day: datetime) -> tuple[datetime, datetime]:
        """The window's [start, end) that begins on `day` (a UTC midnight)."""
        start = day.replace(hour=self.start.hour, minute=self.start.minute)
        end = day.replace(hour=self.end.hour, minute=self.end.minute)
        if end <= start:
            end += timedelta(days=1)
        return start, end


@dataclass(frozen=True)
class ZoneBudget:
    """One zone's budget: a cap always in force (None: none) and its daily windows."""

    cap_w: float | None = None
    windows: tuple[PowerWindow, ...] = ()

    def _occurrences(self, start: datetime, end: datetime):
        """(start, end, window) of each daily window occurrence that begins on a day from the
        one before `start` to the day of `end` (a window may run past midnight)."""
        day = start.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
        while day <= end:
            for w in self.windows:
                yield (*w.spans_on(day), w)
            day += timedelta(days=1)

    def cap_at(self, t: datetime) -> float | None:
        """The cap in force at `t`: the lowest that covers it; None when nothing does."""
        caps = [self.cap_w] if self.cap_w is not None else []
        caps += [w.cap_w for a, b, w in self._occurrences(t, t) if a <= t < b]
        return min(caps) if caps else None

    def changes_between(self, start: datetime, end: datetime) -> list[datetime]:
        """The times in (start, end) at which the cap in force may change (window edges)."""
        return sorted({t for a, b, _ in self._occurrences(start, end) for t in (a, b) if start < t < end})

    def caps_between(self, zone: str, start: datetime, end: datetime) -> tuple[PowerCap, ...]:
        """The budget as PowerCaps over [start, end): the constant cap and each window's
        occurrences that overlap it."""
        out = [PowerCap(zone=zone, cap_w=self.cap_w)] if self.cap_w is not None else []
        out += [PowerCap(zone=zone, cap_w=w.cap_w, start=a, end=b)
                for a, b, w in self._occurrences(start, end) if b > start and a < end]
        return tuple(sorted(out, key=lambda c: (c.start or datetime.min.replace(tzinfo=timezone.utc), c.cap_w)))


def _watts(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"config {where}: a positive number of watts (got {value!r})")
    return float(value)


def _clock_time(value: object, where: str) -> time:
    text = str(value).strip()
    try:
        hours, minutes = text.split(":")
        t = time(int(hours), int(minutes))
    except ValueError:
        raise ValueError(f"config {where}: a time of day as HH:MM in UTC (got {value!r})") from None
    return t


def parse_zone_budget(zone: str, table: Mapping) -> ZoneBudget | None:
    """The budget in `[zones.ZONE]` (`power_cap_w`, `power_windows`); None when it has none.
    Raises ValueError with the key's path for a bad value."""
    cap = _watts(table["power_cap_w"], f"zones.{zone}.power_cap_w") if "power_cap_w" in table else None
    raw = table.get("power_windows", [])
    if not isinstance(raw, list):
        raise ValueError(f"config zones.{zone}.power_windows: a list of tables ([[zones.{zone}.power_windows]])")
    windows = []
    for i, w in enumerate(raw):
        where = f"zones.{zone}.power_windows[{i}]"
        if not isinstance(w, Mapping):
            raise ValueError(f"config {where}: a table with start, end and cap_w")
        unknown = sorted(set(w) - {"start", "end", "cap_w"})
        missing = sorted({"start", "end", "cap_w"} - set(w))
        if unknown or missing:
            raise ValueError(f"config {where}: " + (f"unknown key(s) {', '.join(unknown)}" if unknown
                                                    else f"missing {', '.join(missing)}") + " (keys: start, end, cap_w)")
        start, end = _clock_time(w["start"], f"{where}.start"), _clock_time(w["end"], f"{where}.end")
        if start == end:
            raise ValueError(f"config {where}: start and end are the same time: an empty window")
        windows.append(PowerWindow(start, end, _watts(w["cap_w"], f"{where}.cap_w")))
    if cap is None and not windows:
        return None
    return ZoneBudget(cap, tuple(windows))


def caps_between(budgets: Mapping[str, ZoneBudget], zones: Iterable[str] | None, start: datetime,
                 end: datetime) -> tuple[PowerCap, ...]:
    """Every zone's budget over [start, end) as PowerCaps (all configured zones when None)."""
    wanted = None if zones is None else set(zones)
    return tuple(c for z, b in sorted(budgets.items()) if wanted is None or z in wanted
                 for c in b.caps_between(z, start, end))
