"""Fleet reports: figures over the jobs that ended in a period, grouped by user, workload,
GPU model, zone, day or node, with why the unpriced ones are unpriced."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from scheduler.accounting.aggregate import JobSums, signal_figures
from scheduler.accounting.embodied import METHODOLOGY as EMBODIED_METHODOLOGY
from scheduler.accounting.figures import iso, tidy
from scheduler.accounting.ledger import Ledger
from scheduler.carbon_table import zones_with_data
from scheduler.jobs.sums import signal_key, unpriced_by_zone
from telemetry.grid.static import static_intensity

GROUPINGS = ("user", "workload", "model", "zone", "day", "node")


class Reports:
    """Fleet reports over one store; never-priced jobs of the period are priced by `ledger` first."""

    def __init__(self, ledger: Ledger, sums: JobSums) -> None:
        self.ledger = ledger
        self.sums = sums

    def report(self, since: datetime, until: datetime, *, by: str = "user", owner_uid: int | None = None,
               account_missing: int = 200) -> dict:
        """Fleet figures over jobs that ended in [since, until), grouped `by` one of GROUPINGS;
        only `owner_uid`'s jobs when given. Up to `account_missing` jobs of the period that
        were never priced are priced first (carbon data may arrive after a job ends)."""
        if by not in GROUPINGS:
            raise ValueError(f"unknown grouping {by!r}; use one of {', '.join(GROUPINGS)}")
        if until <= since:
            raise ValueError("the report period is empty: --since must be before --until")
        where = self.sums.period_filter(since, until, owner_uid)
        if account_missing:
            self.ledger.price_missing(where, account_missing)
        rows = self.sums.aggregate(where, self.sums.group_key(by).label("key"), signal_key().label("signal"))
        unaccounted = sum(int(r["unpriced"] or 0) for r in rows)
        by_key: dict[Any, list[dict]] = {}
        for r in rows:
            by_key.setdefault(r["key"], []).append(r)
        groups = [signal_figures(parts) | {"group": key} for key, parts in by_key.items()]
        groups.sort(key=lambda g: (g["group"] is None, str(g["group"])))
        total = signal_figures(rows)
        cfg = self.ledger.config
        return tidy({"since": iso(since), "until": iso(until), "by": by, "generated_at": iso(self.ledger.clock()),
                "scope": "all users" if owner_uid is None else f"uid {owner_uid}",
                "groups": groups, "total": total, "jobs_without_gco2": unaccounted,
                "unpriced": self._unpriced(where) if unaccounted else [],
                "assumptions": {"gpu_lifetime_years": cfg.gpu_lifetime_years,
                                "energy_price_usd_per_kwh": cfg.energy_price_usd_per_kwh,
                                "zone_energy_price_usd_per_kwh": dict(cfg.zone_energy_price_usd_per_kwh),
                                "embodied": EMBODIED_METHODOLOGY}})

    def _unpriced(self, where) -> list[dict]:
        """Why jobs of the period have no gCO2: per zone, how many, and whether the zone has
        any carbon data at all (none: it never will be priced until data is imported)."""
        with self.ledger.store.read() as conn:
            rows = unpriced_by_zone(conn, where)
            with_data = zones_with_data(conn, [r[0] for r in rows if r[0]])
        static = getattr(getattr(self.ledger.carbon, "config", None), "static", None)
        out = []
        for zone, count, unmeasured in sorted(rows, key=lambda r: str(r[0])):
            has_data = zone in with_data or (zone is not None and static_intensity(zone, static) is not None)
            out.append({"zone": zone, "jobs": int(count), "jobs_unmeasured": int(unmeasured or 0),
                        "zone_has_data": has_data,
                        "why": ("no energy measured" if count == unmeasured else
                                f"zone {zone} has no carbon data (import it: carbonsched carbon import FILE "
                                f"--zone {zone})" if not has_data else
                                "no intensity data for the run's hours yet")})
        return out


def parse_period(since: str | None, until: str | None, now: datetime, *,
                 default_days: float = 30.0) -> tuple[datetime, datetime]:
    """--since/--until: an ISO time or date (UTC if no offset), or a duration back from now
    (`7d`); defaults: the last `default_days` days up to now."""
    def one(text: str | None, default: datetime) -> datetime:
        if not text:
            return default
        from scheduler.timeparse import parse_duration

        try:
            return now - timedelta(seconds=parse_duration(text))
        except ValueError:
            pass
        try:
            t = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"bad time {text!r}: use an ISO date/time (2026-01-31, 2026-01-31T12:00Z) "
                             "or a duration back from now (7d, 12h)") from None
        return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)

    end = one(until, now)
    start = one(since, end - timedelta(days=default_days))
    if end <= start:
        raise ValueError(f"the period is empty: since {iso(start)} is not before until {iso(end)}")
    return start, end
