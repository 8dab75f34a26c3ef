"""Where each queued job stands: its multifactor priority (`scheduler.priority`: fair share,
QOS, age, size), from the operator's account tree and the decayed usage of the jobs that ran
(`scheduler.fair_share`), and what its QOS lets carbon do with it. The daemon's planner asks
it every tick; `carbonsched share` and `carbonsched priority` show what it computed.

Usage counts each finished job's GPU-hours (or kWh, or kgCO2e as measured, the operator's
`fair_share_currency`) times its QOS's usage factor, decayed with `fair_share_half_life`
(default 7 days), and each running job's GPU-hours so far. Finished usage is read again at
most every `refresh_s` (it changes by a few jobs a minute and decays by a week's half-life;
a tick must not read months of jobs); running usage is read every time, in GPU-hours only
(a running job's energy and grams are known when it ends).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from policies.types import J_PER_KWH
from scheduler.accounts import list_accounts, list_users
from scheduler.budget_book import read_budgets
from scheduler.budgets import Budgets
from scheduler.fair_share import (CURRENCIES, DEFAULT_ACCOUNT, DEFAULT_HALF_LIFE_S, AccountSpec, AccountTree, Charge, DecayingUsage, FairShare,
                                  UserSpec)
from scheduler.jobs.usage import finished_usage, running_usage
from scheduler.priority import PriorityBreakdown, PriorityJob, PriorityWeights, queue_priorities
from scheduler.qos import DEFAULT_QOS, QosTable
from scheduler.timeparse import parse_duration

USAGE_WINDOW_HALF_LIVES = 8  # older usage counts under 0.4 %: not read


@dataclass(frozen=True)
class StandingSettings:
    """How standing is computed (config keys in `scheduler.settings`)."""

    weights: PriorityWeights = field(default_factory=PriorityWeights)
    half_life_s: float = DEFAULT_HALF_LIFE_S
    currency: str = "gpu_hours"
    fair_share: bool = True
    refresh_s: float = 300.0
    flexible_grace_pct: float = 0.0  # [accounting] flexible_grace_pct: how far flexible jobs may pass a limit


# The config tables behind StandingSettings, their keys and what each becomes.
PRIORITY_KEYS = {"weight_fair_share": "fair_share", "weight_qos": "qos", "weight_age": "age",
                 "weight_job_size": "job_size", "max_age": "max_age_s", "favor_small": "favor_small"}
FAIR_SHARE_KEYS = ("half_life", "currency", "enabled")


def _seconds(value: Any, key: str) -> float:
    try:
        seconds = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else \
            parse_duration(str(value))
    except ValueError as e:
        raise ValueError(f"{key}: {e}") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{key} must be a positive duration, e.g. 7d")
    return seconds


def standing_settings(config: Mapping[str, Any], *, flexible_grace_pct: float = 0.0) -> StandingSettings:
    """StandingSettings from a whole config file's `[priority]` (the weights, as Slurm's
    PriorityWeight*: `weight_fair_share`, `weight_qos`, `weight_age`, `weight_job_size`,
    `max_age`, `favor_small`) and `[fair_share]` (`half_life`, `currency`: gpu_hours, kwh or
    kgco2e, `enabled`) tables; ValueError naming the key that is wrong. Unset keys keep
    the defaults (`scheduler.priority`, `scheduler.fair_share`)."""
    prio = config.get("priority") or {}
    share = config.get("fair_share") or {}
    for name, table, known in (("priority", prio, tuple(PRIORITY_KEYS)), ("fair_share", share, FAIR_SHARE_KEYS)):
        if not isinstance(table, Mapping):
            raise ValueError(f"[{name}] must be a table")
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise ValueError(f"[{name}]: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
    weights: dict[str, Any] = {}
    for key, field_name in PRIORITY_KEYS.items():
        if key not in prio:
            continue
        value = prio[key]
        if key == "max_age":
            value = _seconds(value, "[priority] max_age")
        elif key == "favor_small":
            if not isinstance(value, bool):
                raise ValueError("[priority] favor_small must be true or false")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"[priority] {key} must be a number >= 0")
        weights[field_name] = value
    try:
        priority_weights = PriorityWeights(**weights)
    except ValueError as e:
        raise ValueError(f"[priority]: {e}") from None
    currency = share.get("currency", "gpu_hours")
    if currency not in CURRENCIES:
        raise ValueError(f"[fair_share] currency must be one of {', '.join(CURRENCIES)}, got {currency!r}")
    enabled = share.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError("[fair_share] enabled must be true or false")
    half_life = _seconds(share["half_life"], "[fair_share] half_life") if "half_life" in share else DEFAULT_HALF_LIFE_S
    return StandingSettings(weights=priority_weights, half_life_s=half_life, currency=currency,
                            fair_share=enabled, flexible_grace_pct=flexible_grace_pct)


def check_standing_config(name: str, table: Any) -> list[str]:
    """`carbonsched config check`'s view of the table `name` (`priority` or `fair_share`):
    its errors, without the table's name (config check puts it in front)."""
    try:
        standing_settings({name: table})
    except ValueError as e:
        return [str(e).removeprefix(f"[{name}]").lstrip(": ")]
    return []


