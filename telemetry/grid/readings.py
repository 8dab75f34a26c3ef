"""Plain readings and errors shared by every grid carbon-intensity provider.

Providers (CSV traces, Electricity Maps, WattTime, the UK Carbon Intensity API, the static
table) all return `IntensityReading`s: one value in gCO2eq/kWh for one period of one zone,
with what kind of value it is (a measured `actual` or a `forecast`), when it became known
(`issued_at`), which signal it is (`average` or `marginal`, never mixed) and where it came
from. The scheduler stores them; nothing here knows about the store.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone

SIGNAL_AVERAGE = "average"
SIGNAL_MARGINAL = "marginal"
SIGNALS = (SIGNAL_AVERAGE, SIGNAL_MARGINAL)

KIND_ACTUAL = "actual"
KIND_FORECAST = "forecast"
KINDS = (KIND_ACTUAL, KIND_FORECAST)

#: A zone id: Electricity Maps' (DE, US-CAL-CISO), WattTime's regions (CAISO_NORTH), UK
#: regions; letters, digits and . _ : - only, at most 64 characters (no NUL, no controls).
ZONE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


def zone_problem(zone: object) -> str | None:
    """Why `zone` cannot be a zone id, or None when it can."""
    if not isinstance(zone, str) or not ZONE_RE.fullmatch(zone):
        text = repr(zone)
        return (f"zone id {text[:40] + ('...' if len(text) > 40 else '')} is not valid: use 1-64 letters, "
                "digits and . _ : - (e.g. DE, US-CAL-CISO)")
    return None


#: 1 lb/MWh in g/kWh: 453.59237 g per lb, 1000 kWh per MWh.
G_PER_KWH_PER_LB_PER_MWH = 453.59237 / 1000.0


def lbs_per_mwh_to_g_per_kwh(lbs_per_mwh: float) -> float:
    """Convert a rate in lbs CO2/MWh (WattTime's MOER unit) to gCO2/kWh."""
    return lbs_per_mwh * G_PER_KWH_PER_LB_PER_MWH


@dataclass(frozen=True, slots=True)
class IntensityReading:
    """One carbon-intensity value for one period of one grid zone.

    `at` is the start of the period (UTC) and `duration_s` its length: Electricity Maps'
    hourly values are averages over the hour that starts at `at`. `issued_at` is when the
    value became known: the issue time of a forecast, or for an actual the end of its period
    (or the provider's update time), so a replay "as of t" can leave out what was not known
    yet at t.
    """

    zone: str
    at: datetime
    duration_s: int
    gco2_per_kwh: float
    signal: str
    kind: str
    issued_at: datetime
    source: str
    estimated: bool | None = None


@dataclass(frozen=True, slots=True)
class SignalIndexReading:
    """WattTime's signal index: where the current MOER sits (0-100 percentile, by default).

    It is a relative signal, not a gCO2/kWh value, so it is kept apart from intensities.
    """

    zone: str
    at: datetime
    value: float
    units: str
    signal_type: str
    fetched_at: datetime


class GridError(Exception):
    """Base of every error a grid carbon provider raises."""


class GridConfigError(GridError):
    """The provider is not configured (e.g. missing credentials)."""


class GridAuthError(GridError):
    """The provider refused the credentials (HTTP 401/403). Not retried."""


class GridRateLimited(GridError):
    """The provider answered 429; call again after `retry_after_s` seconds."""

    def __init__(self, message: str, retry_after_s: float | None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class GridUnavailable(GridError):
    """Transient trouble that outlasted the retries: timeouts, refused connections, 5xx."""


class GridRequestError(GridError):
    """The provider rejected the request (a 4xx other than 401/403/429), e.g. unknown zone."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class GridBadResponse(GridError):
    """The provider answered something that is not the documented shape (garbage)."""


class CsvFormatError(GridError):
    """A trace file cannot be read; `line` is the 1-based line number of the problem."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        where = f"{path}, line {line}" if line is not None else path
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.reason = message


def parse_api_time(value: object, what: str) -> datetime:
    """An ISO 8601 time from an API response, as aware UTC; GridBadResponse if it is not one.

    A time without an offset is taken as UTC (all three APIs document UTC).
    """
    if not isinstance(value, str):
        raise GridBadResponse(f"{what}: expected an ISO 8601 time, got {value!r}")
    try:
        t = datetime.fromisoformat(value.strip())
    except ValueError:
        raise GridBadResponse(f"{what}: malformed time {value!r}") from None
    if t.tzinfo is None:
        return t.replace(tzinfo=timezone.utc)
    return t.astimezone(timezone.utc)


def number(value: object, what: str) -> float | None:
    """A finite, non-negative number from an API response; None for null (a gap, not zero)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GridBadResponse(f"{what}: expected a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise GridBadResponse(f"{what}: implausible value {value!r}")
    return v
