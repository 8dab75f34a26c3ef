"""Electricity Maps API v3: carbon-intensity latest, history (past 24 h) and forecast.

Documented shapes (https://docs.electricitymaps.com, v3), with the `auth-token` header:

- `GET /v3/carbon-intensity/latest?zone=DE` ->
  `{"zone": "DE", "carbonIntensity": 302, "datetime": "2019-05-21T00:00:00.000Z",
    "updatedAt": "...", "createdAt": "...", "emissionFactorType": "lifecycle",
    "isEstimated": true, "estimationMethod": "TIME_SLICER_AVERAGE"}`
- `GET /v3/carbon-intensity/history?zone=DE` -> `{"zone": "DE", "history": [<as latest>, ...]}`
- `GET /v3/carbon-intensity/forecast?zone=DE` ->
  `{"zone": "DE", "forecast": [{"carbonIntensity": 326, "datetime": "..."}, ...],
    "updatedAt": "..."}`
- errors: a 4xx/5xx status with `{"error": "..."}` (or `{"message": ...}`).

Values are hour-start averages in gCO2eq/kWh (the average, consumption-based signal).
We ask for `emissionFactorType=direct` by default, the same basis as the shipped hourly
CSV exports, so live and imported values are comparable; the API's own default is
lifecycle (set `emission_factor="lifecycle"` to match that instead).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from telemetry.grid.http import get_json
from telemetry.grid.readings import (
    KIND_ACTUAL,
    KIND_FORECAST,
    SIGNAL_AVERAGE,
    GridBadResponse,
    GridConfigError,
    IntensityReading,
    number,
    parse_api_time,
)

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.electricitymaps.com/v3"
SOURCE = "electricitymaps"
GRANULARITY_S = {"5_minutes": 300, "15_minutes": 900, "hourly": 3600, "daily": 86400}


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class ElectricityMapsClient:
    """A client for one Electricity Maps API token. The token is never logged or shown."""

    name = SOURCE

    def __init__(
        self,
        token: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        timeout_s: float = 10.0,
        retries: int = 2,
        emission_factor: str | None = "direct",
        clock: Callable[[], datetime] = _utcnow,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not token:
            raise GridConfigError("Electricity Maps needs an API token (electricitymaps_token)")
        self._token = token
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.emission_factor = emission_factor
        self._clock = clock
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"ElectricityMapsClient(base_url={self.base_url!r}, token=<hidden>)"

    def _get(self, endpoint: str, zone: str, what: str, **params: Any) -> Any:
        data = get_json(
            f"{self.base_url}/carbon-intensity/{endpoint}",
            params={"zone": zone, "emissionFactorType": self.emission_factor, **params},
            headers={"auth-token": self._token},
            timeout_s=self.timeout_s, retries=self.retries, what=what, sleep=self._sleep,
        )
        if not isinstance(data, dict):
            raise GridBadResponse(f"{what}: expected a JSON object, got {type(data).__name__}")
        return data

    def _point(self, item: Any, zone: str, kind: str, issued_at: datetime | None,
               what: str) -> IntensityReading | None:
        if not isinstance(item, dict):
            raise GridBadResponse(f"{what}: expected an object per value, got {item!r:.60}")
        if "datetime" not in item or "carbonIntensity" not in item:
            raise GridBadResponse(f"{what}: value without datetime/carbonIntensity: {item!r:.80}")
        at = parse_api_time(item["datetime"], what)
        value = number(item["carbonIntensity"], what)
        if value is None:
            return None  # the API has no value for this hour: a gap, never a zero
        duration_s = GRANULARITY_S.get(str(item.get("temporalGranularity", "hourly")), 3600)
        if kind == KIND_ACTUAL:
            # Known once the provider last updated it; never before its period started.
            updated = item.get("updatedAt")
            issued = parse_api_time(updated, what) if updated else self._clock()
            issued_at = max(issued, at)
        estimated = item.get("isEstimated")
        return IntensityReading(
            zone=zone, at=at, duration_s=duration_s, gco2_per_kwh=value, signal=SIGNAL_AVERAGE,
            kind=kind, issued_at=issued_at, source=SOURCE,
            estimated=estimated if isinstance(estimated, bool) else None,
        )

    def latest(self, zone: str) -> IntensityReading | None:
        """The newest value for `zone` (None when the API has no value for it)."""
        what = f"Electricity Maps latest for {zone}"
        data = self._get("latest", zone, what)
        return self._point(data, zone, KIND_ACTUAL, None, what)

    def history(self, zone: str) -> list[IntensityReading]:
        """The past 24 hours of hourly values for `zone`, oldest first."""
        what = f"Electricity Maps history for {zone}"
        data = self._get("history", zone, what)
        items = data.get("history")
        if not isinstance(items, list):
            raise GridBadResponse(f"{what}: no 'history' list in the response")
        out = [self._point(item, zone, KIND_ACTUAL, None, what) for item in items]
        return sorted((r for r in out if r is not None), key=lambda r: r.at)

    def forecast(self, zone: str, horizon_hours: int = 72) -> list[IntensityReading]:
        """The provider's forecast for `zone`, oldest first, issued at its `updatedAt`."""
        what = f"Electricity Maps forecast for {zone}"
        data = self._get("forecast", zone, what, horizonHours=horizon_hours)
        items = data.get("forecast")
        if not isinstance(items, list):
            raise GridBadResponse(f"{what}: no 'forecast' list in the response")
        updated = data.get("updatedAt")
        issued_at = parse_api_time(updated, what) if updated else self._clock()
        out = [self._point(item, zone, KIND_FORECAST, issued_at, what) for item in items]
        return sorted((r for r in out if r is not None), key=lambda r: r.at)
