"""Admission at submit: refuse what the fleet can never run, warn about what waits for GPUs
out of service.

A job that no GPU of the cluster can ever take (too many GPUs or too much memory for any
node, an SLO no operating point meets, an explicit `--time-limit` below its estimated
runtime on every model) would wait PENDING for ever; it is refused at once with the reason
per GPU model, exit 2 at the CLI, and nothing is stored. The rules are the planner's own
(`policies.pricing.feasibility`, over `policies.model.energy`'s `fits` / `within_time_limit`), applied to
the registered GPUs, with the same profile book (seeds plus what this cluster learned).

GPUs count in two ways:

* **in service**: healthy, not drained, on a node whose agent is alive. A job one of them can
  take is accepted silently.
* **out of service, but coming back**: healthy but drained by an operator, or on a node that
  is down (no heartbeat within `node_timeout_s`). A job only they can take is accepted with a
  warning: it runs when one returns. Unhealthy and lost GPUs count for nothing.

A job that only this cluster's learned profiles would refuse, where the seed model says it
fits (issue 48: one user's runs taught a profile that shuts everyone else's jobs out), is
accepted with a warning that says so: the planner plans it with the seeds
(`policies.pricing.feasibility.learned_refusal`).

With no GPU registered yet, the catalog stands in for the fleet (any known model, up to 1024
per node): a job no known GPU model could take is still refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import exists, select

from policies.model.catalog import catalog
from policies.types import QueuedJob
from scheduler.clock import utcnow
from scheduler.store import Store
from scheduler.store.models import gpu_instances, gpus, nodes
from scheduler.timeparse import format_duration

if TYPE_CHECKING:  # numpy-backed: imported on first use, not with the API
    from policies.model.energy import ProfileBook
    from policies.pricing.feasibility import GpuKind

MAX_GPUS = 1024
INVENTORY_TTL_S = 5.0  # the inventory and profiles change rarely, submits come often
MAX_LISTED = 6  # GPU sets named in a warning


class Refused(Exception):
    """What no GPU set could ever satisfy; `status` follows HTTP (400 malformed, 422 unmeetable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class GpuSet:
    """The healthy GPUs of one model and memory on one node, and whether they are in service."""

    node: str
    model: str
    memory_gib: float
    count: int
    drained: bool
    node_up: bool

    @property
    def in_service(self) -> bool:
        return self.node_up and not self.drained

    @property
    def state(self) -> str:
        return ", ".join(s for s, on in (("drained", self.drained), ("node down", not self.node_up)) if on)


@dataclass(frozen=True)
class Inventory:
    """The registered fleet as admission asks about it, built once per refresh."""

    sets: tuple[GpuSet, ...]
    # one GpuKind per (node, model, memory), drained or not: a gang is on one node
    kinds: tuple[GpuKind, ...]
    serving: tuple[GpuKind, ...]  # the distinct kinds of the GPUs in service (their counts in service)
    book: ProfileBook  # the planner's: seeds plus this cluster's learned profiles

    @classmethod
    def of(cls, sets: list[GpuSet], book: ProfileBook) -> Inventory:
        whole: dict[tuple, int] = {}
        serving: dict[tuple, int] = {}
        for s in sets:
            key = (s.node, s.model, s.memory_gib)
            whole[key] = whole.get(key, 0) + s.count
            if s.in_service:
                serving[key] = serving.get(key, 0) + s.count
        return cls(tuple(sets), tuple(_kind(m, mem, n) for (_, m, mem), n in whole.items()),
                   tuple(_kind(m, mem, n) for m, mem, n in sorted({(m, mem, n) for (_, m, mem), n in serving.items()})),
                   book)

    def whole_kind(self, s: GpuSet) -> GpuKind:
        """The kind `s` belongs to, counting its node's GPUs of that model in any state."""
        n = sum(o.count for o in self.sets if (o.node, o.model, o.memory_gib) == (s.node, s.model, s.memory_gib))
        return _kind(s.model, s.memory_gib, n)


class Admission:
    """Answers "can this cluster ever run this job?" at submit, from a briefly cached inventory."""

    def __init__(self, store: Store, *, node_timeout_s: float = 60.0, default_runtime_s: float = 3600.0,
                 clock: Callable[[], datetime] = utcnow, ttl_s: float = INVENTORY_TTL_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.node_timeout_s = node_timeout_s
        self.default_runtime_s = default_runtime_s
        self._clock = clock
        self._ttl_s = ttl_s
        self._monotonic = monotonic
        self._cached: tuple[float, Inventory] | None = None

    def invalidate(self) -> None:
        """Forget the cached inventory (after a drain or resume)."""
        self._cached = None

    def _inventory(self) -> Inventory:
        """The healthy registered GPUs and the planner's profile book, cached for `ttl_s`."""
        now = self._monotonic()
        if self._cached is not None and now - self._cached[0] < self._ttl_s:
            return self._cached[1]
        from policies.model.energy import ProfileBook, seed_profiles
        from scheduler.profiles import learned_profiles

        fresh_after = self._clock() - timedelta(seconds=self.node_timeout_s)
        with self.store.read() as conn:
            beats = {r.name: r.last_heartbeat for r in conn.execute(select(nodes.c.name, nodes.c.last_heartbeat))}
            # a shared GPU (MIG mode, declared shares) takes slice jobs only (slice_admission)
            shared = exists().where(gpu_instances.c.gpu_id == gpus.c.id)
            rows = list(conn.execute(select(gpus.c.node_name, gpus.c.model, gpus.c.memory_gib, gpus.c.drained)
                                     .where(gpus.c.healthy.is_(True), gpus.c.index >= 0,
                                            gpus.c.mig_enabled.is_(False), ~shared)))
            learned = learned_profiles(conn)
        counts: dict[tuple, int] = {}
        for r in rows:
            beat = beats.get(r.node_name)
            key = (r.node_name, r.model, float(r.memory_gib), bool(r.drained), beat is not None and beat >= fresh_after)
            counts[key] = counts.get(key, 0) + 1
        sets = [GpuSet(node, model, mem, n, drained, up) for (node, model, mem, drained, up), n in sorted(counts.items())]
        inventory = Inventory.of(sets, ProfileBook(seed_profiles() + learned))
        self._cached = (now, inventory)
        return inventory

    def check(self, job: QueuedJob, *, estimated: bool = True) -> str | None:
        """Raise Refused if no GPU of the cluster can ever take `job`; else a warning (None:
        GPUs in service can take it). `estimated`: the user gave a runtime or a prompt count
        (else the refusal says the planner's stand-in runtime decided it)."""
        from policies.pricing.feasibility import kind_verdict, learned_refusal

        if not 1 <= job.gpus <= MAX_GPUS:
            raise Refused(400, f"--gpus must be between 1 and {MAX_GPUS} (got {job.gpus})")
        inv = self._inventory()
        book = inv.book
        if not inv.sets:
            kinds = [_kind(m.name, m.memory_gib, MAX_GPUS) for m in catalog().values()]
            _check_counts(job, kinds, "any known GPU model")
            job, seeded = _seeded(job, kinds, book, self.default_runtime_s)
            self._check_models(job, kinds, book, estimated)
            return _joined(seeded, "no GPU is registered yet: the job waits until a node agent registers one that "
                                   "can take it")
        _check_counts(job, inv.kinds, "any registered GPU")
        job, seeded = _seeded(job, inv.kinds, book, self.default_runtime_s)
        if any(kind_verdict(job, kind, book, self.default_runtime_s) is None for kind in inv.serving):
            return seeded
        self._check_models(job, list(inv.kinds), book, estimated)  # raises: no GPU, in service or not, can take it
        waiting = [s for s in inv.sets if not s.in_service
                   and kind_verdict(job, inv.whole_kind(s), book, self.default_runtime_s) is None]
        named = ", ".join(f"{s.count}x{s.model} on {s.node} ({s.state})" for s in waiting[:MAX_LISTED])
        more = f" and {len(waiting) - MAX_LISTED} more" if len(waiting) > MAX_LISTED else ""
        return _joined(seeded, f"only GPUs out of service can run this job now: {named}{more}; "
                               "it waits until one of them returns")

    def _check_models(self, job: QueuedJob, kinds: list[GpuKind], book: ProfileBook, estimated: bool) -> None:
        """Raise Refused(422) with the reason per GPU model if no kind can take `job`."""
        from policies.pricing.feasibility import estimated_runtime_s, exclusions, unfit_text

        excluded = exclusions(job, kinds, book, self.default_runtime_s)
        if len(excluded) < len({k.model for k in kinds}):
            return
        detailed = {}
        for model, why in excluded.items():
            if why == "time limit":
                why += f": ~{format_duration(estimated_runtime_s(job, model, book, self.default_runtime_s))}"
            elif why == "gang":
                most = max(k.count for k in kinds if k.model == model)
                why += f": at most {most} per node"
            detailed[model] = why
        notes = []
        reasons = set(excluded.values())
        if "slo" in reasons:
            from policies.model.energy import slo_text

            notes.append(f"no operating point meets {slo_text(job)}")
        if "time limit" in reasons:
            notes.append(f"the estimated runtime exceeds --time-limit {format_duration(job.time_limit_s)}")
            if not estimated:  # the planner's stand-in runtime on the reference GPU
                from policies.model.energy import REFERENCE_MODEL

                ran = format_duration(job.est_runtime_s or self.default_runtime_s)
                notes.append(f"without --est-runtime the job is planned as running {ran} on an {REFERENCE_MODEL}: "
                             "give --est-runtime")
        if "memory" in reasons and not job.gpu_mem_gib:
            notes.append(f"the workload does not fit in the memory of {job.gpus} GPU(s)")
        raise Refused(422, unfit_text(detailed) + "".join(f"; {n}" for n in notes))


def _seeded(job: QueuedJob, kinds: Sequence[GpuKind], book: ProfileBook,
            default_runtime_s: float) -> tuple[QueuedJob, str | None]:
    """`job` as the planner will plan it, and the warning to give: with its seed profiles
    when the learned ones alone would refuse it (`policies.pricing.feasibility.learned_refusal`)."""
    from dataclasses import replace

    from policies.pricing.feasibility import learned_refusal

    why = learned_refusal(job, kinds, book, default_runtime_s)
    if why is None:
        return job, None
    return replace(job, seed_profile=why), f"{why}; it is planned with the seed profile (the performance model's)"


def _joined(*warnings: str | None) -> str | None:
    return "; ".join(w for w in warnings if w) or None


def _kind(model: str, memory_gib: float, count: int) -> GpuKind:
    from policies.pricing.feasibility import GpuKind

    return GpuKind(model, memory_gib, count)


def _check_counts(job: QueuedJob, kinds: Sequence[GpuKind], where: str) -> None:
    """The plain inventory questions first, in the words a user asked them: no node has that
    many GPUs of one model, or that much memory per GPU."""
    max_count = max(k.count for k in kinds)
    max_mem = max(k.memory_gib for k in kinds)
    if job.gpus > max_count:
        raise Refused(422, f"--gpus {job.gpus}: no node has that many GPUs of one model (the most is {max_count})")
    if job.gpu_mem_gib > max_mem:
        raise Refused(422, f"--gpu-mem {job.gpu_mem_gib:g} GiB is more than {where} has ({max_mem:g} GiB)")
    if job.gpus > 1 and not any(k.count >= job.gpus and k.memory_gib >= job.gpu_mem_gib for k in kinds):
        raise Refused(422, f"no node has {job.gpus} GPUs of one model with >= {job.gpu_mem_gib:g} GiB")
