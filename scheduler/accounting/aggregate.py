"""The SQL that adds up finished jobs over a period, and the figures made of the sums:
what fleet reports and the disclosure export share. Aggregation runs in the database (GROUP
BY over the indexed `jobs.ended_at`), so a year of a busy fleet answers in well under a
second (bench/report_bench.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import String, and_, case, extract, func, literal, literal_column, or_, select, type_coerce

from policies.types import J_PER_KWH
from scheduler.accounting.config import AccountingConfig
from scheduler.accounting.figures import difference, intensity_g_per_kwh
from scheduler.accounting.ledger import FINISHED
from scheduler.lifecycle import State
from scheduler.store import Store
from scheduler.store.base import UTCDateTime
from scheduler.store.models import jobs
from scheduler.timeparse import utc_aware
from telemetry.energy import MODELLED
from telemetry.grid.readings import SIGNAL_AVERAGE

#: The figures of a group that are grams (or derived from grams): they exist per carbon signal
#: only, since average and marginal grams are different quantities and never added.
CARBON_FIGURES = ("kgco2", "intensity_g_per_kwh", "gco2_per_prompt", "gco2_per_1k_tokens",
                  "counterfactual_kgco2", "saving_kgco2", "saving_pct", "jobs_with_gco2")


class JobSums:
    """Sums over the finished jobs of one store: the period's filter, the grouped sums."""

    def __init__(self, store: Store, config: AccountingConfig) -> None:
        self.store = store
        self.config = config

    def _runtime_s(self):
        j = jobs.c
        if self.store.dialect == "sqlite":
            return (func.julianday(j.ended_at) - func.julianday(j.started_at)) * 86400.0
        return extract("epoch", j.ended_at - j.started_at)

    def _day(self):
        j = jobs.c
        if self.store.dialect == "sqlite":
            return func.substr(type_coerce(j.ended_at, String), 1, 10, type_=String)
        return func.to_char(func.timezone("UTC", j.ended_at), "YYYY-MM-DD", type_=String)

    def group_key(self, by: str):
        j = jobs.c
        return {"user": j.owner_name, "workload": j.workload, "model": j.gpu_model, "zone": j.zone,
                "node": j.node, "day": self._day()}[by]

    def _cost_expr(self, runtime_s):
        from policies.model.catalog import catalog

        j = jobs.c
        rates = [(j.gpu_model == name, self.config.gpu_usd_per_hour(spec.list_price_usd))
                 for name, spec in sorted(catalog().items())]
        rate = case(*rates, else_=0.0) if rates else literal(0.0)
        prices = [(j.zone == z, p) for z, p in sorted(self.config.zone_energy_price_usd_per_kwh.items())]
        price = case(*prices, else_=self.config.energy_price_usd_per_kwh) if prices \
            else literal(self.config.energy_price_usd_per_kwh)
        return (rate * j.gpus * runtime_s / 3600.0
                + func.coalesce(j.energy_j, 0.0) / J_PER_KWH * func.coalesce(j.pue, 1.0) * price)

    def period_filter(self, since: datetime, until: datetime, owner_uid: int | None):
        j = jobs.c
        ended = j.ended_at
        if self.store.dialect == "sqlite" and owner_uid is None and self._mostly_covered(since, until):
            # SQLite's planner takes ix_jobs_ended_at even for a range holding most rows, and
            # 100,000 index lookups are ~8x slower than one scan; `+col` makes it scan.
            ended = literal_column("+jobs.ended_at", UTCDateTime())
        cond = [ended >= utc_aware(since, "since"), ended < utc_aware(until, "until"),
                j.started_at.is_not(None), j.state.in_(FINISHED)]
        if owner_uid is not None:
            cond.append(j.owner_uid == owner_uid)
        return and_(*cond)

    def _mostly_covered(self, since: datetime, until: datetime) -> bool:
        """Whether [since, until) spans over a quarter of the time the finished jobs span."""
        with self.store.read() as conn:
            first, last = conn.execute(select(func.min(jobs.c.ended_at), func.max(jobs.c.ended_at))).one()
        if first is None or last is None or last <= first:
            return True
        overlap = (min(until, last) - max(since, first)).total_seconds()
        return overlap > 0.25 * (last - first).total_seconds()

    def aggregate(self, where, *keys) -> list[dict]:
        j = jobs.c
        runtime = self._runtime_s()
        cost = self._cost_expr(runtime)
        priced = j.gco2.is_not(None)
        # the work done: reported by the job, else declared at submit (receipts say the same)
        prompts = func.coalesce(j.reported_prompts, j.prompts)
        tokens = func.coalesce(j.reported_output_tokens, j.tokens)
        with_prompts = and_(priced, prompts > 0)
        with_tokens = and_(tokens > 0, j.energy_j.is_not(None))
        both = and_(priced, j.est_gco2_if_now.is_not(None))
        modelled = or_(j.energy_method == MODELLED, j.energy_method.like(MODELLED + "+%"))
        # the counterfactual of each job as its receipt has it: measured x (if-now / planned
        # estimate), or the raw if-now estimate where the plan's own estimate is missing
        scaled_cf = case((j.est_gco2 > 0, j.gco2 * j.est_gco2_if_now / j.est_gco2), else_=j.est_gco2_if_now)

        def when(cond, value):
            return func.sum(case((cond, value), else_=None))

        stmt = select(
            *keys,
            func.count().label("jobs"),
            func.sum(case((j.state == State.COMPLETED.value, 1), else_=0)).label("completed"),
            func.sum(j.gpus * runtime).label("gpu_s"),
            func.sum(j.energy_j).label("energy_j"),
            func.count(j.energy_j).label("measured"),
            when(modelled, j.energy_j).label("modelled_j"), when(modelled, 1).label("modelled"),
            func.sum(j.energy_j * func.coalesce(j.pue, 1.0)).label("facility_j"),
            func.sum(j.gco2).label("gco2"),
            func.count(j.gco2).label("priced"),
            func.sum(case((and_(priced, j.energy_j.is_not(None)), j.energy_j), else_=None)).label("priced_j"),
            func.sum(case((and_(priced, j.energy_j.is_not(None)), j.energy_j * func.coalesce(j.pue, 1.0)),
                          else_=None)).label("priced_facility_j"),
            when(with_prompts, j.gco2).label("gco2_p"), when(with_prompts, prompts).label("prompts_p"),
            func.sum(prompts).label("prompts"), func.sum(tokens).label("tokens"),
            func.sum(case((j.reported_prompts.is_not(None), 1), else_=0)).label("prompts_reported"),
            func.count(prompts).label("prompts_counted"),
            func.sum(case((j.reported_output_tokens.is_not(None), 1), else_=0)).label("tokens_reported"),
            func.count(tokens).label("tokens_counted"),
            when(with_tokens, j.energy_j).label("energy_t"), when(with_tokens, tokens).label("tokens_e"),
            func.sum(cost).label("usd"), when(tokens > 0, cost).label("usd_t"),
            when(tokens > 0, tokens).label("tokens_c"),
            when(and_(priced, tokens > 0), j.gco2).label("gco2_t"),
            when(and_(priced, tokens > 0), tokens).label("tokens_g"),
            when(both, scaled_cf).label("cf"), when(both, j.gco2).label("cf_actual"),
            func.sum(case((and_(j.deadline.is_not(None), j.ended_at > j.deadline), 1), else_=0)).label("late"),
            func.sum(case((or_(j.accounted_at.is_(None), and_(j.energy_j.is_not(None), j.gco2.is_(None))), 1),
                          else_=0)).label("unpriced"),
        ).where(where)
        if keys:
            stmt = stmt.group_by(*keys)
        with self.store.read() as conn:
            return [dict(r) for r in conn.execute(stmt).mappings()]


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
    }


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


def signal_key():
    """The carbon signal a job was priced with; NULL (priced before signals were recorded, at
    the zone's static yearly mean) is the average signal."""
    return func.coalesce(jobs.c.gco2_signal, SIGNAL_AVERAGE)


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
