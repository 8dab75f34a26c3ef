"""WattTime API v3: login token, signal index and MOER forecast (a marginal signal).

Documented shapes (https://docs.watttime.org, v3):

- `GET /login` with HTTP Basic credentials -> `{"token": "<JWT>"}`, valid for 30 minutes;
  data calls send `Authorization: Bearer <token>`.
- `GET /v3/signal-index?region=CAISO_NORTH&signal_type=co2_moer` ->
  `{"data": [{"point_time": "2024-01-01T00:00:00+00:00", "value": 63.0}],
    "meta": {"region": ..., "signal_type": "co2_moer", "units": "percentile", ...}}`
  The index is relative (where now sits among the coming day), not a gCO2/kWh value.
- `GET /v3/forecast?region=CAISO_NORTH&signal_type=co2_moer&horizon_hours=24` ->
  `{"data": [{"point_time": ..., "value": 912.3}, ...],
    "meta": {"generated_at": ..., "units": "lbs_co2_per_mwh",
             "data_point_period_seconds": 300, ...}}`

MOER values in lbs CO2/MWh are converted to gCO2/kWh and marked `marginal`: they are the
emissions of the generator that answers a change in load, not the grid average.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from telemetry.grid.http import basic_auth_header, get_json
from telemetry.grid.readings import (
    KIND_FORECAST,
    SIGNAL_MARGINAL,
    GridAuthError,
    GridBadResponse,
    GridConfigError,
    IntensityReading,
    SignalIndexReading,
    lbs_per_mwh_to_g_per_kwh,
    number,
    parse_api_time,
)

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.watttime.org"
SOURCE = "watttime"
TOKEN_LIFETIME = timedelta(minutes=30)
TOKEN_MARGIN = timedelta(minutes=2)
_TO_G_PER_KWH = {
    "lbs_co2_per_mwh": lbs_per_mwh_to_g_per_kwh,
    "g_co2_per_kwh": lambda v: v,
    "kg_co2_per_mwh": lambda v: v,
}


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class WattTimeClient:
    """A client for one WattTime account; logs in lazily and again when the token expires.

    The password and token are never logged or shown.
    """

    name = SOURCE

    def __init__(
        self,
        username: str,
        password: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        timeout_s: float = 10.0,
        retries: int = 2,
        clock: Callable[[], datetime] = _utcnow,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not username or not password:
            raise GridConfigError("WattTime needs a username and password "
                                  "(watttime_username, watttime_password)")
        self.username = username
        self._password = password
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self._clock = clock
        self._sleep = sleep
        self._token: str | None = None
        self._token_until: datetime | None = None

    def __repr__(self) -> str:
        return f"WattTimeClient(base_url={self.base_url!r}, username={self.username!r}, password=<hidden>)"

    def _login(self) -> str:
        data = get_json(
            f"{self.base_url}/login",
            headers={"Authorization": basic_auth_header(self.username, self._password)},
            timeout_s=self.timeout_s, retries=self.retries, what="WattTime login", sleep=self._sleep,
        )
        token = data.get("token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not token:
            raise GridBadResponse("WattTime login: no token in the response")
        self._token = token
        self._token_until = self._clock() + TOKEN_LIFETIME - TOKEN_MARGIN
        log.debug("WattTime: logged in as %s", self.username)
        return token

    def _get(self, path: str, params: dict[str, Any], what: str) -> dict:
        for attempt in (1, 2):
            if self._token is None or self._token_until is None or self._clock() >= self._token_until:
                self._login()
            try:
                data = get_json(
                    f"{self.base_url}{path}", params=params,
                    headers={"Authorization": f"Bearer {self._token}"},
                    timeout_s=self.timeout_s, retries=self.retries, what=what, sleep=self._sleep,
                )
            except GridAuthError:
                if attempt == 2:
                    raise
                self._token = None  # expired early or revoked: log in once more
                continue
            if not isinstance(data, dict) or not isinstance(data.get("data"), list):
                raise GridBadResponse(f"{what}: no 'data' list in the response")
            if not isinstance(data.get("meta", {}), dict):
                raise GridBadResponse(f"{what}: 'meta' is not an object")
            return data
        raise AssertionError("unreachable")

    def signal_index(self, region: str, signal_type: str = "co2_moer") -> SignalIndexReading | None:
        """The current signal index of `region` (None when the API returns no point)."""
        what = f"WattTime signal-index for {region}"
        data = self._get("/v3/signal-index", {"region": region, "signal_type": signal_type}, what)
        meta = data.get("meta") or {}
        if not data["data"]:
            return None
        point = data["data"][0]
        if not isinstance(point, dict):
            raise GridBadResponse(f"{what}: expected an object per point")
        value = number(point.get("value"), what)
        if value is None:
            return None
        return SignalIndexReading(
            zone=region, at=parse_api_time(point.get("point_time"), what), value=value,
            units=str(meta.get("units", "percentile")), signal_type=str(meta.get("signal_type", signal_type)),
            fetched_at=self._clock(),
        )

    def forecast(self, region: str, horizon_hours: int = 24,
                 signal_type: str = "co2_moer") -> list[IntensityReading]:
        """The MOER forecast for `region` in gCO2/kWh (marginal), oldest first."""
        what = f"WattTime forecast for {region}"
        data = self._get("/v3/forecast", {"region": region, "signal_type": signal_type,
                                          "horizon_hours": horizon_hours}, what)
        meta = data.get("meta") or {}
        units = str(meta.get("units", "lbs_co2_per_mwh"))
        convert = _TO_G_PER_KWH.get(units)
        if convert is None:
            raise GridBadResponse(f"{what}: unexpected units {units!r} (expected lbs_co2_per_mwh)")
        generated = meta.get("generated_at")
        issued_at = parse_api_time(generated, what) if generated else self._clock()
        period = meta.get("data_point_period_seconds", 300)
        if isinstance(period, bool) or not isinstance(period, int) or period <= 0:
            raise GridBadResponse(f"{what}: bad data_point_period_seconds {period!r}")
        out = []
        for point in data["data"]:
            if not isinstance(point, dict):
                raise GridBadResponse(f"{what}: expected an object per point")
            value = number(point.get("value"), what)
            if value is None:
                continue
            out.append(IntensityReading(
                zone=region, at=parse_api_time(point.get("point_time"), what), duration_s=period,
                gco2_per_kwh=convert(value), signal=SIGNAL_MARGINAL, kind=KIND_FORECAST,
                issued_at=issued_at, source=SOURCE,
            ))
        return sorted(out, key=lambda r: r.at)
