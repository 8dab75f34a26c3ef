"""The API under hostile and malformed input, and per-uid limits.

A real ApiServer on a real socket in front of a real JobService and store. Whatever bytes
arrive, the daemon answers with a clear JSON error (never a 500, never a traceback), changes
nothing it should not, and keeps serving. One uid cannot take all of the daemon.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.cli.client import ApiError, Client
from scheduler.daemon.access import RequestError, ServiceConfig
from scheduler.daemon.api import ApiServer, UidLimits, _UidGate
from scheduler.daemon.service import JobService
from scheduler.store import Store
from scheduler.store.models import jobs

FUZZ_EXAMPLES = int(os.environ.get("CARBONSCHED_FUZZ_EXAMPLES", "800"))
TRIED = {"requests": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    store = Store(f"sqlite:///{root / 'db.sqlite'}")
    store.upgrade()
    service = JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=root / "logs")
    api = ApiServer(root / "s.sock", service)
    api.start()
    yield api, store
    api.stop()
    store.dispose()
    print(f"\nhostile API requests tried: {TRIED['requests']}")


def raw_exchange(path, data: bytes, timeout: float = 60.0) -> bytes:
    """Send raw bytes, half-close, read everything the daemon answers (what is tested is the
    answer, not its speed: 5 s were too short for a submit on PostgreSQL with four test
    workers and two busy loops on 2 cores, and Hypothesis then saw the stored job as flaky)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon closed early (oversized body): its answer is still readable
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def responses(raw: bytes) -> list[tuple[int, dict]]:
    """Parse the HTTP responses in a byte stream: (status, JSON body) each."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body, raw = rest[:length], rest[length:]
        out.append((status, json.loads(body) if body else None))
    return out


def job_count(store) -> int:
    with store.read() as conn:
        return conn.execute(jobs.select().with_only_columns(jobs.c.id)).all().__len__()


scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)
submit_fields = st.sampled_from(["argv", "name", "gpus", "gpu_mem_gib", "deadline", "latency_slo_ms",
                                 "workload", "prompts", "est_runtime_s", "time_limit_s", "cwd", "env",
                                 "max_retries", "uid", "owner_uid"])
hostile_submits = st.dictionaries(submit_fields, json_values, max_size=8)
paths = st.one_of(
    st.sampled_from(["/v1/jobs", "/v1/jobs/1", "/v1/jobs/1/logs", "/v1/jobs/-1/cancel", "/v1/cancel",
                     "/v1/nodes", "/v1/health", "/v1/plan", "/v2/jobs", "/", "/v1/jobs/abc",
                     "/v1/jobs/1/logs?stream=../../etc/passwd", "/v1/jobs?limit=-5", "/v1/jobs?state=%00",
                     "/v1/jobs/99999999999999999999999", "/v1/jobs/1/logs?tail_bytes=x"]),
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=60)
    .map(lambda p: "/" + p))
methods = st.sampled_from(["GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS", "BREW"])


def request_bytes(method: str, path: str, body: bytes | None, *, length: int | None = None,
                  extra: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n".encode()
    if body is not None:
        head += f"Content-Length: {len(body) if length is None else length}\r\n".encode()
    return head + extra + b"Connection: close\r\n\r\n" + (body or b"")


def check_answer(raw: bytes, method: str) -> None:
    TRIED["requests"] += 1
    if method == "HEAD" or not raw:
        return  # HEAD answers have no body; a closed connection is an answer to garbage
    for status, payload in responses(raw):
        assert status != 500, payload
        if status >= 400:
            assert isinstance(payload, dict) and isinstance(payload.get("error"), str) and payload["error"]


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(method=methods, path=paths, body=st.one_of(st.none(), json_values.map(lambda v: json.dumps(v).encode()),
                                                  st.binary(max_size=200)))
def test_any_request_gets_a_clear_answer_and_the_daemon_keeps_serving(server, method, path, body):
    api, _ = server
    raw = raw_exchange(api.path, request_bytes(method, path, body))
    check_answer(raw, method)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=hostile_submits)
def test_hostile_submit_bodies_are_rejected_cleanly_or_accepted_whole(server, body):
    api, store = server
    before = job_count(store)
    raw = raw_exchange(api.path, request_bytes("POST", "/v1/jobs", json.dumps(body).encode()))
    check_answer(raw, "POST")
    (status, payload), = responses(raw)
    after = job_count(store)
    if status == 201:
        assert after == before + 1 and isinstance(payload["id"], int)
    else:
        assert 400 <= status < 500 and after == before  # a rejected request changes nothing


@settings(max_examples=max(50, FUZZ_EXAMPLES // 4), deadline=None, suppress_health_check=list(HealthCheck))
@given(garbage=st.binary(min_size=1, max_size=400))
def test_raw_garbage_on_the_socket_never_breaks_the_server(server, garbage):
    api, _ = server
    raw = raw_exchange(api.path, garbage)
    TRIED["requests"] += 1
    if raw.startswith(b"HTTP/"):
        status = int(raw.split()[1])
        assert status != 500


@pytest.mark.parametrize("length, body", [(2 * 1024 * 1024, b"{}"), (-1, b"{}"), (5, b"{")])
def test_lying_or_oversized_content_length_is_refused(server, length, body):
    api, store = server
    before = job_count(store)
    raw = raw_exchange(api.path, request_bytes("POST", "/v1/jobs", body, length=length), timeout=10)
    (status, payload), *_ = responses(raw)
    assert status in (400, 413) and payload["error"]
    assert job_count(store) == before


def test_still_serving_after_all_that(server):
    api, _ = server
    assert Client(api.path).request("GET", "/health")["ok"] in (True, False)


# -- per-uid limits ----------------------------------------------------------------------------

def test_token_bucket_refuses_a_uid_beyond_its_rate_with_a_clear_error():
    now = [0.0]
    gate = _UidGate(UidLimits(rate_per_s=10, burst=5, max_inflight=100), clock=lambda: now[0])
    for _ in range(5):
        gate.enter(1000)
        gate.leave(1000)
    with pytest.raises(RequestError) as e:
        gate.enter(1000)
    assert e.value.status == 429 and "retry in" in e.value.message
    gate.enter(2000)  # another user is not affected
    gate.leave(2000)
    now[0] = 0.5  # 5 tokens back
    for _ in range(5):
        gate.enter(1000)
        gate.leave(1000)


def test_requests_in_flight_are_capped_per_uid():
    gate = _UidGate(UidLimits(max_inflight=2))
    gate.enter(7)
    gate.enter(7)
    with pytest.raises(RequestError, match="already has 2 requests in progress"):
        gate.enter(7)
    gate.enter(8)
    gate.leave(7)
    gate.enter(7)


def test_open_connections_are_capped_per_uid(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.upgrade()
    service = JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=tmp_path / "logs")
    api = ApiServer(tmp_path / "s.sock", service, limits=UidLimits(max_connections=3))
    api.start()
    held = []
    try:
        for _ in range(3):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(api.path))
            held.append(s)
        deadline = time.monotonic() + 5
        while api.gate._connections.get(os.getuid(), 0) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        raw = raw_exchange(api.path, request_bytes("GET", "/v1/health", None))
        (status, payload), = responses(raw)
        assert status == 429 and "too many open connections" in payload["error"]
        held.pop().close()
        deadline = time.monotonic() + 5
        while True:  # once one closes, a new connection is served again
            try:
                assert Client(api.path, timeout=2).request("GET", "/health") is not None
                break
            except ApiError:
                assert time.monotonic() < deadline
                time.sleep(0.02)
    finally:
        for s in held:
            s.close()
        api.stop()
        store.dispose()


def test_a_flooding_uid_gets_429_while_the_daemon_stays_responsive(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.upgrade()
    service = JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=tmp_path / "logs")
    api = ApiServer(tmp_path / "s.sock", service, limits=UidLimits(rate_per_s=50, burst=20))
    api.start()
    statuses: list[int] = []
    try:
        c = Client(api.path)
        for _ in range(60):
            try:
                c.request("GET", "/health")
                statuses.append(200)
            except ApiError as e:
                statuses.append(e.status)
        assert 429 in statuses and statuses[:20] == [200] * 20
    finally:
        api.stop()
        store.dispose()


# -- text that cannot be stored and shown again; requests refused before their body (issue 25) --

def test_a_lone_surrogate_is_refused_at_the_edge_and_changes_nothing(server):
    api, store = server
    before = job_count(store)
    for body in (rb'{"argv": ["echo", "\ud800"]}', rb'{"argv": ["echo", "x"], "env": {"\udfff": "1"}}',
                 b'{"argv": ["echo", "\xff"]}'):
        (status, payload), = responses(raw_exchange(api.path, request_bytes("POST", "/v1/jobs", body)))
        assert status == 400 and "not valid JSON" in payload["error"], payload
    assert job_count(store) == before


def test_a_stored_row_with_text_utf8_cannot_carry_still_lists_and_shows(server):
    """A row stored before the edge refused lone surrogates must not break `queue --all`."""
    from sqlalchemy import insert
    from scheduler.clock import utcnow

    api, store = server
    job_id = store.transact(lambda conn: conn.execute(insert(jobs).values(
        name="old-row", state="PENDING", owner_uid=os.getuid(), owner_gid=os.getgid(), owner_groups=[],
        owner_name="me", argv=["echo", "\ud800"], cwd="/", env={"X": "\udfff"}, gpus=1, gpu_mem_gib=0.0, max_retries=0,
        attempts=0, submitted_at=utcnow(), plan_rev=0)).inserted_primary_key[0])
    c = Client(api.path)
    listed = {j["id"]: j for j in c.jobs(include_done=True)}
    assert listed[job_id]["argv"] == ["echo", "\ufffd\ufffd\ufffd"]  # U+FFFD for each byte UTF-8 cannot take
    shown = c.job(job_id)
    assert shown["argv"][0] == "echo" and shown["argv"][1] != "\ud800"
    assert Client(api.path).request("GET", "/health") is not None  # and the daemon still serves


def test_a_body_refused_with_429_is_never_read_as_the_next_request(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.upgrade()
    service = JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=tmp_path / "logs")
    api = ApiServer(tmp_path / "s.sock", service, limits=UidLimits(rate_per_s=0.001, burst=1))
    api.start()
    try:
        smuggled = b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
        stream = (b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"  # takes the one token
                  + b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(smuggled)
                  + smuggled)
        answers = responses(raw_exchange(api.path, stream))
        assert [s for s, _ in answers] == [200, 429]  # the body was not served as a request
        # A GET that carries a body is answered, and its body is not taken for a request either.
        api.gate = _UidGate(UidLimits())
        stream = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(smuggled) + smuggled
        assert [s for s, _ in responses(raw_exchange(api.path, stream))] == [200]
        assert job_count(store) == 0
    finally:
        api.stop()
        store.dispose()


# -- one user cannot degrade everyone (issue 25, item 8) ----------------------------------------

def test_expensive_requests_are_capped_per_uid_and_others_are_not_affected():
    gate = _UidGate(UidLimits(max_expensive_inflight=2))
    gate.enter_expensive(7)
    gate.enter_expensive(7)
    with pytest.raises(RequestError) as e:
        gate.enter_expensive(7)
    assert e.value.status == 429 and "listing/report/export/plan" in e.value.message
    gate.enter_expensive(8)  # another uid: its own allowance
    gate.leave_expensive(7)
    gate.enter_expensive(7)


@contextmanager
def one_expensive_request_held(tmp_path, method: str, request, wait_s: float):
    """An API allowing one expensive request per uid, with one request (`request(socket_path)`,
    in a thread) held inside the service's `method` until `release` is set: the uid's
    allowance is taken when the block starts. Yields (api, release, thread)."""
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.upgrade()
    service = JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=tmp_path / "logs")
    entered, release = threading.Event(), threading.Event()
    real = getattr(service, method)

    def held(*a, **k):
        entered.set()  # the API's gate counted the request before calling the service
        release.wait(wait_s)
        return real(*a, **k)

    setattr(service, method, held)
    api = ApiServer(tmp_path / "s.sock", service, limits=UidLimits(max_expensive_inflight=1))
    api.start()
    first = threading.Thread(target=request, args=(api.path,))
    try:
        first.start()
        assert entered.wait(wait_s), f"the first {method} request never reached the service"
        yield api, release, first
    finally:
        release.set()
        first.join(wait_s)
        api.stop()
        store.dispose()


def test_a_slow_listing_holds_the_uids_allowance_while_submits_still_go_through(tmp_path):
    with one_expensive_request_held(tmp_path, "list_jobs", lambda path: Client(path).jobs(include_done=True),
                                    wait_s=10) as (api, release, first):
        with pytest.raises(ApiError) as e:
            Client(api.path).jobs(include_done=True)
        assert e.value.status == 429
        assert Client(api.path).submit(argv=["true"])["id"] == 1  # cheap requests are served
        release.set()
        first.join(10)
        assert len(Client(api.path).jobs(include_done=True)) == 1  # and the allowance is back


def test_a_user_cannot_queue_more_than_max_queued_per_user(tmp_path):
    from scheduler.daemon.access import Caller

    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.upgrade()
    service = JobService(store, ServiceConfig(daemon_uid=0, max_queued_per_user=3), log_dir=tmp_path / "logs")
    alice, bob = Caller(uid=1000, gid=1000), Caller(uid=1001, gid=1001)
    for _ in range(3):
        service.submit(alice, {"argv": ["true"]})
    with pytest.raises(RequestError) as e:
        service.submit(alice, {"argv": ["true"]})
    assert e.value.status == 429 and "already has 3 jobs waiting (limit 3" in e.value.message
    assert job_count(store) == 3  # nothing stored from the refused request
    service.submit(bob, {"argv": ["true"]})  # bob has his own allowance
    # once alice's jobs have started (or ended), she may submit again (after the count's refresh)
    with store.write() as conn:
        conn.execute(jobs.update().where(jobs.c.owner_uid == 1000).values(state="CANCELLED"))
    service.submissions.queue_limit._counts.clear()
    service.submit(alice, {"argv": ["true"]})


def test_a_client_that_leaves_before_its_reply_is_not_logged_as_a_daemon_error(tmp_path, caplog):
    # A timed-out probe or a killed CLI breaks the pipe under the reply: a debug line, never
    # an ERROR with a traceback in the operator's log. Anything else still is one.
    service = JobService(Store(f"sqlite:///{tmp_path}/db.sqlite"), ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs")
    api = ApiServer(tmp_path / "s.sock", service)
    try:
        for error, logged in ((BrokenPipeError(32, "Broken pipe"), False),
                              (ConnectionResetError(104, "reset"), False), (ValueError("a bug"), True)):
            def finish_request(request, client_address, error=error):
                raise error

            api.finish_request = finish_request
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger="scheduler.daemon.api"):
                api._serve_connection(socket.socket(socket.AF_UNIX), None, 0)
            errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert bool(errors) is logged, (error, [r.getMessage() for r in caplog.records])
    finally:
        api.server_close()


# -- one user cannot empty the database pool or fill the daemon with logs (issue 48) ------------

def _api_on(store, tmp_path, **limits) -> ApiServer:
    service = JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=tmp_path / "logs")
    api = ApiServer(tmp_path / "s.sock", service, limits=UidLimits(**limits) if limits else None)
    api.start()
    return api


def _status_and_headers(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)


def test_one_uid_may_hold_at_most_half_of_the_pool_the_api_may_use(store, tmp_path):
    """32 requests of one uid in flight emptied a pool of 15 connections: another user's
    submits failed and the agent's dispatch tick with them. One uid now gets at most half of
    what is left after the daemon's own loops, on SQLite (15) and PostgreSQL (30)."""
    pool = store.engine.pool
    connections = pool.size() + pool._max_overflow
    api = _api_on(store, tmp_path)
    try:
        assert 2 <= 2 * api.gate.limits.max_inflight <= connections - 2
    finally:
        api.stop()


