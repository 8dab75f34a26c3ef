"""Carbon curves: a zone's forecast as the step curve a policy plans on.

`zone_curve(signals, forecast, slot_s)` is the one way a `CarbonCurve` is made, in the daemon
and in the simulator alike: the forecast's values slot by slot at the data's own step
(`curve_step_s`, `curve_from_forecast`), with the zone's climatology as the tail past its
end (`CarbonSignal.climatology`), so a job that runs for days is priced over its whole run.

`CarbonCurves` is the daemon planner's cache of them over the live signals: curves for the
zones of a tick, rebuilt when a slot starts, after `ttl_s`, or when a zone's carbon data
changed (`VersionedSignal.data_versions`). The simulator's `ForecastModel.curve` caches its
own per issue step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

from sqlalchemy.exc import SQLAlchemyError

from policies.types import CarbonCurve
from scheduler.carbon_signal import CarbonForecast, CarbonSignal

log = logging.getLogger(__name__)

DEFAULT_CARBON_TTL_S = 60.0
# Forecasts are read this far beyond the planning horizon: a job starting near its end
# runs on past it.
CURVE_TAIL_S = 24 * 3600.0
MIN_CURVE_STEP_S = 300.0


def zone_curve(signals: CarbonSignal, fc: CarbonForecast, slot_s: float) -> CarbonCurve | None:
    """The curve a policy plans on from a zone's forecast over its window: slot means at the
    data's step, the zone's climatology past its end; None where the forecast has no value."""
    step = curve_step_s(fc, slot_s)
    curve = curve_from_forecast(fc, fc.start, step, int(round((fc.end - fc.start).total_seconds() / step)))
    if curve is None:
        return None
    return replace(curve, tail=signals.climatology(fc.zone, fc.signal, fc.as_of))


def curve_step_s(fc: CarbonForecast, slot_s: float) -> float:
    """The step of a zone's curve: a replayed forecast's own grid step; else its data's shortest
    period (5-minute MOER) where that is finer than the planner's slot and divides it, so no
    value is averaged away; else the slot."""
    if fc.grid is not None:
        return fc.grid.step_s
    periods = Counter((p.until - p.at).total_seconds() for p in fc.points)
    # a period cut at the window's edge is no step; nothing provides finer than 5 minutes
    finest = min((d for d, n in periods.items() if d >= MIN_CURVE_STEP_S and n >= 2), default=slot_s)
    return float(finest) if finest < slot_s and slot_s % finest == 0 else float(slot_s)


def curve_from_forecast(fc: CarbonForecast, start: datetime, step_s: float, n_steps: int) -> CarbonCurve | None:
    """A `CarbonForecast` as a step curve of `n_steps` slots from `start`; None without values.

    Each slot holds the time-weighted mean of the forecast over it. Gaps are bridged with the
    nearest earlier value (the first known value before the first one), and the curve's
    source says so. A forecast on a grid of exactly these slots gives its values as they are.
    """
    grid = fc.grid
    if grid is not None and grid.start == start and grid.step_s == step_s and len(grid.values) >= n_steps:
        return CarbonCurve(zone=fc.zone, start=start, step_s=step_s, values_g_per_kwh=tuple(grid.values[:n_steps]),
                           signal=fc.signal, source=f"{fc.source} ({fc.level})")
    points = sorted(fc.pieces(), key=lambda p: p.at)
    if not points:
        return None
    step = timedelta(seconds=step_s)
    values: list[float | None] = []
    i = 0
    for k in range(n_steps):
        a = start + k * step
        b = a + step
        while i < len(points) and points[i].until <= a:
            i += 1
        total = weight = 0.0
        j = i
        while j < len(points) and points[j].at < b:
            lo, hi = max(points[j].at, a), min(points[j].until, b)
            if hi > lo:
                w = (hi - lo).total_seconds()
                total += points[j].gco2_per_kwh * w
                weight += w
            j += 1
        values.append(total / weight if weight > 0 else None)
    filled = sum(v is None for v in values)
    first = next(v for v in values if v is not None) if filled < len(values) else None
    if first is None:
        return None
    last = first
    out: list[float] = []
    for v in values:
        last = v if v is not None else last
        out.append(last)
    source = f"{fc.source} ({fc.level})"
    if filled:
        source += f", {filled} of {n_steps} slots bridged over gaps"
    return CarbonCurve(zone=fc.zone, start=start, step_s=step_s, values_g_per_kwh=tuple(out),
                       signal=fc.signal, source=source)


@dataclass(frozen=True)
class ZoneCarbon:
    """One zone's curve for a tick, or None with the reason it is planned carbon-blind."""

    zone: str
    curve: CarbonCurve | None
    note: str | None = None


