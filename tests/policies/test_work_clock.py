"""cpsat's deterministic budget (`deterministic=True`, `policies.solvers.work_clock`): the same
snapshot and budget give the same plan on any host at any load, so simulations that compare
policies can be rerun and give the same figures."""

from __future__ import annotations

import logging
import re
import types

from policies.solvers.cpsat import CpsatPolicy
from policies.solvers.work_clock import WallClock, WorkClock
from policy_checker import score, violations
from test_policy_search import random_snapshot


def _fingerprint(plan) -> list[tuple]:
    return sorted((a.job_id, a.node, a.gpu_ids, a.start_at) for a in plan.assignments)


def _lns_rounds(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"(\d+) LNS rounds", text)]


class _CrawlingHost:
    """time.monotonic on a host 50x slower than ours: every reading is 0.2 s later."""

    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        self.t += 0.2
        return self.t


def test_a_work_clock_advances_only_by_the_work_charged_to_it():
    clock = WorkClock()
    assert clock.now() == 0.0 and clock.deterministic
    clock.charge(0.25)
    clock.charge(-1.0)  # nothing is ever taken back
    assert clock.now() == 0.25
    assert not WallClock().deterministic


def test_a_deterministic_search_gives_the_same_plan_however_loaded_the_host(monkeypatch, caplog):
    snapshot = random_snapshot(4, 70, 8)
    policy = CpsatPolicy(max_time_s=0.5, deterministic=True)
    with caplog.at_level(logging.INFO, logger="policies.solvers.cpsat"):
        first = policy.plan(snapshot)
        again = policy.plan(snapshot)
        monkeypatch.setattr("policies.solvers.work_clock.time", types.SimpleNamespace(monotonic=_CrawlingHost().monotonic))
        crawling = policy.plan(snapshot)
        wall = CpsatPolicy(max_time_s=0.5).plan(snapshot)
    rounds = _lns_rounds(caplog.text)
    assert rounds[0] > 0 and rounds[0] == rounds[1] == rounds[2]  # the same search, LNS included
    assert rounds[3] == 0  # by the crawling wall clock the budget was gone before LNS began
    assert _fingerprint(first) == _fingerprint(again) == _fingerprint(crawling)
    assert violations(snapshot, first) == [] and violations(snapshot, wall) == []


def test_a_larger_work_budget_buys_at_least_as_good_a_plan():
    snapshot = random_snapshot(5, 70, 8)
    small = CpsatPolicy(max_time_s=0.05, deterministic=True).plan(snapshot)
    large = CpsatPolicy(max_time_s=1.0, deterministic=True).plan(snapshot)
    assert violations(snapshot, large) == []
    assert score(large) <= score(small)


def test_a_greedy_pass_is_charged_the_segment_search_of_its_interruptible_jobs():
    """A checkpoint job's segments are searched over its whole window (8 h of work due in
    15 h: 60 slots of 15 min; with no deadline, the 48 h horizon's 192), and that search is
    most of a pass over such jobs, so the budget's clock must count it."""
    from policies.problem.instance import compile_problem
    from policies.solvers.work_clock import (GREEDY_PASS_MIN_S, GREEDY_PASS_S_PER_CELL, SEGMENT_PASS_S_PER_SLOT,
                                     SEGMENT_PASS_S_PER_SLOT_GROUP, greedy_pass_work_s, segment_window_slots)
    from test_segments import _job, _snap

    due = compile_problem(_snap(_job(1), _job(2, kind=None)))
    open_ended = compile_problem(_snap(_job(1, deadline=None), _job(2, kind=None)))
    plain = compile_problem(_snap(_job(1, kind=None), _job(2, kind=None)))
    assert segment_window_slots(due) == 60
    assert segment_window_slots(open_ended) == 192
    assert segment_window_slots(plain) == 0
    cells = len(due.jobs) * len(due.groups) * due.n_slots
    per_slot = SEGMENT_PASS_S_PER_SLOT + SEGMENT_PASS_S_PER_SLOT_GROUP * len(due.groups)
    for problem, slots in ((due, 60), (open_ended, 192), (plain, 0)):
        assert greedy_pass_work_s(problem) == max(GREEDY_PASS_MIN_S, GREEDY_PASS_S_PER_CELL * cells + slots * per_slot)
    assert greedy_pass_work_s(open_ended) > greedy_pass_work_s(plain)
