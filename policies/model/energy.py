"""The energy and carbon model: how long a job runs on a GPU model, at what power, and what
that emits at a given start time.

Pure: the only inputs it reads are its own package data (the catalog and the performance
model's data files, through `policies.model.perf_model`).

Rules (documented here because every policy and the benchmark rely on them):

* **Workload jobs the performance model knows** (a preset or a `llm:` spec, see
  `policies.model.operating_point`): on each GPU model the job runs at its operating point there
  (the most energy-efficient batch limit, precision and TP degree that fits in memory and
  meets every SLO of the job), k / tp replicas data-parallel over its k GPUs, so
  `runtime_s = prompts / (replicas x point prompts_per_s)` and `power_w = replicas x point
  power`. No such point: the model is excluded ("memory" or "slo", `fits`). A profile in
  the book that differs from the seed profile of the same (workload, model) (learned from
  this cluster's runs, `policies.model.learning`) scales the point's throughput and power by its
  ratios to the seed, and its latencies by the inverse throughput ratio. A workload job
  without a prompt count takes its `est_runtime_s` as measured on the reference GPU (H100)
  and scales it by the throughput ratio of the two choices.
* **Other workload jobs with a profile** (a class the performance model does not know, with
  runs learned here): `runtime_s = prompts / (k * prompts_per_s)`, `power_w = k *
  profile.power_w`; such a profile has no latency model, so any SLO excludes the job.
* **Generic jobs** (no workload class, or no profile for the model): `est_runtime_s` (or the
  snapshot's default) is the runtime on the reference GPU (H100). On another model it scales
  by the geometric mean of the BF16 TFLOP/s and HBM TB/s ratios: a generic batch job is taken
  as half compute-bound, half memory-bound. Power per GPU is
  `idle_w + GENERIC_UTILISATION * (tdp_w - idle_w)`.
* **Power limits**: a GPU's power per job never exceeds its current board power limit
  (`GpuSlot.power_limit_w`, read from the driver): a GPU capped at 500 W is estimated at
  most at 500 W, whatever its profile or TDP says, and the job takes as much longer
  (`perf_model.stretch`: runtime x uncapped power / limit, the same energy), the rule the
  performance model applies at the TDP (`perf_model._capped`). So an H100 capped at 350 W
  is not 39 % cheaper for the same work (it is as expensive, for twice as long), and every
  deadline and time-limit check, which reads these runtimes, sees the stretched one.
* **Unknown parts** (a driver name the catalog does not know): runtime as on the reference
  GPU, power from what the driver reports, `UNKNOWN_IDLE_SHARE` of the power limit idle plus
  `GENERIC_UTILISATION` of the rest; with no power limit either, the reference GPU's
  generic power (the only figure left).
* **Many jobs at once**: `shape_arrays` is `job_shape` vectorised over jobs and models (the
  same arithmetic, bit for bit; a test checks it), for planners that compile thousands of
  (job, model) pairs per tick.
* **Carbon**: gCO2 = power_w x PUE x integral of intensity over [start, start + runtime]
  / 3.6e6 (W x s = J; J / 3.6e6 = kWh; kWh x g/kWh = g). The forecast is a step function.
* **Learning** from this cluster's completed runs: `policies.model.learning` (a median over the
  recent runs, so it converges in a few runs, ignores a stalled one and follows a drift);
  each run is first restated at its seed's point (`seed_equivalent_run`), so a learned
  profile carries the model's error, not the difference between two operating points.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import NamedTuple

import numpy as np

from policies.model.catalog import GpuModel, catalog
from policies.pricing.carbon_tail import extended, per_curve
from policies.model.learning import Run
from policies.model.length_spread import expected
from policies.types import J_PER_KWH, CarbonCurve, Profile, QueuedJob
from policies.model.operating_point import Choice, Refusal, job_choice, seed_choice, workload_model
from policies.model.perf_model import OperatingPoint, stretch

log = logging.getLogger(__name__)

REFERENCE_MODEL = "H100"
GENERIC_UTILISATION = 0.8  # share of (TDP - idle) a generic batch job draws on average
UNKNOWN_IDLE_SHARE = 0.15  # an unknown part's idle power, as a share of its power limit


@dataclass(frozen=True)
class JobShape:
    """A job as it would run on k GPUs of one model: runtime, total mean power, energy.

    `power_w` is IT power summed over the k GPUs (no PUE); `energy_j = power_w * runtime_s`.
    """

    model: str
    gpus: int
    runtime_s: float
    power_w: float
    energy_j: float
    latency_p95_ms: float | None
    source: str
    # The operating point the job runs at on this model (performance-model workloads only).
    operating_point: OperatingPoint | None = None
    point_note: str = ""  # e.g. "H200 at batch 64 BF16 TP1: TPOT p95 38 ms <= 40 ms (binding), ..."


_PRIMED_SEEDS: list[tuple[Profile, ...]] = []


def prime_seed_profiles(profiles: tuple[Profile, ...]) -> None:
    """Use the seed profiles an earlier process derived from the same code and data
    (`scheduler.policy_tables`); takes effect only before the first `seed_profiles()` call."""
    _PRIMED_SEEDS[:] = [tuple(profiles)]


@cache
def seed_profiles() -> tuple[Profile, ...]:
    """The seed profiles, one per (preset workload, catalog model) that fits on at most 8
    GPUs: the performance model's point under the preset's default SLOs on the fewest GPUs
    that hold the model, per GPU. Derived at first use: one source of truth.
    Learned profiles are these scaled by this cluster's runs (`policies.model.learning`); a
    profile differing from its seed is read as that correction (`job_shape`). Derived once
    per code and data: `scheduler.policy_tables` keeps them for later processes."""
    if _PRIMED_SEEDS:
        return _PRIMED_SEEDS[0]
    from policies.model.perf_model import presets

    out: list[Profile] = []
    for name, w in presets().items():
        for model in catalog():
            c = seed_choice(name, model)
            if c is None:
                continue
            p = c.prediction
            inference = w.kind == "inference"
            p50 = p.ttft_p50_ms + w.mean_output_tokens * p.tpot_p50_ms if inference else math.nan
            out.append(Profile(workload=name, model=model, prompts_per_s=c.prompts_per_s / c.gpus,
                               power_w=c.power_w / c.gpus, latency_p50_ms=p50,
                               latency_p95_ms=c.latency_p95_ms if inference else math.nan,
                               source=("perf model: " if inference else "nominal: perf model ") + c.describe()
                                      + " (" + ", ".join(f"{k} {v}" for k, v in p.sources.items()) + ")"))
    return tuple(out)


@cache
def _seed_index() -> dict[tuple[str, str], Profile]:
    return {(p.workload, p.model): p for p in seed_profiles()}


class ProfileBook:
    """Profiles by (workload, model); later entries override earlier ones for the same key,
    so `ProfileBook(seed_profiles() + learned)` prefers what this cluster measured. The
    first entry of a key is its seed: `get(..., seed=True)` answers with it, for a job the
    learned figures alone would refuse (`QueuedJob.seed_profile`)."""

    def __init__(self, profiles: Iterable[Profile] = ()) -> None:
        self._by_key: dict[tuple[str, str], Profile] = {}
        self._first: dict[tuple[str, str], Profile] = {}
        # model_choice's answers for this book's profiles: a planner asks the same few
        # (workload, model, k, SLOs) questions thousands of times per tick
        self.choices: dict[tuple, object] = {}
        for p in profiles:
            key = (p.workload, _canonical_model(p.model))
            self._by_key[key] = p
            self._first.setdefault(key, p)

    def get(self, workload: str | None, model: str, *, seed: bool = False) -> Profile | None:
        if workload is None:
            return None
        return (self._first if seed else self._by_key).get((workload, _canonical_model(model)))

    def workloads(self) -> list[str]:
        return sorted({w for w, _ in self._by_key})

    def __len__(self) -> int:
        return len(self._by_key)


@cache
def _canonical_model(model: str) -> str:
    known = catalog()
    if model in known:
        return model
    upper = model.strip().upper()
    for name in known:
        if name.upper() == upper:
            return name
    return model


def _spec(model: str) -> GpuModel | None:
    return catalog().get(_canonical_model(model))


@cache
def generic_runtime_scale(model: str) -> float:
    """Runtime on `model` over runtime on the reference GPU, for a job with no profile."""
    ref, spec = catalog()[REFERENCE_MODEL], _spec(model)
    if spec is None:
        return 1.0
    return math.sqrt((ref.bf16_dense_tflops / spec.bf16_dense_tflops)
                     * (ref.hbm_tb_per_s / spec.hbm_tb_per_s))


@cache
def generic_power_w(model: str, power_limit_w: float | None = None) -> float:
    """Mean power of one GPU of `model` running a generic batch job, under its power limit."""
    spec = _spec(model)
    if spec is None and power_limit_w:
        idle = UNKNOWN_IDLE_SHARE * power_limit_w
        return idle + GENERIC_UTILISATION * (power_limit_w - idle)
    if spec is None:
        spec = catalog()[REFERENCE_MODEL]
    return capped_w(spec.idle_w + GENERIC_UTILISATION * (spec.tdp_w - spec.idle_w), power_limit_w)


@cache
def generic_stretch(model: str, power_limit_w: float | None = None) -> float:
    """How much longer a generic job runs under a power limit (1 for an unknown part, whose
    power is taken from the limit itself)."""
    spec = _spec(model)
    if spec is None:
        return 1.0
    return stretch(spec.idle_w + GENERIC_UTILISATION * (spec.tdp_w - spec.idle_w), power_limit_w)


def gang_power_limit_w(limits: Iterable[float | None]) -> float | None:
    """The power limit a job on these GPUs is estimated under: the highest of theirs when
    all of them report one, else none."""
    limits = list(limits)
    return None if not limits or None in limits else max(limits)


def capped_w(per_gpu_w: float, power_limit_w: float | None) -> float:
    """One GPU's power under its board power limit (None or 0: no limit known)."""
    return min(per_gpu_w, power_limit_w) if power_limit_w else per_gpu_w