class CarbonCurves:
    """Forecast curves per zone, slot by slot, from the carbon-signal store only.

    Curves are `zone_curve`s over [slot holding now, + horizon + `CURVE_TAIL_S`). A zone
    whose forecast has no value at all gets no curve. All zones of one snapshot use one
    signal (average unless every zone with data only has marginal): zones whose data is of
    the other signal are planned blind rather than mixed in silently.
    """

    def __init__(self, signals: CarbonSignal | None, *, slot_s: float, horizon_s: float,
                 ttl_s: float = DEFAULT_CARBON_TTL_S, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.signals = signals
        self.slot_s = slot_s
        self.horizon_s = horizon_s
        self.ttl_s = ttl_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        # (monotonic time, slot start, zones, their data versions, curves)
        self._cache: tuple[float, datetime, frozenset[str], tuple[tuple[str, int], ...] | None,
                           dict[str, ZoneCarbon]] | None = None
        self._blind_logged: set[str] = set()

    def invalidate(self) -> None:
        with self._lock:
            self._cache = None

    def for_zones(self, zones: Iterable[str], now: datetime) -> dict[str, ZoneCarbon]:
        """Curves for `zones` starting at the slot that holds `now` (cached briefly, and only
        while no zone's carbon data has changed)."""
        wanted = frozenset(zones)
        start = _slot_floor(now, self.slot_s)
        mono = self._monotonic()
        versions = self._versions(wanted)
        with self._lock:
            hit = self._cache
            if (hit is not None and versions is not None and mono - hit[0] < self.ttl_s and hit[1] == start
                    and hit[2] == wanted and hit[3] == versions):
                return hit[4]
        out = self._build(sorted(wanted), start, now)
        with self._lock:
            self._cache = (mono, start, wanted, versions, out)
        for z, zc in out.items():
            if zc.curve is None and z not in self._blind_logged:
                self._blind_logged.add(z)
                log.warning("planning zone %s carbon-blind: %s", z, zc.note)
            elif zc.curve is not None and z in self._blind_logged:
                self._blind_logged.discard(z)
                log.info("zone %s has carbon data again (%s)", z, zc.curve.source)
        return out

    def _versions(self, zones: frozenset[str]) -> tuple[tuple[str, int], ...] | None:
        """The zones' carbon data versions; None (no cache hit) when they cannot be read."""
        read = getattr(self.signals, "data_versions", None)
        if read is None:
            return ()  # a signal without versions (not a VersionedSignal): the TTL alone decides
        try:
            return tuple(sorted(read(zones).items()))
        except SQLAlchemyError as e:
            log.warning("carbon data versions unreadable, re-reading the curves: %s", e)
            return None

    def _build(self, zones: list[str], start: datetime, now: datetime) -> dict[str, ZoneCarbon]:
        if self.signals is None:
            return {z: ZoneCarbon(z, None, "no carbon-signal store") for z in zones}
        end = start + timedelta(seconds=self.horizon_s + CURVE_TAIL_S)
        own: dict[str, str | None] = {}
        for z in zones:
            try:
                own[z] = self.signals.signal_of(z)
            except SQLAlchemyError as e:
                log.warning("carbon signal of zone %s unreadable: %s", z, e)
                own[z] = None
        kinds = Counter(sig for sig in own.values() if sig)
        signal = "marginal" if kinds and "average" not in kinds else "average"
        out: dict[str, ZoneCarbon] = {}
        for z in zones:
            try:
                fc = self.signals.forecast(z, start, end, as_of=now, signal=signal)
            except (SQLAlchemyError, ValueError) as e:
                log.warning("carbon forecast of zone %s unreadable: %s", z, e)
                out[z] = ZoneCarbon(z, None, f"its forecast could not be read ({e})")
                continue
            curve = zone_curve(self.signals, fc, self.slot_s)
            if curve is None:
                why = f"no {signal} carbon data"
                if own[z] and own[z] != signal:
                    why += f" (it has {own[z]} data, which is not mixed with {signal} in one plan)"
                elif fc.reason:
                    why += f": {fc.reason}"
                out[z] = ZoneCarbon(z, None, why)
            else:
                out[z] = ZoneCarbon(z, curve, None)
        return out


def _slot_floor(t: datetime, slot_s: float) -> datetime:
    epoch = t.timestamp()
    return datetime.fromtimestamp(epoch - (epoch % slot_s), tz=timezone.utc)
