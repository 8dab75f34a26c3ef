"""Live provider refresh: fetch each configured zone's values into the store, within budget.

`ProviderRefresh.refresh(zone)` calls the zone's provider (`scheduler.carbon_providers`)
endpoint by endpoint, at most once per `min_interval_s` per endpoint across all processes
(the `carbon_fetches` table is the shared gate), with a back-off after failures and the
provider's Retry-After after a 429, and stores what it got (`scheduler.carbon_writes`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Connection, Row, and_, select, update

from scheduler.carbon_config import CarbonConfig
from scheduler.carbon_providers import provider as registered
from scheduler.carbon_writes import CarbonWrites
from scheduler.clock import utcnow
from scheduler.store import Store
from scheduler.store.carbon_models import carbon_fetches
from telemetry.grid.readings import GridAuthError, GridConfigError, GridError, GridRateLimited, IntensityReading

log = logging.getLogger(__name__)

FAILURE_BACKOFF_S = (60, 120, 300, 600, 1800, 3600)
AUTH_FAILURE_BACKOFF_S = 3600
PROVIDER_WIDE = "*"           # the carbon_fetches zone/endpoint of account-wide back-offs


@dataclass
class RefreshReport:
    zone: str
    provider: str | None
    fetched: dict[str, int] = field(default_factory=dict)   # endpoint -> rows stored
    skipped: dict[str, str] = field(default_factory=dict)   # endpoint -> why (cached, backing off)
    errors: dict[str, str] = field(default_factory=dict)    # endpoint -> error


class ProviderRefresh:
    """Calls the live providers of the configured zones and stores their values.

    `clients` maps provider names to client objects (tests pass fakes), otherwise they are
    built from `config` on first use (the registry's factories).
    """

    def __init__(self, store: Store, config: CarbonConfig, writes: CarbonWrites, *,
                 clock: Callable[[], datetime] = utcnow, clients: Mapping[str, Any] | None = None) -> None:
        self.store = store
        self.config = config
        self.writes = writes
        self._clock = clock
        self._clients: dict[str, Any] = dict(clients or {})

    def _client(self, provider: str) -> Any:
        client = self._clients.get(provider)
        if client is not None:
            return client
        cfg = self.config
        common = {"timeout_s": cfg.timeout_s, "retries": cfg.retries, "clock": self._clock}
        client = registered(provider).client(cfg, common)
        self._clients[provider] = client
        return client

    def _calls(self, provider: str, zone: str, region: str, horizon_hours: int
               ) -> list[tuple[str, Callable[[], list[IntensityReading]]]]:
        """The provider's endpoints for one zone, in order, each a call returning its readings
        relabelled to `zone`."""
        def relabel(readings: Iterable[IntensityReading | None]) -> list[IntensityReading]:
            return [r if r.zone == zone else replace(r, zone=zone) for r in readings if r is not None]

        def bound(call: Callable[..., list[IntensityReading | None]]) -> Callable[[], list[IntensityReading]]:
            return lambda: relabel(call(self._client(provider), zone, region, horizon_hours))

        return [(endpoint, bound(call)) for endpoint, call, _ in registered(provider).endpoints]

    def refresh(self, zone: str, *, force: bool = False) -> RefreshReport:
        """Fetch the zone's live values into the store, within the call budget.

        Each endpoint is called only when its `min_interval_s` has passed since the last
        call by any process (`force` skips that wait but never a back-off after errors or
        a 429). Errors are recorded and reported, never raised: the forecast chain falls
        back by itself.
        """
        zc = self.config.zones.get(zone)
        report = RefreshReport(zone=zone, provider=zc.provider if zc else None)
        if zc is None or zc.provider is None:
            report.skipped["*"] = "no live provider configured"
            return report
        provider = zc.provider
        for endpoint, call in self._calls(provider, zone, zc.region or zone, zc.horizon_hours):
            interval = self.config.min_interval_s.get((provider, endpoint), 3600)
            why_not = self._claim(provider, zone, endpoint, interval, force)
            if why_not:
                report.skipped[endpoint] = why_not
                continue
            try:
                readings = call()
            except GridError as e:
                report.errors[endpoint] = str(e)
                self._record_failure(provider, zone, endpoint, e)
                if isinstance(e, (GridAuthError, GridConfigError, GridRateLimited)):
                    break  # the other endpoints would fail the same way
                continue
            n = self.writes.store_readings(readings)
            report.fetched[endpoint] = n
            self._record_success(provider, zone, endpoint, interval, n)
        return report

    def refresh_all(self, *, force: bool = False) -> list[RefreshReport]:
        """Refresh every zone that has a live provider configured."""
        return [self.refresh(z, force=force) for z, zc in sorted(self.config.zones.items()) if zc.provider]

    def _fetch_row(self, conn: Connection, provider: str, zone: str, endpoint: str) -> tuple[Row, Any]:
        """The carbon_fetches row of one endpoint, created if missing, locked on PostgreSQL."""
        fc = carbon_fetches.c
        key = and_(fc.provider == provider, fc.zone == zone, fc.endpoint == endpoint)
        row = conn.execute(select(carbon_fetches).where(key).with_for_update()).first()
        if row is None:
            if self.store.dialect == "postgresql":
                from sqlalchemy.dialects.postgresql import insert as dialect_insert
            else:
                from sqlalchemy.dialects.sqlite import insert as dialect_insert
            conn.execute(dialect_insert(carbon_fetches).values(
                provider=provider, zone=zone, endpoint=endpoint, failures=0, calls=0).on_conflict_do_nothing())
            row = conn.execute(select(carbon_fetches).where(key).with_for_update()).first()
        return row, key

    def _claim(self, provider: str, zone: str, endpoint: str, interval_s: float, force: bool) -> str | None:
        """Reserve the right to call an endpoint now; None if granted, else why not.

        A provider-wide row (zone and endpoint "*") holds back-offs that concern the whole
        account: a 429 or refused credentials stop every endpoint of every zone.
        """
        def claim(conn: Connection) -> str | None:
            now = self._clock()
            account, _ = self._fetch_row(conn, provider, PROVIDER_WIDE, PROVIDER_WIDE)
            if account.failures and account.next_allowed_at is not None and now < account.next_allowed_at:
                return (f"backing off {provider} until {_iso(account.next_allowed_at)} after: "
                        f"{account.last_error}")
            row, key = self._fetch_row(conn, provider, zone, endpoint)
            if row.next_allowed_at is not None and now < row.next_allowed_at:
                if row.failures:
                    return f"backing off after {row.failures} failure(s) until {_iso(row.next_allowed_at)}"
                if not force:
                    return f"cached: last call {_iso(row.last_attempt_at)}, next after {_iso(row.next_allowed_at)}"
            conn.execute(update(carbon_fetches).where(key).values(
                last_attempt_at=now, next_allowed_at=now + timedelta(seconds=interval_s), calls=row.calls + 1))
            return None

        return self.store.transact(claim)

    def _record_success(self, provider: str, zone: str, endpoint: str, interval_s: float, rows: int) -> None:
        now = self._clock()

        def write(conn: Connection) -> int:
            row, key = self._fetch_row(conn, provider, zone, endpoint)
            conn.execute(update(carbon_fetches).where(key).values(
                last_success_at=now, next_allowed_at=now + timedelta(seconds=interval_s), failures=0,
                rows=rows, last_error=None))
            account, account_key = self._fetch_row(conn, provider, PROVIDER_WIDE, PROVIDER_WIDE)
            if account.failures:
                conn.execute(update(carbon_fetches).where(account_key).values(failures=0, last_error=None))
            return row.failures

        if self.store.transact(write):
            log.info("carbon %s: %s %s works again (%d values)", zone, provider, endpoint, rows)

    def _record_failure(self, provider: str, zone: str, endpoint: str, error: GridError) -> None:
        now = self._clock()
        account_wide = isinstance(error, (GridRateLimited, GridAuthError, GridConfigError))

        def write(conn: Connection) -> tuple[int, datetime]:
            row, key = self._fetch_row(conn, provider, zone, endpoint)
            failures = row.failures + 1
            if isinstance(error, GridRateLimited):
                wait_s = max(error.retry_after_s or 0.0, FAILURE_BACKOFF_S[min(failures, len(FAILURE_BACKOFF_S)) - 1])
            elif isinstance(error, (GridAuthError, GridConfigError)):
                wait_s = AUTH_FAILURE_BACKOFF_S
            else:
                wait_s = FAILURE_BACKOFF_S[min(failures, len(FAILURE_BACKOFF_S)) - 1]
            until = now + timedelta(seconds=wait_s)
            message = str(error)[:500]
            conn.execute(update(carbon_fetches).where(key).values(
                failures=failures, next_allowed_at=until, last_error=message))
            if account_wide:
                account, account_key = self._fetch_row(conn, provider, PROVIDER_WIDE, PROVIDER_WIDE)
                conn.execute(update(carbon_fetches).where(account_key).values(
                    failures=account.failures + 1, next_allowed_at=until, last_error=message,
                    last_attempt_at=now))
            return failures, until

        failures, until = self.store.transact(write)
        if failures == 1:
            log.warning("carbon %s: %s %s failed, not calling %s before %s: %s", zone, provider, endpoint,
                        provider if account_wide else "it", _iso(until), error)
        else:
            log.debug("carbon %s: %s %s failed again (%d): %s", zone, provider, endpoint, failures, error)


def _iso(t: datetime | None) -> str:
    if t is None:
        return "never"
    return t.astimezone(timezone.utc).isoformat(timespec="minutes").replace("+00:00", "Z")
