"""The carbon signal of a zone, as of a time: one interface for live and replayed carbon.

A planner may only know what was known at the time it plans. `CarbonSignal` is what it asks:

- `signal_of(zone)`: which signal (average or marginal) the zone's values are;
- `intensity(zone, t, as_of=...)`: the recorded value at `t` as known at `as_of`;
- `forecast(zone, start, end, as_of)`: the best values for [start, end) known at `as_of`,
  a `CarbonForecast`;
- `climatology(zone, signal, as_of)`: the zone's typical value by month and hour, from what
  was known by the start of `as_of`'s day (`scheduler.carbon_climatology`), which prices a
  job past the forecast's end.

Two implementations: the store-backed live signals of the daemon (`scheduler.carbon.
CarbonSignals`) and the simulator's replayed ones (`scheduler.simulate.forecasts.
ForecastModel` over each zone's `ZoneIntensity`). Both hand their forecasts to one function,
`scheduler.carbon_curves.zone_curve`, which makes the `CarbonCurve` a policy plans on.

The result types live here too, as the interface's vocabulary. A forecast is a list of
constant pieces (`points`); a replayed forecast also carries them as a regular `grid` (one
value per step from the window's start), which the curve takes as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from policies.types import Climatology

KIND_STATIC = "static"
SOURCE_OWN = "own-forecast"
SOURCE_STATIC = "static"
LEVELS = ("actual", "live", "own", "static", "none")  # best to worst
#: the level of a replayed (simulated) forecast: whatever the simulator's forecast model issued
LEVEL_REPLAYED = "replayed"


@dataclass(frozen=True)
class IntensityValue:
    """A recorded value at one moment, with the period it holds for and where it came from."""

    zone: str
    at: datetime
    gco2_per_kwh: float
    kind: str
    signal: str
    source: str
    valid_from: datetime
    valid_until: datetime
    issued_at: datetime | None
    estimated: bool | None = None


@dataclass(frozen=True)
class ForecastPoint:
    """One constant piece of a forecast: [at, until) at gco2_per_kwh.

    kind is "actual", "forecast" or "static"; source names the provider, "own-forecast" or
    "static"; issued_at is when the value was known (None for static).
    """

    at: datetime
    until: datetime
    gco2_per_kwh: float
    kind: str
    source: str
    issued_at: datetime | None


@dataclass(frozen=True)
class ForecastGrid:
    """A forecast's values on a regular grid: `values[i]` holds on
    [start + i*step_s, start + (i+1)*step_s)."""

    start: datetime
    step_s: float
    values: tuple[float, ...]


@dataclass(frozen=True)
class CarbonForecast:
    """Values for [start, end) as known at `as_of`, with gaps, source and quality.

    `grid`: the same values on a regular grid, where the signal has them so (a replayed
    forecast); `points` is then empty until asked for (`pieces()`).
    """

    zone: str
    signal: str
    start: datetime
    end: datetime
    as_of: datetime
    points: tuple[ForecastPoint, ...]
    gaps: tuple[tuple[datetime, datetime], ...]
    level: str
    source: str
    expected_mape_pct: float | None
    reason: str | None = None
    method: str | None = None
    grid: ForecastGrid | None = None

    @property
    def complete(self) -> bool:
        return not self.gaps

    def pieces(self) -> tuple[ForecastPoint, ...]:
        """The constant pieces: `points`, or the grid's steps as pieces."""
        if self.points or self.grid is None:
            return self.points
        from datetime import timedelta

        g = self.grid
        step = timedelta(seconds=g.step_s)
        return tuple(ForecastPoint(g.start + i * step, g.start + (i + 1) * step, v, "forecast", self.source,
                                   self.as_of) for i, v in enumerate(g.values))

    def value_at(self, t: datetime) -> float | None:
        """The value holding at t, or None in a gap or outside the window."""
        for p in self.pieces():
            if p.at <= t < p.until:
                return p.gco2_per_kwh
        return None

    def mean_gco2_per_kwh(self, start: datetime | None = None, end: datetime | None = None) -> float | None:
        """Time-weighted mean over [start, end) (default the window); None if a gap is inside."""
        start = start or self.start
        end = end or self.end
        if any(a < end and b > start for a, b in self.gaps):
            return None
        total = weight = 0.0
        for p in self.pieces():
            a, b = max(p.at, start), min(p.until, end)
            if b > a:
                s = (b - a).total_seconds()
                total += p.gco2_per_kwh * s
                weight += s
        if weight + 1e-6 < (end - start).total_seconds():
            return None
        return total / weight if weight else None


class CarbonSignal(Protocol):
    """The carbon signal of zones as a planner may know it at `as_of` (module docstring)."""

    def signal_of(self, zone: str) -> str | None: ...

    def intensity(self, zone: str, t: datetime, *, signal: str | None = None,
                  as_of: datetime | None = None) -> IntensityValue | None: ...

    def forecast(self, zone: str, start: datetime, end: datetime, as_of: datetime | None = None,
                 *, signal: str | None = None) -> CarbonForecast: ...

    def climatology(self, zone: str, signal: str, as_of: datetime) -> Climatology | None: ...


class VersionedSignal(CarbonSignal, Protocol):
    """A signal whose data can change under a reader (the store): `data_versions` counts the
    changes of each zone's data, so a cache of what was read knows when to read again."""

    def data_versions(self, zones: Iterable[str]) -> dict[str, int]: ...
