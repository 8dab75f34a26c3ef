"""What each account is charged for a period: its finished jobs' usage in every currency
(GPU-hours, kWh, kgCO2e operational, kgCO2e embodied), as measured, and the same times each
job's QOS usage factor, what the account is charged (`report --by account` gives it per
group, `export --by account` as a statement per account, JSON or CSV).

Charges follow fair share and the budgets (`scheduler.budgets`): a `flexible` job's usage
counts half, an `urgent` one's 1.5 times (the QOS table's factors). The operational grams
are summed per carbon signal (average, marginal) and given as one figure only where an
account's jobs were priced with one signal; embodied grams are their own figure, never added
to the operational ones. A job charged to an account is its subtree's too: `subtree_*`
figures add up the account and everything under it, as its limits count them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select

from scheduler.accounting.aggregate import JobSums, figures
from scheduler.accounting.embodied import METHODOLOGY as EMBODIED_METHODOLOGY
from scheduler.accounting.figures import iso, tidy
from scheduler.jobs.sums import account_columns, signal_key
from scheduler.store.account_models import accounts

CURRENCY_FIGURES = ("gpu_hours", "energy_kwh", "kgco2e", "embodied_kgco2e")
STATEMENT_COLUMNS = ("account", "parent", "period_start", "period_end", "jobs", "gpu_hours", "energy_kwh",
                     "kgco2e", "signal", "embodied_kgco2e", "embodied_unknown_gpu_hours", "charged_gpu_hours",
                     "charged_energy_kwh", "charged_kgco2e", "charged_embodied_kgco2e", "subtree_charged_gpu_hours",
                     "subtree_charged_energy_kwh", "subtree_charged_kgco2e", "subtree_charged_embodied_kgco2e")


def _zero() -> dict[str, Any]:
    return {"gpu_hours": 0.0, "energy_kwh": 0.0, "kgco2e_by_signal": {}, "embodied_kgco2e": 0.0}


def _add(into: dict, fig: Mapping[str, Any], signal: str | None, factor: float) -> None:
    into["gpu_hours"] += fig["gpu_hours"] * factor
    into["energy_kwh"] += fig["energy_kwh"] * factor
    if fig["kgco2"] is not None:
        by = into["kgco2e_by_signal"]
        by[signal or "unknown"] = by.get(signal or "unknown", 0.0) + fig["kgco2"] * factor
    into["embodied_kgco2e"] += (fig["embodied_kgco2e"] or 0.0) * factor


def _finish(c: dict) -> dict:
    """`kgco2e` is the one signal's figure, None where none or several were used (never summed)."""
    by = c["kgco2e_by_signal"]
    return {**c, "kgco2e": next(iter(by.values())) if len(by) == 1 else None,
            "signal": next(iter(by)) if len(by) == 1 else ("mixed" if by else None)}


