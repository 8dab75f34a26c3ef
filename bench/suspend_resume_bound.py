"""The most any suspend-resume policy can save in a scenario whose pool is never full, with or
without a cost per resume (the GAIA comparison of interruptible jobs).

With free resumes a job's cheapest plan is its window's cleanest hours (or parts of hours),
taken in order of intensity. A resume that costs `r` seconds of extra running changes that:
cutting pays for itself only where the hours skipped are dirty enough. The exact cheapest
plan then comes from a dynamic programme over the window's hour pieces, in whole minutes:

- Intensity is constant within a piece (the data's hours, cut at the window's ends), so for
  a fixed shape of plan (which pieces are run in full, where segments start and end) the
  grams are linear in the minutes run in each partly used piece, under one equality (the work
  plus one `r` per resume). A linear programme with one equality has an optimum with at most
  one variable strictly inside its bounds: the cheapest plan runs whole pieces plus at most one
  part of a piece.
- When the window's ends, the work and `r` are whole minutes, that part is whole minutes too,
  so a programme over minutes finds the exact optimum. Widening the window to whole minutes
  and rounding the work down only makes the problem easier, so the figure is a true bound on
  what any policy can save (it is not a plan anyone can run).

No shortest segment and no limit on segments: those only make plans dearer.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

HOUR_S = 3600.0
MINUTE_S = 60.0


def window_pieces(integral_g_per_kwh_s, start_s: float, end_s: float) -> list[tuple[float, float]]:
    """[start, end) cut at the data's whole hours: (mean intensity g/kWh, length s) in time order.
    `integral_g_per_kwh_s(a, b)` is the zone's intensity integrated over [a, b]."""
    pieces, t = [], start_s
    while t < end_s - 1e-9:
        e = min(end_s, (math.floor(t / HOUR_S) + 1) * HOUR_S)
        pieces.append((integral_g_per_kwh_s(t, e) / (e - t), e - t))
        t = e
    return pieces


def cheapest_free_resumes(pieces: Iterable[tuple[float, float]], work_s: float) -> float:
    """g/kWh x s of `work_s` run in the cleanest parts of `pieces`, resumes free."""
    need, total = work_s, 0.0
    for rate, length in sorted(pieces):
        take = min(length, need)
        total += rate * take
        need -= take
        if need <= 1e-9:
            break
    return total


def cheapest_with_resumes_min(pieces: Sequence[tuple[float, int]], work_min: float, resume_min: int) -> float:
    """g/kWh x minutes of the cheapest plan of `work_min` minutes of work over `pieces`
    ((intensity, whole minutes) in time order), any number of segments, each segment after the
    first running `resume_min` (whole) minutes more. `inf` when the work does not fit.

    The work's part of a minute goes, whole, into one piece that is not run in full: the
    cheapest plan runs whole pieces plus at most one part of a piece, and that part holds it."""
    whole = int(math.floor(work_min + 1e-12))
    rest = work_min - whole if work_min - whole > 1e-12 else 0.0
    if whole <= 0 and not rest:
        return 0.0
    inf, r = math.inf, resume_min
    # index = net whole minutes done + 2r, where net = minutes run - r per resume so far. A
    # resume's first piece may leave net below where it was (the resume is paid before the work
    # goes on), but never below -2r in a plan worth having: a segment of at most r minutes only
    # costs, save one that holds just the part of a minute. Net is capped at the work (top).
    base = 2 * r
    top = whole + base

    def spread(src: np.ndarray, cost0: float, rate: float, lo: int, hi: int, shift: int, out: np.ndarray) -> None:
        """out[min(j + u - shift, top)] <- src[j] + cost0 + rate * u for u in [lo, hi]; below 0 dropped."""
        for u in range(lo, hi + 1):
            step, cost = u - shift, cost0 + rate * u
            if step >= 0:
                if step <= top:
                    np.minimum(out[step:], src[:top + 1 - step] + cost, out=out[step:])
                tail = src[max(0, top + 1 - step):].min() + cost if step else inf  # finished in this run
            else:
                np.minimum(out[:top + 1 + step], src[-step:] + cost, out=out[:top + 1 + step])
                tail = inf
            if tail < out[top]:
                out[top] = tail

    def advance(idle: np.ndarray | None, run: np.ndarray | None, rate: float, a: int, extra: float | None,
                idle_out: np.ndarray, run_out: np.ndarray) -> None:
        """The piece's moves from (idle, run) (None: not started) into the outputs; with `extra`
        (the work's part of a minute, in minutes) each move also runs that part in this piece,
        so it cannot use the piece in full."""
        full = a if extra is None else a - 1  # most whole minutes a move may run here
        c0 = 0.0 if extra is None else rate * extra
        if idle is None:  # the first segment: to the piece's end, or inside it
            for u in range(0 if extra else 1, full + 1):
                j = min(u + base, top)
                if u < a:
                    idle_out[j] = min(idle_out[j], c0 + rate * u)
                if u >= 1 or extra:
                    run_out[j] = min(run_out[j], c0 + rate * u)
            return
        # from a pause: resume and run to the piece's end, or a segment inside it
        lo = 0 if extra else 1  # with the part of a minute, a segment may run that part alone
        spread(idle, c0, rate, lo, full, r, run_out)
        spread(idle, c0, rate, lo, min(full, a - 1), r, idle_out)
        # running into the piece: through it, stop inside it, or stop and resume before its end
        if extra is None:
            spread(run, 0.0, rate, a, a, 0, run_out)
            np.minimum(idle_out, run, out=idle_out)  # stopped at the boundary
        else:
            np.minimum(idle_out, run + c0, out=idle_out)  # ran the part of a minute and stopped
        spread(run, c0, rate, 1, min(full, a - 1), 0, idle_out)
        spread(run, c0, rate, lo, min(full, a - 1), r, run_out)

    blank = np.full(top + 1, inf)
    idle0, run0 = blank.copy(), blank.copy()  # the part of a minute still to place
    idle1, run1 = blank.copy(), blank.copy()  # placed (only used when there is one)
    for rate, a in pieces:
        if a <= 0:
            continue
        n_idle0, n_run0 = idle0.copy(), blank.copy()  # skip the piece
        advance(None, None, rate, a, None, n_idle0, n_run0)
        advance(idle0, run0, rate, a, None, n_idle0, n_run0)
        if rest:
            n_idle1, n_run1 = idle1.copy(), blank.copy()
            advance(None, None, rate, a, rest, n_idle1, n_run1)
            advance(idle0, run0, rate, a, rest, n_idle1, n_run1)
            advance(idle1, run1, rate, a, None, n_idle1, n_run1)
            idle1, run1 = n_idle1, n_run1
        idle0, run0 = n_idle0, n_run0
    return float(min(idle1[top], run1[top]) if rest else min(idle0[top], run0[top]))


