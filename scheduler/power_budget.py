"""Power budgets per zone's site, with their daily windows and dated events (issue 29).

A site's electrical feed, its contract or a demand-response programme bounds the power it
may draw. The budget of a zone is configured with the zone:

```toml
[zones.DE]
power_cap_w = 20000          # always in force (optional)
static_power_w = 3000        # what the site draws besides its GPUs (hosts, network, fans)
ramp_w_per_min = 5000        # at most this much new GPU load a minute (policies.pricing.ramp)
power_schedule = "/etc/carbonsched/de-events.csv"   # dated events: start,end,cap_w
[[zones.DE.power_windows]]   # a daily window (UTC) with its own cap: demand response, a tariff
start = "17:00"
end = "19:00"                # an end before the start runs past midnight
cap_w = 12000
[[zones.DE.power_events]]    # one dated event, as a row of the schedule
start = "2026-12-03T16:00:00Z"
end = "2026-12-03T18:00:00Z"
cap_w = 8000
```

Caps are of the site's whole draw: its GPUs plus `static_power_w`. In force at a time is the
lowest of the caps that cover it. The planner sees each cap of its horizon less the static
power as a `policies.types.PowerCap` of GPU power (the policies keep planned GPU power within
the lowest of every slot); the head node's governor (`scheduler.daemon.power_governor`) holds
the measured GPU power plus the static power to the cap in force now. A schedule file (a
utility's demand-response calendar, a tariff's dated periods) is read when the configuration
is: at the daemon's start.

A zone's budget covers its nodes as one site's feed. Where one zone holds several sites,
each behind its own feed, a `[sites.S]` (with `nodes = [...]`) takes the same keys: its nodes
then draw against the site's budget (key `site:S`, `policies.types.site_budget`) and not
against their zone's; the zone's covers its other nodes.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone
from pathlib import Path

from policies.types import PowerCap


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
class PowerEvent:
    """A dated window [start, end) with its own cap (W of the site's draw): a demand-response
    event, a tariff period, a maintenance of the feed."""

    start: datetime
    end: datetime
    cap_w: float


@dataclass(frozen=True)
class ZoneBudget:
    """One zone's budget: a cap always in force (None: none), its daily windows, its dated
    events, and the static power the site draws besides its GPUs (counted against each cap)."""

    cap_w: float | None = None
    windows: tuple[PowerWindow, ...] = ()
    events: tuple[PowerEvent, ...] = ()
    static_w: float = 0.0
    ramp_w_per_min: float | None = None  # new GPU load a minute (policies.pricing.ramp); None: any

    def _occurrences(self, start: datetime, end: datetime):
        """(start, end, window or event) of each daily window occurrence that begins on a day
        from the one before `start` to the day of `end` (a window may run past midnight), and
        of each dated event that overlaps [start, end]."""
        day = start.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
        while day <= end:
            for w in self.windows:
                yield (*w.spans_on(day), w)
            day += timedelta(days=1)
        for e in self.events:
            if e.end > start and e.start <= end:
                yield e.start, e.end, e

    def gpu_cap_at(self, t: datetime) -> float | None:
        """What the GPUs may draw at `t`: the cap in force less the static power (>= 0)."""
        cap = self.cap_at(t)
        return None if cap is None else max(0.0, cap - self.static_w)

    def cap_at(self, t: datetime) -> float | None:
        """The cap in force at `t`: the lowest that covers it; None when nothing does."""
        caps = [self.cap_w] if self.cap_w is not None else []
        caps += [w.cap_w for a, b, w in self._occurrences(t, t) if a <= t < b]
        return min(caps) if caps else None

    def changes_between(self, start: datetime, end: datetime) -> list[datetime]:
        """The times in (start, end) at which the cap in force may change (window edges)."""
        return sorted({t for a, b, _ in self._occurrences(start, end) for t in (a, b) if start < t < end})

    def caps_between(self, zone: str, start: datetime, end: datetime) -> tuple[PowerCap, ...]:
        """The budget as PowerCaps of GPU power over [start, end): the constant cap and each
        window's occurrences and event that overlap it, each less the static power."""
        gpu = self.static_w
        out = [PowerCap(zone=zone, cap_w=max(0.0, self.cap_w - gpu))] if self.cap_w is not None else []
        out += [PowerCap(zone=zone, cap_w=max(0.0, w.cap_w - gpu), start=a, end=b)
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


def _instant(value: object, where: str) -> datetime:
    """An ISO 8601 date and time; UTC when it names no offset."""
    if isinstance(value, datetime):
        t = value
    else:
        try:
            t = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"config {where}: a date and time as 2026-12-03T17:00:00Z (got {value!r})") from None
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


def _event(row: Mapping, where: str) -> PowerEvent:
    unknown = sorted(set(row) - {"start", "end", "cap_w"})
    missing = sorted(k for k in ("start", "end", "cap_w") if row.get(k) in (None, ""))
    if unknown or missing:
        raise ValueError(f"config {where}: " + (f"unknown key(s) {', '.join(unknown)}" if unknown
                                                else f"missing {', '.join(missing)}") + " (keys: start, end, cap_w)")
    start, end = _instant(row["start"], f"{where}.start"), _instant(row["end"], f"{where}.end")
    if end <= start:
        raise ValueError(f"config {where}: its end is not after its start")
    cap = row["cap_w"]
    if isinstance(cap, str):
        try:
            cap = float(cap)
        except ValueError:
            pass
    return PowerEvent(start, end, _watts(cap, f"{where}.cap_w"))


def read_schedule(path: Path, where: str) -> tuple[PowerEvent, ...]:
    """The dated events of a CSV schedule (a header `start,end,cap_w`, a row per event)."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or sorted(reader.fieldnames) != ["cap_w", "end", "start"]:
                raise ValueError(f"config {where}: {path}: the header must be start,end,cap_w "
                                 f"(got {','.join(reader.fieldnames or [])!r})")
            return tuple(_event(row, f"{where} ({path} line {reader.line_num})") for row in reader)
    except OSError as e:
        raise ValueError(f"config {where}: cannot read {path}: {e.strerror or e}") from None


def parse_zone_budget(zone: str, table: Mapping, base_dir: Path | None = None,
                      where: str | None = None) -> ZoneBudget | None:
    """The budget in `[zones.ZONE]` or a `[sites.SITE]` (`power_cap_w`, `power_windows`,
    `power_events`, `power_schedule`, `static_power_w`, `ramp_w_per_min`); None when it has no
    cap and no ramp limit. A relative schedule path is taken from `base_dir` (the
    configuration file's folder), which must then be known. Raises ValueError with the key's
    path (`where`, default `zones.ZONE`) for a bad value."""
    base = where or f"zones.{zone}"
    cap = _watts(table["power_cap_w"], f"{base}.power_cap_w") if "power_cap_w" in table else None
    raw = table.get("power_windows", [])
    if not isinstance(raw, list):
        raise ValueError(f"config {base}.power_windows: a list of tables ([[{base}.power_windows]])")
    windows = []
    for i, w in enumerate(raw):
        where = f"{base}.power_windows[{i}]"
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
    raw_events = table.get("power_events", [])
    if not isinstance(raw_events, list) or not all(isinstance(e, Mapping) for e in raw_events):
        raise ValueError(f"config {base}.power_events: a list of tables ([[{base}.power_events]]) "
                         "with start, end and cap_w")
    events = [_event(e, f"{base}.power_events[{i}]") for i, e in enumerate(raw_events)]
    if "power_schedule" in table:
        where = f"{base}.power_schedule"
        path = Path(str(table["power_schedule"])).expanduser()
        if not path.is_absolute():
            if base_dir is None:
                raise ValueError(f"config {where}: an absolute path to a CSV file (got {str(path)!r})")
            path = base_dir / path
        events += read_schedule(path, where)
    static = 0.0
    if "static_power_w" in table:
        static = table["static_power_w"]
        if isinstance(static, bool) or not isinstance(static, (int, float)) or not math.isfinite(static) or static < 0:
            raise ValueError(f"config {base}.static_power_w: watts, 0 or more (got {static!r})")
        static = float(static)
    ramp = _watts(table["ramp_w_per_min"], f"{base}.ramp_w_per_min") if "ramp_w_per_min" in table else None
    if cap is None and not windows and not events:
        if static:
            raise ValueError(f"config {base}.static_power_w: counts against a cap, and the budget has none")
        return ZoneBudget(ramp_w_per_min=ramp) if ramp is not None else None
    caps = ([cap] if cap is not None else []) + [w.cap_w for w in windows] + [e.cap_w for e in events]
    if static >= min(caps):
        raise ValueError(f"config {base}.static_power_w: {static:g} W leaves nothing of its lowest cap "
                         f"({min(caps):g} W) for the GPUs")
    return ZoneBudget(cap, tuple(windows), tuple(sorted(events, key=lambda e: (e.start, e.end))), static, ramp)


def ramps_of(budgets: Mapping[str, ZoneBudget]) -> dict[str, float]:
    """The zones with a ramp limit, and its W of new load a minute."""
    return {z: b.ramp_w_per_min for z, b in budgets.items() if b.ramp_w_per_min is not None}


def caps_between(budgets: Mapping[str, ZoneBudget], zones: Iterable[str] | None, start: datetime,
                 end: datetime) -> tuple[PowerCap, ...]:
    """Every zone's budget over [start, end) as PowerCaps (all configured zones when None)."""
    wanted = None if zones is None else set(zones)
    return tuple(c for z, b in sorted(budgets.items()) if wanted is None or z in wanted
                 for c in b.caps_between(z, start, end))