def correction(book: ProfileBook, workload: str | None, model: str, *, seed: bool = False) -> tuple[float, float]:
    """(throughput ratio, power ratio) of the book's profile of (workload, model) to its seed:
    what this cluster's runs taught about the performance model's figures (1, 1: nothing, or
    `seed`: the seed asked for)."""
    if workload is None or seed:
        return 1.0, 1.0
    seed = _seed_index().get((workload, model))
    mine = book.get(workload, model)
    if seed is None or mine is None or mine is seed or mine.prompts_per_s <= 0:
        return 1.0, 1.0
    return mine.prompts_per_s / seed.prompts_per_s, mine.power_w / seed.power_w


_MISSING = object()


def model_choice(job: QueuedJob, model: str, book: ProfileBook):
    """The operating point of `job` on `model` (`policies.model.operating_point.job_choice`, with the
    book's learned correction): a Choice, a Refusal, or None (the model does not know the
    workload or the GPU)."""
    seed = job.seed_profile is not None
    key = (job.workload, model, job.gpus, job.ttft_slo_ms, job.tpot_slo_ms, job.latency_slo_ms, seed)
    hit = book.choices.get(key, _MISSING)
    if hit is _MISSING:
        canonical = _canonical_model(model)
        speed, power_ratio = correction(book, job.workload, canonical, seed=seed)
        hit = book.choices[key] = job_choice(job.workload, canonical, max(1, job.gpus), job.ttft_slo_ms,
                                             job.tpot_slo_ms, job.latency_slo_ms, speed, power_ratio)
    return hit


