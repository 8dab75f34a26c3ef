"""The simulated daemon's job priorities: fair share over the trace's accounts, QOS, age and
size (`scheduler.priority`), from the usage each account's jobs have run so far, decayed as
the daemon decays it (`scheduler.fair_share`). A planner tick gives each queued job its
priority before the policy plans; the policies then let no job delay a higher-priority
job's start (the backfill rule), and carbon chooses within that.

A run whose jobs all have one owner and one QOS has one priority for every job under the
default weights (age and size weigh nothing, `scheduler.priority.PriorityWeights`), so
nothing is computed there and its plans are those of a run without priorities.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.types import J_PER_KWH
from scheduler.fair_share import DEFAULT_HALF_LIFE_S, AccountSpec, AccountTree, Charge, DecayingUsage, FairShare
from scheduler.priority import PriorityJob, PriorityWeights, queue_priorities
from scheduler.qos import DEFAULT_QOS, QosTable
from scheduler.simulate.records import JobRecord
from scheduler.simulate.tenancy import Tenant, run_spans


class SimPriorities:
    """Usage charged as jobs finish, and each queued job's priority at a tick.

    `fair_share` False: every job's fair-share factor is 0 (`simulate --no-fair-share`):
    QOS, age and size alone order the queue.
    """

    def __init__(self, tenants: Mapping[int, Tenant], shares: Mapping[str, int], qos: QosTable | None = None,
                 *, fair_share: bool = True, weights: PriorityWeights | None = None,
                 half_life_s: float = DEFAULT_HALF_LIFE_S, fleet_gpus: int = 1) -> None:
        self.tenants = tenants
        self.fair_share = fair_share
        self.weights = weights or PriorityWeights()
        table = qos or QosTable()
        self.qos_priority = table.priorities()
        self.usage_factor = table.usage_factors()
        self.fleet_gpus = fleet_gpus
        self.tree = AccountTree([AccountSpec(a, None, float(s)) for a, s in shares.items()])
        self.usage = DecayingUsage(half_life_s=half_life_s)
        owners = {(t.account, t.user, t.qos or DEFAULT_QOS) for t in tenants.values()}
        self.active = len(owners) > 1 or bool(self.weights.age) or bool(self.weights.job_size)

    def _owner(self, job_id: int) -> tuple[Tenant, str, str]:
        """The job's owner, its user (a trace without users: the account is its one user) and
        the QOS it is ranked and charged by (none given: the default one's)."""
        t = self.tenants.get(job_id) or Tenant()
        return t, t.user or t.account, t.qos or DEFAULT_QOS

    def charge(self, r: JobRecord) -> None:
        """Charge a finished job's GPU-hours (and energy, grams) to its owner, at its end."""
        if not self.active or r.start_s is None or r.end_s is None:
            return
        t, user, qos = self._owner(r.job.id)
        ran_s = sum(e - s for s, e in run_spans(r))
        self.usage.add(Charge(t.account, user, r.end_s, len(r.gpu_ids) * ran_s / 3600.0,
                              r.energy_j / J_PER_KWH, r.gco2 / 1000.0, usage_factor=self.usage_factor.get(qos, 1.0),
                              duration_s=max(0.0, r.end_s - r.start_s)))

    def priorities(self, now_s: float, queued: list[JobRecord], running: list[JobRecord]) -> dict[int, float]:
        """Each queued job's priority at `now_s` (empty where every job has one priority)."""
        if not self.active or not queued:
            return {}
        factor = None
        if self.fair_share:
            so_far = []
            for r in running:
                begun = r.run_start_s if r.run_start_s is not None else r.start_s
                if begun is None:
                    continue
                t, user, qos = self._owner(r.job.id)
                ran_s = sum(e - s for s, e, _, _ in r.segment_log) + max(0.0, now_s - begun)
                so_far.append(Charge(t.account, user, now_s, len(r.gpu_ids) * ran_s / 3600.0,
                                     usage_factor=self.usage_factor.get(qos, 1.0),
                                     duration_s=max(0.0, now_s - (r.first_start_s or begun))))
            factor = FairShare(self.tree, self.usage.totals(now_s, so_far)).factor
        jobs = []
        for r in queued:
            t, user, qos = self._owner(r.job.id)
            jobs.append(PriorityJob(r.job.id, t.account, user, qos, r.job.gpus, r.arrival_s))
        ranked = queue_priorities(jobs, now_s=now_s, fair_share=factor, qos_priority=self.qos_priority,
                                  fleet_gpus=self.fleet_gpus, weights=self.weights)
        return {int(b.job_id): b.priority for b in ranked}
