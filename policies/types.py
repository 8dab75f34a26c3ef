"""Plain, frozen data that flows into and out of a policy.

A policy sees only these types. Times are timezone-aware UTC datetimes; durations are
seconds in fields named `*_s`; memory is GiB in fields named `*_gib`.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from collections.abc import Mapping
from datetime import datetime
from typing import Any

J_PER_KWH = 3.6e6  # joules in a kilowatt-hour: every J -> kWh in the policies, the simulator and accounting


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting for GPUs (PENDING, or PLANNED but not yet started)."""

    id: int
    gpus: int
    gpu_mem_gib: float
    submitted_at: datetime
    est_runtime_s: float | None = None
    deadline: datetime | None = None
    latency_slo_ms: float | None = None
    workload: str | None = None
    prompts: int | None = None
    max_delay_s: float | None = None  # start no later than submitted_at + this
    pinned: bool = False  # its start falls in the current tick: keep its GPUs and start
    # The user's explicit --time-limit: binding, no option whose estimated runtime exceeds it.
    time_limit_s: float | None = None
    # A limit derived from --est-runtime follows the plan: runtime on the chosen GPUs x this
    # (the estimate's `time_limit_s`); it never constrains the plan.
    time_limit_factor: float | None = None
    # p95 time to first token and time per output token limits (ms), beside `latency_slo_ms`
    # (p95 per-prompt latency); None: the workload preset's default (policies.model.operating_point).
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    # How far one run strays from `est_runtime_s` (relative, one sigma), where that is an
    # estimate whose error was learned from the runs of its class
    # (`policies.model.runtime_correction`); None: not known. `policies.model.margin` widens the job's
    # deadline margin by it.
    runtime_rel_uncertainty: float | None = None
    # The spread of that error as multipliers of `est_runtime_s` that sample the real length
    # evenly (each equally likely; `policies.model.length_spread`): the job is priced by its
    # expected grams over them. Empty: priced at `est_runtime_s` alone.
    length_spread: tuple[float, ...] = ()
    # The "if run now" counterfactual fixed when the job was first planned
    # (policies.pricing.counterfactual); None: not planned yet, the policy computes it. It changes no
    # plan, only what the plan is compared with, so it is left out of equality and hashing
    # (an unchanged queue still skips a re-plan once the figure is stored).
    gco2_if_now: float | None = field(default=None, compare=False)
    # Interruptible work (issue 30): "checkpoint" (the job saves its state when told and exits
    # to be resumed later, possibly on other GPUs of the same model) or "pause" (stopped in
    # place: its GPUs stay held and draw idle power); None: it runs in one piece.
    interruptible: str | None = None
    min_run_s: float | None = None  # the shortest useful segment; None: any
    resume_cost_s: float = 0.0  # time lost per resume (reload, warm-up), added to each later segment
    max_segments: int = 4  # the most segments a plan may cut it into, the first included
    # Work already done by earlier segments, as a fraction of the whole job (0: none): the
    # planner plans the rest, plus one resume cost when it is above 0.
    done_fraction: float = 0.0
    resume_count: int = 0  # segments already run (CARBONSCHED_RESUME_COUNT of the next one)
    # Why this job is planned with the seed profiles of its workload, not the learned ones
    # (issue 48): the learned figures would exclude every GPU model the seeds let it run on
    # (`policies.pricing.feasibility.learned_refusal`). None: the profile book as it is.
    seed_profile: str | None = None
    # Standing under contention (a multifactor priority the daemon computes; higher goes
    # first): a job may take GPUs a higher-priority job wants only where that does not delay
    # the higher one's planned start (`policies.solvers.priority`). Equal priorities: each
    # policy's own order.
    priority: float = 0.0
    # How far carbon may move the start beyond the earliest start the job could have on
    # fitting GPUs (given running work and jobs of higher priority): 0 starts it on the first
    # free fitting GPUs, never held for carbon; None: anywhere up to its deadline.
    max_defer_s: float | None = None
    # The smallest saving worth waiting for: a start later than the earliest one is taken only
    # where it saves at least `min_saving_gco2` grams AND `min_saving_frac` of the grams of
    # that earliest start; otherwise the job runs at its earliest start
    # (`policies.pricing.worth`). 0, 0: any saving is worth it.
    min_saving_gco2: float = 0.0
    min_saving_frac: float = 0.0

    def derived_time_limit_s(self, runtime_s: float) -> float | None:
        """The time limit that follows a plan with this estimated runtime on its chosen GPUs:
        `time_limit_factor` x that runtime, but never less than `time_limit_factor` x the
        user's own `est_runtime_s`. The catalog's speed ratios are estimates: a job the user
        said runs 20 s must not be killed at 28 s because a faster GPU was expected to take
        14 s (issue 24). A slower GPU lengthens the limit, as its runtime does. None: the
        job has no derived limit (an explicit one, or no estimate)."""
        if not self.time_limit_factor:
            return None
        return max(runtime_s, self.est_runtime_s or 0.0) * self.time_limit_factor


