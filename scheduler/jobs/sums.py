"""Sums over the jobs table: what fleet reports and the disclosure export add up over the
jobs that ended in a period (`scheduler.accounting`), why a period's unpriced jobs are
unpriced, and the all-time totals the daemon's Prometheus gauges show (`scheduler.metrics`).

Aggregation runs in the database (GROUP BY over the indexed `jobs.ended_at`), so a year of
a busy fleet answers in well under a second (bench/report_bench.py); the statements here are
tuned for that (see `period_filter`). The figures made of the sums are accounting's
(`scheduler.accounting.aggregate`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (Connection, Row, String, and_, case, extract, func, literal, literal_column, or_, select,
                        type_coerce)

from policies.types import J_PER_KWH
from scheduler.jobs.pricing import FINISHED
from scheduler.lifecycle import State
from scheduler.store import Store
from scheduler.store.base import UTCDateTime
from scheduler.store.models import jobs
from scheduler.timeparse import utc_aware
from telemetry.energy import MODELLED
from telemetry.grid.readings import SIGNAL_AVERAGE


@dataclass(frozen=True)
class Prices:
    """What the `usd` sum prices with: USD per GPU-hour by GPU model (0 for another), and
    USD per kWh of facility energy by zone, else `energy_usd_per_kwh`; and what the embodied
    sums price GPU-seconds with: grams per GPU-second by GPU model, {"gpu": g, "host": g}
    (a model missing: unknown, summed as GPU-seconds without a figure, never as 0 g)."""

    energy_usd_per_kwh: float
    gpu_usd_per_hour: Mapping[str, float] = field(default_factory=dict)
    zone_energy_usd_per_kwh: Mapping[str, float] = field(default_factory=dict)
    embodied_g_per_gpu_s: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


def _modelled():
    """A job whose energy is the emulator's power model, not a measurement."""
    return or_(jobs.c.energy_method == MODELLED, jobs.c.energy_method.like(MODELLED + "+%"))


def signal_key():
    """The carbon signal a job was priced with; NULL (priced before signals were recorded, at
    the zone's static yearly mean) is the average signal."""
    return func.coalesce(jobs.c.gco2_signal, SIGNAL_AVERAGE)


def _runtime_s(dialect: str):
    j = jobs.c
    if dialect == "sqlite":
        return (func.julianday(j.ended_at) - func.julianday(j.started_at)) * 86400.0
    return extract("epoch", j.ended_at - j.started_at)


def gpu_seconds(dialect: str):
    """GPUs x the time a finished job ran, in seconds (budgets charge it as GPU-hours)."""
    return jobs.c.gpus * _runtime_s(dialect)


def _day(dialect: str):
    j = jobs.c
    if dialect == "sqlite":
        return func.substr(type_coerce(j.ended_at, String), 1, 10, type_=String)
    return func.to_char(func.timezone("UTC", j.ended_at), "YYYY-MM-DD", type_=String)


def group_column(by: str, dialect: str):
    """The column a period's sums are grouped `by`: user, account, workload, model, zone,
    node or day (the UTC date the job ended)."""
    j = jobs.c
    return {"user": j.owner_name, "account": j.account, "workload": j.workload, "model": j.gpu_model, "zone": j.zone,
            "node": j.node, "day": _day(dialect)}[by]


def account_columns() -> tuple:
    """The per-account statement's grouping (`scheduler.accounting.statements`): the account
    (labelled `key`) and the QOS (labelled `qos`), whose usage factor the charge takes."""
    return (jobs.c.account.label("key"), jobs.c.qos.label("qos"))


def system_columns() -> tuple:
    """The disclosure export's grouping: node, GPU model, zone (a system), and within it the
    energy method, carbon signal, intensity basis and PUE, each labelled by that name."""
    j = jobs.c
    return (j.node.label("node"), j.gpu_model.label("gpu_model"), j.zone.label("zone"),
            j.energy_method.label("method"), signal_key().label("signal"), j.gco2_basis.label("basis"),
            j.pue.label("pue"))


