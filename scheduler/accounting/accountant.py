"""The accounting of one store as one object: the ledger that prices finished jobs, and the
receipts, fleet reports and disclosure export built on it (see `scheduler.accounting`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from scheduler.accounting.aggregate import JobSums
from scheduler.accounting.config import AccountingConfig
from scheduler.accounting.export import Disclosure
from scheduler.accounting.ledger import Ledger
from scheduler.accounting.receipts import Receipts
from scheduler.accounting.reports import Reports
from scheduler.accounting.run_carbon import RunCarbon
from scheduler.accounting.statements import Statements
from scheduler.clock import utcnow
from scheduler.store import Store


class Accountant:
    """Prices finished jobs, builds receipts, reports and exports over one store.

    Each job has its own part: `ledger` (pricing, `account`, `backfill`), `receipts`,
    `reports` and `disclosure`; the methods here are their entry points for the daemon, the
    API and the command line. The arguments are the ledger's (`Ledger`): `site` for PUE,
    `carbon` or `carbon_config` for the signal per zone, `config` the `[accounting]` section.
    `usage_factors`: each QOS's usage factor (`scheduler.qos`), what accounts are charged at.
    """

    def __init__(self, store: Store, *, site: Any = None, carbon: Any = None, carbon_config: Any = None,
                 config: AccountingConfig | None = None, clock: Callable[[], datetime] = utcnow,
                 usage_factors: Mapping[str, float] | None = None) -> None:
        self.ledger = Ledger(store, site=site, carbon=carbon, carbon_config=carbon_config, config=config,
                             clock=clock)
        sums = JobSums(store, self.ledger.config)
        self.receipts = Receipts(self.ledger)
        self.reports = Reports(self.ledger, sums)
        self.disclosure = Disclosure(self.ledger, sums)
        self.statements = Statements(sums, usage_factors)
        self._clock = clock

    def account(self, job_id: int, *, energy_note: str | None = None, tokens: int | None = None) -> RunCarbon | None:
        """Price a finished job and record it on the job (`Ledger.account`)."""
        return self.ledger.account(job_id, energy_note=energy_note, tokens=tokens)

    def backfill(self, *, limit: int = 500, ids: Iterable[int] | None = None) -> int:
        """Price the never-priced finished jobs and re-price recent ones (`Ledger.backfill`)."""
        return self.ledger.backfill(limit=limit, ids=ids)

    def receipt(self, job_id: int) -> dict:
        """The receipt of one job (`Receipts.receipt`)."""
        return self.receipts.receipt(job_id)

    def report(self, since: datetime, until: datetime, *, by: str = "user", owner_uid: int | None = None,
               account_missing: int = 200) -> dict:
        """Fleet figures over a period, grouped (`Reports.report`); grouped by account, each
        group also gives what the account is charged (`charged`: times the QOS usage factors)."""
        data = self.reports.report(since, until, by=by, owner_uid=owner_uid, account_missing=account_missing)
        if by == "account":
            charged = self.statements.charged(self.reports.sums.period_filter(since, until, owner_uid))
            for g in data["groups"]:
                g["charged"] = charged.get(g["group"], {}).get("charged")
            data["usage_factors"] = dict(sorted(self.statements.usage_factors.items()))
        return data

    def statement(self, since: datetime, until: datetime, *, owner_uid: int | None = None) -> dict:
        """Each account's usage and charges over a period (`Statements.statement`); never-priced
        jobs of the period are priced first, as for a report."""
        self.ledger.price_missing(self.reports.sums.period_filter(since, until, owner_uid), 200)
        return self.statements.statement(since, until, owner_uid=owner_uid, generated_at=self._clock())

    def export(self, since: datetime, until: datetime, *, owner_uid: int | None = None) -> dict:
        """The period's energy and emissions disclosure (`Disclosure.export`)."""
        return self.disclosure.export(since, until, owner_uid=owner_uid)


def record_actual_carbon(store: Store, job_id: int, *, site: Any = None, carbon: Any = None,
                         config: AccountingConfig | None = None, energy_note: str | None = None,
                         tokens: int | None = None) -> RunCarbon | None:
    """Price a job that just finished and record its gCO2 (the agent's completion path).

    `energy_note`: why the energy method was chosen (e.g. the counter fault the sampler
    saw), kept for the receipt. A job priced without full actuals is re-priced later by
    `Accountant.backfill`.
    """
    return Accountant(store, site=site, carbon=carbon, config=config).account(
        job_id, energy_note=energy_note, tokens=tokens)
