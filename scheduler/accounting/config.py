"""The `[accounting]` section of the config file: hardware lifetime, energy prices, recheck."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

HOURS_PER_YEAR = 8766.0


@dataclass(frozen=True)
class AccountingConfig:
    """The `[accounting]` section of the config file.

    ```toml
    [accounting]
    gpu_lifetime_years = 4            # catalog list price amortized over this
    energy_price_usd_per_kwh = 0.10   # facility energy (IT energy x PUE)
    recheck_days = 7                  # re-price non-actual figures while data may arrive
    flexible_grace_pct = 0            # flexible-QOS jobs may take an account this far over a limit
    [accounting.zone_energy_price_usd_per_kwh]
    DE = 0.25
    ```
    """

    gpu_lifetime_years: float = 4.0
    energy_price_usd_per_kwh: float = 0.10
    zone_energy_price_usd_per_kwh: Mapping[str, float] = field(default_factory=dict)
    recheck_days: float = 7.0
    flexible_grace_pct: float = 0.0

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> AccountingConfig:
        section = (config or {}).get("accounting") or {}
        if not isinstance(section, Mapping):
            raise ValueError("config [accounting]: expected a table")
        known = {"gpu_lifetime_years", "energy_price_usd_per_kwh", "zone_energy_price_usd_per_kwh",
                 "recheck_days", "flexible_grace_pct"}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"config [accounting]: unknown key(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(known))})")

        def number(value: object, name: str, *, positive: bool) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0 or (positive and value == 0):
                raise ValueError(f"config accounting.{name}: a {'positive' if positive else 'non-negative'} "
                                 f"number (got {value!r})")
            return float(value)

        zones = section.get("zone_energy_price_usd_per_kwh") or {}
        if not isinstance(zones, Mapping):
            raise ValueError("config accounting.zone_energy_price_usd_per_kwh: expected a table of zones")
        return cls(
            gpu_lifetime_years=number(section.get("gpu_lifetime_years", 4.0), "gpu_lifetime_years",
                                      positive=True),
            energy_price_usd_per_kwh=number(section.get("energy_price_usd_per_kwh", 0.10),
                                            "energy_price_usd_per_kwh", positive=False),
            zone_energy_price_usd_per_kwh={str(z): number(v, f"zone_energy_price_usd_per_kwh.{z}", positive=False)
                                           for z, v in zones.items()},
            recheck_days=number(section.get("recheck_days", 7.0), "recheck_days", positive=False),
            flexible_grace_pct=number(section.get("flexible_grace_pct", 0.0), "flexible_grace_pct", positive=False),
        )

    def energy_price(self, zone: str | None) -> float:
        return self.zone_energy_price_usd_per_kwh.get(zone or "", self.energy_price_usd_per_kwh)

    def gpu_usd_per_hour(self, list_price_usd: float) -> float:
        return list_price_usd / (self.gpu_lifetime_years * HOURS_PER_YEAR)