def _cost(runtime_s, prices: Prices):
    j = jobs.c
    rates = [(j.gpu_model == name, usd) for name, usd in sorted(prices.gpu_usd_per_hour.items())]
    rate = case(*rates, else_=0.0) if rates else literal(0.0)
    zone_prices = [(j.zone == z, p) for z, p in sorted(prices.zone_energy_usd_per_kwh.items())]
    price = case(*zone_prices, else_=prices.energy_usd_per_kwh) if zone_prices \
        else literal(prices.energy_usd_per_kwh)
    return (rate * j.gpus * runtime_s / 3600.0
            + func.coalesce(j.energy_j, 0.0) / J_PER_KWH * func.coalesce(j.pue, 1.0) * price)


def _embodied(gpu_s, rates: Mapping[str, Mapping[str, float]]) -> dict:
    """The embodied sums' parts of a job: its GPU-seconds priced per part ("gpu", "host";
    NULL for a model without that figure) and whether each part is known for its model."""
    j = jobs.c
    out = {}
    for part in ("gpu", "host"):
        known = sorted(name for name, r in rates.items() if part in r)
        rate = case(*[(j.gpu_model == name, rates[name][part]) for name in known], else_=None) if known \
            else literal(None)
        out[part] = (gpu_s * rate, j.gpu_model.in_(known))
    return out


def period_filter(store: Store, since: datetime, until: datetime, owner_uid: int | None):
    """The condition on `jobs` of the finished jobs (that ran) which ended in [since, until),
    only `owner_uid`'s when given."""
    j = jobs.c
    ended = j.ended_at
    if store.dialect == "sqlite" and owner_uid is None and _mostly_covered(store, since, until):
        # SQLite's planner takes ix_jobs_ended_at even for a range holding most rows, and
        # 100,000 index lookups are ~8x slower than one scan; `+col` makes it scan.
        ended = literal_column("+jobs.ended_at", UTCDateTime())
    cond = [ended >= utc_aware(since, "since"), ended < utc_aware(until, "until"),
            j.started_at.is_not(None), j.state.in_(FINISHED)]
    if owner_uid is not None:
        cond.append(j.owner_uid == owner_uid)
    return and_(*cond)


def _mostly_covered(store: Store, since: datetime, until: datetime) -> bool:
    """Whether [since, until) spans over a quarter of the time the finished jobs span."""
    with store.read() as conn:
        first, last = conn.execute(select(func.min(jobs.c.ended_at), func.max(jobs.c.ended_at))).one()
    if first is None or last is None or last <= first:
        return True
    overlap = (min(until, last) - max(since, first)).total_seconds()
    return overlap > 0.25 * (last - first).total_seconds()


