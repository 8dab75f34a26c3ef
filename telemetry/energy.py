"""Energy of a GPU over a window, from its samples: hardware counter or integrated power.

Hardware energy counters (NVML's total-energy mJ counter, amdsmi's accumulator) are the
most accurate source, but some parts misbehave: counters that go backwards, stick, or read
zero (the odd die of an MI250). So a counter is only trusted when it moves forward, and when
it agrees with the trapezoid integral of power over the same window within a tolerance;
otherwise the integral is used. The method that produced each figure is always reported.

An emulated GPU has no meter: its "counter" and power are the emulator's power model. A
job's energy on emulated GPUs is labelled `modelled` (MODELLED), whichever of the model's
readings produced the figure, so no receipt, report or export presents it as measured.

An invalid power reading is a gap, never a number: a sample whose power is None (the
backend's validity gate dropped a sentinel or "N/A"), negative, not finite or above
`max_power_w` (impossible for the part) has no power. The cross-check compares the counter
with integrated power only over the intervals where power is valid at both ends, so a gap
cannot make a healthy counter look wrong; when valid power covers less than
MIN_POWER_COVERAGE of the window, the counter is used unverified rather than outvoted.
Nor can a power step between two sparse readings (a job starting while the sampler was
starved of CPU): the trapezoid over an interval whose ends differ by dP watts over dt seconds
may be off by up to dP*dt/2 joules, and the counter is only outvoted by more than the
tolerance plus that known error of the integral (the per-interval bounds combined as
independent errors, so a noisy but dense trace does not blunt the check).
Without a usable counter, the integral bridges gaps (the best figure there is) and says so.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_TOLERANCE = 0.10  # counter vs integral, relative
# NVML's power reading is a 1 s average on Ampere and later, so over short windows the two
# legitimately differ; below this many joules a disagreement is not evidence of a bad counter.
MIN_CHECKABLE_J = 500.0
# The method of energy read from an emulated GPU (a power model, not a measurement).
MODELLED = "modelled"

# Below this share of the window covered by valid power readings, integrated power is no
# witness against the counter.
MIN_POWER_COVERAGE = 0.5


@dataclass(frozen=True)
class Sample:
    """One reading of one GPU: time in seconds (any monotonic origin), power, energy counter
    and utilization. The sampler's `Reading` is one (of a named device); the store keeps
    them and gives them back as this type, so every step from the GPU to a receipt reads
    one shape."""

    t_s: float
    power_w: float | None
    energy_j: float | None
    utilization_pct: float | None = None


@dataclass(frozen=True)
class EnergyEstimate:
    energy_j: float | None
    method: str  # "counter", "integral", "counter-unverified" or "none" ("modelled": see MODELLED)
    counter_j: float | None = None
    integral_j: float | None = None
    note: str = ""


def clip_window(samples: Sequence[Sample], start_s: float, end_s: float) -> list[Sample]:
    """The samples inside [start, end], with readings at both ends interpolated linearly
    from the neighbours outside, so a window is measured exactly, not from the nearest sample."""
    pts = sorted(samples, key=lambda s: s.t_s)
    inside = [s for s in pts if start_s <= s.t_s <= end_s]
    before = [s for s in pts if s.t_s < start_s]
    after = [s for s in pts if s.t_s > end_s]
    if before and (inside or after):
        nxt = inside[0] if inside else after[0]
        inside.insert(0, _interpolate(before[-1], nxt, start_s))
    if after and inside:
        inside.append(_interpolate(inside[-1], after[0], end_s))
    return inside


def _interpolate(a: Sample, b: Sample, t_s: float) -> Sample:
    if b.t_s == a.t_s:
        return Sample(t_s, a.power_w, a.energy_j)
    f = (t_s - a.t_s) / (b.t_s - a.t_s)

    def lerp(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None else x + (y - x) * f

    return Sample(t_s, lerp(a.power_w, b.power_w), lerp(a.energy_j, b.energy_j))


def _valid_power(p: float | None, max_power_w: float | None) -> float | None:
    if p is None or p != p or p < 0 or p == float("inf"):
        return None
    if max_power_w is not None and p > max_power_w:
        return None
    return p


def _valid_samples(samples: Sequence[Sample], max_power_w: float | None) -> list[Sample]:
    """The samples in time order, with invalid power readings turned into gaps (None)."""
    return [Sample(s.t_s, _valid_power(s.power_w, max_power_w), s.energy_j)
            for s in sorted(samples, key=lambda s: s.t_s)]


def integrate_power(samples: Sequence[Sample], start_s: float | None = None, end_s: float | None = None, *,
                    max_power_w: float | None = None) -> float | None:
    """The trapezoid integral of power over time, in joules: the one place power is integrated
    (a job's energy, the counter's cross-check, the agent's daily GPU energy, and the split of
    a run's energy among intensity periods all come from here).

    Power is linear between valid readings (gaps bridged). Without a window: over the
    readings' own span (None: fewer than 2 valid readings). With [start_s, end_s]: over that
    window, power interpolated at its edges and held flat beyond the first and last readings
    (0.0 for an empty window or no valid readings), so cutting a span into windows never
    changes the total."""
    pts = [(s.t_s, p) for s in sorted(samples, key=lambda s: s.t_s)
           if (p := _valid_power(s.power_w, max_power_w)) is not None]
    if start_s is None or end_s is None:
        if len(pts) < 2:
            return None
        knots = pts
    elif end_s <= start_s or not pts:
        return 0.0
    else:
        knots = _window_knots(pts, start_s, end_s)
    return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(knots, knots[1:]))


def _window_knots(pts: list[tuple[float, float]], start_s: float, end_s: float) -> list[tuple[float, float]]:
    """(t, W) at the window's edges and at every reading strictly inside it."""
    times = [t for t, _ in pts]
    inner = times[bisect.bisect_right(times, start_s):bisect.bisect_left(times, end_s)]
    return [(t, _power_at(pts, times, t)) for t in [start_s, *inner, end_s]]


def _power_at(pts: list[tuple[float, float]], times: list[float], t: float) -> float:
    """Linear interpolation of a power series, held flat beyond its ends."""
    i = bisect.bisect_left(times, t)
    if i < len(times) and times[i] == t:
        return pts[i][1]
    if i == 0:
        return pts[0][1]
    if i == len(times):
        return pts[-1][1]
    (t0, p0), (t1, p1) = pts[i - 1], pts[i]
    return p0 + (p1 - p0) * (t - t0) / (t1 - t0)


def counter_delta(samples: Sequence[Sample]) -> tuple[float | None, str]:
    """Energy from the counter's first and last readings, or None with the reason it is unusable."""
    pts = sorted((s.t_s, s.energy_j) for s in samples if s.energy_j is not None)
    if len(pts) < 2:
        return None, "no energy counter"
    values = [e for _, e in pts]
    if any(b < a for a, b in zip(values, values[1:])):
        return None, "energy counter went backwards"
    if values[-1] == values[0]:
        return None, "energy counter is stuck"
    return values[-1] - values[0], ""


@dataclass(frozen=True)
class _Coverage:
    """Counter and integral over the intervals with valid power and counter at both ends."""

    integral_j: float
    counter_j: float
    covered_s: float
    span_s: float
    integral_error_j: float  # how far the trapezoid may be off where power stepped between readings


def _covered(samples: list[Sample]) -> _Coverage:
    integral = counter = covered = error_sq = 0.0
    for a, b in zip(samples, samples[1:]):
        if None in (a.power_w, b.power_w, a.energy_j, b.energy_j):
            continue
        dt = b.t_s - a.t_s
        integral += integrate_power((a, b)) or 0.0  # both readings hold valid power
        counter += b.energy_j - a.energy_j
        covered += dt
        error_sq += (abs(b.power_w - a.power_w) * dt / 2) ** 2
    span = samples[-1].t_s - samples[0].t_s if samples else 0.0
    return _Coverage(integral, counter, covered, span, error_sq ** 0.5)


def window_energy(samples: Sequence[Sample], *, tolerance: float = DEFAULT_TOLERANCE,
                  max_power_w: float | None = None) -> EnergyEstimate:
    """The best energy figure for one GPU over the samples' span, with the method used.

    `max_power_w`: power readings above it are impossible for the GPU (a sentinel or a unit
    mix-up that got through) and count as gaps."""
    pts = _valid_samples(samples, max_power_w)
    integral = integrate_power(pts)
    counter, why_not = counter_delta(pts)
    if counter is None:
        if integral is None:
            return EnergyEstimate(None, "none", note=why_not or "too few samples")
        return EnergyEstimate(integral, "integral", None, integral, note=why_not)
    if integral is None:
        return EnergyEstimate(counter, "counter-unverified", counter, None,
                              note="too few valid power samples to cross-check the counter")
    cov = _covered(pts)
    if cov.span_s <= 0 or cov.covered_s < MIN_POWER_COVERAGE * cov.span_s:
        share = cov.covered_s / cov.span_s if cov.span_s > 0 else 0.0
        return EnergyEstimate(counter, "counter-unverified", counter, integral,
                              note=f"valid power readings cover {share:.0%} of the window: "
                                   f"too little to cross-check the counter")
    scale = max(cov.counter_j, cov.integral_j)
    gap = abs(cov.counter_j - cov.integral_j)
    if scale >= MIN_CHECKABLE_J and gap > tolerance * scale + cov.integral_error_j:
        return EnergyEstimate(integral, "integral", counter, integral,
                              note=f"counter disagrees with integrated power by {gap / scale:.0%}")
    return EnergyEstimate(counter, "counter", counter, integral)


def combine_methods(methods: Sequence[str]) -> str:
    """One label for a job measured on several GPUs: the weakest method used on any of them."""
    order = ["none", MODELLED, "counter-unverified", "integral", "counter"]
    if not methods:
        return "none"
    return min(methods, key=order.index)