class Statements:
    """Per-account usage and charges of a period over one store (the accountant's sums)."""

    def __init__(self, sums: JobSums, usage_factors: Mapping[str, float] | None = None) -> None:
        self.sums = sums
        self.usage_factors = dict(usage_factors or {})

    def charged(self, where) -> dict[str, dict]:
        """account -> {"usage": as measured, "charged": times the QOS factors}, each with
        gpu_hours, energy_kwh, kgco2e (and kgco2e_by_signal, signal), embodied_kgco2e and
        embodied_unknown_gpu_hours, jobs; over the finished jobs matching `where`."""
        rows = self.sums.aggregate(where, *account_columns(), signal_key().label("signal"))
        out: dict[str, dict] = {}
        for r in rows:
            fig = figures(r)
            acc = out.setdefault(r["key"], {"usage": _zero(), "charged": _zero(), "jobs": 0,
                                            "embodied_unknown_gpu_hours": 0.0})
            acc["jobs"] += fig["jobs"]
            acc["embodied_unknown_gpu_hours"] += fig["embodied_unknown_gpu_hours"]
            _add(acc["usage"], fig, r["signal"], 1.0)
            _add(acc["charged"], fig, r["signal"], self.usage_factors.get(r["qos"], 1.0))
        return {a: {**v, "usage": _finish(v["usage"]), "charged": _finish(v["charged"])} for a, v in out.items()}

    def statement(self, since: datetime, until: datetime, *, owner_uid: int | None = None,
                  generated_at: datetime | None = None) -> dict:
        """Every account's statement for [since, until): its own jobs' usage and charges and
        its subtree's charges, in tree order (accounts no longer in the tree last)."""
        charged = self.charged(self.sums.period_filter(since, until, owner_uid))
        with self.sums.store.read() as conn:
            parents = {r.name: r.parent for r in conn.execute(select(accounts.c.name, accounts.c.parent))}
        for gone in set(charged) - set(parents):
            parents[gone] = None
        subtree = {a: _zero() for a in parents}
        for a, v in charged.items():
            seen, node = set(), a
            while node is not None and node not in seen:
                seen.add(node)
                c = subtree[node]
                for k in ("gpu_hours", "energy_kwh", "embodied_kgco2e"):
                    c[k] += v["charged"][k]
                for sig, kg in v["charged"]["kgco2e_by_signal"].items():
                    c["kgco2e_by_signal"][sig] = c["kgco2e_by_signal"].get(sig, 0.0) + kg
                node = parents.get(node)
        rows = []
        for a in _tree_order(parents):
            own = charged.get(a)
            rows.append({"account": a, "parent": parents[a], "jobs": own["jobs"] if own else 0,
                         "usage": own["usage"] if own else _finish(_zero()),
                         "charged": own["charged"] if own else _finish(_zero()),
                         "subtree_charged": _finish(subtree[a]),
                         "embodied_unknown_gpu_hours": own["embodied_unknown_gpu_hours"] if own else 0.0})
        if owner_uid is not None:  # a user's statement: only the accounts their jobs charged
            rows = [r for r in rows if r["jobs"]]
        return tidy({"by": "account", "period": {"start": iso(since), "end": iso(until)},
                     "generated_at": iso(generated_at) if generated_at else None,
                     "scope": "all users" if owner_uid is None else f"uid {owner_uid}",
                     "accounts": rows,
                     "usage_factors": dict(sorted(self.usage_factors.items())),
                     "methodology": {
                         "usage": "finished jobs that ended in the period: GPU-hours (GPUs x time run), kWh (GPU "
                                  "energy measured), kgCO2e operational (as the receipts price it, per signal) and "
                                  "kgCO2e embodied (the GPUs' manufacturing share, never added to the operational)",
                         "charged": "usage x the job's QOS usage factor (usage_factors), as fair share and the "
                                    "account limits count it",
                         "subtree": "subtree_charged adds the account and every account under it, as its limits "
                                    "count them",
                         "embodied": EMBODIED_METHODOLOGY}})


def _tree_order(parents: Mapping[str, str | None]) -> list[str]:
    children: dict[str | None, list[str]] = {}
    for a, p in parents.items():
        children.setdefault(p if p in parents else None, []).append(a)
    out: list[str] = []

    def walk(p: str | None) -> None:
        for a in sorted(children.get(p, [])):
            if a not in out:
                out.append(a)
                walk(a)

    walk(None)
    return out + sorted(set(parents) - set(out))


def statement_csv_rows(doc: dict) -> list[list]:
    """The statement as CSV rows (STATEMENT_COLUMNS first): one per account."""
    out: list[list] = [list(STATEMENT_COLUMNS)]
    for r in doc["accounts"]:
        u, c, s = r["usage"], r["charged"], r["subtree_charged"]
        cells = {"account": r["account"], "parent": r["parent"], "period_start": doc["period"]["start"],
                 "period_end": doc["period"]["end"], "jobs": r["jobs"], "signal": u["signal"],
                 "embodied_unknown_gpu_hours": r["embodied_unknown_gpu_hours"],
                 **{k: u[k] for k in CURRENCY_FIGURES},
                 **{f"charged_{k}": c[k] for k in CURRENCY_FIGURES},
                 **{f"subtree_charged_{k}": s[k] for k in CURRENCY_FIGURES}}
        out.append(["" if cells.get(k) is None else cells[k] for k in STATEMENT_COLUMNS])
    return out