@dataclass(frozen=True)
class GpuSlot:
    """One GPU as the planner sees it: where it is, what it is, and when it is next free."""

    id: int
    node: str
    zone: str
    index: int
    model: str
    memory_gib: float
    healthy: bool = True
    busy_until: datetime | None = None  # None: free now
    drained: bool = False  # healthy but closed to new work by an operator
    # The PUE of the site (data centre) the GPU's node is in; None: its zone's default in
    # `Snapshot.pue`. One grid zone can hold sites with different PUEs.
    pue: float | None = None
    power_limit_w: float | None = None  # the board power limit now: no estimate draws more
    # The power budget the GPU is under: `site:NAME` when its node is in a `[sites.NAME]` with
    # a budget of its own; None: its zone's (`budget_of`). One grid zone can hold several
    # sites, each behind its own feed.
    budget: str | None = None


def budget_of(gpu: GpuSlot) -> str:
    """The key of the power budget `gpu` draws against (`PowerCap.zone`): its site's
    (`site:NAME`) where its site has one, else its zone's."""
    return gpu.budget or gpu.zone


SITE_BUDGET_PREFIX = "site:"


def site_budget(site: str) -> str:
    """The budget key of `[sites.SITE]` (never equal to a zone id)."""
    return SITE_BUDGET_PREFIX + site


def budget_text(key: str) -> str:
    """A budget key in words: `site fra-dc2` or `zone DE`."""
    if key.startswith(SITE_BUDGET_PREFIX):
        return f"site {key[len(SITE_BUDGET_PREFIX):]}"
    return f"zone {key}"


#: Cells of a `Climatology`: 12 months x 24 UTC hours of the day.
CLIMATOLOGY_CELLS = 12 * 24


@dataclass(frozen=True)
class Climatology:
    """A zone's typical carbon intensity by month and hour of the day (UTC): what a planner
    expects beyond the end of the zone's forecast.

    `values_g_per_kwh[(month - 1) * 24 + hour]` is the expected intensity at UTC hour `hour`
    of a day in month `month` (1-12): the mean of the zone's recorded actuals for that month
    and hour over the last year known at the snapshot's `now`, with fallbacks where the
    record is thin (the scheduler builds it: `scheduler.carbon_climatology`). A forecast
    covers two or three days; a job that runs for ten is priced over all ten with this, so
    it goes to the zone that is cleaner over its whole run, not over the forecast's first
    hours followed by their last value repeated. `source` says what it was built from.
    """

    values_g_per_kwh: tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.values_g_per_kwh) != CLIMATOLOGY_CELLS:
            raise ValueError(f"a climatology has {CLIMATOLOGY_CELLS} values (12 months x 24 hours), "
                             f"got {len(self.values_g_per_kwh)}")

    def value(self, month: int, hour: int) -> float:
        """The typical intensity at UTC hour `hour` (0-23) of a day in `month` (1-12)."""
        return self.values_g_per_kwh[(month - 1) * 24 + hour]


