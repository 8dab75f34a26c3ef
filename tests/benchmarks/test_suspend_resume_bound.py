"""The suspend-resume bound (bench/suspend_resume_bound.py) against brute force: the exact
cheapest plan of a job over hour pieces when each resume costs extra running time."""

from __future__ import annotations

import itertools
import math
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.suspend_resume_bound import (  # noqa: E402
    cheapest_free_resumes, cheapest_with_resumes, cheapest_with_resumes_min, window_pieces)


def brute_force(pieces: list[tuple[float, int]], work: int, resume: int) -> float:
    """Every on/off pattern over the pieces' minutes: the cheapest whose minutes cover the work
    plus one `resume` per segment after the first."""
    rates = [rate for rate, length in pieces for _ in range(length)]
    best = math.inf
    for pattern in itertools.product((0, 1), repeat=len(rates)):
        segments = sum(1 for i, on in enumerate(pattern) if on and (i == 0 or not pattern[i - 1]))
        if segments and sum(pattern) >= work + (segments - 1) * resume:
            best = min(best, sum(r for r, on in zip(rates, pattern) if on))
    return best


@pytest.mark.parametrize("seed", range(60))
def test_the_programme_finds_the_cheapest_plan_of_every_pattern(seed):
    rng = random.Random(seed)
    pieces = [(float(rng.choice([1, 2, 3, 5, 8, 13, 21])), rng.randint(1, 5)) for _ in range(rng.randint(1, 6))]
    while sum(length for _, length in pieces) > 14:
        pieces.pop()
    work = rng.randint(1, sum(length for _, length in pieces) + 1)  # sometimes more than fits
    resume = rng.randint(0, 4)
    assert cheapest_with_resumes_min(pieces, work, resume) == pytest.approx(brute_force(pieces, work, resume))


@pytest.mark.parametrize("seed", range(40))
def test_a_part_of_a_minute_of_work_goes_where_the_cheapest_plan_puts_it(seed):
    # on a half-minute grid the brute force sees every plan that matters: the cheapest runs
    # whole pieces plus one part of a piece, which holds the half minute
    rng = random.Random(1000 + seed)
    pieces = [(float(rng.choice([1, 2, 3, 5, 8, 13, 21])), rng.randint(1, 4)) for _ in range(rng.randint(1, 5))]
    while sum(length for _, length in pieces) > 8:
        pieces.pop()
    work = rng.randint(0, sum(length for _, length in pieces)) + 0.5
    resume = rng.randint(0, 3)
    halves = [(rate, 2 * length) for rate, length in pieces]
    expected = brute_force(halves, int(2 * work), 2 * resume) / 2
    assert cheapest_with_resumes_min(pieces, work, resume) == pytest.approx(expected)


def test_a_resume_that_costs_more_than_the_dirty_hour_saves_keeps_the_job_in_one_piece():
    # 2 clean minutes, 1 dirty, 2 clean: 4 minutes of work
    pieces = [(1.0, 2), (3.0, 1), (1.0, 2)]
    assert cheapest_with_resumes_min(pieces, 4, 0) == 4.0  # free resumes: skip the dirty minute
    assert cheapest_with_resumes_min(pieces, 4, 1) == 6.0  # one resume: 5 clean minutes = 5 > run through 1+1+3+1
    assert cheapest_with_resumes_min(pieces, 4, 2) == 6.0  # run through: 1+1+3+1


def test_work_that_does_not_fit_the_window_has_no_plan():
    assert cheapest_with_resumes_min([(1.0, 3)], 4, 1) == math.inf


def test_with_hours_the_bound_matches_the_free_ideal_at_no_cost_and_never_exceeds_a_one_piece_run():
    rng = random.Random(3)
    rates = [rng.uniform(100, 500) for _ in range(30)]

    def integral(a: float, b: float) -> float:  # hourly steps
        total, t = 0.0, a
        while t < b:
            e = min(b, (math.floor(t / 3600) + 1) * 3600)
            total += rates[int(t // 3600)] * (e - t)
            t = e
        return total

    pieces = window_pieces(integral, 1800.0, 1800.0 + 20 * 3600)
    assert [length for _, length in pieces][:2] == [1800.0, 3600.0]
    work = 7 * 3600 + 600
    free = cheapest_free_resumes(pieces, work)
    one_minute = cheapest_with_resumes(pieces, work, 60.0)
    best_window = min(integral(s, s + work) for s in range(1800, 1800 + 13 * 3600 - 600 + 1, 60))
    assert free <= one_minute <= best_window
    assert one_minute > free  # the cuts of the free ideal are not all worth a minute each
    # an hour of resume: no cut pays, the best plan is the best single window
    assert cheapest_with_resumes(pieces, work, 3600.0) == pytest.approx(best_window)
