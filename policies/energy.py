"""The energy and carbon model: how long a job runs on a GPU model, at what power, and what
that emits at a given start time.

Pure: the only input it reads is its own package data (`policies/data/profiles.toml`).

Rules (documented here because every policy and the benchmark rely on them):

* **Workload jobs** (`job.workload` has a profile for the model): the job's `prompts` are
  served data-parallel over its k GPUs, so `runtime_s = prompts / (k * prompts_per_s)` and
  `power_w = k * profile.power_w`. A workload job without a prompt count takes its
  `est_runtime_s` as measured on the reference GPU (H100) and scales it by the profiles'
  throughput ratio.
* **Generic jobs** (no workload class, or no profile for the model): `est_runtime_s` (or the
  snapshot's default) is the runtime on the reference GPU (H100). On another model it scales
  by the geometric mean of the BF16 TFLOP/s and HBM TB/s ratios: a generic batch job is taken
  as half compute-bound, half memory-bound. Power per GPU is
  `idle_w + GENERIC_UTILISATION * (tdp_w - idle_w)`.
* **Power limits**: a GPU's power per job never exceeds its current board power limit
  (`GpuSlot.power_limit_w`, read from the driver): a GPU capped at 500 W is estimated at
  most at 500 W, whatever its profile or TDP says. Runtime is not stretched for the cap
  (the profiles hold no power-performance curve); the energy estimate is so a lower bound
  for a job that a cap slows down.
* **Unknown parts** (a driver name the catalog does not know): runtime as on the reference
  GPU, power from what the driver reports, `UNKNOWN_IDLE_SHARE` of the power limit idle plus
  `GENERIC_UTILISATION` of the rest; with no power limit either, the reference GPU's
  generic power (the only figure left).
* **Many jobs at once**: `shape_arrays` is `job_shape` vectorised over jobs and models (the
  same arithmetic, bit for bit; a test checks it), for planners that compile thousands of
  (job, model) pairs per tick.
* **Carbon**: gCO2 = power_w x PUE x integral of intensity over [start, start + runtime]
  / 3.6e6 (W x s = J; J / 3.6e6 = kWh; kWh x g/kWh = g). The forecast is a step function.
* **Learning** from this cluster's completed runs: `policies.learning` (a median over the
  recent runs, so it converges in a few runs, ignores a stalled one and follows a drift).
"""

from __future__ import annotations

import itertools
import logging
import math
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from importlib import resources
from typing import NamedTuple

import numpy as np

from policies.catalog import GpuModel, catalog
from policies.model import CarbonCurve, Profile, QueuedJob

log = logging.getLogger(__name__)

REFERENCE_MODEL = "H100"
GENERIC_UTILISATION = 0.8  # share of (TDP - idle) a generic batch job draws on average
UNKNOWN_IDLE_SHARE = 0.15  # an unknown part's idle power, as a share of its power limit
J_PER_KWH = 3.6e6


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


@cache
def seed_profiles() -> tuple[Profile, ...]:
    """The packaged seed profiles: one per (workload class, catalog model).

    Measured where public data exists (ML.ENERGY v2/v3), roofline-scaled otherwise; each
    profile's `source` says which. Regenerate with `python -m policies.data.make_profiles`.
    """
    text = resources.files("policies").joinpath("data/profiles.toml").read_text("utf-8")
    data = tomllib.loads(text)
    out: list[Profile] = []
    for row in data.get("profile", []):
        out.append(Profile(workload=row["workload"], model=row["model"],
                           prompts_per_s=float(row["prompts_per_s"]), power_w=float(row["power_w"]),
                           latency_p50_ms=float(row["latency_p50_ms"]),
                           latency_p95_ms=float(row["latency_p95_ms"]),
                           source=row.get("source", ""), samples=int(row.get("samples", 0))))
    return tuple(out)


class ProfileBook:
    """Profiles by (workload, model); later entries override earlier ones for the same key,
    so `ProfileBook(seed_profiles() + learned)` prefers what this cluster measured."""

    def __init__(self, profiles: Iterable[Profile] = ()) -> None:
        self._by_key: dict[tuple[str, str], Profile] = {}
        for p in profiles:
            self._by_key[(p.workload, _canonical_model(p.model))] = p

    def get(self, workload: str | None, model: str) -> Profile | None:
        if workload is None:
            return None
        return self._by_key.get((workload, _canonical_model(model)))

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


def gang_power_limit_w(limits: Iterable[float | None]) -> float | None:
    """The power limit a job on these GPUs is estimated under: the highest of theirs when
    all of them report one, else none."""
    limits = list(limits)
    return None if not limits or None in limits else max(limits)


def capped_w(per_gpu_w: float, power_limit_w: float | None) -> float:
    """One GPU's power under its board power limit (None or 0: no limit known)."""
    return min(per_gpu_w, power_limit_w) if power_limit_w else per_gpu_w


def job_shape(job: QueuedJob, model: str, book: ProfileBook, default_runtime_s: float,
              power_limit_w: float | None = None) -> JobShape:
    """How `job` would run on `job.gpus` GPUs of `model` capped at `power_limit_w` each
    (rules in the module docstring)."""
    k = max(1, job.gpus)
    profile = book.get(job.workload, model)
    if profile is not None and profile.prompts_per_s > 0:
        if job.prompts:
            runtime_s = job.prompts / (k * profile.prompts_per_s)
        else:
            ref = book.get(job.workload, REFERENCE_MODEL)
            base_s = job.est_runtime_s or default_runtime_s
            runtime_s = base_s * (ref.prompts_per_s / profile.prompts_per_s if ref else 1.0)
        power_w = k * capped_w(profile.power_w, power_limit_w)
        p95 = profile.latency_p95_ms if math.isfinite(profile.latency_p95_ms) else None
        source = f"profile {job.workload}/{profile.model}: {profile.source}"
    else:
        base_s = job.est_runtime_s or default_runtime_s
        runtime_s = base_s * generic_runtime_scale(model)
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
    latency_p95_ms: np.ndarray  # float, the profile's p95, for `fits` (nan: no profile, or unknown)


