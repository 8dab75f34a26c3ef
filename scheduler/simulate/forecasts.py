"""Forecast models: what a simulated planner believes about carbon intensity ahead.

Decisions in a simulation are made on the forecast, emissions are counted on the actual
intensity, so forecast error is part of what is evaluated. At planner time `now` a model
issues a `CarbonCurve` per zone covering the hours from the one holding `now` to
`horizon_s` ahead. Curves are hourly and cached per (zone, issue hour): the hour is the
unit in which anything new becomes known.

- `perfect`: the actual values (an upper bound on what forecasting can give).
- `noisy:SIGMA`: actual x max(0, 1 + SIGMA * z), z standard normal, independent per target
  hour and issue hour (SIGMA is relative: 0.1 = 10 %, `10%` also works). The noise comes
  from a generator seeded with (seed, zone, issue hour), so a run is reproducible and does
  not depend on which other zones or ticks were planned.
- `persistence`: each target hour gets the value at the same hour on the newest day already
  known (24 h earlier for targets up to a day ahead, 48 h earlier for the next day, ...).
- `model`: the project's own forecaster (`telemetry.grid.forecast.baseline_forecast`, the
  daemon's fallback when no provider forecast exists), fed only hours complete at `now`.
  Where it has no value (too little history) persistence is used, and at a cold start
  (nothing known yet) the zone's first actual value; both are counted.

A value is "known" at `now` once its hour has ended: the newest known hour is the one
before the hour holding `now`.

Past its end every curve carries the zone's climatology (`CarbonCurve.tail`, the typical
intensity by month and UTC hour: `scheduler.carbon_climatology`), computed as the daemon
does from the trace's hours that ended before the start of the simulated day (a year of them
at most), so a job that runs past the forecast is priced over its whole run and the
simulator does not peek.
"""

from __future__ import annotations

import logging
import math
import zlib
from dataclasses import dataclass, field

import numpy as np

from policies.model import CarbonCurve, Climatology
from scheduler.simulate.intensity import HOUR_S, ZoneIntensity

log = logging.getLogger(__name__)

KINDS = ("perfect", "noisy", "persistence", "model")


