"""Each zone's carbon intensity integrated from now, for pricing runs on the slot grid.

A run of `runtime_s` from slot s on a group of zone z costs power x PUE x (G(t_s + runtime)
- G(t_s)) / 3.6e6 grams, where G is the zone's cumulative intensity (g/kWh x s) from now:
piecewise linear between knots, so one vectorised `numpy.interp` prices many starts (and
many jobs) at once. Past the forecast's end G follows its `tail` (the zone's typical values,
`policies.pricing.carbon_tail`) up to `until_s`, which the planning problem sets to the last slot's
start plus the longest run any job can make; a curve without a tail is extended flat. A zone
without a forecast comes priced blind (`policies.pricing.blind`), flat at one price.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np

from policies.pricing.carbon_tail import extended
from policies.model.energy import curve_integral_g_per_kwh_s
from policies.model.length_spread import expected
from policies.types import J_PER_KWH, CarbonCurve
from policies.problem.slot_grid import SlotGrid

_FAR_S = 1e9  # flat extension of a forecast beyond its ends, in seconds


class ZoneIntegrals:
    """Per zone (in `zones` order: `zone_knots`, `zone_base`; by name: `knots`, `base`), the
    cumulative knots (seconds from now, g/kWh x s) and their values at each slot's start."""

    def __init__(self, curves: dict[str, CarbonCurve], zones: list[str], grid: SlotGrid, until_s: float) -> None:
        self.curves = curves
        self.zones = zones
        self.grid = grid
        self.until_s = until_s  # epoch s: the knots cover every run that ends by then
        self.knots: dict[str, tuple[np.ndarray, np.ndarray]] = {
            zone: _cumulative_knots(curves[zone], grid.now, until_s) for zone in zones}
        self.base = {z: np.interp(grid.offsets_s, *self.knots[z]) for z in zones}
        self.zone_knots = [self.knots[z] for z in zones]
        self.zone_base = [self.base[z] for z in zones]
        self._slot_integrals: dict[str, np.ndarray] = {}

    def slot_integrals(self, zone: str) -> np.ndarray:
        """The zone's forecast intensity integrated over each slot (g/kWh x s), cached:
        what one slot of running costs per kWh-rate (`policies.problem.segments`)."""
        hit = self._slot_integrals.get(zone)
        if hit is None:
            tk, gk = self.knots[zone]
            grid = self.grid
            hit = self._slot_integrals[zone] = np.interp(grid.offsets_s + grid.slot_s, tk, gk) - self.base[zone]
        return hit

    def gco2_at(self, zone: str, start: datetime, runtime_s: float, power_w: float, pue: float,
                spread: np.ndarray | None = None) -> float:
        """Internal cost of drawing power_w from `start` in a zone (blind zones: fallback);
        with `spread` (length multipliers, `policies.model.length_spread`) the mean over them."""
        if spread is not None:
            return expected(lambda run_s: self.gco2_at(zone, start, run_s, power_w, pue), runtime_s, spread)
        now = self.grid.now
        a = (start - now).total_seconds()
        end_s = now.timestamp() + a + runtime_s
        if end_s > self.until_s and self.curves[zone].tail is not None:  # a pinned or kept run past the knots
            return power_w * pue * curve_integral_g_per_kwh_s(
                self.curves[zone], start, start + timedelta(seconds=runtime_s)) / J_PER_KWH
        tk, gk = self.knots[zone]
        integral = float(np.interp(a + runtime_s, tk, gk) - np.interp(a, tk, gk))
        return power_w * pue * integral / J_PER_KWH

    def tail_s(self, zone: str, start: datetime, runtime_s: float) -> float:
        """Seconds of a run from `start` that fall past the end of the zone's forecast and are
        priced by its tail (`policies.pricing.carbon_tail`; 0 for a curve without one)."""
        curve = self.curves.get(zone)
        if curve is None or curve.tail is None:
            return 0.0
        t = start.timestamp()
        return extended(curve).tail_s(t, t + runtime_s)


def _cumulative_knots(curve: CarbonCurve, now: datetime, until_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Knots (seconds from now, cumulative g/kWh x s) of the curve's integral: flat-extended
    without a tail; with one, its typical values up to `until_s` (epoch s), then its mean."""
    if curve.tail is not None:
        return extended(curve).knots(now.timestamp(), until_s, _FAR_S)
    values = np.asarray(curve.values_g_per_kwh, dtype=np.float64)
    t0 = (curve.start - now).total_seconds()
    n = values.size
    tk = t0 + np.arange(n + 1, dtype=np.float64) * curve.step_s
    gk = np.concatenate([[0.0], np.cumsum(values) * curve.step_s])
    tk = np.concatenate([[t0 - _FAR_S], tk, [tk[-1] + _FAR_S]])
    gk = np.concatenate([[-_FAR_S * values[0]], gk, [gk[-1] + _FAR_S * values[-1]]])
    return tk, gk
