"""Each placed job's operating point written into the plan, for its reader.

The planner's policies price a job on a GPU model through its operating point (batch limit,
precision, tensor-parallel degree: `policies.model.operating_point`, chosen per job by
`policies.model.energy.model_choice`), but their assignments carry only the energy model's figures.
`annotate` adds the point the job runs at on the GPUs it was given, and why, after planning.
It sits above both modules (it needs the profile book of `policies.model.energy` and the choice of
`policies.model.operating_point`), so neither of them imports the other's caller.
"""

from __future__ import annotations

from dataclasses import replace

from policies.model.energy import ProfileBook, model_choice, seed_profiles
from policies.types import Plan, Snapshot
from policies.model.operating_point import Choice


def annotate(snapshot: Snapshot, plan: Plan) -> Plan:
    """`plan` with each placed job's operating point on its chosen GPUs: the point in its
    estimate (`max_batch`, `precision`, `tp`) and why in its explanation ("H200 at batch 64
    BF16 TP1: TPOT p95 38 ms <= 40 ms (binding), ..."); a binding SLO becomes the plan's
    `binding` when nothing else bound it. Assignments that already carry a point (kept,
    pinned) and jobs without a performance-model workload are left as they are."""
    jobs = {j.id: j for j in snapshot.jobs}
    model_of = {g.id: g.model for g in snapshot.gpus}
    book: ProfileBook | None = None
    out = []
    for a in plan.assignments:
        job = jobs.get(a.job_id)
        if job is None or job.workload is None or not a.gpu_ids or a.estimate.max_batch is not None:
            out.append(a)
            continue
        if book is None:
            book = ProfileBook(snapshot.profiles) if snapshot.profiles else ProfileBook(seed_profiles())
        c = model_choice(job, model_of.get(a.gpu_ids[0], ""), book)
        if not isinstance(c, Choice) or not c.inference:  # training presets: no serving point
            out.append(a)
            continue
        p = c.point
        est = replace(a.estimate, max_batch=p.max_batch, precision=p.precision, tp=p.tp,
                      binding=a.estimate.binding or ("slo" if c.binding else None))
        why = c.describe()
        out.append(replace(a, estimate=est, explanation=f"{a.explanation}; {why}" if a.explanation else why))
    return replace(plan, assignments=tuple(out))
