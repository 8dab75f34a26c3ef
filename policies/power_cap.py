"""How a job responds to a GPU power limit below what it would draw: the cap response.

A board limited to `cap_w` while the job would draw `uncapped_w` (both per GPU) draws the
cap, and its clocks drop until it does; the work takes longer, by less than the power fell,
so the energy falls. The response is modelled per vendor as

    runtime factor = (uncapped_w / cap_w) ** ALPHA[vendor]     (cap_w < uncapped_w)
    power          = cap_w

and a cap at or above the job's uncapped draw changes nothing (memory-bound LLM decode on
an H200 draws 137-300 W of its 700 W, so a 500 W cap never triggers: Ma et al., "The
Illusion of Power Capping in LLM Decode", arXiv:2605.11999).

Sources of the fitted exponents:

- NVIDIA: "From Words to Watts: Benchmarking the Energy Costs of Large Language Model
  Inference" (Samsi et al., IEEE HPEC 2023): capping an A100 from 250 W to 175 W (0.70 of
  its draw) cut inference energy by about 23 % for about 6-7 % more latency. 1.065 =
  (250/175) ** ALPHA gives ALPHA = ln 1.065 / ln(250/175) = 0.177; the energy it implies,
  0.70 x 1.065 = 0.745 (25 % less), is within two points of the 23 % reported.
- AMD: no public cap-response figure for MI300X-class parts was found for this model; the
  cross-vendor study of H100, H200 and MI300X under power caps ("AI Application
  Benchmarking: Power-Aware Performance Analysis for Vision and Language Models",
  arXiv:2603.16164) reports that no single cap is optimal across the three. Until measured
  runs say otherwise the AMD exponent is an ASSUMPTION: 0.25, i.e. a steeper slowdown than
  NVIDIA's, so the planner is more cautious with AMD caps (a flagged guess, not a fit).

Pure functions; no I/O.
"""

from __future__ import annotations

import math

# Runtime exponent per vendor (see the module docstring for each figure's source).
ALPHA = {"nvidia": math.log(1.065) / math.log(250.0 / 175.0), "amd": 0.25}
DEFAULT_ALPHA = ALPHA["amd"]  # an unknown vendor: the cautious (steeper) response


def alpha_of(vendor: str | None) -> float:
    return ALPHA.get((vendor or "").lower(), DEFAULT_ALPHA)


def capped(uncapped_w: float, cap_w: float | None, vendor: str | None) -> tuple[float, float]:
    """(runtime factor, power per GPU in W) of a job that draws `uncapped_w` per GPU when its
    GPUs are limited to `cap_w` (None: no cap)."""
    if cap_w is None or uncapped_w <= 0 or cap_w >= uncapped_w:
        return 1.0, uncapped_w
    if cap_w <= 0:
        raise ValueError(f"a power cap of {cap_w!r} W is not a power cap")
    return (uncapped_w / cap_w) ** alpha_of(vendor), cap_w
