"""The sums over finished jobs in a period, and the figures made of them: what fleet reports
and the disclosure export share. The SQL is `scheduler.jobs.sums` (aggregation in the
database, GROUP BY over the indexed `jobs.ended_at`, so a year of a busy fleet answers in
well under a second: bench/report_bench.py); here are the prices it is given and the
figures made of its sums."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from policies.types import J_PER_KWH
from scheduler.accounting.config import AccountingConfig
from scheduler.accounting.embodied import embodied_figures, g_per_gpu_second
from scheduler.accounting.figures import difference, intensity_g_per_kwh
from scheduler.jobs import sums
from scheduler.store import Store

#: The figures of a group that are grams (or derived from grams): they exist per carbon signal
#: only, since average and marginal grams are different quantities and never added.
CARBON_FIGURES = ("kgco2", "intensity_g_per_kwh", "gco2_per_prompt", "gco2_per_1k_tokens",
                  "counterfactual_kgco2", "saving_kgco2", "saving_pct", "jobs_with_gco2",
                  "sci_gco2_per_prompt", "sci_operational_gco2_per_prompt", "sci_embodied_gco2_per_prompt")


class JobSums:
    """Sums over the finished jobs of one store (`scheduler.jobs.sums`), priced with its
    accounting configuration: the period's filter, the grouped sums."""

    def __init__(self, store: Store, config: AccountingConfig) -> None:
        self.store = store
        self.config = config

    def group_key(self, by: str):
        """The column the sums are grouped `by` (`scheduler.accounting.reports.GROUPINGS`)."""
        return sums.group_column(by, self.store.dialect)

    def period_filter(self, since: datetime, until: datetime, owner_uid: int | None):
        """The finished jobs that ended in [since, until), only `owner_uid`'s when given."""
        return sums.period_filter(self.store, since, until, owner_uid)

    def prices(self) -> sums.Prices:
        """The configured prices: each catalog GPU's hourly cost, energy per zone and elsewhere."""
        from policies.model.catalog import catalog

        return sums.Prices(energy_usd_per_kwh=self.config.energy_price_usd_per_kwh,
                           gpu_usd_per_hour={name: self.config.gpu_usd_per_hour(spec.list_price_usd)
                                             for name, spec in sorted(catalog().items())},
                           zone_energy_usd_per_kwh=dict(self.config.zone_energy_price_usd_per_kwh),
                           embodied_g_per_gpu_s=g_per_gpu_second())

    def aggregate(self, where, *keys) -> list[dict]:
        """The sums over the jobs matching `where`, one dict per group of `keys`."""
        return sums.finished_sums(self.store, where, keys, prices=self.prices())


def signal_figures(rows: Sequence[Mapping[str, Any]]) -> dict:
    """The figures of aggregate rows (each of one carbon signal, `signal`), with the
    grams split by signal: `by_signal` holds CARBON_FIGURES per signal, and the group's own
    CARBON_FIGURES are that signal's, or None where the group mixes both (the
    issue-25 example: 1 kWh at 100 g average plus 1 kWh at 800 g marginal is not
    "0.9 kg at 450 g/kWh"). `signal` names it: average, marginal, mixed or None."""
    fig = figures(sum_rows(rows))
    per: dict[str, dict] = {}
    for sig in sorted({r.get("signal") for r in rows if r.get("priced")} - {None}):
        part = figures(sum_rows([r for r in rows if r.get("signal") == sig]))
        per[sig] = {k: part[k] for k in CARBON_FIGURES}
    fig["by_signal"] = per
    fig["signal"] = next(iter(per)) if len(per) == 1 else ("mixed" if per else None)
    if len(per) > 1:
        for k in CARBON_FIGURES:
            if k != "jobs_with_gco2":
                fig[k] = None
    return fig


