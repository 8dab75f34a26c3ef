"""Grid operators' day-ahead wind and solar generation forecasts from files, as hourly MW.

The dataset is ENTSO-E's "Generation Forecasts for Wind and Solar" (Transparency Platform
item 14.1.D), day-ahead process. Three layouts are told apart by their header row:

- `entsoe`: the platform's CSV export. A time column `MTU (CET/CEST)` (or `MTU (UTC)`)
  holding a span such as `01.01.2021 00:00 - 01.01.2021 00:15` (or
  `01/01/2025 00:00:00 - 01/01/2025 00:15:00`, a local time possibly followed by `(CET)` or
  `(CEST)`), then per production type the columns
  `Generation - Solar  [MW] Day Ahead/ BZN|DE-LU`, `... Intraday / ...`, `... Current / ...`
  for Solar, Wind Offshore and Wind Onshore. Values are MW over each market time unit (MTU:
  15 min in DE, 30 min in GB, an hour elsewhere); only the Day Ahead columns are read. Files
  saved with `;` between fields (and `,` as the decimal mark) read the same. `n/e`
  ("not expected": no such plants in the area) counts as 0 MW, an empty value or `-` is
  missing. Local times are resolved with Europe/Brussels (CET/CEST); the repeated hour at
  the end of summer time is told apart by its `(CEST)`/`(CET)` mark or, without one, by
  order (the first is summer time). Rows at a local time that does not exist (the skipped
  hour in spring) must be empty and are dropped.
- `entsoe-per-type`: the platform's newer export, one production type per file, named by
  the platform `GUI_WIND_SOLAR_GENERATION_FORECAST_<SOLAR|ONSHORE|OFFSHORE>_<from>-<to>.csv`
  (the type is read from that name): `MTU (CET/CEST)` (or `MTU (UTC)`) with spans such as
  `01/01/2024 00:00:00 (CET) - 01/01/2024 00:15:00 (CET)`, `Area`, `Day-ahead (MW)`,
  `Intraday (MW)`, `Current (MW)`, `Actual (MW)`; only `Day-ahead (MW)` is read.
- `carboncast`: the shared file's layout (CarbonCast's cleaned ENTSO-E data): `UTC time`,
  `solar`, `wind` (onshore + offshore), one row per UTC hour. Each value is the SUM of the
  MW values of the hour's MTUs, so it is divided by the MTUs per hour of the zone (DE 4,
  GB 2); zones whose MTU is not known here are refused. Two defects of that source are
  handled: the hour in which summer time ends (local 02:00 summer time, e.g. DE
  2021-10-31 00:00 UTC) was summed over both repeated local hours, so a value there nearer
  double its neighbours' mean than equal to it (at least √2 times it) is halved (and said so); and values the source filled in by
  averaging neighbours show as not whole numbers: they are kept but flagged `imputed`.

All give hourly mean MW per UTC hour and production type: `solar`, and wind either as
`wind` (onshore + offshore, the shared layout) or as `wind_onshore` and `wind_offshore` (the
platform's exports); an hour's wind is their sum once both are known (`wind_total`). A file
with a missing hour (or MTU) inside its span, or an hour given twice, is refused
(`CsvFormatError`, one line): a day-ahead input with holes would silently change what a
forecaster sees. Leading and trailing rows without any value (the part of an export not yet
published) are trimmed and counted.

When each value was known: the files carry no issue time. ENTSO-E's day-ahead wind and
solar forecasts are published by about 18:00 local time of the day before, so each hour is
stamped as issued at 18:00 of the previous local day in the zone's publication time zone
(`publication_tz`: Europe/Berlin for DE, Europe/London for GB, Europe/Brussels, the
platform's own CET, otherwise).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

from telemetry.grid.readings import CsvFormatError, zone_problem

LAYOUT_ENTSOE = "entsoe"
LAYOUT_ENTSOE_PER_TYPE = "entsoe-per-type"
LAYOUT_CARBONCAST = "carboncast"
LAYOUTS = (LAYOUT_ENTSOE, LAYOUT_ENTSOE_PER_TYPE, LAYOUT_CARBONCAST)
SOURCES = {LAYOUT_ENTSOE: "entsoe-csv", LAYOUT_ENTSOE_PER_TYPE: "entsoe-csv",
           LAYOUT_CARBONCAST: "carboncast-entsoe-csv"}

SOLAR = "solar"
WIND = "wind"                       # onshore + offshore in one value
WIND_ONSHORE = "wind_onshore"
WIND_OFFSHORE = "wind_offshore"
PRODUCTION_TYPES = (SOLAR, WIND, WIND_ONSHORE, WIND_OFFSHORE)
#: the other way the same wind is held: importing one replaces the other
WIND_FORMS = {WIND: (WIND_ONSHORE, WIND_OFFSHORE), WIND_ONSHORE: (WIND,), WIND_OFFSHORE: (WIND,), SOLAR: ()}

#: The time zone whose 18:00 of the day before marks a day's forecast as published.
PUBLICATION_TZ = {"DE": "Europe/Berlin", "DE-LU": "Europe/Berlin", "GB": "Europe/London"}
DEFAULT_PUBLICATION_TZ = "Europe/Brussels"
PUBLICATION_HOUR = 18
#: MTUs per hour of the zones whose shared-layout sums can be turned back into MW.
CARBONCAST_MTUS_PER_HOUR = {"DE": 4, "DE-LU": 4, "GB": 2}
#: a summer-time-end value at least this many times its neighbours' mean is a double sum:
#: from √2 on, half the value is nearer (by ratio) to the neighbours than the value itself
DOUBLE_SUM_RATIO = 2 ** 0.5

_ENTSOE_VALUE = re.compile(r"^generation - (solar|wind offshore|wind onshore) \[mw\] day ahead ?/ ?(.+)$")
_ENTSOE_TYPES = {"solar": SOLAR, "wind offshore": WIND_OFFSHORE, "wind onshore": WIND_ONSHORE}
_PER_TYPE_VALUE = "day-ahead (mw)"
_PER_TYPE_NAME = re.compile(r"FORECAST_(SOLAR|ONSHORE|OFFSHORE)", re.I)
_PER_TYPE_TYPES = {"SOLAR": SOLAR, "ONSHORE": WIND_ONSHORE, "OFFSHORE": WIND_OFFSHORE}
_ENTSOE_TIME = {"mtu (cet/cest)": "Europe/Brussels", "mtu (utc)": "UTC"}
_MTU_START = re.compile(r"^\s*(\d{2})[./](\d{2})[./](\d{4}) (\d{2}):(\d{2})(?::(\d{2}))?\s*(?:\((CEST|CET)\))?")
_MISSING = {"", "-", "n/a", "na", "nan"}
_NOT_EXPECTED = "n/e"
HOUR = timedelta(hours=1)


def wind_total(mw: Mapping[str, float]) -> float | None:
    """An hour's wind (onshore + offshore) MW from its values by production type; None while
    only one of onshore and offshore is known."""
    if WIND in mw:
        return mw[WIND]
    if WIND_ONSHORE in mw and WIND_OFFSHORE in mw:
        return mw[WIND_ONSHORE] + mw[WIND_OFFSHORE]
    return None


@dataclass(frozen=True)
class DayAheadHour:
    """One UTC hour's day-ahead forecast: mean MW by production type."""

    at: datetime
    mw: dict[str, float]
    imputed: bool = False

    @property
    def solar_mw(self) -> float | None:
        return self.mw.get(SOLAR)

    @property
    def wind_mw(self) -> float | None:
        return wind_total(self.mw)