def _gpus(row) -> int:
    return len(row.gpu_ids) if row.gpu_ids else int(row.gpus or 1)


class Standing:
    """The account tree, the usage and the priorities of one store, cached between ticks."""

    def __init__(self, qos: QosTable, settings: StandingSettings | None = None) -> None:
        self.qos = qos
        self.settings = settings or StandingSettings()
        self._finished: tuple[float, DecayingUsage] | None = None  # (read at, monotonic), usage

    def _finished_usage(self, conn: Connection, now: datetime) -> DecayingUsage:
        cached = self._finished
        if cached is not None and time.monotonic() - cached[0] < self.settings.refresh_s:
            return cached[1]
        s = self.settings
        usage = DecayingUsage(half_life_s=s.half_life_s, currency=s.currency)
        factors = self.qos.usage_factors()
        since = now - timedelta(seconds=s.half_life_s * USAGE_WINDOW_HALF_LIVES)
        for r in finished_usage(conn, since):
            ran_s = max(0.0, (r.ended_at - r.started_at).total_seconds())
            charge = Charge(r.account, r.owner_name, min(r.ended_at, now).timestamp(), _gpus(r) * ran_s / 3600.0,
                            None if r.energy_j is None else r.energy_j / J_PER_KWH,
                            None if r.gco2 is None else r.gco2 / 1000.0,
                            usage_factor=factors.get(r.qos, 1.0), duration_s=ran_s)
            if getattr(charge, s.currency) is not None:  # not measured yet: counted once it is
                usage.add(charge)
        self._finished = (time.monotonic(), usage)
        return usage

    def tree(self, conn: Connection) -> AccountTree:
        """The operator's accounts and associations as a fair-share tree."""
        accounts = [AccountSpec(a["name"], a["parent"], float(a["shares"])) for a in list_accounts(conn)]
        users = [UserSpec(u["account"], u["user"]) for u in list_users(conn)]
        return AccountTree(accounts, users)

    def fair_share(self, conn: Connection, now: datetime, running_rows: Sequence | None = None) -> FairShare:
        """Every association's shares, usage and factor at `now`; `running_rows`: the running
        jobs' `running_usage`, where the caller has read it already."""
        factors = self.qos.usage_factors()
        running = []
        for r in running_usage(conn) if running_rows is None else running_rows:
            ran_s = max(0.0, (now - r.started_at).total_seconds())
            running.append(Charge(r.account, r.owner_name, now.timestamp(), _gpus(r) * ran_s / 3600.0,
                                  0.0, 0.0, usage_factor=factors.get(r.qos, 1.0), duration_s=ran_s))
        usage = self._finished_usage(conn, now).totals(now.timestamp(), running)
        return FairShare(self.tree(conn), usage)

    def budgets(self, conn: Connection, now: datetime) -> Budgets | None:
        """The accounts' limits and what counts against them at `now` (`scheduler.budget_book`),
        each job charged times its QOS's usage factor; None when no account has a limit."""
        return read_budgets(conn, now, self.qos.usage_factors(),
                            flexible_grace_pct=self.settings.flexible_grace_pct)

    def held_by_qos(self, ranked: Sequence, running_rows: Sequence) -> dict[int, str]:
        """The jobs a QOS's `max_gpus_running_per_user` holds back, with their REASON: taken
        in `ranked` order (highest priority first), a job is let through only while its
        user's GPUs running in that QOS plus those let through before it stay within the
        limit. What is let through may be planned at any time, so the limit holds whatever
        the plan. `running_rows`: the running jobs' `running_usage`. Empty where no QOS sets
        the limit."""
        limits = {name: q.max_gpus_running_per_user for name, q in self.qos.levels.items()
                  if q.max_gpus_running_per_user}
        if not limits or not ranked:
            return {}
        used: dict[tuple[str, str], int] = {}
        for r in running_rows:
            if r.qos in limits:
                used[(r.owner_name, r.qos)] = used.get((r.owner_name, r.qos), 0) + _gpus(r)
        held = {}
        for j in ranked:
            limit = limits.get(j.qos)
            if limit is None:
                continue
            key = (j.owner_name, j.qos)
            if used.get(key, 0) + j.gpus > limit:
                held[j.id] = (f"QOS {j.qos} lets a user run {limit} GPU(s) at once; {used.get(key, 0)} running "
                              "or planned first (QOSMaxGPUPerUserLimit)")
            else:
                used[key] = used.get(key, 0) + j.gpus
        return held

    @staticmethod
    def _factor(fs: FairShare):
        """`fs.factor`, with 0 (owed nothing) for an account no longer in the tree: such a
        job is planned after the others, never fails the tick."""
        def factor(account: str, user: str) -> float:
            try:
                return fs.factor(account, user)
            except ValueError:
                return 0.0
        return factor

    def plan_order(self, conn: Connection, jobs: Sequence, now: datetime,
                   fleet_gpus: int) -> tuple[list[PriorityBreakdown], dict[int, str]]:
        """What a planner tick needs: each job's priority, highest first (`priorities`), and
        the jobs a QOS's GPU limit holds back (`held_by_qos`), from one read of the running jobs."""
        if not jobs:
            return [], {}
        running = running_usage(conn)
        ranked = self.priorities(conn, jobs, now, fleet_gpus, running)
        by_id = {j.id: j for j in jobs}
        return ranked, self.held_by_qos([by_id[b.job_id] for b in ranked], running)

    def priorities(self, conn: Connection, jobs: Sequence, now: datetime, fleet_gpus: int,
                   running_rows: Sequence | None = None) -> list[PriorityBreakdown]:
        """Each job's priority (`jobs`: `scheduler.jobs.job.Job`s, or anything with id,
        account, owner_name, qos, gpus and submitted_at), highest first; a QOS no longer
        configured counts as the default one."""
        if not jobs:
            return []
        factor = (self._factor(self.fair_share(conn, now, running_rows)) if self.settings.fair_share
                  else None)
        known = self.qos.levels
        wanted = [PriorityJob(j.id, j.account or DEFAULT_ACCOUNT, j.owner_name or "-",
                              j.qos if j.qos in known else DEFAULT_QOS, j.gpus, j.submitted_at.timestamp())
                  for j in jobs]
        return queue_priorities(wanted, now_s=now.timestamp(), fair_share=factor,
                                qos_priority=self.qos.priorities(), fleet_gpus=fleet_gpus,
                                weights=self.settings.weights)
