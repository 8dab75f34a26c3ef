"""Carbon-intensity trace files: Electricity Maps exports, WattTime MOER, plain CSV.

Three formats, told apart by their header row (or named with `fmt`):

- `electricitymaps`: the Electricity Maps data-portal export, e.g. the hourly files in
  ../shared/data/carbon/electricitymaps. Columns `Datetime (UTC)`, `Zone Id`,
  `Carbon Intensity gCO₂eq/kWh (direct)` (and `(LCA)`), `Data Estimated`, ... The header
  uses the subscript "₂": files are read as UTF-8. Each row is the average over the period
  that starts at its timestamp. The zone comes from the file's `Zone Id` column (folder
  names can differ: DE-LU holds DE) unless `zone` overrides it.
- `watttime`: WattTime MOER data, `point_time,value` (v3, optionally with `region`,
  `generated_at` for historical forecasts, `units`) or `timestamp,MOER` (v2 exports).
  Values in lbs CO2/MWh are converted to gCO2/kWh and marked `marginal`.
- `plain`: `time,gco2_per_kwh` with optional `zone`, `signal` (average|marginal) and
  `issued_at` (rows with an issue time are forecasts). `Time,Carbon Intensity` (the
  30-minute files of Let's Wait Awhile, gCO2/kWh, average) is read as plain too; its zone
  comes from `zone` (--zone).
- `vessim`: the WattTime files Vessim publishes (e.g. `watttime2023_caiso-north_actual.csv`
  and `_forecast.csv`): actuals `time,<region>` and historical forecasts
  `request_time,forecast_time,<region>`, the request time being the forecast's issue time.
  Values are MOER already converted to gCO2/kWh, so they are stored as `marginal` as they are.
  The region column names the zone unless `zone` overrides it.

An Electricity Maps export may carry forecasts: a column `issued_at` (or `updated_at`,
`forecast issued at (utc)`, `Datetime of forecast issue (UTC)`; Electricity Maps' API calls the
issue time `updatedAt`) makes each row with a value there a forecast issued then.

Times: ISO 8601; an offset in the text wins, otherwise Electricity Maps and WattTime times
are UTC (as documented) and plain times are in `tz` (an IANA name, default UTC).
Out-of-order rows are sorted; a repeated timestamp keeps the last row (counted, and
counted separately when the values differ); an empty value is a gap (counted, skipped,
never a zero). Anything else malformed is rejected with its line number.

Resolution: each zone's step is detected from its timestamps, never assumed (5, 15, 30 or
60 minutes are all kept as they are): the shortest step between consecutive rows. A longer
step that is a whole multiple of it is a gap (rows missing), but two such steps of one
length in a row mean the file changes resolution (30 min, then 15 min) and the file is
refused (`MixedStepsError`), as is a step that is no multiple of the resolution (00:00,
00:30, 01:10): one period length per zone and file, so a value always holds for the
period its row says.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from telemetry.grid.readings import (
    KIND_ACTUAL,
    KIND_FORECAST,
    SIGNAL_AVERAGE,
    SIGNAL_MARGINAL,
    SIGNALS,
    CsvFormatError,
    IntensityReading,
    lbs_per_mwh_to_g_per_kwh,
    zone_problem,
)

FORMATS = ("electricitymaps", "watttime", "plain", "vessim")
SOURCES = {"electricitymaps": "electricitymaps-csv", "watttime": "watttime-csv", "plain": "csv",
           "vessim": "vessim-watttime-csv"}
DEFAULT_DURATION_S = {"electricitymaps": 3600, "watttime": 300, "plain": 3600, "vessim": 300}
_EM_ISSUED = ("issued_at", "updated_at", "updatedat", "forecast issued at (utc)",
              "datetime of forecast issue (utc)")
_VALUE_COLUMNS = ("gco2_per_kwh", "carbon intensity")
_KNOWN_COLUMNS = {"gco2_per_kwh", "carbon intensity", "value", "moer", "point_time", "timestamp", "zone", "signal", "issued_at",
                  "region", "generated_at", "units", "datetime"}
PROGRESS_EVERY_ROWS = 2000

Progress = Callable[[int, int], None]  # (lines done, lines in total)


@dataclass
class ParsedTrace:
    """What a trace file holds, cleaned: readings sorted and de-duplicated, plus counts."""

    path: str
    fmt: str
    readings: list[IntensityReading]
    rows: int = 0
    duplicates: int = 0
    conflicting_duplicates: int = 0
    out_of_order: int = 0
    missing: int = 0
    zones: list[str] = field(default_factory=list)
    signals: list[str] = field(default_factory=list)
    duration_s: dict[str, int] = field(default_factory=dict)

    @property
    def first(self) -> datetime | None:
        return min((r.at for r in self.readings), default=None)

    @property
    def last(self) -> datetime | None:
        return max((r.at for r in self.readings), default=None)


def _norm(name: str) -> str:
    return " ".join(name.replace("₂", "2").replace("\ufeff", "").strip().lower().split())


def _find(columns: list[str], *candidates: str) -> int | None:
    for c in candidates:
        if c in columns:
            return columns.index(c)
    return None


_EM_VALUE = {"direct": ("carbon intensity gco2eq/kwh (direct)", "carbon intensity gco2/kwh (direct)"),
             "lifecycle": ("carbon intensity gco2eq/kwh (lca)", "carbon intensity gco2/kwh (lca)")}


def detect_format(header: list[str]) -> str | None:
    """The format a header row belongs to, or None if it is none of the three."""
    cols = [_norm(c) for c in header]
    if _find(cols, *_EM_VALUE["direct"], *_EM_VALUE["lifecycle"]) is not None:
        return "electricitymaps"
    if _find(cols, *_VALUE_COLUMNS) is not None:
        return "plain"
    if _find(cols, "value", "moer") is not None and _find(cols, "point_time", "timestamp") is not None:
        return "watttime"
    if (len(cols) == 2 and cols[0] == "time" and cols[1] and cols[1] not in _KNOWN_COLUMNS) or \
            (len(cols) == 3 and cols[:2] == ["request_time", "forecast_time"] and cols[2]):
        return "vessim"
    return None


def _tzinfo(tz: str):
    if tz.upper() == "UTC":
        return timezone.utc
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {tz!r}; use an IANA name such as Europe/Berlin") from None


def read_trace(
    path: str | Path,
    *,
    fmt: str | None = None,
    zone: str | None = None,
    tz: str = "UTC",
    duration_s: int | None = None,
    emission_factor: str = "direct",
    progress: Progress | None = None,
) -> ParsedTrace:
    """Read and validate a trace file; raise CsvFormatError (with the line) if it is malformed."""
    path = Path(path)
    name = str(path)
    if fmt is not None and fmt not in FORMATS:
        raise CsvFormatError(name, None, f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    text = _read_text(path, name)
    total_lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    reader = csv.reader(io.StringIO(text, newline=""))
    header, fmt = _read_header(reader, name, fmt)
    if emission_factor not in _EM_VALUE:
        raise ValueError(f"emission_factor must be direct or lifecycle, not {emission_factor!r}")
    cols = [_norm(c) for c in header]
    try:
        parse_row = _row_parser(name, fmt, cols, zone, _tzinfo(tz), emission_factor,
                                [c.strip() for c in header])
    except ValueError as e:
        raise CsvFormatError(name, 1, str(e)) from None
    scan = _scan_rows(reader, parse_row, len(header), name, total_lines, progress)
    return _clean_trace(scan, name, fmt, zone, duration_s)


def _read_text(path: Path, name: str) -> str:
    """The file's text (UTF-8, a byte-order mark dropped); CsvFormatError where it cannot be read."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CsvFormatError(name, None, "no such file") from None
    except IsADirectoryError:
        raise CsvFormatError(name, None, "is a directory, not a CSV file") from None
    except PermissionError:
        raise CsvFormatError(name, None, "permission denied") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise CsvFormatError(name, line, "not UTF-8 text (Electricity Maps headers need UTF-8)") from None