@dataclass
class DayAheadFile:
    """What a day-ahead file holds, as hourly MW, with what was done to it."""

    path: str
    layout: str
    zone: str
    hours: list[DayAheadHour]
    mtu_s: int
    area: str | None = None
    #: one line per fix applied to the data (the summer-time row)
    fixes: list[str] = field(default_factory=list)
    #: empty rows trimmed at the start and end of the export
    trimmed_rows: int = 0

    @property
    def source(self) -> str:
        return SOURCES[self.layout]

    @property
    def imputed(self) -> int:
        return sum(h.imputed for h in self.hours)

    @property
    def production_types(self) -> list[str]:
        return [t for t in PRODUCTION_TYPES if any(t in h.mw for h in self.hours)]


def _norm(name: str) -> str:
    return " ".join(name.replace("\ufeff", "").strip().lower().split())


def detect_layout(header: list[str]) -> str | None:
    """The day-ahead layout of a header row, or None when it is neither."""
    cols = [_norm(c) for c in header]
    if cols == ["utc time", "solar", "wind"]:
        return LAYOUT_CARBONCAST
    if cols and cols[0] in _ENTSOE_TIME and any(_ENTSOE_VALUE.match(c) for c in cols[1:]):
        return LAYOUT_ENTSOE
    if cols and cols[0] in _ENTSOE_TIME and _PER_TYPE_VALUE in cols:
        return LAYOUT_ENTSOE_PER_TYPE
    return None