def cheapest_with_resumes(pieces: Sequence[tuple[float, float]], work_s: float, resume_s: float) -> float:
    """A lower bound on g/kWh x s of any plan of `work_s` over `pieces` ((intensity, s) in time
    order) where each resume runs `resume_s` more: exact on whole minutes, with the window's
    partial pieces widened and the work rounded down to whole minutes. Falls back to the
    free-resume figure (also a bound) when `resume_s` is not whole minutes."""
    if resume_s <= 0 or abs(resume_s / MINUTE_S - round(resume_s / MINUTE_S)) > 1e-9:
        return cheapest_free_resumes(pieces, work_s)
    minutes = [(rate, int(math.ceil(length / MINUTE_S - 1e-9))) for rate, length in pieces]
    best_min = cheapest_with_resumes_min(minutes, work_s / MINUTE_S, int(round(resume_s / MINUTE_S)))
    return best_min * MINUTE_S


def ideal_suspend_resume_pct(scenario, zone: str, resume_cost_s: float = 0.0) -> float:
    """The most any suspend-resume policy can save in this scenario against run-at-arrival, in
    %: each job alone in [arrival, deadline] on a pool that is never full, each resume running
    `resume_cost_s` more (0: the cleanest hours or parts of hours, in any number of pieces); a
    job's grams are its GPUs x its intensity integral (one power per GPU, as in GAIA's pool).
    GAIA's own "wait awhile" figure is the free-resume ideal on its hourly data."""
    zi = scenario.carbon[zone]
    at_arrival = best = 0.0
    for job in scenario.jobs:
        a, r, k = job.submitted_at.timestamp(), float(job.est_runtime_s), max(1, job.gpus)
        at_arrival += k * zi.integral_g_per_kwh_s(a, a + r)
        end = job.deadline.timestamp() if job.deadline is not None else a + r + 24 * HOUR_S
        if resume_cost_s > 0:  # widen the window to whole minutes: a relaxation, still a bound
            a, end = math.floor(a / MINUTE_S) * MINUTE_S, math.ceil(end / MINUTE_S) * MINUTE_S
        pieces = window_pieces(zi.integral_g_per_kwh_s, a, end)
        best += k * (cheapest_with_resumes(pieces, r, resume_cost_s) if resume_cost_s > 0
                     else cheapest_free_resumes(pieces, r))
    return 100.0 * (1.0 - best / at_arrival)