@dataclass(frozen=True)
class CarbonCurve:
    """Forecast grid carbon intensity of one zone as a step function.

    `values_g_per_kwh[i]` holds on [start + i*step_s, start + (i+1)*step_s). Before `start`
    the first value holds. After the end, `tail` (the zone's typical value for the month and
    hour, `Climatology`) holds where the curve has one, else the last value (a long job is
    priced over its whole run: `policies.pricing.carbon_tail`, which every integral of a curve in
    `policies` goes through). `signal` is "average" or "marginal"; a snapshot never mixes the
    two.
    """

    zone: str
    start: datetime
    step_s: float
    values_g_per_kwh: tuple[float, ...]
    signal: str = "average"
    source: str = ""
    tail: Climatology | None = None


@dataclass(frozen=True)
class PowerCap:
    """A site power cap: at most `cap_w` of GPU power in [start, end) on the GPUs of one
    budget. `zone` is that budget's key (`budget_of`): a grid zone's id for a `[zones.Z]`
    budget (the zone is one site's feed), `site:NAME` for a `[sites.NAME]` one."""

    zone: str
    cap_w: float
    start: datetime | None = None  # None: from always
    end: datetime | None = None  # None: until always


@dataclass(frozen=True)
class Profile:
    """How one workload class runs on one GPU model (per GPU, data-parallel over k GPUs).

    `source` says where the numbers come from: a public measurement, a roofline scaling
    from another model, or this cluster's own completed jobs (with `samples` runs).
    """

    workload: str
    model: str
    prompts_per_s: float
    power_w: float
    latency_p50_ms: float
    latency_p95_ms: float
    source: str = ""
    samples: int = 0
    rel_uncertainty: float = math.nan  # of prompts_per_s, learned profiles (policies.model.learning)
    rel_spread: float = math.nan  # of one run's prompts_per_s around it (policies.model.learning, margin)


@dataclass(frozen=True)
class Estimate:
    """What a policy expects an assignment to cost; None where it cannot tell yet."""

    finish_at: datetime | None = None
    energy_j: float | None = None
    gco2: float | None = None
    gco2_if_now: float | None = None
    runtime_s: float | None = None
    prompts: int | None = None
    binding: str | None = None  # the constraint that shaped this choice (deadline, slo, memory, ...)
    deadline_miss: bool = False  # no feasible placement meets the deadline: runs ASAP, flagged
    # The zone had no forecast: gco2 is priced at this flat intensity (policies.pricing.blind), not
    # forecast. None: priced from the zone's forecast.
    blind_g_per_kwh: float | None = None
    # A time limit that follows the plan: the runtime estimated on the chosen GPUs x the job's
    # `QueuedJob.time_limit_factor` (None: the job has none, or an explicit one).
    time_limit_s: float | None = None
    # The operating point on the chosen GPUs (policies.model.point_annotation.annotate): batch limit,
    # precision, tensor-parallel degree. None: the job has no performance-model workload.
    max_batch: int | None = None
    precision: str | None = None
    tp: int | None = None
    # The GPU power limit chosen with the operating point (policies.pricing.power_cap.choose_caps), W
    # per GPU; None: the GPUs' default. The figures above are then at that limit, and these
    # are the same placement at the default limit.
    power_limit_w: float | None = None
    uncapped_energy_j: float | None = None
    uncapped_gco2: float | None = None
    uncapped_runtime_s: float | None = None

    @property
    def gco2_per_prompt(self) -> float | None:
        if self.gco2 is None or not self.prompts:
            return None
        return self.gco2 / self.prompts


@dataclass(frozen=True)
class Assignment:
    """One job placed on a set of GPUs of one node, to start at `start_at`."""

    job_id: int
    node: str
    gpu_ids: tuple[int, ...]
    start_at: datetime
    estimate: Estimate = field(default_factory=Estimate)
    explanation: str = ""
    # An interruptible job's plan in segments (issue 30): (start, end) of each, the first
    # starting at `start_at`; empty: one piece from `start_at`. Only the first segment is
    # acted on: the job is interrupted at `interrupt_at` (its end) and the rest re-planned,
    # or, for a "pause" job, continued in place at `resume_at` (the second segment's start).
    segments: tuple[tuple[datetime, datetime], ...] = ()

    @property
    def interrupt_at(self) -> datetime | None:
        """The planned end of the first segment when more follow; None: it runs to the end."""
        return self.segments[0][1] if len(self.segments) > 1 else None

    @property
    def resume_at(self) -> datetime | None:
        """The planned start of the second segment; None: one piece."""
        return self.segments[1][0] if len(self.segments) > 1 else None


