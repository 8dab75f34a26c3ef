"""The price of lateness: how many grams of CO2 one GPU-hour past a deadline is worth.

Greedy, cpsat and the oracle minimise grams + price x GPU-hours late (k GPUs x hours a job is
expected to finish past its deadline), so a plan may let a job run late where being on time
would cost more grams than the price, instead of buying every avoided miss at any carbon cost
(moving long jobs onto the fastest, hottest GPUs in dirtier zones). `strict` (inf) keeps the
lexicographic order: fewer misses first, then fewer GPU-hours late, then fewer grams (a job
that must miss its deadline finishes as soon as it can, not wherever its grams are lowest).

Set per policy (`cpsat:lateness_g_per_gpu_h=500`, `greedy:lateness_g_per_gpu_h=strict`) or in
the daemon's config (`policy = "cpsat:lateness_g_per_gpu_h=500"`). The default
(`DEFAULT_LATENESS_G_PER_GPU_H`) was chosen from the overload scenarios of
bench/simulate_bench.py (see docs/benchmarks.md, "overload").

For scale: an H100 draws ~0.5-0.7 kW, so one GPU-hour emits ~30 g in a clean zone and
~400 g in a coal-heavy one; a price of a few hundred grams makes a GPU-hour of lateness worth
about one GPU-hour of dirty power.
"""

from __future__ import annotations

import math

#: the default price, in grams of CO2 per GPU-hour late (see the module docstring)
DEFAULT_LATENESS_G_PER_GPU_H = math.inf
#: strict: among plans with as many misses, the one late by fewer GPU-hours wins, then grams;
#: charged as this price (10 kg per GPU-hour: lateness outweighs any plausible carbon saving)
STRICT_LATENESS_G_PER_GPU_H = 1e4


def parse_lateness_price(value: object) -> float:
    """`strict`/`inf` -> inf, a number of grams per GPU-hour >= 0 -> float; ValueError else."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("strict", "inf", "infinity"):
            return math.inf
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"lateness_g_per_gpu_h must be a number of grams per GPU-hour or 'strict' "
                             f"(got {value!r})") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise ValueError(f"lateness_g_per_gpu_h must be a number of grams per GPU-hour >= 0 or 'strict' "
                         f"(got {value!r})")
    return float(value)


def price_text(price: float) -> str:
    """`strict` or e.g. `500 g/GPU-h`."""
    return "strict" if not math.isfinite(price) else f"{price:g} g/GPU-h"