def test_a_request_that_finds_every_connection_in_use_gets_503_with_retry_after(store, tmp_path):
    """The pool's 'QueuePool limit reached' was a 500; it is a busy daemon, to retry."""
    from sqlalchemy import create_engine

    from scheduler.store.engine import _configure_sqlite, normalize_url

    engine = create_engine(normalize_url(store.engine.url.render_as_string(hide_password=False)),
                           pool_size=2, max_overflow=0, pool_timeout=0.2)
    if engine.dialect.name == "sqlite":
        _configure_sqlite(engine)
    small = Store(engine)
    api = _api_on(small, tmp_path)
    held = [small.engine.connect() for _ in range(2)]  # the planner and agent have them all
    try:
        status, headers, payload = _status_and_headers(raw_exchange(api.path, request_bytes("GET", "/v1/jobs", None)))
        assert status == 503 and "in use" in payload["error"] and headers.get("retry-after") == "1", payload
        for conn in held:
            conn.close()
        held = []
        assert Client(api.path).jobs() == []  # served again once a connection is free
    finally:
        for conn in held:
            conn.close()
        api.stop()
        small.dispose()


def test_api_requests_beyond_their_share_of_the_pool_wait_briefly_then_get_503(store, tmp_path):
    api = _api_on(store, tmp_path, db_wait_s=0.1)
    slots = api.db_slots
    taken = 0
    try:
        while slots._free.acquire(blocking=False):  # other users' requests hold every slot
            taken += 1
        assert taken == slots.slots and taken <= store.pool_connections() - 2
        (status, payload), = responses(raw_exchange(api.path, request_bytes("GET", "/v1/jobs", None)))
        assert status == 503 and "database connections for API requests are in use" in payload["error"]
        slots._free.release()
        taken -= 1
        assert Client(api.path).jobs() == []
    finally:
        for _ in range(taken):
            slots._free.release()
        api.stop()


