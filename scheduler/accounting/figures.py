"""The small definitions every accounting figure shares: the one definition of an intensity
(joules per kWh: `policies.types.J_PER_KWH`), ISO times as receipts and reports print them, a difference without noise."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from policies.types import J_PER_KWH


def intensity_g_per_kwh(gco2: float | None, facility_energy_j: float | None) -> float | None:
    """The one definition of a run's or a group's intensity: grams per kWh of *facility*
    energy (IT energy x PUE), i.e. the energy-weighted grid intensity the grams were priced at.
    Receipts, reports and exports all use this; dividing by IT energy would fold the PUE in."""
    if gco2 is None or not facility_energy_j or facility_energy_j <= 0:
        return None
    return gco2 / (facility_energy_j / J_PER_KWH)


def iso(t: datetime | None) -> str | None:
    """ISO 8601 in UTC with a Z and the time's full precision, or None."""
    return None if t is None else t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def difference(a: float | None, b: float | None) -> float | None:
    """a - b, with rounding noise (two estimates of the same choice computed along different
    paths) shown as the 0 it is rather than as -2.8e-17 g."""
    if a is None or b is None:
        return None
    d = a - b
    return 0.0 if abs(d) <= 1e-9 * max(abs(a), abs(b)) else d


def tidy(value: Any, digits: int = 12) -> Any:
    """A JSON-ready document with every float at `digits` significant digits: sums and
    ratios of measured figures carry binary noise (410.99999999999994 g/kWh) that no
    measurement behind them supports; the export and the report print 411.0."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: tidy(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [tidy(v, digits) for v in value]
    return value