def _profile_p95(profile: Profile | None) -> float | None:
    return profile.latency_p95_ms if profile is not None and math.isfinite(profile.latency_p95_ms) else None


def job_shape(job: QueuedJob, model: str, book: ProfileBook, default_runtime_s: float,
              power_limit_w: float | None = None) -> JobShape:
    """How `job` would run on `job.gpus` GPUs of `model` capped at `power_limit_w` each
    (rules in the module docstring). A model the job does not fit is shaped by the generic
    rule (`fits` says why it is excluded)."""
    k = max(1, job.gpus)
    base_s = job.est_runtime_s or default_runtime_s
    choice = model_choice(job, model, book) if job.workload is not None else None
    if isinstance(choice, Choice):
        if job.prompts:
            runtime_s = job.prompts / choice.prompts_per_s
        else:
            ref = model_choice(job, REFERENCE_MODEL, book)
            ratio = ref.prompts_per_s / choice.prompts_per_s if isinstance(ref, Choice) \
                else generic_runtime_scale(model)
            runtime_s = base_s * ratio
        power_w = k * capped_w(choice.power_w / k, power_limit_w)
        runtime_s = runtime_s * stretch(choice.power_w / k, power_limit_w)
        return JobShape(model=_canonical_model(model), gpus=k, runtime_s=max(1.0, runtime_s), power_w=power_w,
                        energy_j=power_w * max(1.0, runtime_s),
                        latency_p95_ms=choice.latency_p95_ms if choice.inference else None,
                        source=f"perf model {job.workload}: {choice.note}",
                        operating_point=choice.point if choice.inference else None,
                        point_note=choice.note)
    seed = job.seed_profile is not None
    profile = book.get(job.workload, model, seed=seed) if choice is None else None
    if profile is not None and profile.prompts_per_s > 0:
        if job.prompts:
            runtime_s = job.prompts / (k * profile.prompts_per_s)
        else:
            ref = book.get(job.workload, REFERENCE_MODEL, seed=seed)
            runtime_s = base_s * (ref.prompts_per_s / profile.prompts_per_s if ref else 1.0)
        power_w = k * capped_w(profile.power_w, power_limit_w)
        runtime_s = runtime_s * stretch(profile.power_w, power_limit_w)
        p95 = _profile_p95(profile)
        source = f"profile {job.workload}/{profile.model}: {profile.source}"
    else:
        runtime_s = base_s * generic_runtime_scale(model) * generic_stretch(model, power_limit_w)
        power_w = k * generic_power_w(model, power_limit_w)
        p95 = None
        source = f"catalog: {'est-runtime' if job.est_runtime_s else 'default runtime'} on {REFERENCE_MODEL} scaled"
    runtime_s = max(1.0, runtime_s)
    return JobShape(model=_canonical_model(model), gpus=k, runtime_s=runtime_s, power_w=power_w,
                    energy_j=power_w * runtime_s, latency_p95_ms=p95, source=source)


