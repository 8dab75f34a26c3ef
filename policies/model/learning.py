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

One user cannot poison a profile for everyone (issue 48): a run more than
`MAX_SEED_FACTOR` off its seed, either way, is not learned from (`is_outlier`: a job that
declared one prompt and slept, a stall, another program under the workload's name); with
runs of two users or more in the window, each user's runs weigh at most `MAX_USER_WEIGHT`
runs' worth in the median (a lone user's count in full: nobody else's word is at stake);
and a full window drops the oldest run of the user with the most runs in it (`keep`), so
one user's many runs never crowd the others' out. Runs of unknown users (learned before
owners were kept, or the simulator's) count as one user.

The confidence of an estimate is its run count and `rel_uncertainty`: the standard error of a
median, 1.253 x 1.4826 x MAD / sqrt(n), as a relative figure (NaN below two runs); how far
one run strays from it is `rel_spread`, 1.4826 x MAD as a relative figure (the deadline
margin of `policies.model.margin` plans with both).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from policies.types import Profile

WINDOW = 15  # recent runs kept per (workload, GPU model)
# A run whose throughput or power per GPU is more than this factor off its seed's, either
# way, is not learned from: the seed model's own error is tens of percent, not 10x.
MAX_SEED_FACTOR = 10.0
# With runs of two users or more, each user's runs weigh at most this many runs' worth.
MAX_USER_WEIGHT = 3.0


@dataclass(frozen=True)
class Run:
    """One completed run, per GPU (data-parallel over the job's GPUs)."""

    prompts_per_s: float
    power_w: float
    user: int | None = None  # the uid whose job it was (None: not known)

    @classmethod
    def of(cls, *, gpus: int, runtime_s: float, energy_j: float, prompts: int, user: int | None = None) -> Run:
        if gpus <= 0 or runtime_s <= 0 or prompts <= 0 or energy_j < 0:
            raise ValueError(f"cannot learn from gpus={gpus} runtime_s={runtime_s} prompts={prompts} "
                             f"energy_j={energy_j}")
        return cls(prompts / (gpus * runtime_s), energy_j / (gpus * runtime_s), user)


def is_outlier(run: Run, seed: Profile | None) -> bool:
    """Whether `run` is more than `MAX_SEED_FACTOR` off `seed` in throughput or power (never
    with no seed: then there is nothing to compare with)."""
    if seed is None or seed.prompts_per_s <= 0 or seed.power_w <= 0:
        return False
    bound = math.log(MAX_SEED_FACTOR)
    return (run.prompts_per_s <= 0 or abs(math.log(run.prompts_per_s / seed.prompts_per_s)) > bound
            or abs(math.log(max(run.power_w, 1e-9) / seed.power_w)) > bound)


def keep(runs: Sequence[Run], new: Run) -> list[Run]:
    """The window after `new` (oldest first): while it holds more than `WINDOW` runs, the
    oldest run of the user with the most runs in it goes (one user alone: the oldest)."""
    out = [*runs, new]
    while len(out) > WINDOW:
        counts: dict[int | None, int] = {}
        for r in out:
            counts[r.user] = counts.get(r.user, 0) + 1
        most = max(counts.values())
        drop = next(i for i, r in enumerate(out) if counts[r.user] == most)
        del out[drop]
    return out


def user_weights(runs: Sequence[Run]) -> list[float]:
    """Each run's weight in the median: 1, but with runs of two users or more, a user's runs
    share at most `MAX_USER_WEIGHT` between them."""
    counts: dict[int | None, int] = {}
    for r in runs:
        counts[r.user] = counts.get(r.user, 0) + 1
    if len(counts) < 2:
        return [1.0] * len(runs)
    return [min(1.0, MAX_USER_WEIGHT / counts[r.user]) for r in runs]


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The median of `values` with `weights` (equal weights: `statistics.median`'s answer)."""
    if all(w == 1.0 for w in weights):
        return statistics.median(values)
    pairs = sorted(zip(values, weights))
    half = sum(weights) / 2
    acc = 0.0
    for i, (v, w) in enumerate(pairs):
        acc += w
        if math.isclose(acc, half, rel_tol=1e-12) and i + 1 < len(pairs):
            return (v + pairs[i + 1][0]) / 2
        if acc > half:
            return v
    return pairs[-1][0]


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
    pairs = [(run, x) for seed, runs in others for run, x in zip(runs, ratios(runs, seed))]
    if not pairs:
        return None
    weights = user_weights([run for run, _ in pairs])
    return Ratios(weighted_median([x.throughput for _, x in pairs], weights),
                  weighted_median([x.power for _, x in pairs], weights))


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
        weights = user_weights(runs)
        tput = weighted_median([r.prompts_per_s for r in runs], weights)
        return Profile(workload=workload, model=model, prompts_per_s=tput,
                       power_w=weighted_median([r.power_w for r in runs], weights), latency_p50_ms=math.nan,
                       latency_p95_ms=math.nan, source=f"measured here (n={len(runs)})", samples=len(runs),
                       rel_uncertainty=_uncertainty([math.log(r.prompts_per_s) for r in runs]),
                       rel_spread=_spread([math.log(r.prompts_per_s) for r in runs]))
    prior = shared or Ratios(0.0, 0.0)
    own = ratios(runs, seed)
    weights = [1.0] + user_weights(runs)
    x = weighted_median([prior.throughput] + [r.throughput for r in own], weights)
    y = weighted_median([prior.power] + [r.power for r in own], weights)
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