@dataclass(frozen=True)
class Snapshot:
    """Everything a policy may look at: the queue, the GPUs, carbon forecasts, profiles, now.

    `carbon` maps zone -> forecast curve; a zone without one is priced blind (see
    `policies.pricing.blind`: one rule for every policy, never 0), and the explanation says so. `pue`
    maps zone -> default PUE (1.0 when missing), for GPUs without a PUE of their own site
    (`GpuSlot.pue`); policies read a GPU's PUE through `gpu_pue`. `profiles` are the workload
    profiles known now (seeded + learned; when empty the
    policies use `energy.seed_profiles()`); a job whose workload has no profile for a model
    is estimated from the catalog. Start times fall on `slot_s` slots from `now` within
    `horizon_s`.
    """

    now: datetime
    jobs: tuple[QueuedJob, ...]
    gpus: tuple[GpuSlot, ...]
    default_runtime_s: float = 3600.0
    carbon: Mapping[str, CarbonCurve] = field(default_factory=dict)
    pue: Mapping[str, float] = field(default_factory=dict)
    profiles: tuple[Profile, ...] = ()
    power_caps: tuple[PowerCap, ...] = ()
    slot_s: float = 900.0
    horizon_s: float = 48 * 3600.0
    # The current plan of each job with `pinned=True` (its start falls in this tick): the
    # policy keeps these GPUs and start as they are and plans the rest around them. A pinned
    # job without an entry here is planned like any other job.
    pinned: Mapping[int, Assignment] = field(default_factory=dict)
    # Plans of earlier ticks to keep between full re-plans (incremental planning): the
    # policy keeps each one's node and start and plans only the other jobs around them; the
    # GPU ids on that node may be re-assigned. One that no longer fits (its start passed, its
    # node lost GPUs, the capacity is gone) is planned again like any other job.
    keep: Mapping[int, Assignment] = field(default_factory=dict)
    # The current plans of jobs planned again from scratch (a full re-plan): a starting point,
    # not a constraint. cpsat tries them first, where they still fit, so a re-plan goes on
    # from the last tick's answer instead of starting over.
    previous: Mapping[int, Assignment] = field(default_factory=dict)
    # Whether a job's learned estimate error (`QueuedJob.runtime_rel_uncertainty`) widens its
    # deadline margin (`policies.model.margin`); False: the estimate is planned as a point.
    estimate_margin: bool = True
    # What operators allow of GPU power limits (policies.pricing.power_cap.CapBounds); None: no caps.
    caps: Any = None

    def gpu_pue(self, gpu: GpuSlot) -> float:
        """The PUE a GPU's energy is scaled by: its site's, else its zone's default, else 1.0."""
        return float(gpu.pue) if gpu.pue is not None else float(self.pue.get(gpu.zone, 1.0))


@dataclass(frozen=True)
class Plan:
    """A policy's answer: assignments for the jobs it could place, reasons for the rest."""

    assignments: tuple[Assignment, ...] = ()
    unplaced: dict[int, str] = field(default_factory=dict)

    def by_job(self) -> dict[int, Assignment]:
        return {a.job_id: a for a in self.assignments}


def sig(v: float, digits: int = 3) -> str:
    """`v` to `digits` significant digits as "g" formats it, but never in exponent notation:
    0.0000482, not 4.82e-05; 1510, not 1.51e+03 (what a person reads in a table or a plan)."""
    text = format(v, f".{digits}g")
    if "e" not in text or not math.isfinite(v) or v == 0:
        return text
    decimals = digits - 1 - math.floor(math.log10(abs(v)))
    return f"{v:.{decimals}f}" if decimals >= 0 else f"{round(v, decimals):.0f}"


def grams(g: float) -> str:
    """Grams of CO2 for explanations, never in exponent notation ("140 g", not "1.4e+02 g")."""
    if abs(g) >= 10:
        return f"{g:,.0f} g"
    if abs(g) >= 0.01 or g == 0:
        return f"{g:.2f}".rstrip("0").rstrip(".") + " g"
    return f"{g:.6f}".rstrip("0").rstrip(".") + " g"