class ShapeArrays(NamedTuple):
    """`job_shape` for many jobs on many models at once: arrays of shape (jobs, models)."""

    runtime_s: np.ndarray  # float
    power_w: np.ndarray  # float, IT power over the job's k GPUs
    why: np.ndarray  # int8: 0 the model can take the job by workload and SLOs, 1 memory, 2 slo


_WHY_CODE = {"memory": 1, "slo": 2}


def shape_arrays(jobs: Sequence[QueuedJob], models: Sequence[str], book: ProfileBook,
                 default_runtime_s: float,
                 power_limits_w: Sequence[float | None] | None = None) -> ShapeArrays:
    """`job_shape(job, model, ...)` for every job and model, vectorised over the jobs that
    share a workload, GPU count and SLOs (one operating-point choice each; the same
    arithmetic in the same order, so the floats are identical), plus `fits`'s workload and
    SLO verdict (`why`; the `--gpu-mem` check is the caller's, against its GPUs' memory).

    A planner tick compiles thousands of (job, model) pairs; one Python call each was the
    largest share of greedy's time at 5,000 jobs.
    """
    n, m = len(jobs), len(models)
    k = np.array([max(1, j.gpus) for j in jobs], dtype=np.float64)
    base = np.array([j.est_runtime_s or default_runtime_s for j in jobs], dtype=np.float64)
    prompts = np.array([j.prompts or 0 for j in jobs], dtype=np.float64)
    runtime = np.empty((n, m))
    power = np.empty((n, m))
    why = np.zeros((n, m), dtype=np.int8)
    groups: dict[tuple, list[int]] = {}
    for i, j in enumerate(jobs):
        key = (j.workload, max(1, j.gpus), j.ttft_slo_ms, j.tpot_slo_ms, j.latency_slo_ms,
               j.seed_profile is not None) if j.workload is not None else (None,)
        groups.setdefault(key, []).append(i)
    for c, model in enumerate(models):
        cap = power_limits_w[c] if power_limits_w is not None else None
        generic_scale, generic_w = generic_runtime_scale(model), generic_power_w(model, cap)
        generic_slow = generic_stretch(model, cap)
        for key, rows_l in groups.items():
            rows = np.array(rows_l, dtype=np.int64)
            workload = key[0]
            first = jobs[rows_l[0]]
            if workload is None:  # generic jobs: an SLO cannot be checked, so it excludes
                why[[i for i in rows_l if has_slo(jobs[i])], c] = 2
            choice = model_choice(first, model, book) if workload is not None else None
            if isinstance(choice, Choice):
                kr, pr = k[rows], prompts[rows]
                ref = model_choice(first, REFERENCE_MODEL, book)
                ratio = ref.prompts_per_s / choice.prompts_per_s if isinstance(ref, Choice) else generic_scale
                with np.errstate(divide="ignore", invalid="ignore"):
                    by_prompts = pr / choice.prompts_per_s
                runtime[rows, c] = np.where(pr != 0, by_prompts, base[rows] * ratio) \
                    * stretch(choice.power_w / key[1], cap)
                power[rows, c] = kr * capped_w(choice.power_w / key[1], cap)
                continue
            if isinstance(choice, Refusal):
                why[rows, c] = _WHY_CODE[choice.reason]
            seed = first.seed_profile is not None
            profile = book.get(workload, model, seed=seed) if choice is None else None
            if profile is not None and workload is not None:
                slo_why = _profile_slo_why(first, profile)
                if slo_why:
                    why[rows, c] = slo_why
            elif workload is not None and choice is None and has_slo(first):
                why[rows, c] = 2  # an SLO, and no latency model for this workload here
            if profile is not None and profile.prompts_per_s > 0:
                ref = book.get(workload, REFERENCE_MODEL, seed=seed)
                ratio = ref.prompts_per_s / profile.prompts_per_s if ref else 1.0
                kr, pr = k[rows], prompts[rows]
                with np.errstate(divide="ignore", invalid="ignore"):
                    by_prompts = pr / (kr * profile.prompts_per_s)
                runtime[rows, c] = np.where(pr != 0, by_prompts, base[rows] * ratio) * stretch(profile.power_w, cap)
                power[rows, c] = kr * capped_w(profile.power_w, cap)
            else:
                runtime[rows, c] = base[rows] * generic_scale * generic_slow
                power[rows, c] = k[rows] * generic_w
    np.maximum(runtime, 1.0, out=runtime)
    return ShapeArrays(runtime, power, why)


