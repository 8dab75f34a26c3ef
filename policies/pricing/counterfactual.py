"""The "if run now" counterfactual: one rule, stated once, used by every policy and path.

**Rule.** What a carbon-blind scheduler would have done with the job when it was submitted:
run it alone (the rest of the queue ignored; running and pinned jobs still hold their GPUs)
on the fitting GPUs free *earliest*; among those, on the *fastest* (shortest estimated
runtime); if several (zone, GPU model) pairs are still tied, equally early and equally fast,
a carbon-blind scheduler has no reason to prefer one, so the counterfactual is the *mean* of
their grams. Zone, node and model names never decide it. It is priced like the plan (same
forecast, PUE and blind price). It is computed when the job is first planned (normally the
tick right after submission) and kept from then on (`QueuedJob.gco2_if_now`), so `plan`,
`show`, the receipt, `report` and `export` compare the plan with the same figure, and waiting
does not shrink the saving.

`choose` applies the tie rule to candidate arrays; the slot planner (`greedy.ChunkNotes`,
`placement.if_now`), fifo and the short-job packer each compute their candidates their own
(vectorised) way and pass them here or apply the same arithmetic.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np

#: Starts closer than this (seconds) are equally early; runtimes closer than this share of the
#: shorter one are equally fast.
START_TOL_S = 1.0
RUNTIME_TOL = 1e-9

#: How receipts, reports and exports name the counterfactual.
RULE_SHORT = ("the job alone at submission on the earliest free, fastest fitting GPUs "
              "(the mean over equally early and fast zones/models)")


class Counterfactual(NamedTuple):
    """The counterfactual of one job: start (seconds or slot), grams, and where."""

    start: float
    gco2: float
    kinds: tuple[tuple[str, str], ...]  # the tied (zone, model) pairs it averages over

    def where(self) -> str:
        """ "H100 in DE", or "H100 in A/B (mean of 2)" for a tie."""
        return _where(self.kinds)


@functools.lru_cache(maxsize=256)
def _where(kinds: tuple[tuple[str, str], ...]) -> str:
    models = "/".join(sorted({m for _, m in kinds}))
    zones = "/".join(sorted({z for z, _ in kinds}))
    return f"{models} in {zones}" + (f" (mean of {len(kinds)})" if len(kinds) > 1 else "")


def choose(kinds: Sequence[tuple[str, str]], start: np.ndarray, runtime_s: np.ndarray, gco2: np.ndarray,
           start_tol: float = START_TOL_S) -> Counterfactual | None:
    """The counterfactual among candidates (one or more per (zone, model) kind, e.g. sites of
    different PUE): the earliest `start` (inf: cannot start), then the shortest `runtime_s`,
    then the mean `gco2` over the distinct tied kinds, each kind the mean of its tied
    candidates. None: no candidate."""
    import numpy as np  # here, not at the top: the CLI (any user's python) imports RULE_SHORT only

    start = np.asarray(start, dtype=float)
    if start.size == 0 or not np.isfinite(start).any():
        return None
    runtime_s = np.asarray(runtime_s, dtype=float)
    gco2 = np.asarray(gco2, dtype=float)
    s0 = float(start.min())
    early = start <= s0 + start_tol
    r0 = float(runtime_s[early].min())
    tied = early & (runtime_s <= r0 * (1 + RUNTIME_TOL))
    by_kind: dict[tuple[str, str], list[float]] = {}
    for i in np.flatnonzero(tied).tolist():
        by_kind.setdefault(tuple(kinds[i]), []).append(float(gco2[i]))
    # each tied kind counts once; candidates within a kind (sites of different PUE) average
    return Counterfactual(s0, float(np.mean([np.mean(g) for g in by_kind.values()])), tuple(sorted(by_kind)))
