"""Live grid-intensity providers behind one registry: name -> how to build and call it.

Each provider (`telemetry.grid`: Electricity Maps, WattTime, the UK Carbon Intensity API)
is one `Provider` entry: the signal it serves, the default call budget of its endpoints,
a factory that builds its client from the `[carbon]` configuration, and the endpoints a
refresh calls, in order. Adding a provider is one entry here; nothing else in the carbon
layer names providers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from telemetry.grid.readings import SIGNAL_AVERAGE, SIGNAL_MARGINAL, GridConfigError


#: A provider's client call: (client, zone, region, horizon_hours) -> readings (None entries
#: skipped); `region` is the provider's own id of the zone (default: the zone).
EndpointCall = Callable[[Any, str, str, int], "list[IntensityReading | None]"]


class ProviderSettings(Protocol):
    """What the client factories read of the carbon configuration (`CarbonConfig` has it)."""

    electricitymaps_token: str | None
    electricitymaps_url: str | None
    emission_factor: str
    watttime_username: str | None
    watttime_password: str | None
    watttime_url: str | None
    ukgrid_url: str | None


@dataclass(frozen=True)
class Provider:
    """One live provider: its signal, endpoints (name, call, default min interval s) and client factory.

    `client(config, common)` builds the client; `common` holds the shared keyword arguments
    (timeout_s, retries, clock).
    """

    name: str
    signal: str
    endpoints: tuple[tuple[str, EndpointCall, float], ...]
    client: Callable[[ProviderSettings, dict[str, Any]], Any]


def _electricitymaps(cfg: ProviderSettings, common: dict[str, Any]) -> Any:
    from telemetry.grid.electricitymaps import DEFAULT_BASE_URL, ElectricityMapsClient

    return ElectricityMapsClient(cfg.electricitymaps_token or "", base_url=cfg.electricitymaps_url or DEFAULT_BASE_URL,
                                 emission_factor=cfg.emission_factor, **common)


def _watttime(cfg: ProviderSettings, common: dict[str, Any]) -> Any:
    from telemetry.grid.watttime import DEFAULT_BASE_URL, WattTimeClient

    return WattTimeClient(cfg.watttime_username or "", cfg.watttime_password or "",
                          base_url=cfg.watttime_url or DEFAULT_BASE_URL, **common)


def _ukgrid(cfg: ProviderSettings, common: dict[str, Any]) -> Any:
    from telemetry.grid.ukgrid import DEFAULT_BASE_URL, UkCarbonIntensityClient

    return UkCarbonIntensityClient(base_url=cfg.ukgrid_url or DEFAULT_BASE_URL, **common)


REGISTRY: dict[str, Provider] = {p.name: p for p in (
    Provider("electricitymaps", SIGNAL_AVERAGE, (
        ("history", lambda c, zone, region, h: c.history(region), 3600),
        ("latest", lambda c, zone, region, h: [c.latest(region)], 900),
        ("forecast", lambda c, zone, region, h: c.forecast(region, h), 3600),
    ), _electricitymaps),
    Provider("watttime", SIGNAL_MARGINAL, (
        ("forecast", lambda c, zone, region, h: c.forecast(region, min(h, 72)), 300),
    ), _watttime),
    Provider("ukgrid", SIGNAL_AVERAGE, (
        ("fw48h", lambda c, zone, region, h: c.forecast_48h(zone), 1800),
    ), _ukgrid),
)}

PROVIDERS = tuple(REGISTRY)
PROVIDER_SIGNAL = {name: p.signal for name, p in REGISTRY.items()}
#: Default minimum seconds between calls per (provider, endpoint): the API call budget.
DEFAULT_MIN_INTERVAL_S = {(name, endpoint): interval
                          for name, p in REGISTRY.items() for endpoint, _, interval in p.endpoints}


def provider(name: str) -> Provider:
    """The registered provider `name`; GridConfigError for an unknown one."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise GridConfigError(f"unknown carbon provider {name!r}") from None