def has_slo(job: QueuedJob) -> bool:
    """Whether the job sets any latency SLO of its own."""
    return job.latency_slo_ms is not None or job.ttft_slo_ms is not None or job.tpot_slo_ms is not None


def slo_text(job: QueuedJob) -> str:
    """The job's own SLOs, e.g. "TPOT p95 <= 40 ms" ("preset defaults" when none)."""
    given = [f"{name} p95 <= {value:g} ms" for name, value in (("TTFT", job.ttft_slo_ms), ("TPOT", job.tpot_slo_ms),
                                                                ("latency", job.latency_slo_ms)) if value is not None]
    return ", ".join(given) or "preset defaults"


def _profile_slo_why(job: QueuedJob, profile: Profile) -> int:
    """For a workload the performance model does not know: 2 when the job has an SLO its
    profile cannot show it meets (TTFT/TPOT: no model; latency: no finite p95, or above)."""
    if job.ttft_slo_ms is not None or job.tpot_slo_ms is not None:
        return 2
    if job.latency_slo_ms is None:
        return 0
    p95 = _profile_p95(profile)
    return 2 if p95 is None or p95 > job.latency_slo_ms else 0


def fits(job: QueuedJob, model_name: str, memory_gib: float, book: ProfileBook) -> str | None:
    """None if GPUs of this model can take the job, else the reason ("memory" or "slo"):
    its `--gpu-mem`, then its operating point (no point fits in memory, or none meets its
    SLOs), then, for a workload the performance model does not know, any SLO (no latency
    model, or the profile's p95 above it). Never a comparison with NaN."""
    if memory_gib < job.gpu_mem_gib:
        return "memory"
    if job.workload is None:
        return "slo" if has_slo(job) else None
    choice = model_choice(job, model_name, book)
    if isinstance(choice, Refusal):
        return choice.reason
    if choice is not None:
        return None
    if not has_slo(job):
        return None
    profile = book.get(job.workload, model_name, seed=job.seed_profile is not None)
    return "slo" if profile is None or _profile_slo_why(job, profile) else None


