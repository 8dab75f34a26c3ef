"""The planner's check of each plan against the accounts' limits (`scheduler.budgets`), as
Slurm holds a job at `GrpTRESMins`: after the policy plans, the placed jobs are taken in
priority order and each is let through only while its plan's estimate (GPU-hours, kWh,
grams, times its QOS's usage factor) fits what its account and every ancestor have left this
period after the finished and running jobs and the jobs let through before it. A job that
does not fit is taken out of the plan and waits with a REASON naming the limit; the planner
asks again every tick, so it is planned once the next period begins. Running jobs are never
stopped: they are only counted.

A warning goes to the log once per account, currency and period when its subtree has used
or committed 80 % of a limit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace

from policies import Plan
from policies.types import Assignment
from scheduler.budgets import UNIT, WARN_FRACTION, WORD, Budgets, Usage
from scheduler.fair_share import DEFAULT_ACCOUNT
from scheduler.qos import FLEXIBLE, QosTable

log = logging.getLogger(__name__)


def planned_usage(a: Assignment, job, factor: float) -> Usage:
    """A placed job's estimate as its budget is charged: GPUs x planned runtime, the plan's
    energy and grams, times its QOS's usage factor."""
    runtime_s = a.estimate.runtime_s or job.est_runtime_s or job.time_limit_s or 0.0
    return Usage.of(len(a.gpu_ids) * runtime_s, a.estimate.energy_j or 0.0, a.estimate.gco2 or 0.0).times(factor)


class BudgetGate:
    """Holds placed jobs over their accounts' limits; remembers which 80 % warnings it logged."""

    def __init__(self, qos: QosTable) -> None:
        self.qos = qos
        self._warned: set[tuple[str, str, str]] = set()  # (account, currency, period start)

    def apply(self, budgets: Budgets, plan: Plan, queued: Mapping[int, object],
              order: Iterable[int]) -> tuple[Plan, dict[int, str]]:
        """The plan without the jobs their limits hold back, and each held job's REASON.
        `queued`: the queue's `Job`s by id (account, QOS); `order`: job ids, highest priority
        first (jobs placed but missing from it go last, by id)."""
        placed = plan.by_job()
        ranked = [i for i in order if i in placed]
        ranked += sorted(set(placed) - set(ranked))
        factors = self.qos.usage_factors()
        held: dict[int, str] = {}
        for job_id in ranked:
            job = queued.get(job_id)
            if job is None:
                continue
            account = job.account or DEFAULT_ACCOUNT
            if not any(a in budgets.limits for a in budgets.chain(account)):
                continue
            level = self.qos.levels.get(job.qos)
            flexible = level is not None and level.defer == FLEXIBLE
            need = planned_usage(placed[job_id], job, factors.get(job.qos, 1.0))
            why = budgets.alone_over(account, need, flexible=flexible) or budgets.admit(account, need,
                                                                                       flexible=flexible)
            if why is not None:
                held[job_id] = why
        self._warn(budgets)
        if not held:
            return plan, held
        return replace(plan, assignments=tuple(a for a in plan.assignments if a.job_id not in held),
                       unplaced={**plan.unplaced, **held}), held

    @staticmethod
    def periods(budgets: Budgets | None) -> tuple:
        """The limits in force, their periods and what they have used: when a new period
        begins, an operator changes a limit or a finished job's figures come in, the plan is
        made again, not skipped as unchanged."""
        return () if budgets is None else tuple((s.account, s.limit, s.start, round(s.used, 6))
                                                for s in budgets.standings())

    def _warn(self, budgets: Budgets) -> None:
        for s in budgets.standings():
            key = (s.account, s.limit.currency, s.start.isoformat())
            if s.fraction >= WARN_FRACTION and key not in self._warned:
                self._warned.add(key)
                log.warning("account %s has used or committed %.0f %% of its %s limit (%s used of %s since %s)",
                            s.account, 100 * s.fraction, WORD[s.limit.currency],
                            f"{s.used:.4g} {UNIT[s.limit.currency]}", s.limit.text(), s.start.date())
