"""What a zone without carbon data costs: one rule for every policy and every path.

A zone of the snapshot's GPUs without a forecast curve (the scheduler has already tried the
zone's live forecast, its own forecast and its static yearly mean for the plan's signal) is
**priced blind**: at the highest intensity any zone of the snapshot has over the planning
horizon, or, with no carbon data in the snapshot at all, at `NO_DATA_G_PER_KWH` (the highest
static yearly mean of the built-in table, IN-WE 2022). Never at 0: a zone nobody measures is
not assumed clean, so a job goes there only when it is the better choice even if that zone
were as dirty as the dirtiest known one (or when nothing else can take it).

The slot planner (greedy, cpsat, oracle, the LP bound), fifo and short-job packing all price
with `priced_curves`, so their plans and scores compare alike; estimates priced this way
carry `Estimate.blind_g_per_kwh` and explanations say "priced blind at ... g/kWh".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from policies.types import CarbonCurve, Snapshot

#: gCO2/kWh for a blind zone when no zone of the snapshot has carbon data: the highest static
#: yearly mean of `telemetry.grid.static` (IN-WE, 2022; a test keeps the two equal).
NO_DATA_G_PER_KWH = 690.0


@dataclass(frozen=True)
class BlindPrice:
    """The flat intensity a blind zone is priced at, and where it comes from."""

    g_per_kwh: float
    basis: str  # e.g. "the highest intensity in the snapshot (IN-WE)"

    def note(self) -> str:
        """The words explanations use: "priced blind at 690 g/kWh (...)"."""
        return f"priced blind at {self.g_per_kwh:.0f} g/kWh ({self.basis})"


def blind_zones(snapshot: Snapshot) -> list[str]:
    """Zones of the snapshot's GPUs without a usable forecast curve, sorted."""
    return sorted({g.zone for g in snapshot.gpus if not _usable(snapshot.carbon.get(g.zone))})


def blind_price(snapshot: Snapshot) -> BlindPrice:
    """The price of every blind zone of `snapshot` (see the module docstring)."""
    end = snapshot.now + timedelta(seconds=snapshot.horizon_s)
    best: tuple[float, str] | None = None
    for zone, curve in sorted(snapshot.carbon.items()):
        if not _usable(curve):
            continue
        high = _highest(curve, snapshot.now, end)
        if best is None or high > best[0]:
            best = (high, zone)
    if best is None:
        return BlindPrice(NO_DATA_G_PER_KWH, "no carbon data in the snapshot: the highest static yearly mean")
    return BlindPrice(best[0], f"the highest intensity in the snapshot, {best[1]}")


def priced_curves(snapshot: Snapshot) -> dict[str, CarbonCurve]:
    """A curve for every zone of the snapshot's carbon data and GPUs: its forecast, or a flat
    curve at `blind_price` (signal "blind", source the price's note) for a blind zone."""
    out = {z: c for z, c in snapshot.carbon.items() if _usable(c)}
    blind = [z for z in blind_zones(snapshot)]
    if blind:
        price = blind_price(snapshot)
        for zone in blind:
            out[zone] = CarbonCurve(zone=zone, start=snapshot.now, step_s=float(snapshot.slot_s),
                                    values_g_per_kwh=(price.g_per_kwh,), signal="blind", source=price.note())
    return out


def _usable(curve: CarbonCurve | None) -> bool:
    return curve is not None and bool(curve.values_g_per_kwh)


def _highest(curve: CarbonCurve, start, end) -> float:
    """The highest value of the step curve on [start, end) (flat-extended beyond its ends)."""
    values = curve.values_g_per_kwh
    n = len(values)
    i0 = int((start - curve.start).total_seconds() // curve.step_s)
    i1 = int(-(-(end - curve.start).total_seconds() // curve.step_s))  # ceil
    i0, i1 = min(max(i0, 0), n - 1), min(max(i1, 1), n)
    return float(max(values[i0:max(i1, i0 + 1)]))