def within_time_limit(job: QueuedJob, model_name: str, book: ProfileBook, default_runtime_s: float,
                      power_limit_w: float | None = None) -> bool:
    """Whether the job's estimated runtime on `model_name` (capped at `power_limit_w` per GPU:
    the stretched runtime) fits its explicit time limit (`QueuedJob.time_limit_s`; no limit:
    True). A plan past it would end as TIMEOUT by the planner's own estimate, so such a
    model is not an option."""
    if job.time_limit_s is None:
        return True
    return job_shape(job, model_name, book, default_runtime_s, power_limit_w).runtime_s \
        <= job.time_limit_s * (1 + 1e-9)


class CurveIntegrator:
    """Integrals of one forecast curve by prefix sums: O(n) once, O(1) per query.

    Past the forecast's end the curve's `tail` holds where it has one
    (`policies.pricing.carbon_tail`), else the last value."""

    def __init__(self, curve: CarbonCurve) -> None:
        self.curve = curve
        self._prefix = [0.0, *itertools.accumulate(curve.values_g_per_kwh)]
        self._tail = extended(curve) if curve.tail is not None and curve.values_g_per_kwh else None

    def _steps(self, x: float) -> float:
        """Integral of the step function (in steps) from 0 to x, extended both ways."""
        values = self.curve.values_g_per_kwh
        n = len(values)
        if x <= 0:
            return x * values[0]
        if x >= n:
            if self._tail is not None:
                return self._tail.steps(x)
            return self._prefix[n] + (x - n) * values[-1]
        i = int(x)
        return self._prefix[i] + (x - i) * values[i]

    def integral(self, start: datetime, end: datetime) -> float:
        """The integral of intensity over [start, end], in g/kWh x s."""
        if end <= start or not self.curve.values_g_per_kwh:
            return 0.0
        c = self.curve
        a = (start - c.start).total_seconds() / c.step_s
        b = (end - c.start).total_seconds() / c.step_s
        return (self._steps(b) - self._steps(a)) * c.step_s


def curve_integral_g_per_kwh_s(curve: CarbonCurve, start: datetime, end: datetime) -> float:
    """The integral of the step-function intensity over [start, end], in g/kWh x s.

    Before the curve's start the first value holds, after its end its tail (the zone's
    typical values, `policies.pricing.carbon_tail`) or, without one, the last value.
    """
    return _integrator(curve).integral(start, end)


_INTEGRATORS: dict[int, CurveIntegrator] = {}  # id(curve) -> integrator holding that curve


