"""Static per-zone yearly averages: the LAST fallback when nothing better is known.

These are flat numbers, not a signal: a yearly mean ignores the 2-5x daily swing the
scheduler exists to exploit, so a plan built on them is carbon-blind in time (it can still
tell zones apart). Every value handed out from here is marked `kind="static"` and
`source="static"`, and `carbonsched carbon show` says so.

Values: the mean of the hourly direct (operational), consumption-based average carbon
intensity over calendar year 2022 from Electricity Maps' hourly exports (ODbL 1.0,
via HPE green-dcc; the same files as tests/data/carbon). Keys are Electricity Maps zone
ids as written inside the files. The typical error of using them per hour is large
(median MAPE over these zones ~17%, up to ~50% for GB and ~200% for CA-ON).
Electricity Maps revises past years, so these differ slightly from today's figures.
"""

from __future__ import annotations

from dataclasses import dataclass

STATIC_YEAR = 2022
STATIC_BASIS = "Electricity Maps 2022 yearly mean of hourly direct average intensity"
#: Median over the 16 zones of the hourly MAPE of using the yearly mean (2022).
STATIC_EXPECTED_MAPE_PCT = 17.0

#: gCO2eq/kWh, average signal. Clearly NOT live data: see the module docstring.
STATIC_YEARLY_GCO2_PER_KWH: dict[str, float] = {
    "AU-NSW": 539.1,
    "AU-VIC": 492.1,
    "BR-CS": 66.6,
    "CA-ON": 36.3,
    "CL-SEN": 264.1,
    "DE": 411.0,
    "GB": 155.7,
    "IN-WE": 690.0,
    "JP-TK": 459.2,
    "KR": 389.8,
    "SG": 372.4,
    "US-CAL-CISO": 196.0,
    "US-MIDA-PJM": 355.0,
    "US-NY-NYIS": 213.8,
    "US-TEX-ERCO": 338.2,
    "ZA": 648.2,
}


@dataclass(frozen=True, slots=True)
class StaticIntensity:
    """A flat yearly average for a zone; `is_static` is always True, to be unmissable."""

    zone: str
    gco2_per_kwh: float
    year: int | None
    basis: str
    signal: str = "average"
    source: str = "static"
    is_static: bool = True


def static_intensity(zone: str, overrides: dict[str, float] | None = None) -> StaticIntensity | None:
    """The static yearly average for `zone`, or None when there is none.

    `overrides` (from the config file) take precedence over the built-in table.
    """
    if overrides and zone in overrides:
        return StaticIntensity(zone=zone, gco2_per_kwh=float(overrides[zone]), year=None,
                               basis="operator-configured static value")
    value = STATIC_YEARLY_GCO2_PER_KWH.get(zone)
    if value is None:
        return None
    return StaticIntensity(zone=zone, gco2_per_kwh=value, year=STATIC_YEAR, basis=STATIC_BASIS)


def static_zones() -> list[str]:
    """Zones with a built-in static value."""
    return sorted(STATIC_YEARLY_GCO2_PER_KWH)