def figures(r: Mapping[str, Any]) -> dict:
    """The figures of one group from its sums (`sum_rows` of `JobSums.aggregate` rows)."""
    def f(name: str) -> float:
        return float(r.get(name) or 0.0)

    cf, cf_actual = r.get("cf"), r.get("cf_actual")
    saving = difference(cf, cf_actual)
    return {
        "jobs": int(r.get("jobs") or 0), "completed": int(r.get("completed") or 0),
        "deadline_misses": int(r.get("late") or 0),
        "gpu_hours": f("gpu_s") / 3600.0,
        "energy_kwh": f("energy_j") / J_PER_KWH,
        "facility_energy_kwh": f("facility_j") / J_PER_KWH,
        # None, never 0, where no job of the group could be priced (issue 28): an unknown
        # emission is not a zero one; partly priced groups sum the priced jobs only
        "kgco2": f("gco2") / 1000.0 if r.get("priced") else None,
        "jobs_measured": int(r.get("measured") or 0), "jobs_with_gco2": int(r.get("priced") or 0),
        # energy from emulated GPUs' power model: included in the figures, but not measured
        "jobs_modelled": int(r.get("modelled") or 0), "modelled_energy_kwh": f("modelled_j") / J_PER_KWH,
        "intensity_g_per_kwh": intensity_g_per_kwh(f("gco2"), r.get("priced_facility_j")),
        "prompts": int(r["prompts"]) if r.get("prompts") is not None else None,
        "tokens": int(r["tokens"]) if r.get("tokens") is not None else None,
        # how many of the jobs with a prompt / token count reported it themselves
        "prompts_source": source(r.get("prompts_reported"), r.get("prompts_counted")),
        "tokens_source": source(r.get("tokens_reported"), r.get("tokens_counted")),
        "gco2_per_prompt": f("gco2_p") / f("prompts_p") if r.get("prompts_p") else None,
        "gco2_per_1k_tokens": f("gco2_t") / f("tokens_g") * 1000.0 if r.get("tokens_g") else None,
        "tokens_per_j": f("tokens_e") / f("energy_t") if r.get("energy_t") else None,
        "usd": f("usd"),
        "usd_per_mtok": f("usd_t") / f("tokens_c") * 1e6 if r.get("tokens_c") else None,
        "counterfactual_kgco2": None if cf is None else cf / 1000.0,
        "saving_kgco2": None if saving is None else saving / 1000.0,
        "saving_pct": saving / cf * 100.0 if saving is not None and cf else None,
        # embodied carbon: its own figures, never added into kgco2 (the operational grams)
        **embodied_figures(r),
        # the SCI-style total per prompt over the jobs with operational grams, prompts and an
        # embodied figure, both parts beside it (per signal, as the operational grams are)
        **sci_figures(r),
    }


def sci_figures(r: Mapping[str, Any]) -> dict:
    """The SCI-style total per prompt of a group and its two parts; None where no job of the
    group has operational grams, prompts and an embodied figure together."""
    prompts = float(r.get("prompts_s") or 0.0)
    if not prompts:
        return dict.fromkeys(("sci_gco2_per_prompt", "sci_operational_gco2_per_prompt",
                              "sci_embodied_gco2_per_prompt"))
    op, emb = float(r.get("gco2_s") or 0.0) / prompts, float(r.get("embodied_g_s") or 0.0) / prompts
    return {"sci_gco2_per_prompt": op + emb, "sci_operational_gco2_per_prompt": op,
            "sci_embodied_gco2_per_prompt": emb}


def source(reported: int | None, counted: int | None) -> str | None:
    """'reported', 'declared' or 'partly reported' over a group of jobs; None: no counts."""
    reported, counted = int(reported or 0), int(counted or 0)
    if not counted:
        return None
    return "reported" if reported == counted else "partly reported" if reported else "declared"


def work_figures(fig: Mapping[str, Any]) -> dict:
    """The per-prompt and per-token figures of a group, for the export."""
    return {k: fig[k] for k in ("prompts", "prompts_source", "gco2_per_prompt", "tokens", "tokens_source",
                                "gco2_per_1k_tokens", "tokens_per_j", "usd_per_mtok")}


def kg_by_signal(fig: Mapping[str, Any]) -> dict[str, float | None]:
    return {sig: part["kgco2"] for sig, part in fig["by_signal"].items()}


def sum_rows(rows: Sequence[Mapping[str, Any]]) -> dict:
    """Add up aggregate rows (sums stay sums; None where every part is None)."""
    out: dict[str, Any] = {}
    for r in rows:
        for k, v in r.items():
            if k in ("key", "node", "gpu_model", "zone", "method", "signal", "basis", "pue"):
                continue
            if v is None:
                out.setdefault(k, None)
            else:
                out[k] = (out.get(k) or 0) + v
    return out


def shares(rows: Sequence[Mapping[str, Any]], key: str, weight: str) -> dict[str, float]:
    """Share of `weight` (e.g. energy) per value of `key`, over the rows."""
    totals: dict[str, float] = {}
    for r in rows:
        w = r.get(weight)
        if w:
            name = r.get(key) or "none"
            totals[name] = totals.get(name, 0.0) + float(w)
    whole = sum(totals.values())
    return {k: v / whole for k, v in sorted(totals.items())} if whole else {}