def _read_header(reader, name: str, fmt: str | None) -> tuple[list[str], str]:
    """The header row and the file's format (`fmt` if given, else detected from the header)."""
    try:
        header = next(reader)
    except StopIteration:
        raise CsvFormatError(name, 1, "empty file") from None
    except csv.Error as e:
        raise CsvFormatError(name, 1, f"bad CSV: {e}") from None
    fmt = fmt or detect_format(header)
    if fmt is None:
        raise CsvFormatError(name, 1, "unrecognised header; expected an Electricity Maps export, "
                                      "WattTime point_time,value, Vessim time,<region> or "
                                      "request_time,forecast_time,<region>, or plain time,gco2_per_kwh "
                                      f"(got {','.join(header)[:120]!r})")
    return header, fmt


@dataclass
class _Scan:
    """The parsed rows of a file in file order, before cleaning, with what was counted on the way."""

    rows: list[tuple[str, str, datetime, datetime | None, float, bool | None, str]]
    gap_times: list[tuple[str, datetime]]  # (zone, time) of rows with an empty value
    missing: int
    out_of_order: int


def _scan_rows(reader, parse_row, ncols: int, name: str, total_lines: int, progress: Progress | None) -> _Scan:
    """Parse every data row (blank lines skipped, a wrong field count refused), counting gaps
    and rows out of time order."""
    scan = _Scan(rows=[], gap_times=[], missing=0, out_of_order=0)
    rows = scan.rows
    prev: datetime | None = None
    try:
        for record in reader:
            line = reader.line_num
            if not record or (len(record) == 1 and not record[0].strip()):
                continue
            if len(record) != ncols:
                raise CsvFormatError(name, line, f"expected {ncols} fields, got {len(record)}")
            parsed = parse_row(record, line)
            if parsed[4] is None:
                scan.missing += 1
                scan.gap_times.append((parsed[0], parsed[2]))
                continue
            at = parsed[2]
            if prev is not None and at < prev:
                scan.out_of_order += 1
            prev = at
            rows.append(parsed)
            if progress is not None and len(rows) % PROGRESS_EVERY_ROWS == 0:
                progress(line, total_lines)
    except csv.Error as e:
        raise CsvFormatError(name, reader.line_num, f"bad CSV: {e}") from None
    if progress is not None:
        progress(total_lines, total_lines)
    return scan