@dataclass
class ForecastModel:
    """Issues forecast curves per zone; `name` is the spec it was parsed from."""

    kind: str
    zones: dict[str, ZoneIntensity]
    sigma: float = 0.0
    seed: int = 0
    name: str = ""
    fallbacks: int = 0
    climatology: bool = True  # curves carry the zone's climatology past their end (`tail`)
    _cache: dict[tuple[str, int, int], CarbonCurve] = field(default_factory=dict, repr=False)
    _hourly: dict[str, dict[int, float]] = field(default_factory=dict, repr=False)
    _tails: dict[tuple[str, int], Climatology | None] = field(default_factory=dict, repr=False)

    def curve(self, zone: str, now_s: float, horizon_s: float) -> CarbonCurve:
        """The forecast issued at `now_s` for `zone`, hourly, covering [now, now + horizon]."""
        issue_hour = int(now_s // HOUR_S)
        n_hours = int(math.ceil(horizon_s / HOUR_S)) + 1
        key = (zone, issue_hour, n_hours)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        if len(self._cache) > 4096:
            self._cache.clear()
        values = self.values(zone, issue_hour, n_hours)
        from datetime import datetime, timezone

        z = self.zones[zone]
        curve = CarbonCurve(zone=zone, start=datetime.fromtimestamp(issue_hour * HOUR_S, timezone.utc),
                            step_s=HOUR_S, values_g_per_kwh=tuple(values), signal=z.signal,
                            source=f"simulated forecast {self.name or self.kind} of {z.source}",
                            tail=self.tail(zone, issue_hour) if self.climatology else None)
        self._cache[key] = curve
        return curve

    def tail(self, zone: str, issue_hour: int) -> Climatology | None:
        """The zone's climatology as of the start of the day holding `issue_hour`: from the
        trace's hours that ended by then (cached per zone and day)."""
        day = issue_hour // 24
        key = (zone, day)
        if key in self._tails:
            return self._tails[key]
        from scheduler.carbon_climatology import LOOKBACK_DAYS, climatology_from_hourly
        from telemetry.grid.static import static_intensity

        z = self.zones[zone]
        lo = max(z.first_hour, day * 24 - LOOKBACK_DAYS * 24)
        hi = min(day * 24, z.first_hour + z.n_hours)
        hours = np.arange(lo, max(lo, hi), dtype=np.int64)
        values = z.values_g_per_kwh[lo - z.first_hour:max(lo, hi) - z.first_hour]
        static = static_intensity(zone) if z.signal == "average" else None
        tail = climatology_from_hourly(hours, values, static_g_per_kwh=None if static is None else static.gco2_per_kwh,
                                       label=f"the {zone} trace")
        if len(self._tails) > 4096:
            self._tails.clear()
        self._tails[key] = tail
        return tail

    def values(self, zone: str, issue_hour: int, n_hours: int) -> list[float]:
        """Forecast values for the hours issue_hour .. issue_hour + n_hours - 1."""
        z = self.zones[zone]
        targets = range(issue_hour, issue_hour + n_hours)
        if self.kind == "perfect":
            return z.hour_values(issue_hour, n_hours)
        if self.kind == "noisy":
            actual = np.array(z.hour_values(issue_hour, n_hours))
            rng = np.random.default_rng([self.seed, zlib.crc32(zone.encode()), issue_hour & 0xFFFFFFFF])
            noise = rng.standard_normal(n_hours)
            return np.maximum(0.0, actual * (1.0 + self.sigma * noise)).tolist()
        last_known = issue_hour - 1
        if self.kind == "persistence":
            return [self._persistence(z, h, last_known) for h in targets]
        from telemetry.grid.forecast import baseline_forecast

        hourly = self._hourly.get(zone)
        if hourly is None:
            hourly = self._hourly[zone] = z.hourly_dict()
        own = baseline_forecast(hourly, last_known, targets)
        out = []
        for h, v in zip(targets, own):
            if v is None:
                self.fallbacks += 1
                v = self._persistence(z, h, last_known)
            out.append(v)
        return out

    def _persistence(self, z: ZoneIntensity, target: int, last_known: int) -> float:
        if last_known < z.first_hour:
            self.fallbacks += 1
            return z.hour_value(z.first_hour)  # cold start: nothing known yet
        days = max(1, -(-(target - last_known) // 24))
        return z.hour_value(max(target - 24 * days, z.first_hour))


def parse_forecast(spec: str, zones: dict[str, ZoneIntensity], seed: int = 0) -> ForecastModel:
    """Parse `perfect`, `noisy:SIGMA`, `persistence` or `model` into a ForecastModel."""
    text = spec.strip().lower()
    kind, _, arg = text.partition(":")
    if kind not in KINDS:
        raise ValueError(f"unknown forecast {spec!r}; use perfect, noisy:SIGMA (e.g. noisy:0.1), "
                         "persistence or model")
    sigma = 0.0
    if kind == "noisy":
        if not arg:
            raise ValueError("noisy needs a relative error, e.g. noisy:0.1 or noisy:10%")
        try:
            sigma = float(arg[:-1]) / 100.0 if arg.endswith("%") else float(arg)
        except ValueError:
            raise ValueError(f"malformed noise level {arg!r}; e.g. noisy:0.1 or noisy:10%") from None
        if not (0.0 <= sigma <= 5.0):
            raise ValueError(f"noise level {sigma} must be between 0 and 5 (relative)")
    elif arg:
        raise ValueError(f"forecast {kind} takes no argument (got {spec!r})")
    return ForecastModel(kind=kind, zones=zones, sigma=sigma, seed=seed, name=text)
