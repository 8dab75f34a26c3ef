"""Learning how a workload runs on a GPU model from this cluster's completed runs, robustly.

Each completed run of a workload on one GPU model measures two figures per GPU: prompts per
second and mean power. The learned profile is the seed profile (the public figure) scaled by
the *median* of the recent runs' ratios to it, in log space:

    learned = seed x exp(median(prior, log(run_1 / seed), ..., log(run_n / seed)))

over the last `WINDOW` runs, with one pseudo-run `prior` that stands for what was known
before: the seed itself (log ratio 0), or, when the same workload has run on other GPU
models here, their median ratio (`shared_ratios`: a workload whose prompts are longer than
the seed assumes is slower on every GPU). Why a median: a crashed or stalled run (a 10x slow
outlier) moves a mean by a tenth of its size at every later step; it does not move a median
of five runs at all. After two agreeing runs the estimate is theirs. Without a seed profile
the median of the runs' own figures is the estimate.

The confidence of an estimate is its run count and `rel_uncertainty`: the standard error of a
median, 1.253 x 1.4826 x MAD / sqrt(n), as a relative figure (NaN below two runs); how far
one run strays from it is `rel_spread`, 1.4826 x MAD as a relative figure (the deadline
margin of `policies.margin` plans with both).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from policies.model import Profile

WINDOW = 15  # recent runs kept per (workload, GPU model)


@dataclass(frozen=True)
class Run:
    """One completed run, per GPU (data-parallel over the job's GPUs)."""

    prompts_per_s: float
    power_w: float

    @classmethod
    def of(cls, *, gpus: int, runtime_s: float, energy_j: float, prompts: int) -> Run:
        if gpus <= 0 or runtime_s <= 0 or prompts <= 0 or energy_j < 0:
            raise ValueError(f"cannot learn from gpus={gpus} runtime_s={runtime_s} prompts={prompts} "
                             f"energy_j={energy_j}")
        return cls(prompts / (gpus * runtime_s), energy_j / (gpus * runtime_s))


@dataclass(frozen=True)
class Ratios:
    """Log ratios of measured to seed figures (throughput, power)."""

    throughput: float
    power: float


def ratios(runs: Iterable[Run], seed: Profile) -> list[Ratios]:
    return [Ratios(math.log(r.prompts_per_s / seed.prompts_per_s), math.log(max(r.power_w, 1e-9) / seed.power_w))
            for r in runs]


def shared_ratios(others: Iterable[tuple[Profile, Sequence[Run]]]) -> Ratios | None:
    """The workload's correction learned on other GPU models: the median of their runs'
    ratios to their own seeds (None without any)."""
    pooled = [x for seed, runs in others for x in ratios(runs, seed)]
    if not pooled:
        return None
    return Ratios(statistics.median(x.throughput for x in pooled), statistics.median(x.power for x in pooled))


def _uncertainty(values: Sequence[float]) -> float:
    if len(values) < 2:
        return math.nan
    m = statistics.median(values)
    mad = statistics.median(abs(v - m) for v in values)
    return math.expm1(1.253 * 1.4826 * mad / math.sqrt(len(values)))


def _spread(values: Sequence[float]) -> float:
    if len(values) < 2:
        return math.nan
    m = statistics.median(values)
    return math.expm1(1.4826 * statistics.median(abs(v - m) for v in values))


def estimate(seed: Profile | None, runs: Sequence[Run], *, workload: str, model: str,
             shared: Ratios | None = None) -> Profile:
    """The profile of (workload, model) from its seed, its recent runs (oldest first; only the
    last `WINDOW` count) and the workload's correction from other models."""
    runs = list(runs)[-WINDOW:]
    if seed is None:
        if not runs:
            raise ValueError(f"nothing to learn {workload} on {model} from")
        tput = statistics.median(r.prompts_per_s for r in runs)
        return Profile(workload=workload, model=model, prompts_per_s=tput,
                       power_w=statistics.median(r.power_w for r in runs), latency_p50_ms=math.nan,
                       latency_p95_ms=math.nan, source=f"measured here (n={len(runs)})", samples=len(runs),
                       rel_uncertainty=_uncertainty([math.log(r.prompts_per_s) for r in runs]),
                       rel_spread=_spread([math.log(r.prompts_per_s) for r in runs]))
    prior = shared or Ratios(0.0, 0.0)
    own = ratios(runs, seed)
    x = statistics.median([prior.throughput] + [r.throughput for r in own])
    y = statistics.median([prior.power] + [r.power for r in own])
    tput = seed.prompts_per_s * math.exp(x)
    where = (f"measured here (n={len(runs)})" if runs
             else f"{seed.source or 'seed'}, corrected by this workload's runs on other GPU models")
    return replace(seed, prompts_per_s=tput, power_w=seed.power_w * math.exp(y),
                   latency_p50_ms=seed.latency_p50_ms * math.exp(-x),
                   latency_p95_ms=seed.latency_p95_ms * math.exp(-x),
                   source=where, samples=len(runs),
                   rel_uncertainty=_uncertainty([r.throughput for r in own]),
                   rel_spread=_spread([r.throughput for r in own]))


def learned_by_model(workload: str, runs: Mapping[str, Sequence[Run]],
                      seeds: Mapping[tuple[str, str], Profile]) -> dict[str, Profile]:
    """Every learned profile of one workload, by GPU model: each model with runs (its seed, if
    it has one, corrected by its own runs and the workload's ratios on the other models), and
    each seeded model without runs corrected by the workload's runs elsewhere. Empty without
    runs. The daemon's store and the simulator both learn through this."""
    out: dict[str, Profile] = {}
    for model in sorted(set(runs) | {m for (w, m) in seeds if w == workload}):
        own = list(runs.get(model, ()))
        seed = seeds.get((workload, model))
        shared = shared_ratios((seeds[(workload, m)], rs) for m, rs in runs.items()
                               if m != model and (workload, m) in seeds) if seed is not None else None
        if own or shared is not None:
            out[model] = estimate(seed, own, workload=workload, model=model, shared=shared)
    return out