def _clean_trace(scan: _Scan, name: str, fmt: str, zone: str | None, duration_s: int | None) -> ParsedTrace:
    """The scanned rows checked (zones), de-duplicated (the last row of a key wins), given
    each zone's period length and sorted into readings."""
    rows, gap_times = scan.rows, scan.gap_times
    zones_in_file = sorted({r[0] for r in rows})
    for z in zones_in_file:
        problem = zone_problem(z)
        if problem:
            raise CsvFormatError(name, None, problem)
    file_zones = sorted({r[6] for r in rows})
    if zone is not None and len(file_zones) > 1:
        raise CsvFormatError(name, None, f"the file holds several zones ({', '.join(file_zones)}); "
                                         "--zone would merge them: import without --zone")
    signals = sorted({r[1] for r in rows})
    trace = ParsedTrace(path=name, fmt=fmt, readings=[], rows=len(rows) + scan.missing, missing=scan.missing,
                        out_of_order=scan.out_of_order, zones=zones_in_file, signals=signals)
    source = SOURCES[fmt]
    by_key: dict[tuple, tuple] = {}
    for r in rows:
        key = (r[0], r[1], r[2], r[3])
        old = by_key.get(key)
        if old is not None:
            trace.duplicates += 1
            if old[4] != r[4]:
                trace.conflicting_duplicates += 1
        by_key[key] = r
    # One period length per zone, detected from the timestamps (rows with an empty value
    # count: they show the cadence): see the module docstring.
    for z in zones_in_file:
        times = sorted({k[2] for k in by_key if k[0] == z} | {t for gz, t in gap_times if gz == z})
        best = detect_step_s(times, name, z) if duration_s is None else None
        trace.duration_s[z] = duration_s or best or DEFAULT_DURATION_S[fmt]
    readings = []
    for (z, sig, at, issued), r in sorted(by_key.items(), key=_sort_key):
        dur = trace.duration_s[z]
        readings.append(IntensityReading(
            zone=z, at=at, duration_s=dur, gco2_per_kwh=r[4], signal=sig,
            kind=KIND_ACTUAL if issued is None else KIND_FORECAST,
            issued_at=issued if issued is not None else at + timedelta(seconds=dur),
            source=source, estimated=r[5]))
    trace.readings = readings
    return trace


_NO_ISSUE = datetime.min.replace(tzinfo=timezone.utc)


class MixedStepsError(CsvFormatError):
    """A zone's timestamps change their step within one file, or follow no regular step."""


def _step_text(seconds: float) -> str:
    s = int(seconds)
    if s % 3600 == 0:
        return f"{s // 3600} h"
    if s % 60 == 0:
        return f"{s // 60} min"
    return f"{s} s"


