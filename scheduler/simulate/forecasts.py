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
- `model`: the project's own forecaster, the same as the daemon's: the learned model
  (`telemetry.grid.forecast_model.LearnedForecaster`) for the first 72 h, refitted every
  `REFIT_H` simulated hours on the hours known at the refit (so never on a value from after
  the issue), the profile + anomaly baseline beyond it or while there is too little history
  to fit (under 3 weeks). Fits are shared between the policies of one run.
  Using its uncertainty: `model:q=Q` plans on the quantile Q of the forecast (0.5 the
  median; above it a pessimist's forecast), `model:spread=K` on the median plus K times the
  10-90 % spread (an expected value with a penalty for uncertainty: hours whose forecast is
  less sure look dearer).
- `baseline`: the profile + anomaly baseline alone (`telemetry.grid.forecast.baseline_forecast`,
  the project's forecaster before issue 26), fed only hours complete at `now`.
- `stored`: the recorded forecasts of each zone (forecast rows of its `--carbon` files, or
  the store's for `ZONE=store`) as they were issued: at `now` the newest run issued at or
  before `now` (`scheduler.simulate.issued`), never a later one. Hours that have ended are
  actuals; hours the run does not cover come from `model` (counted as fallbacks). The runs
  used are recorded in `seen` (zone, now, issue time) so a replay can be checked.
  For `model` and `baseline`, where there is no value (too little history) persistence is used, and at a cold
  start (nothing known yet) the zone's first actual value; both are counted.

A value is "known" at `now` once its hour has ended: the newest known hour is the one
before the hour holding `now`.

Sub-hourly traces (`ZoneIntensity.fine`: 30-minute GB, 5-minute MOER) get curves at their
own step, issued per step: `perfect` and `noisy` from the values at that step; `model`,
`baseline` and `persistence` forecast the hours as above and split each hour by the zone's
intra-hour shape over the last week known (`telemetry.grid.forecast.intra_hour_shape`, as
the daemon's own forecast does); `stored` stays hourly. A spec ending in `+hourly`
(`perfect+hourly`) makes the planner see the trace averaged into whole hours while
emissions are still counted at its own step: what hourly averaging costs.

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
from datetime import datetime, timedelta, timezone

import numpy as np

from policies.types import CarbonCurve, Climatology
from scheduler.carbon_climatology import LOOKBACK_DAYS, Climatologies
from scheduler.carbon_curves import zone_curve
from scheduler.carbon_signal import LEVEL_REPLAYED, CarbonForecast, ForecastGrid, IntensityValue
from scheduler.simulate.intensity import HOUR_S, ZoneIntensity
from telemetry.grid.forecast import SHAPE_DAYS, baseline_forecast, intra_hour_shape

log = logging.getLogger(__name__)

KINDS = ("perfect", "noisy", "persistence", "model", "baseline", "stored")
#: Simulated hours between refits of the learned model (the daemon refits daily; weekly
#: here keeps a year-long replay to ~50 fits per zone, and the model changes little in a week).
REFIT_H = 168


@dataclass
class ForecastModel:
    """Issues forecast curves per zone; `name` is the spec it was parsed from.

    The simulator's replayed carbon signal (`scheduler.carbon_signal.CarbonSignal`) over each
    zone's `ZoneIntensity`: `forecast` is what the model would have issued at `as_of`,
    `intensity` the trace's value once known, `climatology` the trace's past hours'.
    """

    kind: str
    zones: dict[str, ZoneIntensity]
    sigma: float = 0.0
    quantile: float | None = None
    spread_penalty: float = 0.0
    seed: int = 0
    name: str = ""
    fallbacks: int = 0
    hourly: bool = False  # `+hourly`: curves of hourly means even for sub-hourly traces
    with_climatology: bool = True  # curves carry the zone's climatology past their end (`tail`)
    _cache: dict[tuple, CarbonCurve] = field(default_factory=dict, repr=False)
    _hourly: dict[str, dict[int, float]] = field(default_factory=dict, repr=False)
    _climatologies: Climatologies | None = field(default=None, repr=False)
    #: fitted learned models by (zone, fit hour), shared by the ForecastModels of one run
    fits: dict = field(default_factory=dict, repr=False)
    #: `stored`: (zone, now_s, issued_s or None) of every curve issued
    seen: list[tuple[str, float, float | None]] = field(default_factory=list, repr=False)

    def curve(self, zone: str, now_s: float, horizon_s: float) -> CarbonCurve:
        """The forecast issued at `now_s` for `zone`, hourly (or at a sub-hourly trace's own
        step), covering [now, now + horizon]: `scheduler.carbon_curves.zone_curve` of it."""
        z = self.zones[zone]
        fine = z.fine is not None and not self.hourly and self.kind != "stored"
        step = z.fine.step_s if fine else HOUR_S
        issue = int(now_s // step)
        n = int(math.ceil(horizon_s / step)) + 1
        run = None
        if self.kind == "stored":
            issued = z.issued
            run = issued.latest(now_s) if issued is not None else None
            self.seen.append((zone, now_s, issued.issued_s[run] if run is not None else None))
        key = (zone, -1, issue, n) if fine else (zone, issue, n, run)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        if len(self._cache) > 4096:
            self._cache.clear()
        curve = zone_curve(self, self._issue(zone, issue, n, fine, run, _as_of(now_s)), step)
        assert curve is not None  # a replayed forecast always has values
        self._cache[key] = curve
        return curve

    # -- the carbon signal (scheduler.carbon_signal.CarbonSignal) ----------------------------

    def signal_of(self, zone: str) -> str | None:
        z = self.zones.get(zone)
        return z.signal if z is not None else None

    def intensity(self, zone: str, t: datetime, *, signal: str | None = None,
                  as_of: datetime | None = None) -> IntensityValue | None:
        """The trace's value at `t`, once its step has ended by `as_of`; None outside the trace."""
        z = self.zones.get(zone)
        t_s = t.timestamp()
        if z is None or (signal is not None and signal != z.signal) or not z.start_s <= t_s < z.end_s:
            return None
        step = z.step_s
        valid_from = math.floor(t_s / step) * step
        known_s = valid_from + step
        if as_of is not None and known_s > as_of.timestamp():
            return None
        known = datetime.fromtimestamp(known_s, timezone.utc)
        return IntensityValue(zone=zone, at=t, gco2_per_kwh=z.value_at(t_s), kind="actual", signal=z.signal,
                              source=z.source, valid_from=datetime.fromtimestamp(valid_from, timezone.utc),
                              valid_until=known, issued_at=known)

    def forecast(self, zone: str, start: datetime, end: datetime, as_of: datetime | None = None,
                 *, signal: str | None = None) -> CarbonForecast:
        """This model's forecast issued at `as_of` (default `start`) from the step holding
        `start` to `end`, on the curve's grid."""
        z = self.zones[zone]
        as_of = as_of or start
        fine = z.fine is not None and not self.hourly and self.kind != "stored"
        step = z.fine.step_s if fine else HOUR_S
        issue = int(start.timestamp() // step)
        n = max(1, int(math.ceil((end.timestamp() - issue * step) / step)))
        run = None
        if self.kind == "stored" and z.issued is not None:
            run = z.issued.latest(as_of.timestamp())
        return self._issue(zone, issue, n, fine, run, as_of)

    def climatology(self, zone: str, signal: str, as_of: datetime) -> Climatology | None:
        """The zone's climatology as of the start of `as_of`'s day: from the trace's hours that
        ended by then (None with `with_climatology` off: the curve's last value holds)."""
        if not self.with_climatology:
            return None
        if self._climatologies is None:
            self._climatologies = Climatologies(self._trace_history, label=lambda zone, signal: f"the {zone} trace")
        return self._climatologies.for_zone(zone, signal, as_of)

    def _trace_history(self, zone: str, signal: str, as_of: datetime) -> tuple[np.ndarray, np.ndarray]:
        """The trace's hours of the climatology's lookback that ended by `as_of` (a day's start)."""
        z = self.zones[zone]
        end_hour = int(as_of.timestamp() // HOUR_S)
        lo = max(z.first_hour, end_hour - LOOKBACK_DAYS * 24)
        hi = min(end_hour, z.first_hour + z.n_hours)
        hours = np.arange(lo, max(lo, hi), dtype=np.int64)
        values = z.values_g_per_kwh[lo - z.first_hour:max(lo, hi) - z.first_hour]
        return hours, values

    def _issue(self, zone: str, issue: int, n: int, fine: bool, run: int | None, as_of: datetime) -> CarbonForecast:
        """The forecast of `n` steps from step `issue` (hours, or the trace's own steps when
        `fine`), as a grid."""
        z = self.zones[zone]
        if fine:
            step = z.fine.step_s
            values = self._fine_values(zone, issue, n)
            source = f"simulated forecast {self.name or self.kind} of {z.source} at {step:g} s"
        else:
            step = HOUR_S
            values = self._stored(zone, issue, n, run) if self.kind == "stored" else self.values(zone, issue, n)
            source = f"simulated forecast {self.name or self.kind} of {z.source}"
        start = datetime.fromtimestamp(issue * step, timezone.utc)
        return CarbonForecast(zone=zone, signal=z.signal, start=start, end=start + timedelta(seconds=n * step),
                              as_of=as_of, points=(), gaps=(), level=LEVEL_REPLAYED, source=source,
                              expected_mape_pct=None, grid=ForecastGrid(start, step, tuple(values)))

    def _fine_values(self, zone: str, issue: int, n: int) -> list[float]:
        """The values of `n` steps from step `issue` at the zone's own sub-hourly step."""
        fine = self.zones[zone].fine
        step = fine.step_s
        if self.kind == "perfect":
            return fine.values(issue, n)
        if self.kind == "noisy":
            actual = np.array(fine.values(issue, n))
            rng = np.random.default_rng([self.seed, zlib.crc32(zone.encode()), issue & 0xFFFFFFFF, int(step)])
            return np.maximum(0.0, actual * (1.0 + self.sigma * rng.standard_normal(n))).tolist()
        issue_hour = int(issue * step // HOUR_S)
        last_s = (issue + n) * step
        n_hours = int(math.ceil((last_s - issue_hour * HOUR_S) / HOUR_S))
        hourly = self.values(zone, issue_hour, n_hours)
        known = fine.points((issue_hour - 24 * SHAPE_DAYS) * HOUR_S, issue_hour * HOUR_S)
        shape = intra_hour_shape(known, int(step), issue_hour - 1)
        parts = int(HOUR_S // step)
        values = []
        for k in range(issue, issue + n):
            t = k * step
            h = int(t // HOUR_S)
            ratios = shape.get(h % 24)
            v = hourly[h - issue_hour]
            values.append(v * ratios[int((t - h * HOUR_S) // step)] if ratios and len(ratios) == parts else v)
        return values

    def values(self, zone: str, issue_hour: int, n_hours: int, kind: str | None = None) -> list[float]:
        """Forecast values for the hours issue_hour .. issue_hour + n_hours - 1 (by `kind`,
        default this model's)."""
        kind = kind or self.kind
        z = self.zones[zone]
        targets = range(issue_hour, issue_hour + n_hours)
        if kind == "perfect":
            return z.hour_values(issue_hour, n_hours)
        if kind == "noisy":
            actual = np.array(z.hour_values(issue_hour, n_hours))
            rng = np.random.default_rng([self.seed, zlib.crc32(zone.encode()), issue_hour & 0xFFFFFFFF])
            noise = rng.standard_normal(n_hours)
            return np.maximum(0.0, actual * (1.0 + self.sigma * noise)).tolist()
        last_known = issue_hour - 1
        if kind == "persistence":
            return [self._persistence(z, h, last_known) for h in targets]
        hourly = self._hourly.get(zone)
        if hourly is None:
            hourly = self._hourly[zone] = z.hourly_dict()
        own = baseline_forecast(hourly, last_known, targets)
        if kind == "model":
            learned = self._learned(zone, hourly, last_known)
            if learned is not None:
                own = [m if m is not None else b for m, b in zip(self._learned_values(learned, hourly, last_known,
                                                                                       targets), own)]
        out = []
        for h, v in zip(targets, own):
            if v is None:
                self.fallbacks += 1
                v = self._persistence(z, h, last_known)
            out.append(v)
        return out

    def _stored(self, zone: str, issue_hour: int, n_hours: int, run: int | None) -> list[float]:
        """The run's hourly values; ended hours from actuals, uncovered hours from `model`."""
        z = self.zones[zone]
        values = self.values(zone, issue_hour, n_hours, kind="model")
        if run is None:
            self.fallbacks += n_hours
            return values
        issued = z.issued
        assert issued is not None
        forecast = issued.runs[run]
        known_until = int(issued.issued_s[run] // HOUR_S)  # hours before the issue's hour have ended
        for i, hour in enumerate(range(issue_hour, issue_hour + n_hours)):
            v = forecast.get(hour)
            if v is not None:
                values[i] = v
            elif hour < known_until:
                values[i] = z.hour_value(hour)
            else:
                self.fallbacks += 1
        return values

    def _learned_values(self, learned, hourly: dict[int, float], last_known: int, targets) -> list[float | None]:
        if self.quantile is None and not self.spread_penalty:
            return learned.predict(hourly, last_known, targets)
        if self.quantile is not None:
            return learned.predict_quantiles(hourly, last_known, targets, (self.quantile,))[self.quantile]
        q = learned.predict_quantiles(hourly, last_known, targets, (0.1, 0.5, 0.9))
        return [None if m is None else m + self.spread_penalty * (hi - lo)
                for lo, m, hi in zip(q[0.1], q[0.5], q[0.9])]

    def _learned(self, zone: str, hourly: dict[int, float], last_known: int):
        """The learned model fitted at the newest refit hour <= last_known (None: too little history)."""
        from telemetry.grid.forecast_model import LearnedForecaster, NotEnoughHistory

        fit_hour = last_known - last_known % REFIT_H
        key = (zone, fit_hour)
        if key not in self.fits:
            try:
                self.fits[key] = LearnedForecaster.fit(hourly, fit_hour)
            except NotEnoughHistory as e:
                log.debug("forecast model %s at hour %d: %s", zone, fit_hour, e)
                self.fits[key] = None
        return self.fits[key]

    def _persistence(self, z: ZoneIntensity, target: int, last_known: int) -> float:
        if last_known < z.first_hour:
            self.fallbacks += 1
            return z.hour_value(z.first_hour)  # cold start: nothing known yet
        days = max(1, -(-(target - last_known) // 24))
        return z.hour_value(max(target - 24 * days, z.first_hour))


def parse_forecast(spec: str, zones: dict[str, ZoneIntensity], seed: int = 0,
                   fits: dict | None = None) -> ForecastModel:
    """Parse `perfect`, `noisy:SIGMA`, `persistence`, `model`, `baseline` or `stored`.

    `fits`: a dict to share the learned model's fits with other ForecastModels of the run.
    """
    text = spec.strip().lower()
    base, plus, view = text.partition("+")
    if plus and view != "hourly":
        raise ValueError(f"malformed {spec!r}: the only view after '+' is hourly (e.g. perfect+hourly)")
    kind, _, arg = base.partition(":")
    if kind not in KINDS:
        raise ValueError(f"unknown forecast {spec!r}; use perfect, noisy:SIGMA (e.g. noisy:0.1), "
                         "persistence, model, baseline or stored")
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
    quantile: float | None = None
    spread = 0.0
    if kind == "model" and arg:
        key, _, val = arg.partition("=")
        try:
            number = float(val)
        except ValueError:
            number = float("nan")
        if key == "q" and 0.0 < number < 1.0:
            quantile = number
        elif key == "spread" and 0.0 <= number <= 10.0:
            spread = number
        else:
            raise ValueError(f"malformed {spec!r}; use model, model:q=Q (0 < Q < 1) or model:spread=K (0-10)")
    elif arg and kind != "noisy":
        raise ValueError(f"forecast {kind} takes no argument (got {spec!r})")
    if kind == "stored":
        bare = sorted(z for z, zi in zones.items() if not zi.issued)
        if bare:
            raise ValueError(f"--forecast stored: no recorded forecasts (rows with an issue time) for zone(s) "
                             f"{', '.join(bare)}; import them with `carbonsched carbon import` and use "
                             "--carbon ZONE=store, or pass a file with an issue-time column")
    return ForecastModel(kind=kind, zones=zones, sigma=sigma, quantile=quantile, spread_penalty=spread,
                         seed=seed, name=text, hourly=bool(plus),
                         fits=fits if fits is not None else {})


def _as_of(now_s: float) -> datetime:
    """`now_s` as a time, cut (not rounded) to whole microseconds: its day never moves."""
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=math.floor(now_s * 1_000_000))