def sniff_layout(path: str | Path) -> str | None:
    """The day-ahead layout of a file from its first line; None when it is not one (or cannot
    be read: the caller's own reader then says why)."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            first = f.readline()
    except (OSError, UnicodeDecodeError):
        return None
    return detect_layout(next(csv.reader(io.StringIO(first), delimiter=_delimiter(first)), []))


def _delimiter(first_line: str) -> str:
    """`;` for the exports saved with semicolons (some locales), else `,`."""
    return ";" if first_line.count(";") > first_line.count(",") else ","


def publication_tz(zone: str) -> ZoneInfo:
    return ZoneInfo(PUBLICATION_TZ.get(zone, DEFAULT_PUBLICATION_TZ))


def issued_at(at: datetime, zone: str) -> datetime:
    """When the day-ahead forecast of the hour starting at `at` was published: 18:00 local
    time (the zone's publication time zone) of the day before the hour's local day."""
    tz = publication_tz(zone)
    day: date = at.astimezone(tz).date() - timedelta(days=1)
    return datetime.combine(day, time(PUBLICATION_HOUR), tzinfo=tz).astimezone(timezone.utc)


def read_day_ahead(path: str | Path, zone: str) -> DayAheadFile:
    """Read a day-ahead wind and solar file of either layout as hourly MW for `zone`;
    CsvFormatError (one line, with the line number where there is one) if it is malformed,
    has gaps or duplicated hours."""
    name = str(path)
    problem = zone_problem(zone)
    if problem:
        raise CsvFormatError(name, None, problem)
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise CsvFormatError(name, None, "no such file") from None
    except OSError as e:
        raise CsvFormatError(name, None, e.strerror or str(e)) from None
    except UnicodeDecodeError:
        raise CsvFormatError(name, None, "not UTF-8 text") from None
    delimiter = _delimiter(text.split("\n", 1)[0])
    rows = list(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter))
    if delimiter == ";":                     # such files write a decimal comma
        rows = [row[:1] + [c.replace(",", ".") if c.count(",") == 1 and "." not in c else c for c in row[1:]]
                for row in rows]
    if not rows:
        raise CsvFormatError(name, 1, "empty file")
    layout = detect_layout(rows[0])
    if layout == LAYOUT_CARBONCAST:
        return _read_carboncast(name, rows, zone)
    if layout == LAYOUT_ENTSOE:
        return _read_entsoe(name, rows, zone, _entsoe_columns(name, rows[0]))
    if layout == LAYOUT_ENTSOE_PER_TYPE:
        return _read_entsoe(name, rows, zone, _per_type_columns(name, rows))
    raise CsvFormatError(name, 1, "not a day-ahead wind and solar file (expected `UTC time,solar,wind` or "
                                  "an ENTSO-E export with `MTU (CET/CEST)` and Day Ahead columns)")


# -- the shared file's layout -----------------------------------------------------------------

def _number(name: str, line: int, text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise CsvFormatError(name, line, f"{what} {text!r} is not a number") from None
    if value != value or value < 0:
        raise CsvFormatError(name, line, f"{what} {text!r} is not a non-negative number")
    return value


def _parse_utc(name: str, line: int, text: str) -> datetime:
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CsvFormatError(name, line, f"time {text!r} is not an ISO 8601 time") from None
    t = t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    if t.minute or t.second or t.microsecond:
        raise CsvFormatError(name, line, f"time {text!r} is not the start of an hour")
    return t


def _read_carboncast(name: str, rows: list[list[str]], zone: str) -> DayAheadFile:
    per_hour = CARBONCAST_MTUS_PER_HOUR.get(zone)
    if per_hour is None:
        known = ", ".join(sorted(CARBONCAST_MTUS_PER_HOUR))
        raise CsvFormatError(name, None, f"this layout holds sums over each hour's market time units, and how "
                                         f"many an hour has is known only for {known}, not {zone}")
    seen: dict[datetime, int] = {}
    parsed: list[tuple[int, datetime, float, float, bool]] = []
    for line, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != 3:
            raise CsvFormatError(name, line, f"expected 3 columns, found {len(row)}")
        at = _parse_utc(name, line, row[0])
        if at in seen:
            raise CsvFormatError(name, line, f"hour {at:%Y-%m-%d %H:%M} UTC given twice (also line {seen[at]}): "
                                             "refused, nothing stored")
        seen[at] = line
        if not row[1].strip() or not row[2].strip():
            raise CsvFormatError(name, line, f"hour {at:%Y-%m-%d %H:%M} UTC has no value: a gap, refused, "
                                             "nothing stored")
        solar = _number(name, line, row[1], "solar")
        wind = _number(name, line, row[2], "wind")
        parsed.append((line, at, solar, wind, not (solar.is_integer() and wind.is_integer())))
    if not parsed:
        raise CsvFormatError(name, None, "no rows")
    parsed.sort(key=lambda p: p[1])
    _refuse_gaps(name, [(p[0], p[1]) for p in parsed], HOUR)
    hours = [DayAheadHour(at, {SOLAR: solar / per_hour, WIND: wind / per_hour}, imputed)
             for _line, at, solar, wind, imputed in parsed]
    fixes = _fix_summer_time_end(hours, zone, per_hour)
    return DayAheadFile(path=name, layout=LAYOUT_CARBONCAST, zone=zone, hours=hours, mtu_s=3600 // per_hour,
                        fixes=fixes)


def _refuse_gaps(name: str, lines_times: list[tuple[int, datetime]], step: timedelta) -> None:
    for (_l0, a), (line, b) in zip(lines_times, lines_times[1:]):
        if b - a != step:
            missing = int((b - a) / step) - 1
            raise CsvFormatError(name, line, f"{missing} {'hour' if step == HOUR else 'market time unit'}"
                                             f"{'s' if missing != 1 else ''} missing after {a:%Y-%m-%d %H:%M} UTC: "
                                             "a gap, refused, nothing stored")


def summer_time_end_hours(zone: str, first: datetime, last: datetime) -> list[datetime]:
    """The UTC hours in [first, last] that start the repeated local hour at the end of summer
    time (its first, summer-time occurrence) in the zone's publication time zone."""
    tz = publication_tz(zone)
    out = []
    t = first
    while t <= last:
        if t.astimezone(tz).utcoffset() > (t + HOUR).astimezone(tz).utcoffset():
            # the offset drops an hour later: t starts the repeated local hour's first run
            out.append(t)
        t += HOUR
    return out


def _fix_summer_time_end(hours: list[DayAheadHour], zone: str, per_hour: int) -> list[str]:
    """Halve the summer-time-end hour where the source summed both repeated local hours."""
    fixes = []
    index = {h.at: i for i, h in enumerate(hours)}
    for at in summer_time_end_hours(zone, hours[0].at, hours[-1].at):
        i = index[at]
        neighbours = [hours[j].wind_mw for j in (i - 1, i + 1) if 0 <= j < len(hours)]
        mean = sum(neighbours) / len(neighbours) if neighbours else 0.0
        h = hours[i]
        local = at.astimezone(publication_tz(zone))
        if mean > 0 and h.wind_mw >= DOUBLE_SUM_RATIO * mean:
            hours[i] = DayAheadHour(h.at, {t: v / 2 for t, v in h.mw.items()}, h.imputed)
            fixes.append(f"summer-time end {at:%Y-%m-%d %H:%M} UTC (local {local:%H:%M} {local.tzname()}, "
                         f"repeated hour): wind {h.wind_mw:,.0f} MW (file value {h.wind_mw * per_hour:,.0f}) was "
                         f"{h.wind_mw / mean:.1f}x its neighbours (the source summed both repeated hours), "
                         f"halved to {h.wind_mw / 2:,.0f} MW")
    return fixes


# -- the platform's CSV export ----------------------------------------------------------------

@dataclass
class _Columns:
    time_tz: str
    #: production type -> the column of its Day Ahead values
    values: dict[str, int]
    area: str | None
    layout: str


def _entsoe_columns(name: str, header: list[str]) -> _Columns:
    """The columns of the export with every production type in one file."""
    cols = [_norm(c) for c in header]
    values: dict[str, int] = {}
    areas = set()
    for i, c in enumerate(cols):
        m = _ENTSOE_VALUE.match(c)
        if m:
            kind = _ENTSOE_TYPES[m.group(1)]
            if kind in values:
                raise CsvFormatError(name, 1, f"two Day Ahead columns for {m.group(1)}: export one area per file")
            values[kind] = i
            areas.add(header[i].split("/", 1)[-1].strip())
    if len(areas) > 1:
        raise CsvFormatError(name, 1, f"the export holds several areas ({', '.join(sorted(areas))}): "
                                      "export one area per file")
    return _Columns(_ENTSOE_TIME[cols[0]], values, areas.pop() if areas else None, LAYOUT_ENTSOE)


def _per_type_columns(name: str, rows: list[list[str]]) -> _Columns:
    """The columns of the export with one production type per file, its type from the name
    the platform gives the file."""
    cols = [_norm(c) for c in rows[0]]
    m = _PER_TYPE_NAME.search(Path(name).name)
    if not m:
        raise CsvFormatError(name, None, "this export holds one production type, named only in the file name "
                                         "the platform gives it (GUI_WIND_SOLAR_GENERATION_FORECAST_SOLAR_..., "
                                         "_ONSHORE_ or _OFFSHORE_): keep that name")
    area = None
    if "area" in cols:
        i = cols.index("area")
        areas = {r[i].strip() for r in rows[1:] if len(r) > i and r[i].strip()}
        if len(areas) > 1:
            raise CsvFormatError(name, None, f"the export holds several areas ({', '.join(sorted(areas))}): "
                                             "export one area per file")
        area = areas.pop() if areas else None
    return _Columns(_ENTSOE_TIME[cols[0]], {_PER_TYPE_TYPES[m.group(1).upper()]: cols.index(_PER_TYPE_VALUE)},
                    area, LAYOUT_ENTSOE_PER_TYPE)


def _mtu_start(name: str, line: int, text: str, tz: str, seen_local: set) -> datetime | None:
    """The UTC start of an MTU span; None for a local time that does not exist (spring)."""
    m = _MTU_START.match(text)
    if not m:
        raise CsvFormatError(name, line, f"MTU {text!r} is not a span like '01.01.2021 00:00 - 01.01.2021 00:15'")
    d, mo, y, hh, mm, ss, mark = m.groups()
    try:
        naive = datetime(int(y), int(mo), int(d), int(hh), int(mm), int(ss or 0))
    except ValueError:
        raise CsvFormatError(name, line, f"MTU {text!r} is not a valid date and time") from None
    if tz == "UTC":
        return naive.replace(tzinfo=timezone.utc)
    zi = ZoneInfo(tz)
    if mark:
        return (naive - timedelta(hours=2 if mark == "CEST" else 1)).replace(tzinfo=timezone.utc)
    early = naive.replace(tzinfo=zi, fold=0)
    late = naive.replace(tzinfo=zi, fold=1)
    if early.astimezone(timezone.utc).astimezone(zi).replace(tzinfo=None) != naive:
        return None                                     # skipped in spring
    if early.utcoffset() != late.utcoffset():          # the repeated hour: first summer, then winter
        fold = 1 if naive in seen_local else 0
        seen_local.add(naive)
        return (late if fold else early).astimezone(timezone.utc)
    return early.astimezone(timezone.utc)


def _value(name: str, line: int, text: str) -> float | None:
    t = text.strip().lower()
    if t in _MISSING:
        return None
    if t == _NOT_EXPECTED:
        return 0.0
    return _number(name, line, text.strip(), "value")


def _read_entsoe(name: str, rows: list[list[str]], zone: str, cols: _Columns) -> DayAheadFile:
    seen_local: set = set()
    by_start: dict[datetime, int] = {}
    parsed: list[tuple[int, datetime, dict[str, float | None]]] = []
    for line, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < len(rows[0]):
            raise CsvFormatError(name, line, f"expected {len(rows[0])} columns, found {len(row)}")
        start = _mtu_start(name, line, row[0], cols.time_tz, seen_local)
        values = {kind: _value(name, line, row[i]) for kind, i in cols.values.items()}
        if start is None:
            if any(v is not None for v in values.values()):
                raise CsvFormatError(name, line, f"MTU {row[0].strip()!r} does not exist in local time (the hour "
                                                 "skipped when summer time starts) but has values")
            continue
        if start in by_start:
            raise CsvFormatError(name, line, f"MTU starting {start:%Y-%m-%d %H:%M} UTC given twice (also line "
                                             f"{by_start[start]}): refused, nothing stored")
        by_start[start] = line
        parsed.append((line, start, values))
    parsed.sort(key=lambda p: p[1])
    trimmed = 0
    while parsed and all(v is None for v in parsed[0][2].values()):
        parsed.pop(0)
        trimmed += 1
    while parsed and all(v is None for v in parsed[-1][2].values()):
        parsed.pop()
        trimmed += 1
    if not parsed:
        raise CsvFormatError(name, None, "no Day Ahead values")
    for line, start, values in parsed:
        missing = [kind.replace("_", " ") for kind, v in values.items() if v is None]
        if missing:
            raise CsvFormatError(name, line, f"MTU starting {start:%Y-%m-%d %H:%M} UTC has no {' or '.join(missing)} "
                                             "value: a gap, refused, nothing stored")
    step = min((b[1] - a[1] for a, b in zip(parsed, parsed[1:])), default=HOUR)
    if step <= timedelta(0) or HOUR % step or step > HOUR:
        raise CsvFormatError(name, None, f"market time unit of {step} does not divide an hour")
    _refuse_gaps(name, [(p[0], p[1]) for p in parsed], step)
    hours = _hourly_means(name, parsed, step)
    return DayAheadFile(path=name, layout=cols.layout, zone=zone, hours=hours,
                        mtu_s=int(step.total_seconds()), area=cols.area, trimmed_rows=trimmed)


def _hourly_means(name: str, parsed: list, step: timedelta) -> list[DayAheadHour]:
    """Mean MW of each UTC hour and production type from its MTUs; a part hour is refused."""
    per_hour = HOUR // step
    groups: dict[datetime, list[tuple[int, dict[str, float]]]] = {}
    for line, start, values in parsed:
        groups.setdefault(start.replace(minute=0, second=0, microsecond=0), []).append((line, values))
    hours = []
    for hour, parts in groups.items():
        if len(parts) != per_hour:
            raise CsvFormatError(name, parts[0][0], f"hour {hour:%Y-%m-%d %H:%M} UTC has {len(parts)} of its "
                                                    f"{per_hour} market time units: refused, nothing stored")
        hours.append(DayAheadHour(hour, {kind: sum(p[1][kind] for p in parts) / per_hour for kind in parts[0][1]}))
    return hours