def detect_step_s(times: list[datetime], name: str = "", zone: str = "") -> int | None:
    """The step of sorted, distinct `times` (None for fewer than two); MixedStepsError if
    they follow no single step (see the module docstring)."""
    steps = [int((b - a).total_seconds()) for a, b in zip(times, times[1:])]
    if not steps:
        return None
    base = min(steps)
    where = f" for zone {zone}" if zone else ""
    for i, step in enumerate(steps):
        if step % base:
            raise MixedStepsError(name, None, f"irregular time steps{where}: {_step_text(base)} steps, but "
                                              f"{_iso(times[i])} to {_iso(times[i + 1])} is {_step_text(step)}; "
                                              "one file needs one regular step")
        if step != base and i + 1 < len(steps) and steps[i + 1] == step:
            j = i
            while j + 1 < len(steps) and steps[j + 1] == step:
                j += 1
            raise MixedStepsError(name, None, f"mixed time steps{where}: {_step_text(step)} from "
                                              f"{_iso(times[i])} to {_iso(times[j + 1])}, {_step_text(base)} "
                                              "elsewhere; import each resolution from its own file")
    return base


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%MZ")


def _sort_key(item: tuple) -> tuple:
    z, sig, at, issued = item[0]
    return (z, sig, at, issued or _NO_ISSUE)


def _parse_time(text: str, default_tz, what: str, line: int, name: str) -> datetime:
    t = text.strip()
    try:
        value = datetime.fromisoformat(t)
    except ValueError:
        raise CsvFormatError(name, line, f"malformed {what} {text!r} (expected ISO 8601)") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=default_tz)
    return value.astimezone(timezone.utc)


#: Above any real grid: the dirtiest generation, coal, emits a median 820 gCO2eq/kWh over its
#: life cycle (IPCC AR5 WGIII Annex III, Table A.III.2), so a grid average or margin beyond
#: twice that is a unit or column mistake (lbs/MWh, kg, a wrong column), not data.
MAX_G_PER_KWH = 2000.0


def _parse_value(text: str, line: int, name: str, maximum: float = MAX_G_PER_KWH,
                 unit: str = "g/kWh") -> float | None:
    t = text.strip()
    if not t:
        return None
    try:
        v = float(t)
    except ValueError:
        raise CsvFormatError(name, line, f"malformed value {text!r} (expected a number)") from None
    if not math.isfinite(v):
        raise CsvFormatError(name, line, f"value {text!r} is not a finite number")
    if v < 0:
        raise CsvFormatError(name, line, f"negative intensity {text!r}")
    if v > maximum:
        raise CsvFormatError(name, line, f"intensity {text!r} {unit} is beyond any grid's (at most "
                                         f"{maximum:,.0f}): a wrong unit or column?")
    return v


def _row_parser(name: str, fmt: str, cols: list[str], zone: str | None, tz, emission_factor: str,
                raw_header: list[str] | None = None):
    """A function (record, line) -> one row as a tuple.

    The tuple is (zone, signal, at, issued_at or None, gco2_per_kwh or None for an empty value
    (a gap), estimated, the zone as written in the file); `zone`, when given, replaces the
    file's zone in the first field.
    """
    if fmt == "electricitymaps":
        return _em_parser(name, cols, zone, tz, emission_factor)
    if fmt == "vessim":
        return _vessim_parser(name, cols, zone, raw_header)
    if fmt == "watttime":
        return _watttime_parser(name, cols, zone)
    return _plain_parser(name, cols, zone, tz)


def _em_parser(name: str, cols: list[str], zone: str | None, tz, emission_factor: str):
    """Rows of an Electricity Maps export (`_row_parser`)."""
    i_time = _find(cols, "datetime (utc)", "datetime")
    i_value = _find(cols, *_EM_VALUE[emission_factor])
    i_zone = _find(cols, "zone id")
    i_est = _find(cols, "data estimated")
    i_issued = _find(cols, *_EM_ISSUED)
    if i_time is None or i_value is None:
        raise ValueError("Electricity Maps export without 'Datetime (UTC)' or the "
                         f"{emission_factor} carbon intensity column")
    time_tz = timezone.utc if cols[i_time] == "datetime (utc)" else tz
    if i_zone is None and zone is None:
        raise ValueError("no 'Zone Id' column: give the zone (--zone)")

    def parse(record: list[str], line: int):
        value = _parse_value(record[i_value], line, name)
        at = _parse_time(record[i_time], time_tz, "time", line, name)
        file_zone = record[i_zone].strip() if i_zone is not None else zone
        if not file_zone:
            raise CsvFormatError(name, line, "empty Zone Id")
        est = record[i_est].strip().lower() if i_est is not None else ""
        estimated = True if est == "true" else False if est == "false" else None
        issued = (_parse_time(record[i_issued], time_tz, "issue time", line, name)
                  if i_issued is not None and record[i_issued].strip() else None)
        return (zone or file_zone, SIGNAL_AVERAGE, at, issued, value, estimated, file_zone)

    return parse