def shape_arrays(jobs: Sequence[QueuedJob], models: Sequence[str], book: ProfileBook,
                 default_runtime_s: float,
                 power_limits_w: Sequence[float | None] | None = None) -> ShapeArrays:
    """`job_shape(job, model, ...)` for every job and model, vectorised over the jobs of each
    workload class (the same arithmetic in the same order, so the floats are identical).

    A planner tick compiles thousands of (job, model) pairs; one Python call each was the
    largest share of greedy's time at 5,000 jobs.
    """
    n, m = len(jobs), len(models)
    k = np.array([max(1, j.gpus) for j in jobs], dtype=np.float64)
    base = np.array([j.est_runtime_s or default_runtime_s for j in jobs], dtype=np.float64)
    prompts = np.array([j.prompts or 0 for j in jobs], dtype=np.float64)
    runtime = np.empty((n, m))
    power = np.empty((n, m))
    p95 = np.full((n, m), np.nan)
    by_workload: dict[str | None, list[int]] = {}
    for i, j in enumerate(jobs):
        by_workload.setdefault(j.workload, []).append(i)
    for c, model in enumerate(models):
        cap = power_limits_w[c] if power_limits_w is not None else None
        generic_scale, generic_w = generic_runtime_scale(model), generic_power_w(model, cap)
        for workload, rows_l in by_workload.items():
            rows = np.array(rows_l, dtype=np.int64)
            profile = book.get(workload, model)
            if profile is not None and math.isfinite(profile.latency_p95_ms):
                p95[rows, c] = profile.latency_p95_ms
            if profile is not None and profile.prompts_per_s > 0:
                ref = book.get(workload, REFERENCE_MODEL)
                ratio = ref.prompts_per_s / profile.prompts_per_s if ref else 1.0
                kr, pr = k[rows], prompts[rows]
                with np.errstate(divide="ignore", invalid="ignore"):
                    by_prompts = pr / (kr * profile.prompts_per_s)
                runtime[rows, c] = np.where(pr != 0, by_prompts, base[rows] * ratio)
                power[rows, c] = kr * capped_w(profile.power_w, cap)
            else:
                runtime[rows, c] = base[rows] * generic_scale
                power[rows, c] = k[rows] * generic_w
    np.maximum(runtime, 1.0, out=runtime)
    return ShapeArrays(runtime, power, p95)


def fits(job: QueuedJob, model_name: str, memory_gib: float, book: ProfileBook) -> str | None:
    """None if GPUs of this model can take the job, else the reason ("memory" or "slo")."""
    if memory_gib < job.gpu_mem_gib:
        return "memory"
    if job.latency_slo_ms is not None:
        profile = book.get(job.workload, model_name)
        if profile is not None and math.isfinite(profile.latency_p95_ms) \
                and profile.latency_p95_ms > job.latency_slo_ms:
            return "slo"
    return None


def within_time_limit(job: QueuedJob, model_name: str, book: ProfileBook, default_runtime_s: float) -> bool:
    """Whether the job's estimated runtime on `model_name` fits its explicit time limit
    (`QueuedJob.time_limit_s`; no limit: True). A plan past it would end as TIMEOUT by the
    planner's own estimate, so such a model is not an option."""
    if job.time_limit_s is None:
        return True
    return job_shape(job, model_name, book, default_runtime_s).runtime_s <= job.time_limit_s * (1 + 1e-9)


class CurveIntegrator:
    """Integrals of one forecast curve by prefix sums: O(n) once, O(1) per query."""

    def __init__(self, curve: CarbonCurve) -> None:
        self.curve = curve
        self._prefix = [0.0, *itertools.accumulate(curve.values_g_per_kwh)]

    def _steps(self, x: float) -> float:
        """Integral of the step function (in steps) from 0 to x, flat-extended both ways."""
        values = self.curve.values_g_per_kwh
        n = len(values)
        if x <= 0:
            return x * values[0]
        if x >= n:
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

    Before the curve's start the first value holds, after its end the last one.
    """
    return _integrator(curve).integral(start, end)


_INTEGRATORS: dict[int, CurveIntegrator] = {}  # id(curve) -> integrator holding that curve
_INTEGRATORS_MAX = 256


def _integrator(curve: CarbonCurve) -> CurveIntegrator:
    """One integrator (prefix sums) per curve object: a planner asks for thousands of
    integrals of the same few curves per tick, and building the prefix sums (or hashing 200
    values) was most of each call. The entry keeps its curve alive, so an id is never reused
    while cached; the cache is a bounded memo, not state (clearing it changes no result)."""
    hit = _INTEGRATORS.get(id(curve))
    if hit is None or hit.curve is not curve:
        if len(_INTEGRATORS) >= _INTEGRATORS_MAX:
            _INTEGRATORS.clear()
        hit = _INTEGRATORS[id(curve)] = CurveIntegrator(curve)
    return hit


def job_gco2(curve: CarbonCurve | None, start: datetime, runtime_s: float, power_w: float,
             pue: float = 1.0) -> float | None:
    """gCO2 of drawing `power_w` (IT) for `runtime_s` from `start`, with the site's PUE."""
    if curve is None:
        return None
    integral = curve_integral_g_per_kwh_s(curve, start, start + timedelta(seconds=runtime_s))
    return power_w * pue * integral / J_PER_KWH