def _integrator(curve: CarbonCurve) -> CurveIntegrator:
    """One integrator (prefix sums) per curve object: a planner asks for thousands of
    integrals of the same few curves per tick, and building the prefix sums (or hashing 200
    values) was most of each call. The entry keeps its curve alive, so an id is never reused
    while cached; the cache is a bounded memo, not state (clearing it changes no result)."""
    return per_curve(_INTEGRATORS, curve, CurveIntegrator)


def job_gco2(curve: CarbonCurve | None, start: datetime, runtime_s: float, power_w: float,
             pue: float = 1.0, spread: Sequence[float] | None = None) -> float | None:
    """gCO2 of drawing `power_w` (IT) for `runtime_s` from `start`, with the site's PUE;
    with `spread` (length multipliers, `policies.model.length_spread`) the mean over them."""
    if curve is None:
        return None
    return expected(lambda run_s: power_w * pue * curve_integral_g_per_kwh_s(
        curve, start, start + timedelta(seconds=run_s)) / J_PER_KWH, runtime_s, spread)


def seed_equivalent_run(job: QueuedJob, model: str, run: Run, point: OperatingPoint | None = None) -> Run:
    """A measured run (per GPU) restated at the seed profile's point, for learning.

    Learning compares runs with the seed profile of (workload, model) (`policies.model.learning`),
    but a job ran at its own operating point (its GPU count, SLOs, batch limit), whose
    figures differ from the seed's even when the model is exact: a 70B job on 4 GPUs at TP4
    and batch 512 does more per GPU than the seed's 2 GPUs at batch 64. So the run is scaled
    by seed / prediction-at-its-point: what is left is the model's error, which is what a
    learned profile must carry. `point`: the point it ran at (None: the one the model picks
    for the job, uncorrected). A workload the model does not know is returned as is."""
    canonical = _canonical_model(model)
    seed = _seed_index().get((job.workload, canonical)) if job.workload else None
    if seed is None:
        return run
    figures = _model_figures_per_gpu(job, canonical, point)
    if figures is None:
        return run
    pps_gpu, power_gpu = figures
    return Run(run.prompts_per_s * seed.prompts_per_s / pps_gpu, run.power_w * seed.power_w / power_gpu)


def _model_figures_per_gpu(job: QueuedJob, canonical: str, point: OperatingPoint | None) -> tuple[float, float] | None:
    """(prompts/s, W) per GPU the uncorrected performance model gives `job` on `canonical` at
    `point` (None: at the point the model picks for the job); None where it has no figure."""
    k = max(1, job.gpus)
    if point is not None:
        from policies.model.perf_model import parts, predict

        w = workload_model(job.workload)
        if w is None or canonical not in parts() or k % point.tp:
            return None
        p = predict(w, canonical, point)
        return p.prompts_per_s / point.tp, p.power_w / point.tp
    c = job_choice(job.workload, canonical, k, job.ttft_slo_ms, job.tpot_slo_ms, job.latency_slo_ms)
    if not isinstance(c, Choice):
        return None
    return c.prompts_per_s / k, c.power_w / k


def point_change(job: QueuedJob, model: str, point: OperatingPoint) -> tuple[float, float]:
    """(runtime factor, power factor) of running `job` on `model` at `point` rather than at the
    point the uncorrected model picks for it: how a planned batch limit, precision or TP
    degree changes a run by the performance model (1, 1 where it has no figures). The
    emulated fleet's truth follows the plan's point through it (`scheduler.node.emulation`)."""
    if not job.workload:
        return 1.0, 1.0
    canonical = _canonical_model(model)
    at_point = _model_figures_per_gpu(job, canonical, point)
    picked = _model_figures_per_gpu(job, canonical, None)
    if at_point is None or picked is None or at_point[0] <= 0 or picked[1] <= 0:
        return 1.0, 1.0
    return picked[0] / at_point[0], at_point[1] / picked[1]
