"""A planner tick never fails because of what one job asks.

`GuardedPolicy` wraps a policy (the daemon's, the simulator's) in two defences:

1. **Screening, before any solver.** A job that no usable GPU of the snapshot can ever take
   (memory, latency SLO, an explicit time limit shorter than its runtime on every model, a gang
   wider than any node's pool of one model) is set aside with its reason, per GPU model, the
   same words greedy uses ("fits no GPU model: H100 (slo), MI300X (slo)"). The solvers see
   only jobs that have at least one option, so a queue of impossible jobs costs nothing and
   breaks nothing (an all-infeasible queue made the LP bound index an empty array).
2. **A fallback chain.** If the policy still raises, the next one in `fallbacks` plans the
   queue (cpsat -> greedy -> fifo). The job(s) that made the first policy raise are found by
   halving the queue with a time-limited copy of it, held with reason "planner error: ..."
   and everyone else is planned by the first policy as usual. Where isolation does not
   converge within a few calls, the fallback plans everyone.

Screening is per job and never raises: a job whose feasibility cannot even be computed is
held with "planner error: ..." too. `failures` counts the plans in which a policy raised (the
simulator reports it; the daemon logs each with its traceback).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from policies.model.energy import ProfileBook, seed_profiles
from policies.pricing.feasibility import exclusions, gpu_kinds, unfit_text
from policies.types import Plan, QueuedJob, Snapshot

log = logging.getLogger(__name__)

# At most this many extra plans are made to find the job(s) that make a policy raise.
MAX_ISOLATION_CALLS = 24
# A time-limited policy (cpsat) isolates with this much time per call.
ISOLATION_TIME_S = 0.2
PLANNER_ERROR = "planner error"


def screen(snapshot: Snapshot) -> dict[int, str]:
    """Jobs of the snapshot that no usable GPU can ever take, with the reason (job id -> text).

    "Usable" is healthy and not drained: a job that fits only GPUs that are down or drained is
    set aside here (it would be planned if they came back; `submit` accepted it with a
    warning). The rules are the planner's own, per GPU kind (`policies.pricing.feasibility`)."""
    book = ProfileBook(snapshot.profiles) if snapshot.profiles else ProfileBook(seed_profiles())
    kinds = gpu_kinds(g for g in snapshot.gpus if g.healthy and not g.drained)
    if not kinds:
        return {j.id: "no usable GPUs" for j in snapshot.jobs if not (j.pinned and j.id in snapshot.pinned)}
    out: dict[int, str] = {}
    verdicts: dict[tuple, str | None] = {}
    for job in snapshot.jobs:
        if job.pinned and job.id in snapshot.pinned:
            continue  # starts this tick on GPUs already chosen
        key = _feasibility_key(job)
        if key not in verdicts:
            try:
                excluded = exclusions(job, kinds, book, snapshot.default_runtime_s)
                fit = {k.model for k in kinds} - set(excluded)
                verdicts[key] = None if fit else unfit_text(excluded)
            except Exception as e:  # noqa: BLE001 - one job's arithmetic must not stop the tick
                log.exception("planner: job %s cannot be screened", job.id)
                verdicts[key] = f"{PLANNER_ERROR}: {type(e).__name__}: {e}"
        why = verdicts[key]
        if why is not None:
            out[job.id] = why
    return out


def _feasibility_key(job: QueuedJob) -> tuple:
    """What the verdict depends on: jobs equal here share it."""
    limit = (job.time_limit_s, job.est_runtime_s, job.prompts) if job.time_limit_s is not None else None
    return (job.gpus, float(job.gpu_mem_gib), job.workload, job.latency_slo_ms, job.ttft_slo_ms,
            job.tpot_slo_ms, limit)


def without(snapshot: Snapshot, job_ids: set[int] | frozenset[int]) -> Snapshot:
    """The snapshot without these jobs (and their pinned, kept and previous plans)."""
    if not job_ids:
        return snapshot
    return replace(snapshot, jobs=tuple(j for j in snapshot.jobs if j.id not in job_ids),
                   pinned={i: a for i, a in snapshot.pinned.items() if i not in job_ids},
                   keep={i: a for i, a in snapshot.keep.items() if i not in job_ids},
                   previous={i: a for i, a in snapshot.previous.items() if i not in job_ids})


def only(snapshot: Snapshot, job_ids: Sequence[int]) -> Snapshot:
    """The snapshot with only these jobs."""
    keep = set(job_ids)
    return without(snapshot, {j.id for j in snapshot.jobs if j.id not in keep})


