"""EDF: the carbon-blind, deadline-aware baseline.

Earliest deadline first (jobs without one last, then by submission), each job on the usable
pool that finishes it soonest (a faster model may win over an earlier start), ties by a
seeded random choice: `policies.solvers.fifo`'s list scheduler with another order and rule. It knows
nothing of carbon, so a carbon-aware policy must beat it at equal service: fewer grams with
no more deadline misses. Like fifo it ignores site power caps.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.solvers.fifo import FifoPolicy


@dataclass
class EdfPolicy(FifoPolicy):
    name: str = "edf"

    by_deadline = True
    rule = "earliest deadline first, on the GPUs that finish it soonest"
