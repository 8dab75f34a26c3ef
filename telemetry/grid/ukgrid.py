"""UK Carbon Intensity API (National Grid ESO): national 48 h forecasts, no key needed.

Documented shape (https://carbon-intensity.github.io/api-definitions/):

- `GET /intensity/{from}/fw48h` with `from` as `YYYY-MM-DDThh:mmZ` ->
  `{"data": [{"from": "2018-01-20T12:00Z", "to": "2018-01-20T12:30Z",
              "intensity": {"forecast": 266, "actual": 263, "index": "moderate"}}, ...]}`
  Half-hour periods in gCO2/kWh; `actual` is null for periods not measured yet.
- errors: `{"error": {"code": "400 Bad Request", "message": "..."}}`.

The API covers Great Britain (zone `GB`) with a generation-based average signal. It does
not say when a forecast was made; it is refreshed every half hour, so a fetched forecast is
stamped as issued at the fetch time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone

from telemetry.grid.http import get_json
from telemetry.grid.readings import (
    KIND_ACTUAL,
    KIND_FORECAST,
    SIGNAL_AVERAGE,
    GridBadResponse,
    IntensityReading,
    number,
    parse_api_time,
)

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.carbonintensity.org.uk"
SOURCE = "ukgrid"
DEFAULT_ZONE = "GB"


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UkCarbonIntensityClient:
    """A client for the public UK Carbon Intensity API (national values)."""

    name = SOURCE

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_BASE_URL,
        timeout_s: float = 10.0,
        retries: int = 2,
        clock: Callable[[], datetime] = _utcnow,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self._clock = clock
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"UkCarbonIntensityClient(base_url={self.base_url!r})"

    def forecast_48h(self, zone: str = DEFAULT_ZONE,
                     start: datetime | None = None) -> list[IntensityReading]:
        """The 48 h forecast from `start` (default now), plus the actuals it already carries.

        Returns forecast readings (issued at the fetch time) and, for half hours the API has
        measured, actual readings; oldest first.
        """
        fetched_at = self._clock()
        start = (start or fetched_at).astimezone(timezone.utc)
        stamp = start.strftime("%Y-%m-%dT%H:%MZ")
        what = f"UK Carbon Intensity fw48h from {stamp}"
        data = get_json(f"{self.base_url}/intensity/{stamp}/fw48h", timeout_s=self.timeout_s,
                        retries=self.retries, what=what, sleep=self._sleep)
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise GridBadResponse(f"{what}: no 'data' list in the response")
        out: list[IntensityReading] = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("intensity"), dict):
                raise GridBadResponse(f"{what}: expected objects with an 'intensity' object")
            at = parse_api_time(item.get("from"), what)
            until = parse_api_time(item.get("to"), what)
            duration_s = int((until - at).total_seconds())
            if duration_s <= 0:
                raise GridBadResponse(f"{what}: period ends before it starts: {item!r:.80}")
            intensity = item["intensity"]
            forecast = number(intensity.get("forecast"), what)
            actual = number(intensity.get("actual"), what)
            if forecast is not None:
                out.append(IntensityReading(
                    zone=zone, at=at, duration_s=duration_s, gco2_per_kwh=forecast,
                    signal=SIGNAL_AVERAGE, kind=KIND_FORECAST, issued_at=fetched_at, source=SOURCE))
            if actual is not None and until <= fetched_at:
                out.append(IntensityReading(
                    zone=zone, at=at, duration_s=duration_s, gco2_per_kwh=actual,
                    signal=SIGNAL_AVERAGE, kind=KIND_ACTUAL, issued_at=fetched_at, source=SOURCE))
        return sorted(out, key=lambda r: (r.at, r.kind))
