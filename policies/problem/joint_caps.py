"""The GPU power limit chosen together with the placement (issue 29).

A limit below what a job draws makes it slower and cheaper (`policies.pricing.power_cap.capped`), so
it changes which placement is best: a GPU model whose capped run beats another model's
uncapped one, a start in the green hours that only a slower run still makes on time, a site
budget that holds the job now only at the lower power. Choosing the limit after the policy
has placed the job (`power_cap.choose_caps`) never sees those placements.

So the limit is a knot of the job's operating point on each GPU group, chosen before the
policies search: for every (job, group) whose GPU model operators let the planner cap
(`Snapshot.caps`), each candidate limit (95 % of the default down to the floor, and none) is
priced over the job's start window on that group: its runtime and power at that limit, its
on-time window at the stretched runtime (deadline with the estimate's margin, maximum delay,
horizon) from the first slot the group has its GPUs free, the starts whose whole run the
group's power budget holds at that power (where it has one), and its grams at the best start
in that window. The limit with the fewest grams at its best start wins; none when no limit
beats the default by a gram's millionth (unless the budget holds the job only at a lower
limit), when the default already misses the deadline, or when a stretched run breaks the
job's explicit time limit or a latency SLO (every p95 latency stretches by the runtime
factor). The problem's job arrays then hold the job at that limit, so greedy, cpsat, the LP
bound and the oracle all plan with it, and the estimate carries the limit and the uncapped
figures beside it (`placement.build_assignment`).

What this leaves out, on purpose: the queue. A slower run holds its GPUs longer, and the
choice is made per job before the others are placed, so on a saturated pool a cap can delay
another job; `choose_caps` still runs after placement (for the carbon-blind baselines, and to
go lower where the plan leaves room before the next job). Interruptible jobs (issue 30) are
planned at the default limit: their segments are priced by their own rules.

Pure (numpy); no I/O.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from policies.model.catalog import lookup
from policies.model.energy import ProfileBook, model_choice
from policies.problem.job_arrays import JobArrays
from policies.model.margin import duration_slots, latest_start_slots
from policies.types import J_PER_KWH, QueuedJob
from policies.problem.occupancy import Occupancy
from policies.model.operating_point import Choice
from policies.pricing.power_cap import CapBounds, alpha_of, candidate_fractions, default_limit_w
from policies.problem.slot_grid import SlotGrid
from policies.problem.topology import Group
from policies.problem.zone_integrals import ZoneIntegrals

_CHUNK = 256  # jobs priced at once per group (a chunk x limits x slots array)


class CapVariants:
    """Per allowed group, its candidate limits (W per GPU) and each (job, limit)'s runtime
    and power: what `choose` prices. Built before the problem's carbon knots, which must
    reach the end of the longest stretched run (`longest_s`)."""

    def __init__(self, arrays: JobArrays, jobs: Sequence[QueuedJob], groups: Sequence[Group],
                 bounds: CapBounds | None, book: ProfileBook) -> None:
        self.by_group: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self.longest_s = 0.0
        if bounds is None or not bounds.any_allowed or not jobs:
            return
        eligible = np.array([j.interruptible is None for j in jobs], dtype=bool) & ~arrays.job_resumed
        k = arrays.job_k.astype(np.float64)
        slo_rows = [i for i, j in enumerate(jobs) if j.workload is not None and
                    (j.ttft_slo_ms is not None or j.tpot_slo_ms is not None or j.latency_slo_ms is not None)]
        # an explicit time limit binds the stretched run (a derived one stretches with it)
        limit_s = np.array([math.inf if j.time_limit_s is None or j.time_limit_factor is not None
                            else j.time_limit_s for j in jobs], dtype=np.float64)
        for g, group in enumerate(groups):
            allow, low = bounds.for_model(group.model)
            try:
                spec = lookup(group.model)
            except KeyError:
                continue
            rows = np.flatnonzero(arrays.job_fit[:, g] & eligible)
            fractions = candidate_fractions(low)
            if not allow or not fractions or rows.size == 0:
                continue
            default_w = default_limit_w(spec.tdp_w, group.power_limit_w)
            caps_w = np.array([f * default_w for f in fractions], dtype=np.float64)
            per_gpu_w = arrays.job_power_w[rows, g] / k[rows]
            # (rows x limits): the cap response of `power_cap.capped`, vectorised
            hit = caps_w[None, :] < per_gpu_w[:, None]
            factor = np.where(hit, (per_gpu_w[:, None] / caps_w[None, :]) ** alpha_of(spec.vendor), 1.0)
            power_w = np.where(hit, caps_w[None, :], per_gpu_w[:, None]) * k[rows][:, None]
            runtime_s = arrays.job_runtime_s[rows, g][:, None] * factor
            ok = hit & (runtime_s <= limit_s[rows][:, None] * (1 + 1e-9))
            if slo_rows:
                _slo_check(jobs, group.model, book, rows, factor, ok)
            if not ok.any():
                continue
            allowed_s = np.where(ok, runtime_s, np.nan)
            self.by_group[g] = (rows, caps_w, allowed_s, power_w)
            self.longest_s = max(self.longest_s, float(np.nanmax(allowed_s)))


def _slo_check(jobs: Sequence[QueuedJob], model: str, book: ProfileBook, rows: np.ndarray, factor: np.ndarray,
               ok: np.ndarray) -> None:
    """Rule out the limits under which an inference job's p95 latencies on `model`, stretched
    by the runtime factor, break its SLOs."""
    for r, i in enumerate(rows.tolist()):
        job = jobs[i]
        if job.workload is None:
            continue
        c = model_choice(job, model, book)
        if not isinstance(c, Choice) or not c.inference:
            continue
        for value, limit in ((c.ttft_p95_ms, c.slos.ttft_ms), (c.tpot_p95_ms, c.slos.tpot_ms),
                             (c.latency_p95_ms, c.slos.latency_ms)):
            if limit is not None:
                ok[r] &= value * factor[r] <= limit


def choose(arrays: JobArrays, variants: CapVariants, occupancy: Occupancy, grid: SlotGrid,
           integrals: ZoneIntegrals) -> None:
    """Price each variant over its start window (see the module docstring) and put the winner
    in the job arrays; `arrays.job_cap_w` (jobs x groups, NaN: the default limit) records
    it, `job_uncapped_runtime_s` / `job_uncapped_power_w` the default's figures. The windows
    start where `occupancy` has the GPUs free, and stay under its power budgets."""
    n_jobs, n_groups = arrays.job_runtime_s.shape
    arrays.job_cap_w = np.full((n_jobs, n_groups), np.nan)
    arrays.job_uncapped_runtime_s = arrays.job_runtime_s.copy()
    arrays.job_uncapped_power_w = arrays.job_power_w.copy()
    if not variants.by_group:
        return
    S, slot_s = grid.n_slots, grid.slot_s
    margin, deadline_s = arrays.margin, arrays.deadline_s
    has_deadline = ~np.isnan(deadline_s)
    zone_index = {z: i for i, z in enumerate(integrals.zones)}
    for g, (rows, caps_w, runtime_v, power_v) in variants.by_group.items():
        group = occupancy.groups[g]
        tk, gk = integrals.zone_knots[zone_index[group.zone]]
        base = integrals.zone_base[zone_index[group.zone]]
        for lo in range(0, rows.size, _CHUNK):
            r = rows[lo:lo + _CHUNK]
            sl = slice(lo, lo + _CHUNK)
            k = arrays.job_k[r]
            width = occupancy.group_kth_free_slot.shape[1]
            first = np.maximum(arrays.job_earliest[r],
                               occupancy.group_kth_free_slot[g, np.minimum(k, width) - 1])
            # column 0: the default limit, as compiled; then each candidate limit
            runtime = np.concatenate([arrays.job_runtime_s[r, g][:, None], runtime_v[sl]], axis=1)
            power = np.concatenate([arrays.job_power_w[r, g][:, None], power_v[sl]], axis=1)
            valid = ~np.isnan(runtime)
            rt = np.where(valid, runtime, arrays.job_runtime_s[r, g][:, None])
            # each limit's last on-time start (as `job_arrays` computes it), then within the hard window
            on_time = np.where(has_deadline[r][:, None], latest_start_slots(
                deadline_s[r], rt, margin[r, g][:, None], arrays.job_earliest[r], slot_s), float(S))
            latest = np.minimum(on_time, arrays.job_hard_latest[r][:, None].astype(np.float64))
            # the default must make its deadline from its first free slot, or no cap at all;
            # only the rows with a limit left to weigh are priced, as flat (row, limit) pairs
            plain_ok = latest[:, 0] >= first
            valid &= plain_ok[:, None]
            valid[:, 0] &= valid[:, 1:].any(axis=1)
            pr, pc = np.nonzero(valid)
            if pr.size == 0:
                continue
            rt_p, power_p, latest_p, first_p = rt[pr, pc], power[pr, pc], latest[pr, pc], first[pr]
            lo_s, hi_s = int(first_p.min()), int(min(S - 1, latest_p.max()))
            best_p = np.full(pr.size, np.inf)
            if lo_s <= hi_s:  # price the slots some pair can start in, and only those
                span = slice(lo_s, hi_s + 1)
                ends = np.interp(grid.offsets_s[None, span] + rt_p[:, None], tk, gk)
                grams = (ends - base[None, span]) * (power_p * group.pue / J_PER_KWH)[:, None]
                slots = grid.index[None, span]
                inside = (slots >= first_p[:, None]) & (slots <= latest_p[:, None])
                room = occupancy.power_cap.get(group.budget)
                if room is not None:  # a power budget: only the starts whose whole run it holds
                    inside &= _budget_holds(room, rt_p, power_p, slot_s)[:, span]
                best_p = np.where(inside, grams, np.inf).min(axis=1)
            best = np.full(rt.shape, np.inf)
            best[pr, pc] = best_p
            pick = np.argmin(best, axis=1)
            at_default, at_pick = best[:, 0], best[np.arange(r.size), pick]
            take = plain_ok & (pick > 0) & np.isfinite(at_pick)
            priced = take & np.isfinite(at_default)  # else a budget holds the job only at a lower limit
            take[priced] &= at_default[priced] - at_pick[priced] > 1e-6 * np.maximum(1.0, np.abs(at_default[priced]))
            if not take.any():
                continue
            tr, tc = r[take], pick[take]
            arrays.job_cap_w[tr, g] = caps_w[tc - 1]
            arrays.job_runtime_s[tr, g] = runtime[take, tc]
            arrays.job_power_w[tr, g] = power[take, tc]
            arrays.job_scale[tr, g] = power[take, tc] * group.pue / J_PER_KWH
            arrays.job_duration[tr, g] = duration_slots(runtime[take, tc], slot_s)
            arrays.job_on_time_latest[tr, g] = np.clip(on_time[take, tc], -1e9, 1e9)
            arrays.job_latest[tr, g] = latest[take, tc].astype(np.int64)


def _budget_holds(room_w: np.ndarray, runtime_s: np.ndarray, power_w: np.ndarray, slot_s: float) -> np.ndarray:
    """(runtime_s's shape x slots): whether a budget with `room_w` watts left per slot holds a
    run of `runtime_s` at `power_w` started at each slot (slots past the horizon hold)."""
    n = room_w.size
    duration = duration_slots(runtime_s, slot_s)
    out = np.empty(runtime_s.shape + (n,), dtype=bool)
    padded = np.concatenate([room_w, np.full(n, np.inf)])
    for d in np.unique(duration).tolist():
        d_eff = min(d, n)
        least = np.lib.stride_tricks.sliding_window_view(padded, d_eff)[:n].min(axis=1)
        hit = duration == d
        out[hit] = least[None, :] >= power_w[hit][:, None] - 1e-9
    return out
