"""scheduler.lifecycle: the one table of job state transitions and the `transition` primitive.

The table is checked as data; `transition` runs against the `store` fixture, so every
database test runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import itertools
import threading
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, insert, select

from scheduler.lifecycle import (
    ACTIVE,
    TERMINAL,
    TRANSITIONS,
    State,
    TransitionError,
    allowed_sources,
    record_submit,
    transition,
)
from scheduler.store.models import job_events, jobs

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def add_job(conn, state: State = State.PENDING, **overrides) -> int:
    """Insert one job row in `state` with the columns a submitted job has."""
    row = dict(
        name="infer", state=state.value, reason="test", owner_uid=40001, owner_gid=40001,
        owner_groups=[40001], owner_name="alice", argv=["python", "infer.py"], cwd="/tmp",
        env={}, gpus=1, gpu_mem_gib=0.0, max_retries=0, attempts=0, submitted_at=T0,
        plan_rev=0,
    )
    row.update(overrides)
    return conn.execute(insert(jobs).values(**row).returning(jobs.c.id)).scalar_one()


def state_of(conn, job_id: int) -> str:
    return conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar_one()


def events_of(conn, job_id: int) -> list:
    return list(conn.execute(select(job_events).where(job_events.c.job_id == job_id)
                             .order_by(job_events.c.id)))


def count_events(conn) -> int:
    return conn.execute(select(func.count()).select_from(job_events)).scalar_one()


# -- the table, as data ---------------------------------------------------------------------

def test_every_state_is_either_active_or_terminal():
    assert ACTIVE | TERMINAL == set(State)
    assert not ACTIVE & TERMINAL


def test_the_table_has_a_row_for_every_state():
    assert set(TRANSITIONS) == set(State)


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_nothing_leaves_a_terminal_state(state):
    assert TRANSITIONS[state] == frozenset()


def test_no_state_transitions_to_itself():
    for src, dests in TRANSITIONS.items():
        assert src not in dests


@pytest.mark.parametrize("state", sorted(ACTIVE))
def test_every_active_job_can_be_cancelled_or_fail(state):
    assert State.CANCELLED in TRANSITIONS[state]
    assert State.FAILED in TRANSITIONS[state]


def test_every_state_is_reachable_from_pending():
    seen, todo = {State.PENDING}, [State.PENDING]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(State)


def test_only_a_planned_job_can_start_running():
    """A claim is PLANNED -> RUNNING; nothing jumps the planner."""
    assert allowed_sources(State.RUNNING) == [State.PLANNED]


def test_only_a_running_job_can_complete_time_out_or_be_lost():
    for end in (State.COMPLETED, State.TIMEOUT, State.LOST):
        assert allowed_sources(end) == [State.RUNNING]


# -- transition against a database ----------------------------------------------------------

ALL_PAIRS = [(a, b) for a, b in itertools.product(State, State) if a != b]


def test_every_allowed_transition_changes_the_state_and_writes_one_event(store):
    for src, dst in ALL_PAIRS:
        if dst not in TRANSITIONS[src]:
            continue
        with store.write() as conn:
            job_id = add_job(conn, src)
            before = count_events(conn)
            ok = transition(conn, job_id, dst, actor_uid=40001, reason=f"{src}->{dst}", at=T0)
            assert ok, f"{src} -> {dst} should be allowed"
            assert state_of(conn, job_id) == dst
            assert count_events(conn) == before + 1, f"{src} -> {dst}: one event per transition"
            (event,) = events_of(conn, job_id)
            assert (event.from_state, event.to_state) == (src.value, dst.value)
            assert event.actor_uid == 40001
            assert event.reason == f"{src}->{dst}"
            assert event.at == T0


def test_every_disallowed_transition_is_refused_and_changes_nothing(store):
    for src, dst in ALL_PAIRS:
        if dst in TRANSITIONS[src]:
            continue
        with store.write() as conn:
            job_id = add_job(conn, src, reason="untouched")
            before = count_events(conn)
            assert transition(conn, job_id, dst, actor_uid=0, reason="nope") is False, (
                f"{src} -> {dst} must not be allowed")
            assert state_of(conn, job_id) == src
            assert conn.execute(select(jobs.c.reason).where(jobs.c.id == job_id)).scalar_one() \
                == "untouched"
            assert count_events(conn) == before


def test_naming_a_disallowed_source_state_is_a_programming_error(store):
    with store.write() as conn:
        job_id = add_job(conn, State.PENDING)
        with pytest.raises(TransitionError):
            transition(conn, job_id, State.RUNNING, actor_uid=None, reason="skip the planner",
                       expect=State.PENDING)
        with pytest.raises(TransitionError):
            transition(conn, job_id, State.PENDING, actor_uid=None, reason="resurrect",
                       expect=(State.PLANNED, State.COMPLETED))
        assert state_of(conn, job_id) == State.PENDING
        assert events_of(conn, job_id) == []


def test_expect_narrows_the_accepted_source_states(store):
    with store.write() as conn:
        planned = add_job(conn, State.PLANNED)
        pending = add_job(conn, State.PENDING)
        assert transition(conn, pending, State.CANCELLED, actor_uid=1, reason="x",
                          expect=State.PLANNED) is False
        assert transition(conn, planned, State.CANCELLED, actor_uid=1, reason="x",
                          expect=State.PLANNED) is True
        assert state_of(conn, pending) == State.PENDING


def test_an_unknown_job_is_not_transitioned(store):
    with store.write() as conn:
        assert transition(conn, 999_999, State.CANCELLED, actor_uid=0, reason="x") is False
        assert count_events(conn) == 0


def test_extra_conditions_guard_against_a_stale_plan(store):
    """A claim for plan revision 1 loses when the planner has already moved the job to rev 2."""
    with store.write() as conn:
        job_id = add_job(conn, State.PLANNED, plan_rev=2)
        assert transition(conn, job_id, State.RUNNING, actor_uid=None, reason="claim",
                          expect=State.PLANNED, where=(jobs.c.plan_rev == 1,)) is False
        assert state_of(conn, job_id) == State.PLANNED
        assert events_of(conn, job_id) == []
        assert transition(conn, job_id, State.RUNNING, actor_uid=None, reason="claim",
                          expect=State.PLANNED, where=(jobs.c.plan_rev == 2,)) is True


def test_transition_sets_the_reason_and_extra_values_with_the_state(store):
    started = T0 + timedelta(minutes=5)
    with store.write() as conn:
        job_id = add_job(conn, State.PLANNED)
        assert transition(conn, job_id, State.RUNNING, actor_uid=None, reason="claimed by n1",
                          values=dict(node="n1", started_at=started,
                                      attempts=jobs.c.attempts + 1))
        row = conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
    assert (row.state, row.reason, row.node, row.started_at, row.attempts) == (
        "RUNNING", "claimed by n1", "n1", started, 1)


def test_the_event_is_part_of_the_callers_transaction(store):
    """If the caller's transaction rolls back, neither the state change nor its event remain."""
    with store.write() as conn:
        job_id = add_job(conn, State.PENDING)
        record_submit(conn, job_id, 40001, T0)

    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        with store.write() as conn:
            assert transition(conn, job_id, State.CANCELLED, actor_uid=40001, reason="x")
            raise Abort
    with store.read() as conn:
        assert state_of(conn, job_id) == State.PENDING
        assert [e.to_state for e in events_of(conn, job_id)] == ["PENDING"]


