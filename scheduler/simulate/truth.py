"""How simulated jobs really run, as opposed to how the planner estimates they run.

The planner plans with its energy model (`policies.model.energy.job_shape` over the seed and
learned profiles); a `Truth` decides the runtime and the power a simulated job actually has
on the GPUs it got. Only the simulator's execution reads it: the policies, their snapshots
and the learning see what a real cluster would let them see (the plan, then the measured
runtime and energy of finished jobs).

    perfect         the estimate is the truth (what the simulator always did)
    noisy:SIGMA     per (workload class, GPU model) a systematic factor on runtime and one on
                    power, each lognormal(0, SIGMA), drawn once from the seed (an error a
                    cluster can learn), times a per-job lognormal(0, SIGMA / 4) (run-to-run
                    noise it cannot); power never above the GPUs' TDP
    profiles:FILE   jobs run by the profiles in FILE: TOML `[[profile]]` rows with workload,
                    model, prompts_per_s and power_w per GPU (latency_p50_ms/_p95_ms optional);
                    pairs it lacks fall back to the seeds; e.g. a cluster's measured profiles
"""

from __future__ import annotations

import math
import random
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from policies.model.catalog import catalog
from policies.model.energy import JobShape, ProfileBook, job_shape, seed_profiles
from policies.types import Profile, QueuedJob


class TruthError(ValueError):
    """A --truth spec or file that cannot be used; the message says why."""


@dataclass
class Truth:
    """The runtime and power a job really has on `model`. `planned` is the job's shape by the
    scenario's own profiles (the planner's estimate before it learned anything), so a truth
    never drifts with what the planner learns."""

    name: str = "perfect"

    def actual(self, job: QueuedJob, model: str, planned: JobShape, default_runtime_s: float) -> tuple[float, float]:
        return planned.runtime_s, planned.power_w


@dataclass
class NoisyTruth(Truth):
    sigma: float = 0.1
    seed: int = 0
    _bias: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    _rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self._rng = random.Random(f"truth-jobs-{self.seed}")

    def bias(self, workload: str | None, model: str) -> tuple[float, float]:
        """The systematic (runtime, power) factors of (workload, model): a stable draw per pair."""
        key = (workload or "-", model)
        if key not in self._bias:
            rng = random.Random(f"truth-{self.seed}-{key[0]}-{key[1]}")
            self._bias[key] = (math.exp(rng.gauss(0.0, self.sigma)), math.exp(rng.gauss(0.0, self.sigma)))
        return self._bias[key]

    def actual(self, job: QueuedJob, model: str, planned: JobShape, default_runtime_s: float) -> tuple[float, float]:
        runtime_f, power_f = self.bias(job.workload, model)
        jitter = self.sigma / 4
        runtime_s = planned.runtime_s * runtime_f * math.exp(self._rng.gauss(0.0, jitter))
        power_w = planned.power_w * power_f * math.exp(self._rng.gauss(0.0, jitter))
        spec = catalog().get(model)
        if spec is not None:
            power_w = min(power_w, spec.tdp_w * max(1, job.gpus))
        return runtime_s, power_w


@dataclass
class ProfilesTruth(Truth):
    book: ProfileBook = field(default_factory=lambda: ProfileBook(seed_profiles()))

    def actual(self, job: QueuedJob, model: str, planned: JobShape, default_runtime_s: float) -> tuple[float, float]:
        shape = job_shape(job, model, self.book, default_runtime_s)
        return shape.runtime_s, shape.power_w


def parse_truth(spec: str | None, *, seed: int = 0) -> Truth:
    """`perfect`, `noisy:SIGMA` or `profiles:FILE` (see the module docstring)."""
    spec = (spec or "perfect").strip()
    kind, _, arg = spec.partition(":")
    if kind == "perfect" and not arg:
        return Truth("perfect")
    if kind == "noisy":
        try:
            sigma = float(arg)
        except ValueError:
            raise TruthError(f"--truth noisy:SIGMA needs a number, e.g. noisy:0.3 (got {spec!r})") from None
        if not 0.0 <= sigma <= 2.0:
            raise TruthError(f"--truth noisy:SIGMA: SIGMA must be between 0 and 2 (got {sigma:g})")
        return NoisyTruth(spec, sigma=sigma, seed=seed)
    if kind == "profiles" and arg:
        return ProfilesTruth(spec, book=ProfileBook(seed_profiles() + _load_profiles(Path(arg))))  # later wins
    raise TruthError(f"unknown --truth {spec!r}: use perfect, noisy:SIGMA or profiles:FILE")


def _load_profiles(path: Path) -> tuple[Profile, ...]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TruthError(f"--truth profiles file {path} not found") from None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TruthError(f"--truth profiles file {path} is not readable TOML: {e}") from None
    out = []
    for i, row in enumerate(data.get("profile", []), 1):
        try:
            pps, power = float(row["prompts_per_s"]), float(row["power_w"])
            if not (pps > 0 and power > 0):
                raise ValueError("prompts_per_s and power_w must be positive")
            out.append(Profile(workload=str(row["workload"]), model=str(row["model"]), prompts_per_s=pps,
                               power_w=power, latency_p50_ms=float(row.get("latency_p50_ms", math.nan)),
                               latency_p95_ms=float(row.get("latency_p95_ms", math.nan)),
                               source=f"truth {path.name}"))
        except (KeyError, TypeError, ValueError) as e:
            raise TruthError(f"--truth profiles file {path}: [[profile]] number {i}: {e}") from None
    if not out:
        raise TruthError(f"--truth profiles file {path} has no [[profile]] rows")
    return tuple(out)
