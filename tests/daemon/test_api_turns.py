"""One user's flood cannot take the daemon's CPU from the others.

The audit's attacks 5 and 6 (32 threads of huge holds, 32 threads reading a 4 MiB log) were
already refused or capped, yet another user's submit p99 went from 6 ms to 200 ms: each of
the 64 request threads, refused or not, took its share of the interpreter. Now a uid has at
most `UidLimits.max_active` requests worked on at once (the rest of its requests wait their
turn asleep), an idle kept-alive connection holds no turn, and a connection whose request was
refused with 429 is left unread for `refused_pause_s`, so a client cannot spin the daemon on
a stream of refusals. `bench/two_user_audit.py` measures the effect with two real users.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from scheduler.cli.client import ApiError, Client
from scheduler.daemon.access import ServiceConfig
from scheduler.daemon.api import ApiServer, UidLimits, _UidTurns
from scheduler.daemon.service import JobService
from scheduler.store import Store

WAIT_S = 30.0


def _wait_for(predicate, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.005)


def test_a_uid_has_at_most_its_turns_and_another_uid_is_not_held_up():
    turns = _UidTurns(per_uid=2)
    inside = {7: 0, 8: 0}
    entered = {7: threading.Semaphore(0), 8: threading.Semaphore(0)}
    leave = threading.Event()

    def request(uid: int) -> None:
        with turns.turn(uid):
            inside[uid] += 1
            entered[uid].release()
            leave.wait(WAIT_S)
            inside[uid] -= 1

    threads = [threading.Thread(target=request, args=(7,)) for _ in range(3)]
    for t in threads:
        t.start()
    assert entered[7].acquire(timeout=WAIT_S) and entered[7].acquire(timeout=WAIT_S)
    _wait_for(lambda: turns._uids[7][1] == 1, "uid 7's third request waiting")
    assert inside[7] == 2  # the third waits its turn

    other = threading.Thread(target=request, args=(8,))
    other.start()
    assert entered[8].acquire(timeout=WAIT_S)  # uid 8 is served while uid 7 waits

    leave.set()
    for t in [*threads, other]:
        t.join(WAIT_S)
    assert inside == {7: 0, 8: 0} and turns._uids == {}  # every turn given back, nothing kept


@pytest.fixture
def api_with(tmp_path):
    made = []

    def make(limits: UidLimits, held_method: str | None = None):
        store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
        store.upgrade()
        service = JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=tmp_path / "logs")
        gate = {"entered": threading.Semaphore(0), "release": threading.Event()}
        if held_method:
            real = getattr(service, held_method)

            def held(*a, **k):
                gate["entered"].release()
                gate["release"].wait(WAIT_S)
                return real(*a, **k)

            setattr(service, held_method, held)
        api = ApiServer(tmp_path / "s.sock", service, limits=limits)
        api.start()
        made.append((api, store, gate))
        return api, gate

    yield make
    for api, store, gate in made:
        gate["release"].set()
        api.stop()
        store.dispose()


def test_requests_beyond_a_uids_turns_wait_and_are_served_not_refused(api_with):
    api, gate = api_with(UidLimits(max_active=1), held_method="submit")
    results: list = []
    first = threading.Thread(target=lambda: results.append(Client(api.path).submit(argv=["true"])))
    second = threading.Thread(target=lambda: results.append(Client(api.path).submit(argv=["true"])))
    first.start()
    assert gate["entered"].acquire(timeout=WAIT_S)
    second.start()
    uid = os.getuid()
    _wait_for(lambda: api.turns._uids.get(uid, [0, 0])[1] == 1, "the second submit waiting for its turn")
    assert not gate["entered"].acquire(timeout=0)  # it has not reached the service

    gate["release"].set()
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert sorted(r["id"] for r in results) == [1, 2]


def test_an_idle_kept_alive_connection_holds_no_turn(api_with):
    api, _ = api_with(UidLimits(max_active=1))
    idle = Client(api.path)
    idle.request("GET", "/health")  # its connection stays open, waiting for a next request
    try:
        assert Client(api.path, timeout=WAIT_S).submit(argv=["true"])["id"] == 1
    finally:
        idle.close()


def test_a_connection_refused_with_429_is_not_read_again_for_the_pause(api_with):
    api, _ = api_with(UidLimits(rate_per_s=1, burst=1, refused_pause_s=0.5))
    client = Client(api.path)
    client.request("GET", "/health")
    with pytest.raises(ApiError) as e:
        client.request("GET", "/health")
    assert e.value.status == 429
    t0 = time.monotonic()
    try:
        client.request("GET", "/health")  # sent at once on the same connection
    except ApiError:
        pass
    assert time.monotonic() - t0 >= 0.5