def test_a_job_history_reads_as_a_chain_of_events(store):
    with store.write() as conn:
        job_id = add_job(conn, State.PENDING)
        record_submit(conn, job_id, 40001, T0)
    for to in (State.PLANNED, State.RUNNING, State.COMPLETED):
        with store.write() as conn:
            assert transition(conn, job_id, to, actor_uid=None, reason=to.lower())
    with store.read() as conn:
        history = [(e.from_state, e.to_state) for e in events_of(conn, job_id)]
        assert history == [(None, "PENDING"), ("PENDING", "PLANNED"), ("PLANNED", "RUNNING"),
                           ("RUNNING", "COMPLETED")]
        first = events_of(conn, job_id)[0]
        assert (first.actor_uid, first.reason, first.at) == (40001, "submitted", T0)


# -- races ----------------------------------------------------------------------------------

def claim(store, job_id: int, who: str) -> bool:
    return store.transact(lambda conn: transition(
        conn, job_id, State.RUNNING, actor_uid=None, reason=f"claimed by {who}",
        expect=State.PLANNED, values=dict(node=who)))


def test_two_competing_claims_of_one_planned_job_exactly_one_wins(store):
    """Claim A has read the job and updated it but not committed when claim B starts.

    On PostgreSQL B reads PLANNED (A is uncommitted) and its UPDATE waits for A's row lock;
    on SQLite B waits for A's write lock. Either way B must then lose cleanly.
    """
    with store.write() as conn:
        job_id = add_job(conn, State.PLANNED)
    a_updated = threading.Event()
    results: dict[str, object] = {}

    def claim_a():
        try:
            with store.write() as conn:
                results["a"] = transition(conn, job_id, State.RUNNING, actor_uid=None,
                                          reason="claimed by a", expect=State.PLANNED,
                                          values=dict(node="a"))
                a_updated.set()
                threading.Event().wait(0.3)  # hold the transaction open while B tries
        except BaseException as e:  # surface failures in the main thread
            results["a"] = e
            a_updated.set()

    def claim_b():
        a_updated.wait(5)
        try:
            results["b"] = claim(store, job_id, "b")
        except BaseException as e:
            results["b"] = e

    threads = [threading.Thread(target=claim_a), threading.Thread(target=claim_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {"a": True, "b": False}
    with store.read() as conn:
        row = conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
        assert (row.state, row.node) == ("RUNNING", "a")
        assert [(e.from_state, e.to_state) for e in events_of(conn, job_id)] == [
            ("PLANNED", "RUNNING")]


def test_many_simultaneous_claims_of_one_planned_job_exactly_one_wins(store):
    with store.write() as conn:
        job_id = add_job(conn, State.PLANNED)
    n = 6
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n

    def worker(i: int) -> None:
        barrier.wait(5)
        try:
            results[i] = claim(store, job_id, f"agent{i}")
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results, key=repr) == [False] * (n - 1) + [True], results
    with store.read() as conn:
        winner = conn.execute(select(jobs.c.node).where(jobs.c.id == job_id)).scalar_one()
        assert winner == f"agent{results.index(True)}"
        assert len(events_of(conn, job_id)) == 1


def test_a_cancel_racing_a_claim_leaves_one_consistent_outcome(store):
    with store.write() as conn:
        job_id = add_job(conn, State.PLANNED)
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def run(name, fn):
        barrier.wait(5)
        try:
            results[name] = store.transact(fn)
        except BaseException as e:
            results[name] = e

    cancel = lambda conn: transition(conn, job_id, State.CANCELLED, actor_uid=40001,  # noqa: E731
                                     reason="cancel", expect=(State.PENDING, State.PLANNED))
    threads = [threading.Thread(target=run, args=("claim", lambda c: transition(
                   c, job_id, State.RUNNING, actor_uid=None, reason="claim",
                   expect=State.PLANNED))),
               threading.Thread(target=run, args=("cancel", cancel))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results.values(), key=repr) == [False, True], results
    with store.read() as conn:
        final = state_of(conn, job_id)
        assert final == ("RUNNING" if results["claim"] else "CANCELLED")
        assert [e.to_state for e in events_of(conn, job_id)] == [final]
