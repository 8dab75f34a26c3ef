"""A carbon curve over a whole run: its forecast, then the zone's typical values.

A `CarbonCurve` holds forecast values on [start, end), two or three days. A job that runs
for ten days is priced over ten: after the forecast's end each step of the curve takes its
`tail` (a `Climatology`, the zone's typical intensity for the month and UTC hour of the
step's midpoint); without a tail the last forecast value holds, as it always did. Before
`start` the first value holds.

`Extended` is that step function with prefix sums, materialised step by step as far as a
query needs (`cover`), up to `MAX_TAIL_S` past the forecast (beyond it: the tail's mean, so
a runtime of years costs memory for one year only). Every integral of a curve in `policies`
reads the curve through it: `energy.CurveIntegrator` (fifo's pricing, `job_gco2`: the
counterfactual, short-job packing's checks), `problem`'s cumulative knots (greedy, cpsat,
the oracle, the LP bound) and `short_jobs`' slot costs, so every policy prices the tail
alike. Curves without a tail take the old path in each of them, unchanged.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from policies.types import CarbonCurve

T = TypeVar("T")

#: How far past the forecast's end the tail is materialised (beyond it: the tail's mean).
MAX_TAIL_S = 400 * 86400.0
_GROW_MIN_S = 7 * 86400.0  # materialise at least this much of the tail at once


class Extended:
    """One curve as a step function (forecast, then tail) with prefix sums, in steps.

    `values[i]` holds on step i (i = 0 at `curve.start`); `prefix[i]` is the integral of the
    steps before i (in g/kWh x steps). `values` grows past the forecast as `cover` is asked
    for further steps; `n_forecast` of them are the forecast's own. The two arrays are
    swapped together under a lock, so a reader in another thread (a `plan` preview beside
    the planner tick) always sees a matching pair.
    """

    def __init__(self, curve: CarbonCurve) -> None:
        self.curve = curve
        values = np.asarray(curve.values_g_per_kwh, dtype=np.float64)
        self.n_forecast = int(values.size)
        self._arrays = (values, np.concatenate(([0.0], np.cumsum(values))))
        self._lock = threading.Lock()
        tail = curve.tail
        self._cells = None if tail is None else np.asarray(tail.values_g_per_kwh, dtype=np.float64)
        self._max_steps = self.n_forecast + int(math.ceil(MAX_TAIL_S / curve.step_s)) if tail is not None \
            else self.n_forecast
        #: the value after the materialised steps: the tail's mean (past MAX_TAIL_S), or
        #: without a tail the last forecast value (the flat extension)
        self.beyond = float(self._cells.mean()) if self._cells is not None else \
            (float(values[-1]) if self.n_forecast else 0.0)

    @property
    def values(self) -> np.ndarray:
        return self._arrays[0]

    @property
    def prefix(self) -> np.ndarray:
        return self._arrays[1]

    @property
    def has_tail(self) -> bool:
        return self._cells is not None

    @property
    def forecast_end_s(self) -> float:
        """The end of the forecast (epoch seconds): where the tail begins."""
        return self.curve.start.timestamp() + self.n_forecast * self.curve.step_s

    def cover(self, x_steps: float) -> tuple[np.ndarray, np.ndarray]:
        """Materialise the tail up to step `x_steps` (as far as `MAX_TAIL_S` allows; nothing
        to do without a tail) and return (values, prefix) as they then are."""
        arrays = self._arrays
        size = arrays[0].size
        if self._cells is None or x_steps <= size or size >= self._max_steps:
            return arrays
        with self._lock:
            values, prefix = self._arrays
            size = values.size
            step = self.curve.step_s
            want = max(x_steps, size * 2.0, size + _GROW_MIN_S / step)
            n_new = min(int(math.ceil(want)), self._max_steps) - size
            if n_new > 0:
                mid_s = self.curve.start.timestamp() + (np.arange(size, size + n_new, dtype=np.float64) + 0.5) * step
                new = self._cells[_cell_index(mid_s)]
                self._arrays = (np.concatenate([values, new]), np.concatenate([prefix, prefix[-1] + np.cumsum(new)]))
            return self._arrays

    def steps(self, x: float) -> float:
        """The integral of the step function from step 0 to step x (any real x)."""
        values, prefix = self.cover(x)
        if x <= 0:
            return x * float(values[0])
        n = values.size
        if x >= n:
            return float(prefix[n]) + (x - n) * self.beyond
        i = int(x)
        return float(prefix[i]) + (x - i) * float(values[i])

    def steps_array(self, x: np.ndarray) -> np.ndarray:
        """`steps` of every element of `x` (vectorised)."""
        values, prefix = self.cover(float(np.max(x)) if x.size else 0.0)
        n = values.size
        i = np.clip(np.floor(x).astype(np.int64), 0, n - 1)
        inside = prefix[i] + (x - i) * values[i]
        return np.where(x <= 0, x * values[0], np.where(x >= n, prefix[n] + (x - n) * self.beyond, inside))

    def knots(self, origin_s: float, until_s: float, far_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Knots (seconds from `origin_s`, cumulative g/kWh x s) of the curve's integral,
        materialised to at least `until_s` (epoch seconds), extended `far_s` both ways (at
        the first value before, at `beyond` after): for `numpy.interp`."""
        step = self.curve.step_s
        values, prefix = self.cover((until_s - self.curve.start.timestamp()) / step)
        t0 = self.curve.start.timestamp() - origin_s
        tk = t0 + np.arange(values.size + 1, dtype=np.float64) * step
        gk = prefix * step
        tk = np.concatenate([[t0 - far_s], tk, [tk[-1] + far_s]])
        gk = np.concatenate([[-far_s * values[0]], gk, [gk[-1] + far_s * self.beyond]])
        return tk, gk

    def covered_until_s(self) -> float:
        """Epoch seconds up to which the steps are materialised (the knots are exact)."""
        return self.curve.start.timestamp() + self.values.size * self.curve.step_s

    def tail_s(self, start_s: float, end_s: float) -> float:
        """Seconds of [start_s, end_s] (epoch) past the forecast's end, priced by the tail
        (0 without one): what an explanation reports."""
        if self._cells is None:
            return 0.0
        return max(0.0, end_s - max(start_s, self.forecast_end_s))


