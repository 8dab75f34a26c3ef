"""The carbon of one run, the pure part of accounting: the run cut wherever the grid
intensity changes, each piece's energy from the GPUs' own power (see the package docstring).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from policies.types import J_PER_KWH
from scheduler.accounting.figures import intensity_g_per_kwh
from scheduler.timeparse import utc_aware
from telemetry.energy import Sample, integrate_power
from telemetry.grid.readings import KIND_ACTUAL


@dataclass(frozen=True)
class IntensitySpan:
    """One intensity value holding over [start, end): `kind` "actual" (recorded) or "static"."""

    start: datetime
    end: datetime
    gco2_per_kwh: float
    kind: str
    source: str


@dataclass(frozen=True)
class CarbonPiece:
    """A part of a run under one intensity value (or in a gap: intensity None)."""

    start: datetime
    end: datetime
    energy_j: float
    gco2_per_kwh: float | None
    kind: str | None
    source: str | None
    gco2: float | None


@dataclass(frozen=True)
class RunCarbon:
    """The carbon of one run: total, how it was weighted, each piece, the gaps."""

    energy_j: float
    pue: float
    weighting: str               # power-samples | minute-means | time
    pieces: tuple[CarbonPiece, ...]
    gco2: float | None           # None when some energy has no intensity at all
    basis: str | None            # actual | mixed | static | None
    coverage: float              # share of the energy priced with recorded (actual) values
    gaps: tuple[tuple[datetime, datetime, str | None], ...]   # (start, end, filled_by)

    @property
    def intensity_g_per_kwh(self) -> float | None:
        """Energy-weighted mean intensity of the run, before PUE."""
        return intensity_g_per_kwh(self.gco2, self.energy_j * self.pue)

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(sorted({p.source for p in self.pieces if p.source}))


def run_carbon(energy_j: float, start: datetime, end: datetime, intensity: Sequence[IntensitySpan], *,
               pue: float = 1.0, gpu_power: Sequence[Sequence[Sample]] = (),
               weighting: str = "power-samples") -> RunCarbon:
    """The gCO2 of a run that used `energy_j` over [start, end] (see `scheduler.accounting`).

    `intensity`: non-overlapping spans, sorted or not; time outside them is a gap.
    `gpu_power`: per GPU, its power samples (unix seconds); their shape splits the energy
    among the pieces (each piece weighted by its own energy, not the mean power). Empty:
    the energy is spread evenly over time. `weighting` names where the samples came from.
    """
    start, end = utc_aware(start, "start"), utc_aware(end, "end")
    if end < start:
        raise ValueError(f"run ends ({end}) before it starts ({start})")
    if energy_j < 0 or not math.isfinite(energy_j):
        raise ValueError(f"energy must be a finite non-negative number of joules (got {energy_j!r})")
    spans = sorted((s for s in intensity if s.end > start and s.start < end or (start == end and s.start <= start < s.end)),
                   key=lambda s: s.start)
    cuts = sorted({start, end, *(s.start for s in spans if start < s.start < end),
                   *(s.end for s in spans if start < s.end < end)})
    windows = list(zip(cuts, cuts[1:])) or [(start, end)]

    series = [sorted((p for p in g if p.power_w is not None), key=lambda p: (p.t_s, p.power_w))
              for g in gpu_power]
    series = [s for s in series if s]
    shares: list[float]
    total_s = (end - start).total_seconds()
    if series:
        raw = [sum(integrate_power(s, a.timestamp(), b.timestamp()) for s in series)  # type: ignore[misc]
               for a, b in windows]
        total = sum(raw)
        if total > 0:
            shares = [r / total for r in raw]
        else:
            series = []
    if not series:
        weighting = "time"
        shares = ([(b - a).total_seconds() / total_s for a, b in windows] if total_s > 0
                  else [1.0 / len(windows)] * len(windows))

    pieces: list[CarbonPiece] = []
    for (a, b), share in zip(windows, shares):
        span = next((s for s in spans if s.start <= a < s.end), None)
        e = energy_j * share
        if span is None:
            pieces.append(CarbonPiece(a, b, e, None, None, None, None))
        else:
            pieces.append(CarbonPiece(a, b, e, span.gco2_per_kwh, span.kind, span.source,
                                      e / J_PER_KWH * span.gco2_per_kwh * pue))

    # merge neighbouring pieces under the same value (a span cut by nothing else)
    merged: list[CarbonPiece] = []
    for p in pieces:
        last = merged[-1] if merged else None
        if last is not None and (last.gco2_per_kwh, last.kind, last.source) == (p.gco2_per_kwh, p.kind, p.source) \
                and last.end == p.start:
            merged[-1] = CarbonPiece(last.start, p.end, last.energy_j + p.energy_j, p.gco2_per_kwh, p.kind,
                                     p.source, None if p.gco2 is None else (last.gco2 or 0.0) + p.gco2)
        else:
            merged.append(p)

    unpriced = any(p.gco2 is None for p in merged)
    actual_j = sum(p.energy_j for p in merged if p.kind == KIND_ACTUAL)
    kinds = {p.kind for p in merged}
    if unpriced:
        gco2, basis = None, None
    else:
        gco2 = sum(p.gco2 for p in merged)  # type: ignore[misc]
        basis = "actual" if kinds == {KIND_ACTUAL} else ("static" if KIND_ACTUAL not in kinds else "mixed")
    if energy_j > 0:
        coverage = actual_j / energy_j
    else:
        coverage = 1.0 if kinds == {KIND_ACTUAL} else 0.0
    gaps = tuple((p.start, p.end, p.kind) for p in merged if p.kind != KIND_ACTUAL)
    return RunCarbon(energy_j=energy_j, pue=pue, weighting=weighting, pieces=tuple(merged), gco2=gco2,
                     basis=basis, coverage=coverage, gaps=gaps)


def combine_runs(runs: Sequence[RunCarbon]) -> RunCarbon:
    """One RunCarbon for several runs (an interruptible job's segments): energies and gCO2
    summed (None when any is unpriced), pieces and gaps in order, the basis "actual" only
    when every run's is, coverage weighted by energy."""
    energy = sum(r.energy_j for r in runs)
    gco2 = None if any(r.gco2 is None for r in runs) else sum(r.gco2 for r in runs)  # type: ignore[misc]
    bases = {r.basis for r in runs}
    basis = None if None in bases else (bases.pop() if len(bases) == 1 else "mixed")
    coverage = (sum(r.coverage * r.energy_j for r in runs) / energy) if energy > 0 else min(r.coverage for r in runs)
    weightings = {r.weighting for r in runs}
    return RunCarbon(energy_j=energy, pue=runs[0].pue,
                     weighting=weightings.pop() if len(weightings) == 1 else "mixed",
                     pieces=tuple(p for r in runs for p in r.pieces), gco2=gco2, basis=basis, coverage=coverage,
                     gaps=tuple(g for r in runs for g in r.gaps))
