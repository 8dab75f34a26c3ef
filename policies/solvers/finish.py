"""What the planner does to a policy's plan before it commits it: the one step after the
policy, in the daemon (`scheduler.daemon.planner`) and in the simulator
(`scheduler.simulate.planning`).

1. each placed job's operating point in its estimate and explanation
   (`policies.model.point_annotation`; the daemon's plans are read by people, the simulator's are
   not: it skips this with `points=False`, which changes no figure, only the words of a
   simulated job's explanation and the time a tick takes);
2. a GPU power limit where operators allow caps (`policies.pricing.power_cap.choose_caps`);
3. a job planned with its seed profiles says so in its explanation;
4. starts held back by the budgets' ramp limits (`policies.pricing.ramp`), counting the starts of the
   last minute that `recent` gives (read only where a budget has a ramp limit).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from policies.types import Plan, Snapshot, budget_of
from policies.pricing.ramp import RecentStart, stagger_starts


def finish_plan(snapshot: Snapshot, plan: Plan, *, points: bool = True,
                ramps_w_per_min: Mapping[str, float] | None = None,
                recent: Callable[[], Iterable[RecentStart]] = tuple) -> Plan:
    """`plan` as the planner commits it: with operating points (unless `points` is False),
    power limits, the seed-profile note, and starts staggered by `ramps_w_per_min` (budget
    key -> W per minute; none: no ramp) given the `recent()` starts."""
    from policies.pricing.power_cap import choose_caps

    if points:
        from policies.model.point_annotation import annotate

        plan = annotate(snapshot, plan)
    plan = with_seed_note(snapshot, choose_caps(snapshot, plan))
    if not ramps_w_per_min:
        return plan
    return stagger_starts(plan, snapshot.now, {g.id: budget_of(g) for g in snapshot.gpus}, ramps_w_per_min,
                          list(recent()), pinned=snapshot.pinned)


def with_seed_note(snapshot: Snapshot, plan: Plan) -> Plan:
    """`plan` with the explanation of each job planned with its seed profile saying so."""
    seeded = {j.id: j.seed_profile for j in snapshot.jobs if j.seed_profile is not None}
    if not seeded:
        return plan
    return replace(plan, assignments=tuple(
        replace(a, explanation=f"{a.explanation}; planned with the seed profile: {seeded[a.job_id]}".lstrip("; "))
        if a.job_id in seeded else a for a in plan.assignments))