def _cell_index(epoch_s: np.ndarray) -> np.ndarray:
    """`Climatology` cell ((month - 1) * 24 + UTC hour) of each epoch second."""
    secs = np.floor(epoch_s).astype("datetime64[s]")
    month0 = secs.astype("datetime64[M]").astype(np.int64) % 12  # 1970-01 is month 0
    hour = (np.floor(epoch_s / 3600.0).astype(np.int64)) % 24
    return month0 * 24 + hour


_EXTENDED: dict[int, Extended] = {}  # id(curve) -> its Extended (which keeps the curve alive)
CURVE_MEMO_MAX = 256  # curves a per-curve memo holds before it starts again


def per_curve(memo: dict, curve: CarbonCurve, make: Callable[[CarbonCurve], T]) -> T:
    """`make(curve)` once per curve object, kept in `memo` (by id; the value holds its
    `.curve`, which keeps it alive, so an id is never reused while cached). A bounded memo,
    not state: it is cleared when full, and clearing it changes no result."""
    hit = memo.get(id(curve))
    if hit is None or hit.curve is not curve:
        if len(memo) >= CURVE_MEMO_MAX:
            memo.clear()
        hit = memo[id(curve)] = make(curve)
    return hit


def extended(curve: CarbonCurve) -> Extended:
    """One `Extended` per curve object, shared by every integral of it (a planner asks for
    thousands per tick). A bounded memo, not state: clearing it changes no result."""
    return per_curve(_EXTENDED, curve, Extended)