def finished_sums(store: Store, where: Any, keys: Sequence = (), *, prices: Prices) -> list[dict]:
    """The sums over the jobs matching `where` (`period_filter`), one dict per group of
    `keys` (labelled columns; none: one row): jobs, completed, GPU-seconds, energy (IT,
    facility, modelled), gCO2 and what was priced, prompts and tokens (reported or declared)
    and the gCO2, energy and USD of the jobs that count them, the if-run-now counterfactual,
    deadline misses and unpriced jobs."""
    j = jobs.c
    runtime = _runtime_s(store.dialect)
    cost = _cost(runtime, prices)
    priced = j.gco2.is_not(None)
    # the work done: reported by the job, else declared at submit (receipts say the same)
    prompts = func.coalesce(j.reported_prompts, j.prompts)
    tokens = func.coalesce(j.reported_output_tokens, j.tokens)
    with_prompts = and_(priced, prompts > 0)
    with_tokens = and_(tokens > 0, j.energy_j.is_not(None))
    both = and_(priced, j.est_gco2_if_now.is_not(None))
    modelled = _modelled()
    # the counterfactual of each job as its receipt has it: measured x (if-now / planned
    # estimate), or the raw if-now estimate where the plan's own estimate is missing
    scaled_cf = case((j.est_gco2 > 0, j.gco2 * j.est_gco2_if_now / j.est_gco2), else_=j.est_gco2_if_now)
    # embodied: GPU-seconds x the model's grams per GPU-second, by part; never added to gco2.
    # The SCI-style set: jobs with operational grams, prompts and a GPU figure.
    gpu_s = j.gpus * runtime
    emb = _embodied(gpu_s, prices.embodied_g_per_gpu_s)
    (gpu_g, gpu_known), (host_g, host_known) = emb["gpu"], emb["host"]
    sci = and_(with_prompts, gpu_known)

    def when(cond, value):
        return func.sum(case((cond, value), else_=None))

    stmt = select(
        *keys,
        func.count().label("jobs"),
        func.sum(case((j.state == State.COMPLETED.value, 1), else_=0)).label("completed"),
        func.sum(gpu_s).label("gpu_s"),
        func.sum(gpu_g).label("embodied_gpu_g"), when(gpu_known, gpu_s).label("embodied_gpu_s"),
        func.sum(host_g).label("embodied_host_g"), when(host_known, gpu_s).label("embodied_host_gpu_s"),
        when(sci, j.gco2).label("gco2_s"), when(sci, prompts).label("prompts_s"),
        when(sci, gpu_g + func.coalesce(host_g, 0.0)).label("embodied_g_s"),
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
    with store.read() as conn:
        return [dict(r) for r in conn.execute(stmt).mappings()]


def unpriced_by_zone(conn: Connection, where: Any) -> list[Row]:
    """Per zone, the jobs matching `where` without a gCO2 figure: (zone, how many, how many
    of them have no measured energy)."""
    j = jobs.c
    return conn.execute(select(j.zone, func.count(), func.sum(case((j.energy_j.is_(None), 1), else_=0)))
                        .where(where, j.gco2.is_(None)).group_by(j.zone)).all()


# -- The daemon's gauges: totals over every job ----------------------------------------------

def energy_and_gco2_totals(conn: Connection) -> list[Row]:
    """Energy and gCO2 of every job, per (modelled: 1 or 0, carbon signal `signal_key`):
    rows (m, sig, joules, grams), sums 0 where none."""
    return conn.execute(select(
        case((_modelled(), 1), else_=0).label("m"), signal_key().label("sig"),
        func.coalesce(func.sum(jobs.c.energy_j), 0.0),
        func.coalesce(func.sum(jobs.c.gco2), 0.0)).group_by("m", "sig")).all()


def work_totals(conn: Connection) -> dict[str, list[Row]]:
    """The work of every job with a gCO2 figure: for "prompts" and "tokens" (output tokens),
    rows (method: measured | modelled, source: reported by the job | declared at submit,
    signal, count, its grams, its joules) over the jobs that count them (0 where none)."""
    j = jobs.c
    modelled = _modelled()
    signal = signal_key()
    work = {}
    for what, reported, declared in (("prompts", j.reported_prompts, j.prompts),
                                     ("tokens", j.reported_output_tokens, j.tokens)):
        count = func.coalesce(reported, declared)
        counted = and_(j.gco2.is_not(None), count > 0)
        work[what] = conn.execute(select(
            case((modelled, "modelled"), else_="measured").label("m"),
            case((reported.is_not(None), "reported"), else_="declared").label("s"),
            signal.label("sig"),
            func.coalesce(func.sum(case((counted, count), else_=0)), 0),
            func.coalesce(func.sum(case((counted, j.gco2), else_=0.0)), 0.0),
            func.coalesce(func.sum(case((counted, j.energy_j), else_=0.0)), 0.0),
        ).group_by("m", "s", "sig")).all()
    return work


def embodied_totals(conn: Connection, rates: Mapping[str, Mapping[str, float]]) -> list[Row]:
    """Embodied carbon of every job that ran (started and ended), per (modelled: 1 or 0):
    rows (m, GPU grams, host grams, GPU-seconds with a GPU figure, GPU-seconds without one);
    `rates` as `Prices.embodied_g_per_gpu_s`. Never added to the gCO2 totals."""
    j = jobs.c
    gpu_s = j.gpus * _runtime_s(conn.dialect.name)
    emb = _embodied(gpu_s, rates)
    (gpu_g, gpu_known), (host_g, _) = emb["gpu"], emb["host"]
    return conn.execute(select(
        case((_modelled(), 1), else_=0).label("m"),
        func.coalesce(func.sum(gpu_g), 0.0), func.coalesce(func.sum(host_g), 0.0),
        func.coalesce(func.sum(case((gpu_known, gpu_s), else_=0.0)), 0.0),
        func.coalesce(func.sum(case((gpu_known, 0.0), else_=gpu_s)), 0.0),
    ).where(j.started_at.is_not(None), j.ended_at.is_not(None)).group_by("m")).all()