def _vessim_parser(name: str, cols: list[str], zone: str | None, raw_header: list[str] | None):
    """Rows of a Vessim WattTime file: actuals or historical forecasts (`_row_parser`)."""
    header = raw_header or cols
    forecast = cols[:2] == ["request_time", "forecast_time"]
    if forecast and len(cols) == 3:
        i_issue, i_time, i_value = 0, 1, 2
    elif not forecast and len(cols) == 2 and cols[0] == "time":
        i_issue, i_time, i_value = None, 0, 1
    else:
        raise ValueError("Vessim file: expected time,<region> or request_time,forecast_time,<region>")
    region = header[i_value].strip()

    def parse(record: list[str], line: int):
        value = _parse_value(record[i_value], line, name)
        at = _parse_time(record[i_time], timezone.utc, "time", line, name)
        issued = _parse_time(record[i_issue], timezone.utc, "request_time", line, name) \
            if i_issue is not None else None
        return (zone or region, SIGNAL_MARGINAL, at, issued, value, None, region)

    return parse


def _watttime_parser(name: str, cols: list[str], zone: str | None):
    """Rows of a WattTime MOER file, lbs/MWh converted to g/kWh (`_row_parser`)."""
    i_time = _find(cols, "point_time", "timestamp", "datetime")
    i_value = _find(cols, "value", "moer")
    i_zone = _find(cols, "region", "ba")
    i_gen = _find(cols, "generated_at")
    i_units = _find(cols, "units")
    if i_time is None or i_value is None:
        raise ValueError("WattTime file without point_time/timestamp and value/MOER columns")
    if i_zone is None and zone is None:
        raise ValueError("no region column: give the zone (--zone), e.g. CAISO_NORTH")

    def parse(record: list[str], line: int):
        if i_units is not None and record[i_units].strip() not in ("", "lbs_co2_per_mwh"):
            raise CsvFormatError(name, line, f"units {record[i_units]!r}: only lbs_co2_per_mwh "
                                             "MOER values can be imported")
        value = _parse_value(record[i_value], line, name, MAX_G_PER_KWH / lbs_per_mwh_to_g_per_kwh(1.0),
                             "lbs/MWh")
        at = _parse_time(record[i_time], timezone.utc, "time", line, name)
        issued = (_parse_time(record[i_gen], timezone.utc, "generated_at", line, name)
                  if i_gen is not None and record[i_gen].strip() else None)
        file_zone = record[i_zone].strip() if i_zone is not None else zone
        if not file_zone:
            raise CsvFormatError(name, line, "empty region")
        return (zone or file_zone, SIGNAL_MARGINAL, at, issued,
                None if value is None else lbs_per_mwh_to_g_per_kwh(value), None, file_zone)

    return parse


def _plain_parser(name: str, cols: list[str], zone: str | None, tz):
    """Rows of a plain `time,gco2_per_kwh` file (`_row_parser`)."""
    i_time = _find(cols, "time", "timestamp", "datetime")
    i_value = _find(cols, *_VALUE_COLUMNS)
    i_zone = _find(cols, "zone")
    i_signal = _find(cols, "signal")
    i_issued = _find(cols, "issued_at")
    if i_time is None or i_value is None:
        raise ValueError("plain file needs the columns time,gco2_per_kwh")
    if i_zone is None and zone is None:
        raise ValueError("no zone column: give the zone (--zone)")

    def parse(record: list[str], line: int):
        value = _parse_value(record[i_value], line, name)
        at = _parse_time(record[i_time], tz, "time", line, name)
        issued = (_parse_time(record[i_issued], tz, "issued_at", line, name)
                  if i_issued is not None and record[i_issued].strip() else None)
        signal = record[i_signal].strip().lower() if i_signal is not None else SIGNAL_AVERAGE
        if signal not in SIGNALS:
            raise CsvFormatError(name, line, f"signal {signal!r}: use average or marginal")
        file_zone = record[i_zone].strip() if i_zone is not None else zone
        if not file_zone:
            raise CsvFormatError(name, line, "empty zone")
        return (zone or file_zone, signal, at, issued, value, None, file_zone)

    return parse
