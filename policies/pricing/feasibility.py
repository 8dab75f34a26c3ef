"""Which GPU models of a fleet can ever take a job, and why the others cannot.

The planner's own exclusion rules, asked of one job against an inventory, without a plan:
the API asks them at submit, to refuse at once a job that no GPU of the cluster could ever
run (it would wait for ever) and to warn about one that only GPUs now out of service could
run; `Problem` asks the same questions, vectorised, of every (job, GPU group) pair per tick.
One answer per question: the rules themselves live in `policies.model.energy` (`fits`,
`within_time_limit`, `job_shape`); this module only applies them per GPU kind and words
the result the way greedy words an unplaceable job ("fits no GPU model: H100 (slo)").

A GPU model is excluded for a job when none of its kinds (its GPUs on one node) can take
it, in the planner's order of reasons:

* "memory": the GPU has less than the job's `--gpu-mem`, or no operating point of its
  workload fits in memory on `job.gpus` of them;
* "slo": no operating point meets its latency SLOs (or it has an SLO and no latency model);
* "time limit": its estimated runtime there exceeds its explicit `--time-limit`;
* "gang": the node has fewer GPUs of that model than the job asks for (a job's GPUs are
  on one node and of one model).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from policies.model.energy import ProfileBook, fits, job_shape, within_time_limit
from policies.types import GpuSlot, QueuedJob


@dataclass(frozen=True)
class GpuKind:
    """The GPUs of one model on one node, as far as taking a job goes."""

    model: str
    memory_gib: float
    count: int  # how many of them the node has


def gpu_kinds(gpus: Iterable[GpuSlot]) -> list[GpuKind]:
    """The kinds of `gpus`: one per model, memory and number of such GPUs on a node (two
    nodes of 8 H100s are one kind), in a stable order."""
    count: dict[tuple[str, str, float], int] = defaultdict(int)
    for g in gpus:
        count[(g.node, g.model, float(g.memory_gib))] += 1
    return sorted({GpuKind(model, memory, n) for (_, model, memory), n in count.items()},
                  key=lambda k: (k.model, k.memory_gib, k.count))


def planning_runtime_s(est_runtime_s: float | None, time_limit_s: float | None,
                       default_runtime_s: float) -> float | None:
    """The runtime a queued job is planned with on the reference GPU (None: the snapshot's
    default): its `--est-runtime`; without one, its `--time-limit` when that is shorter than
    the default runtime (a job that cannot run longer than 2 s is not planned for an hour)."""
    if est_runtime_s is not None:
        return est_runtime_s
    if time_limit_s is not None and time_limit_s < default_runtime_s:
        return time_limit_s
    return None


def kind_verdict(job: QueuedJob, kind: GpuKind, book: ProfileBook, default_runtime_s: float) -> str | None:
    """None if `kind` can take `job`, else why not ("memory", "slo", "time limit", "gang")."""
    why = fits(job, kind.model, kind.memory_gib, book)
    if why is not None:
        return why
    if not within_time_limit(job, kind.model, book, default_runtime_s):
        return "time limit"
    if kind.count < max(1, job.gpus):
        return "gang"
    return None


def exclusions(job: QueuedJob, kinds: Iterable[GpuKind], book: ProfileBook,
               default_runtime_s: float) -> dict[str, str]:
    """Every model of `kinds` that cannot take `job`, with why: model -> reason. A model
    absent from the answer has some kind that can. A model whose kinds fail for different
    reasons is reported by its largest kind (most GPUs, then most memory): the one closest
    to taking the job."""
    verdict: dict[str, str | None] = {}
    for kind in sorted(kinds, key=lambda k: (k.model, -k.count, -k.memory_gib)):
        if kind.model in verdict and verdict[kind.model] is None:
            continue
        why = kind_verdict(job, kind, book, default_runtime_s)
        if why is None or kind.model not in verdict:
            verdict[kind.model] = why
    return {m: w for m, w in verdict.items() if w is not None}


def unfit_text(excluded: Mapping[str, str]) -> str:
    """An unplaceable job's reason as greedy and the API word it, e.g.
    "fits no GPU model: H100 (slo), MI300X (slo)"."""
    return "fits no GPU model: " + ", ".join(f"{m} ({r})" for m, r in sorted(excluded.items()))


def learned_refusal(job: QueuedJob, kinds: Iterable[GpuKind], book: ProfileBook,
                    default_runtime_s: float) -> str | None:
    """Why the learned figures alone would refuse `job`, when they would (issue 48): with the
    book's learned profiles no model of `kinds` can take it, but with the seed profiles some
    model can. Then the job is planned with its seeds (`QueuedJob.seed_profile` = this
    text): a learned profile is what runs here taught, and one user's runs must never shut
    a job out that the performance model says fits. None: nothing to fall back from."""
    kinds = list(kinds)
    if job.workload is None or job.seed_profile is not None or not kinds:
        return None
    models = {k.model for k in kinds}
    learned = exclusions(job, kinds, book, default_runtime_s)
    if len(learned) < len(models):
        return None
    seeded = exclusions(replace(job, seed_profile="seed"), kinds, book, default_runtime_s)
    if len(seeded) == len(models):
        return None
    return f"with the profile learned here, {job.workload} {unfit_text(learned)}"


def estimated_runtime_s(job: QueuedJob, model: str, book: ProfileBook, default_runtime_s: float) -> float:
    """The job's estimated runtime on `model` (what a "time limit" exclusion compares)."""
    return job_shape(job, model, book, default_runtime_s).runtime_s
