"""Losing the database: periodic work backs off and logs the outage once instead of failing
every tick, and power samples wait in memory until the store takes them again."""

from __future__ import annotations

import logging
import threading

import pytest
from sqlalchemy.exc import OperationalError

from scheduler.process import DB_BACKOFF_MAX_S, CoalescedJob, is_unreachable


def outage() -> OperationalError:
    return OperationalError("SELECT 1", {}, Exception('connection to server at "127.0.0.1", port 5432 '
                                                      "failed: Connection refused"))


class FakeScheduler:
    def modify_job(self, *a, **k):
        pass


def test_unreachable_database_is_told_apart_from_other_errors():
    assert is_unreachable(outage())
    assert not is_unreachable(OperationalError("x", {}, Exception("database is locked")))
    assert not is_unreachable(ValueError("a bug"))


def test_a_tick_backs_off_while_the_database_is_down_and_logs_it_once(caplog):
    now = [0.0]
    calls = {"n": 0}
    down = {"yes": True}

    def tick():
        calls["n"] += 1
        if down["yes"]:
            raise outage()

    job = CoalescedJob(FakeScheduler(), "dispatch", tick, min_gap_s=0.0, stopping=threading.Event(),
                       clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="scheduler.process")
    tried_at = []
    while now[0] < 120:
        before = calls["n"]
        job.run()
        if calls["n"] > before:
            tried_at.append(now[0])
        now[0] += 0.5
    gaps = [b - a for a, b in zip(tried_at, tried_at[1:])]
    assert gaps[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]  # doubling back-off...
    assert max(gaps) <= DB_BACKOFF_MAX_S + 0.5  # ...capped
    assert len(tried_at) < 15  # not 240 failed ticks
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "database unreachable" in errors[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)  # no traceback per tick
    assert job.last_end == pytest.approx(now[0] - 0.5)  # alive while waiting: no watchdog restart

    down["yes"] = False
    now[0] += DB_BACKOFF_MAX_S
    job.run()
    assert any("reachable again" in r.getMessage() for r in caplog.records)
    n = calls["n"]
    job.run()
    assert calls["n"] == n + 1  # back to running every time


def test_other_failures_are_logged_with_their_traceback_and_not_backed_off(caplog):
    calls = {"n": 0}

    def tick():
        calls["n"] += 1
        raise ValueError("bad row")

    job = CoalescedJob(FakeScheduler(), "dispatch", tick, min_gap_s=0.0, stopping=threading.Event())
    job.run()
    job.run()
    assert calls["n"] == 2
    assert any(r.exc_info for r in caplog.records)