@pytest.mark.parametrize("verb", ["cancel", "hold", "release"])
def test_id_lists_are_capped_with_a_400_that_names_the_cap(server, verb):
    """130,000 ids in one hold were 130,000 transactions on one connection (issue 48)."""
    api, store = server
    body = json.dumps({"ids": list(range(1, 1002))}).encode()
    (status, payload), = responses(raw_exchange(api.path, request_bytes("POST", f"/v1/{verb}", body)))
    assert status == 400 and f"{verb} takes at most 1000 job ids per request (got 1001)" in payload["error"]
    assert "\n" not in payload["error"]


def test_logs_count_as_expensive_requests_of_their_uid(tmp_path):
    """32 parallel reads of a 4 MiB log took another user's health check to a p95 of 3.2 s."""
    with one_expensive_request_held(tmp_path, "logs", lambda path: pytest.raises(ApiError, Client(path).logs, 1),
                                    wait_s=60) as (api, _, _):
        with pytest.raises(ApiError) as e:
            Client(api.path).logs(1)
        assert e.value.status == 429 and "logs" in str(e.value)
        assert Client(api.path).submit(argv=["true"])["id"] == 1  # cheap requests are served


def test_the_cli_prints_a_log_longer_than_one_reply_whole(tmp_path, capsysbinary):
    """`carbonsched logs` reads on from next_offset until the size of its first reply."""
    from sqlalchemy import update

    from scheduler.cli.main import main

    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.upgrade()
    service = JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=tmp_path / "logs")
    api = ApiServer(tmp_path / "s.sock", service)
    api.start()
    try:
        job_id = Client(api.path).submit(argv=["true"])["id"]
        with store.write() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(state="COMPLETED"))
        text = "".join(f"line {i} ü\n" for i in range(60_000))  # ~690 KB: three replies
        (tmp_path / "logs").mkdir(exist_ok=True)
        (tmp_path / "logs" / f"{job_id}.out").write_text(text)
        capsysbinary.readouterr()
        with pytest.raises(SystemExit) as e:
            main(["logs", "--socket", str(api.path), str(job_id)])
        assert e.value.code == 0
        assert capsysbinary.readouterr().out.decode() == text
    finally:
        api.stop()
        store.dispose()
