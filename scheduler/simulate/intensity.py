"""Actual carbon intensity per zone for the simulator: hourly series with fast integrals.

A zone's series comes from one or more trace files (read with the carbon layer's own
`telemetry.grid.csv_import.read_trace`) or from the store's recorded actuals. Values are
averaged into whole UTC hours (Electricity Maps rows already are hourly; 5-min MOER rows are
averaged); a missing hour takes the previous hour's value and is counted. Before the first
hour the first value holds and after the last hour the last value holds, as in
`CarbonCurve`, and the time spent outside the data is reported.

Sub-hourly data (a 30-minute GB trace, 5-minute MOER: a step that divides the hour) is also
kept at its own step (`fine`): emissions are then integrated at that step, the truth a job
really met, and the `perfect`/`noisy` forecasts issue curves at that step; the hourly view
(`hour_value`, `hourly_dict`) stays for the hourly forecasters and the climatology.

Times are float seconds since the Unix epoch (UTC) inside the simulator, for speed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from telemetry.grid.forecast import hourly_means

if TYPE_CHECKING:
    from scheduler.simulate.issued import IssuedForecasts

log = logging.getLogger(__name__)

HOUR_S = 3600.0


class CarbonInputError(ValueError):
    """Carbon inputs that cannot be simulated with (unknown zone, mixed signals, no data)."""


@dataclass
class ZoneIntensity:
    """Hourly actual intensity of one zone from `first_hour` (epoch hours), gaps filled.

    `cum_g_s[i]` is the integral in (g/kWh)*s from the first hour's start to hour i's start,
    so the integral over any interval is two lookups.
    """

    zone: str
    first_hour: int
    values_g_per_kwh: np.ndarray
    signal: str
    source: str
    filled_hours: int = 0
    #: recorded forecasts with their issue times (trace files' or the store's forecast rows)
    issued: "IssuedForecasts | None" = None
    #: the data at its own sub-hourly step, when it has one (see the module docstring)
    fine: "FineSeries | None" = None

    def __post_init__(self) -> None:
        self.values_g_per_kwh = np.asarray(self.values_g_per_kwh, dtype=float)
        self.cum_g_s = np.concatenate(([0.0], np.cumsum(self.values_g_per_kwh) * HOUR_S))
        self._values_list = self.values_g_per_kwh.tolist()
        self._cum_list = self.cum_g_s.tolist()

    @property
    def n_hours(self) -> int:
        return len(self._values_list)

    @property
    def start_s(self) -> float:
        return self.first_hour * HOUR_S

    @property
    def end_s(self) -> float:
        return (self.first_hour + self.n_hours) * HOUR_S

    def hour_value(self, hour: int) -> float:
        """The value of epoch hour `hour` (clamped to the data's first and last hour)."""
        i = hour - self.first_hour
        if i < 0:
            i = 0
        elif i >= self.n_hours:
            i = self.n_hours - 1
        return self._values_list[i]

    def hour_values(self, first: int, n: int) -> list[float]:
        """`hour_value` of the epoch hours first .. first + n - 1, as one slice."""
        i, last = first - self.first_hour, self.n_hours - 1
        if 0 <= i and i + n - 1 <= last:
            return self._values_list[i:i + n]
        return [self._values_list[min(max(j, 0), last)] for j in range(i, i + n)]

    @property
    def step_s(self) -> float:
        """The data's own step: sub-hourly where `fine` holds it, else an hour."""
        return self.fine.step_s if self.fine is not None else HOUR_S

    def value_at(self, t_s: float) -> float:
        if self.fine is not None:
            return self.fine.value_at(t_s)
        return self.hour_value(int(t_s // HOUR_S))

    def _cum(self, t_s: float) -> float:
        x = t_s / HOUR_S - self.first_hour
        n = self.n_hours
        if x <= 0:
            return x * HOUR_S * self._values_list[0]
        if x >= n:
            return self._cum_list[n] + (x - n) * HOUR_S * self._values_list[n - 1]
        i = int(x)
        return self._cum_list[i] + (x - i) * HOUR_S * self._values_list[i]

    def integral_g_per_kwh_s(self, start_s: float, end_s: float) -> float:
        """Integral of intensity over [start_s, end_s] in (gCO2/kWh)*s (at the data's own step)."""
        if self.fine is not None:
            return self.fine.integral(start_s, end_s)
        return self._cum(end_s) - self._cum(start_s)

    def outside_s(self, start_s: float, end_s: float) -> float:
        """Seconds of [start_s, end_s] outside the data (where the edge values were held)."""
        return max(0.0, min(end_s, self.start_s) - start_s) + max(0.0, end_s - max(start_s, self.end_s))

    def hourly_dict(self) -> dict[int, float]:
        """Epoch hour -> value (gap-filled hours included), for the own forecaster."""
        return {self.first_hour + i: v for i, v in enumerate(self._values_list)}


@dataclass
class FineSeries:
    """A zone's values at a sub-hourly step from `first` (in steps since the epoch), gaps
    filled with the previous value; edges held as in the hourly series."""

    step_s: float
    first: int
    values_g_per_kwh: np.ndarray
    filled: int = 0

    def __post_init__(self) -> None:
        self.values_g_per_kwh = np.asarray(self.values_g_per_kwh, dtype=float)
        self._values = self.values_g_per_kwh.tolist()
        self._cum = np.concatenate(([0.0], np.cumsum(self.values_g_per_kwh) * self.step_s)).tolist()

    def values(self, first: int, n: int) -> list[float]:
        """The values of steps first .. first + n - 1 (clamped to the data's edges)."""
        i, last = first - self.first, len(self._values) - 1
        if 0 <= i and i + n - 1 <= last:
            return self._values[i:i + n]
        return [self._values[min(max(j, 0), last)] for j in range(i, i + n)]

    def value_at(self, t_s: float) -> float:
        return self.values(int(t_s // self.step_s), 1)[0]

    def _at(self, t_s: float) -> float:
        x = t_s / self.step_s - self.first
        n = len(self._values)
        if x <= 0:
            return x * self.step_s * self._values[0]
        if x >= n:
            return self._cum[n] + (x - n) * self.step_s * self._values[n - 1]
        i = int(x)
        return self._cum[i] + (x - i) * self.step_s * self._values[i]

    def integral(self, start_s: float, end_s: float) -> float:
        return self._at(end_s) - self._at(start_s)

    def points(self, since_s: float, until_s: float) -> list[tuple[float, int, float]]:
        """(at_s, step, value) of the steps from `since_s` that ended by `until_s` (known then)."""
        lo = max(0, int(since_s // self.step_s) - self.first)
        hi = min(len(self._values), max(0, int(until_s // self.step_s) - self.first))
        return [((self.first + i) * self.step_s, int(self.step_s), self._values[i]) for i in range(lo, hi)]


def fine_series(zone: str, points: list[tuple[float, int, float]]) -> FineSeries | None:
    """The sub-hourly series of (at_s, duration_s, value) rows of one step dividing the hour;
    None for hourly (or coarser) data, or rows of several steps."""
    steps = {int(d) for _, d, _ in points}
    if len(steps) != 1:
        return None
    step = steps.pop()
    if step >= HOUR_S or HOUR_S % step:
        return None
    by_step = {int(at // step): v for at, _, v in points}
    first = min(by_step)
    values, filled = _forward_filled(by_step)
    if filled:
        log.info("zone %s: %d missing %d-s steps filled with the previous value", zone, filled, step)
    return FineSeries(step_s=float(step), first=first, values_g_per_kwh=np.array(values), filled=filled)


def _forward_filled(by_index: dict[int, float]) -> tuple[list[float], int]:
    """The values from the first index to the last, a missing one taking the one before it;
    and how many were missing."""
    first, last = min(by_index), max(by_index)
    values, filled, prev = [], 0, by_index[first]
    for k in range(first, last + 1):
        v = by_index.get(k)
        if v is None:
            filled += 1
            v = prev
        values.append(v)
        prev = v
    return values, filled


def from_hourly(zone: str, hourly: dict[int, float], *, signal: str, source: str) -> ZoneIntensity:
    """A ZoneIntensity from epoch hour -> value, forward-filling missing hours."""
    if not hourly:
        raise CarbonInputError(f"zone {zone}: no carbon-intensity values")
    first = min(hourly)
    values, filled = _forward_filled(hourly)
    if filled:
        log.info("zone %s: %d missing hours filled with the previous hour's value", zone, filled)
    return ZoneIntensity(zone=zone, first_hour=first, values_g_per_kwh=np.array(values), signal=signal,
                         source=source, filled_hours=filled)


def load_zone_files(zone: str, paths: list[str | Path]) -> ZoneIntensity:
    """Read one zone's actual intensity from trace files (several files are merged in order).

    The files are read with the carbon layer's `read_trace`, relabelled to `zone` (folder and
    file zone ids differ: DE-LU holds DE). Forecast rows (with an issue time) are kept apart
    in `issued`, for `--forecast stored`; the other forecast models ignore them.
    """
    from telemetry.grid.csv_import import read_trace
    from telemetry.grid.readings import KIND_ACTUAL, CsvFormatError

    points: list[tuple[float, int, float]] = []
    forecast_rows: list[tuple[float, float, int, float, str]] = []
    signals: set[str] = set()
    sources: list[str] = []
    for path in paths:
        try:
            trace = read_trace(path, zone=zone)
        except CsvFormatError as e:
            raise CarbonInputError(f"--carbon {zone}={path}: {e}") from None
        actual = [r for r in trace.readings if r.kind == KIND_ACTUAL]
        forecast_rows.extend((r.issued_at.timestamp(), r.at.timestamp(), r.duration_s, r.gco2_per_kwh, r.signal)
                             for r in trace.readings if r.kind != KIND_ACTUAL)
        signals.update(r.signal for r in actual)
        points.extend((r.at.timestamp(), r.duration_s, r.gco2_per_kwh) for r in actual)
        sources.append(f"{Path(path).name} ({trace.fmt})")
    if len(signals) > 1:
        raise CarbonInputError(f"zone {zone}: the files mix average and marginal signals")
    if not points:
        raise CarbonInputError(f"zone {zone}: no actual carbon-intensity rows in {', '.join(map(str, paths))}")
    signal = signals.pop()
    if {r[4] for r in forecast_rows} - {signal}:
        raise CarbonInputError(f"zone {zone}: the forecast rows' signal differs from the actuals' ({signal})")
    out = from_hourly(zone, hourly_means(points), signal=signal, source=", ".join(sources))
    out.fine = fine_series(zone, points)
    if forecast_rows:
        from scheduler.simulate.issued import IssuedForecasts

        out.issued = IssuedForecasts.from_rows(r[:4] for r in forecast_rows)
        log.info("zone %s: %d forecast rows in %d issued runs kept for --forecast stored", zone,
                 len(forecast_rows), len(out.issued))
    return out


def load_carbon(specs: list[str]) -> dict[str, ZoneIntensity]:
    """Parse `ZONE=FILE` options (a zone may repeat to join files) into zone -> intensity."""
    by_zone: dict[str, list[str]] = {}
    for spec in specs:
        zone, sep, path = spec.partition("=")
        if not sep or not zone.strip() or not path.strip():
            raise CarbonInputError(f"--carbon {spec!r}: expected ZONE=FILE, e.g. DE=DE-LU_2022_hourly.csv")
        by_zone.setdefault(zone.strip(), []).append(path.strip())
    zones = {zone: load_zone_files(zone, paths) for zone, paths in by_zone.items()}
    check_signals(zones)
    return zones


def check_signals(zones: dict[str, ZoneIntensity]) -> None:
    """Average and marginal signals are never mixed silently: refuse a mix across zones."""
    kinds = {z.signal for z in zones.values()}
    if len(kinds) > 1:
        detail = ", ".join(f"{z.zone}: {z.signal}" for z in zones.values())
        raise CarbonInputError(f"zones mix average and marginal carbon signals ({detail})")


def check_zones(cluster_zones: list[str], carbon: dict[str, ZoneIntensity]) -> None:
    """Every cluster zone needs carbon data and every carbon file a cluster zone."""
    missing = [z for z in cluster_zones if z not in carbon]
    unused = [z for z in carbon if z not in cluster_zones]
    if missing or unused:
        parts = []
        if missing:
            parts.append(f"cluster zone(s) without --carbon data: {', '.join(missing)}")
        if unused:
            parts.append(f"--carbon zone(s) not in the cluster: {', '.join(unused)}")
        raise CarbonInputError("; ".join(parts) + f" (cluster zones: {', '.join(cluster_zones)})")


def common_start(carbon: dict[str, ZoneIntensity]) -> datetime:
    """The first hour every zone has data for."""
    return datetime.fromtimestamp(max(z.start_s for z in carbon.values()), timezone.utc)
