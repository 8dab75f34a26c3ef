"""Energy of a GPU over a window, from its samples: hardware counter or integrated power.

Hardware energy counters (NVML's total-energy mJ counter, amdsmi's accumulator) are the
most accurate source, but some parts misbehave: counters that go backwards, stick, or read
zero (the odd die of an MI250). So a counter is only trusted when it moves forward, and when
it agrees with the trapezoid integral of power over the same window within a tolerance;
otherwise the integral is used. The method that produced each figure is always reported.

An emulated GPU has no meter: its "counter" and power are the emulator's power model. A
job's energy on emulated GPUs is labelled `modelled` (MODELLED), whichever of the model's
readings produced the figure, so no receipt, report or export presents it as measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_TOLERANCE = 0.10  # counter vs integral, relative
# NVML's power reading is a 1 s average on Ampere and later, so over short windows the two
# legitimately differ; below this many joules a disagreement is not evidence of a bad counter.
MIN_CHECKABLE_J = 500.0
# The method of energy read from an emulated GPU (a power model, not a measurement).
MODELLED = "modelled"


@dataclass(frozen=True)
class Sample:
    """One reading of one GPU: time in seconds (any monotonic origin), power, counter."""

    t_s: float
    power_w: float | None
    energy_j: float | None


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


def integrate_power(samples: Sequence[Sample]) -> float | None:
    """Trapezoid integral of power over the samples' span, in joules (None: < 2 readings)."""
    pts = [(s.t_s, s.power_w) for s in samples if s.power_w is not None]
    if len(pts) < 2:
        return None
    pts.sort()
    return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(pts, pts[1:]))


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


def window_energy(samples: Sequence[Sample], *, tolerance: float = DEFAULT_TOLERANCE) -> EnergyEstimate:
    """The best energy figure for one GPU over the samples' span, with the method used."""
    integral = integrate_power(samples)
    counter, why_not = counter_delta(samples)
    if counter is None:
        if integral is None:
            return EnergyEstimate(None, "none", note=why_not or "too few samples")
        return EnergyEstimate(integral, "integral", None, integral, note=why_not)
    if integral is None:
        return EnergyEstimate(counter, "counter-unverified", counter, None,
                              note="too few power samples to cross-check the counter")
    scale = max(counter, integral)
    if scale >= MIN_CHECKABLE_J and abs(counter - integral) > tolerance * scale:
        return EnergyEstimate(integral, "integral", counter, integral,
                              note=f"counter disagrees with integrated power by "
                                   f"{abs(counter - integral) / scale:.0%}")
    return EnergyEstimate(counter, "counter", counter, integral)


def combine_methods(methods: Sequence[str]) -> str:
    """One label for a job measured on several GPUs: the weakest method used on any of them."""
    order = ["none", MODELLED, "counter-unverified", "integral", "counter"]
    if not methods:
        return "none"
    return min(methods, key=order.index)