@dataclass
class GuardedPolicy:
    """`policy` with screening and a fallback chain (see the module docstring). Attributes
    the wrapper does not have (`max_time_s`, `plan_problem`, ...) are the policy's own."""

    policy: object
    fallbacks: tuple[object, ...] = ()
    failures: int = 0  # plans in which the policy (or a fallback) raised
    held: dict[int, str] = field(default_factory=dict)  # the last plan's "planner error" jobs

    @property
    def name(self) -> str:
        return self.policy.name  # type: ignore[attr-defined]

    def __getattr__(self, item: str):
        # only reached for attributes the wrapper lacks; `policy` itself is a field
        if item in ("policy", "fallbacks", "__setstate__"):
            raise AttributeError(item)
        return getattr(self.policy, item)

    def plan(self, snapshot: Snapshot) -> Plan:
        set_aside = screen(snapshot)
        inner = without(snapshot, set(set_aside))
        self.held = {}
        plan = self._plan_or_fall_back(inner)
        unplaced = dict(plan.unplaced)
        unplaced.update(set_aside)
        unplaced.update(self.held)
        return Plan(assignments=plan.assignments, unplaced=unplaced)

    def _plan_or_fall_back(self, snapshot: Snapshot) -> Plan:
        try:
            return self.policy.plan(snapshot)  # type: ignore[attr-defined]
        except Exception as first:  # noqa: BLE001 - one job's input must not fail the tick
            self.failures += 1
            log.exception("planner: policy %s raised on %d jobs; isolating the job(s) that make it raise",
                          self.name, len(snapshot.jobs))
            culprits = self._isolate(snapshot)
            if culprits is not None and len(culprits) < len(snapshot.jobs):
                why = f"{PLANNER_ERROR}: {type(first).__name__}: {first}"
                try:
                    plan = self.policy.plan(without(snapshot, culprits))  # type: ignore[attr-defined]
                except Exception:  # noqa: BLE001
                    log.exception("planner: policy %s raised again without jobs %s", self.name, sorted(culprits))
                else:
                    self.held = {i: why for i in sorted(culprits)}
                    log.error("planner: jobs %s held (%s); the other %d planned by %s", sorted(culprits), why,
                              len(snapshot.jobs) - len(culprits), self.name)
                    return plan
            for fallback in self.fallbacks:
                try:
                    plan = fallback.plan(snapshot)  # type: ignore[attr-defined]
                except Exception:  # noqa: BLE001
                    log.exception("planner: fallback policy %s raised too", fallback.name)  # type: ignore[attr-defined]
                    continue
                log.error("planner: %s raised (%s: %s); this tick planned by %s", self.name,
                          type(first).__name__, first, fallback.name)  # type: ignore[attr-defined]
                return plan
            why = f"{PLANNER_ERROR}: {type(first).__name__}: {first}"
            self.held = {j.id: why for j in snapshot.jobs}
            return Plan(assignments=(), unplaced={})

    def _isolate(self, snapshot: Snapshot) -> set[int] | None:
        """The jobs that make the policy raise, by halving (None: not found within
        MAX_ISOLATION_CALLS plans). A time-limited policy isolates on a short budget."""
        probe = self.policy
        if hasattr(probe, "max_time_s") and hasattr(probe, "__dataclass_fields__"):
            try:
                probe = replace(probe, max_time_s=min(float(probe.max_time_s), ISOLATION_TIME_S))  # type: ignore[arg-type]
            except (TypeError, ValueError):
                probe = self.policy
        calls = 0

        def raises(ids: Sequence[int]) -> bool:
            nonlocal calls
            calls += 1
            try:
                probe.plan(only(snapshot, ids))  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001
                return True
            return False

        found: set[int] = set()
        stack = [[j.id for j in snapshot.jobs]]
        while stack:
            ids = stack.pop()
            if calls >= MAX_ISOLATION_CALLS:
                return None
            if len(ids) == 1:
                if raises(ids):
                    found.add(ids[0])
                continue
            half = len(ids) // 2
            a, b = ids[:half], ids[half:]
            ra, rb = raises(a), raises(b)
            if not ra and not rb:  # only together: hold both halves' smaller side
                found.update(a if len(a) <= len(b) else b)
                continue
            if ra:
                stack.append(a)
            if rb:
                stack.append(b)
        return found or None


def guarded(policy: object, fallbacks: Sequence[object] = ()) -> GuardedPolicy:
    """`policy` wrapped by `GuardedPolicy` (never twice)."""
    if isinstance(policy, GuardedPolicy):
        return policy
    return GuardedPolicy(policy, tuple(fallbacks))


def guarded_policy(name: str, params: Mapping[str, object] | None = None) -> GuardedPolicy:
    """The policy `name` built with `params`, guarded by its fallback chain: the one way the
    daemon (`scheduler.daemon.policy_factory`) and the simulator build a policy by name, so
    that a policy that raises never fails a tick in either."""
    from policies.base import get_policy

    return guarded(get_policy(name, **(params or {})), [get_policy(f) for f in fallback_chain(name)])


def fallback_chain(name: str) -> tuple[str, ...]:
    """The policies that plan a tick in place of `name` when it raises: cpsat -> greedy ->
    fifo; greedy and edf -> fifo; fifo has none."""
    return {"cpsat": ("greedy", "fifo"), "oracle": ("greedy", "fifo"), "greedy": ("fifo",),
            "edf": ("fifo",)}.get(name, ())
