"""Issue 25's low-severity items: what used to answer 500, take nonsense, print raw or go
unnoticed now gets a clear 4xx (or 503), a refusal, an escaped line or a named file."""

from __future__ import annotations

import json
import logging
import os
import socket
import time

import pytest

from scheduler.accounting.accountant import Accountant
from scheduler.cli.client import ApiError, Client
from scheduler.daemon.access import ServiceConfig
from scheduler.daemon.api import ApiServer, UidLimits, accounting_routes
from scheduler.daemon.service import JobService
from scheduler.store import Store
from test_api_hostile import raw_exchange, request_bytes, responses


@pytest.fixture
def api(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.upgrade()
    service = JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=tmp_path / "logs")
    server = ApiServer(tmp_path / "s.sock", service, extra_routes=accounting_routes(Accountant(store), service))
    server.start()
    yield server
    server.stop()
    store.dispose()


def answer(api, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    (status, payload), = responses(raw_exchange(api.path, request_bytes(method, path, data)))
    return status, payload


@pytest.mark.parametrize("method, path, body, needle", [
    ("POST", "/v1/jobs", {"argv": ["true"], "deadline": "9999-12-31T23:59:59-23:59"}, "out of range"),
    ("POST", "/v1/jobs", {"argv": ["true"], "deadline": "9999-12-31T23:59:59+14:00"}, "more than a year"),
    ("POST", "/v1/jobs", {"argv": ["true"], "est_runtime_s": 1e-300}, "between 1s and 30d"),
    ("POST", "/v1/jobs", {"argv": ["true"], "time_limit_s": 0.001}, "between 1s and 30d"),
    ("POST", "/v1/jobs", {"argv": ["true"], "workload": "llm:0b"}, "no parameters"),
    ("GET", "/v1/jobs?limit=9223372036854775808", None, "2^63"),
    ("GET", "/v1/report?since=999999999d", None, "out of range"),
    ("GET", "/v1/export?since=999999999d", None, "out of range"),
    ("GET", "/v1/receipt?job=99999999999999999999999", None, "64-bit"),
])
def test_values_out_of_range_get_a_400_not_a_500(api, method, path, body, needle):
    status, payload = answer(api, method, path, body)
    assert status == 400 and needle in payload["error"], payload


@pytest.mark.parametrize("raw", [b"[" + b"1" * 400 + b"]", b"[" * 2000 + b"]" * 2000])
def test_huge_numbers_and_deep_nesting_get_a_400(api, raw):
    (status, payload), = responses(raw_exchange(api.path, request_bytes("POST", "/v1/jobs", raw)))
    assert status == 400 and "not valid JSON" in payload["error"]


def test_a_database_that_is_down_answers_503_and_logs_once(tmp_path, caplog):
    store = Store("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2")  # nothing listens
    service = JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=tmp_path / "logs")
    server = ApiServer(tmp_path / "s.sock", service)
    server.start()
    try:
        with caplog.at_level(logging.WARNING, logger="scheduler.daemon.api"):
            for _ in range(3):
                with pytest.raises(ApiError) as e:
                    Client(server.path).jobs()
                assert e.value.status == 503 and "retry" in str(e.value)
        lines = [r for r in caplog.records if r.name == "scheduler.daemon.api"]
        assert len(lines) == 1 and "cannot be reached" in lines[0].getMessage()
        assert not any(r.exc_info for r in caplog.records)  # no traceback per request
    finally:
        server.stop()
        store.dispose()


def test_show_prints_stored_text_with_its_controls_escaped():
    from scheduler.cli.output import job_detail, jobs_table

    job = {"id": 7, "name": "x\x1b[2Jy", "state": "PENDING", "reason": "r", "owner": "bob", "owner_uid": 1001,
           "argv": ["echo", "hi\n  owner: alice (uid 0)"], "cwd": "/tmp/\x1b]0;pwned\x07", "gpus_requested": 1,
           "gpu_mem_gib": 0.0, "gpus": [], "submitted_at": "2026-12-01T00:00:00Z", "planned_start": None,
           "started_at": None, "ended_at": None, "exit_code": None, "energy_j": None, "gco2": None,
           "events": [{"at": "2026-12-01T00:00:00Z", "from": None, "to": "PENDING", "actor_uid": 1001,
                       "reason": "evil\u202e\rreason"}]}
    text = job_detail(job) + jobs_table([job])
    assert not any(c in text for c in "\x1b\x07\r\u202e")
    owners = [line.strip() for line in text.splitlines() if line.strip().startswith("owner:")]
    assert owners == ["owner: bob (uid 1001)"]  # no forged "owner: alice" line
    assert "\\n  owner: alice" in text and "\\x1b]0;pwned\\x07" in text


def test_the_metrics_port_listens_on_loopback_unless_told_otherwise():
    import argparse

    from scheduler.metrics import Metrics
    from scheduler.settings import AGENT, DAEMON, add_flags, resolve

    for scope in (DAEMON, AGENT):
        p = argparse.ArgumentParser()
        add_flags(p, scope)
        assert resolve(scope, p.parse_args([]), {}, {})["metrics_addr"] == "127.0.0.1"
    m = Metrics()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m.serve(port)
    try:
        assert m._server.server_address[0] == "127.0.0.1"
    finally:
        m.stop()


def test_a_refused_connection_reads_as_429_with_the_reason(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.upgrade()
    service = JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=tmp_path / "logs")
    server = ApiServer(tmp_path / "s.sock", service, limits=UidLimits(max_connections=1))
    server.start()
    held = socket.socket(socket.AF_UNIX)
    held.connect(str(server.path))
    try:
        deadline = time.monotonic() + 5
        while server.gate._connections.get(os.getuid(), 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(5):  # every time: the reason, not "the daemon closed the connection"
            with pytest.raises(ApiError) as e:
                Client(server.path, timeout=5).request("GET", "/health")
            assert e.value.status == 429 and "too many open connections" in str(e.value)
    finally:
        held.close()
        server.stop()
        store.dispose()


@pytest.mark.parametrize("row, needle", [
    ("2026-01-01T00:00:00Z,1e308,DE", "beyond any grid"),
    ("2026-01-01T00:00:00Z,100,D\x00E", "not valid"),
    ("2026-01-01T00:00:00Z,100," + "Z" * 5000, "not valid"),
])
def test_carbon_import_refuses_impossible_values_and_zone_names(tmp_path, row, needle):
    from telemetry.grid.csv_import import read_trace
    from telemetry.grid.readings import CsvFormatError

    f = tmp_path / "trace.csv"
    f.write_text("time,gco2_per_kwh,zone\n" + row + "\n2026-01-01T01:00:00Z,100,DE\n")
    with pytest.raises(CsvFormatError) as e:
        read_trace(f)
    assert needle in str(e.value) and len(str(e.value)) < 300


def test_a_file_that_is_no_database_is_named(tmp_path):
    import subprocess
    import sys

    (tmp_path / "carbonsched.db").write_bytes(os.urandom(4096))
    r = subprocess.run([sys.executable, "-m", "scheduler", "daemon", "--state-dir", str(tmp_path), "--socket",
                        str(tmp_path / "s.sock"), "--emulate", "1xH100"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert str(tmp_path / "carbonsched.db") in r.stderr and "not a database" in r.stderr
    assert "Traceback" not in r.stderr


# -- issue 48: out-of-range times and too many filters are a 400; the metrics port is bounded --

@pytest.fixture
def api_db(store, tmp_path):
    """The API in front of a store of each kind (SQLite, PostgreSQL)."""
    service = JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=tmp_path / "logs")
    server = ApiServer(tmp_path / "s.sock", service)
    server.start()
    yield server
    server.stop()


def _many(name: str, n: int) -> str:
    return "&".join(f"{name}=v{i}" for i in range(n))


@pytest.mark.parametrize("query, needle", [
    ("since=9999-12-31T23:59:59-23:59", "'9999-12-31T23:59:59-23:59' is out of range"),
    ("until=0001-01-01T00:00:00%2B23:59", "is out of range"),
    (_many("name", 1001), "at most 100 name filters per listing (got 1001)"),
    ("name=" + ",".join(f"v{i}" for i in range(101)), "at most 100 name filters per listing (got 101)"),
    (_many("user", 1001), "at most 100 user filters per listing (got 1001)"),
    (_many("state", 101), "at most 100 state filters per listing (got 101)"),
], ids=["since-past-9999", "until-before-1", "1001-names", "101-names-in-one", "1001-users", "101-states"])
def test_listing_filters_out_of_range_or_too_many_get_a_400(api_db, caplog, query, needle):
    """A 500 (OverflowError), and 1,001 names a 503 'database cannot be reached' with a false
    outage warning in the log (SQLite: 'expression tree is too large')."""
    with caplog.at_level(logging.WARNING, logger="scheduler.daemon.api"):
        status, payload = answer(api_db, "GET", f"/v1/jobs?{query}")
    assert status == 400 and needle in payload["error"], payload
    assert not [r for r in caplog.records if r.name == "scheduler.daemon.api"]  # no outage reported
    assert answer(api_db, "GET", "/v1/jobs?" + _many("name", 100))[0] == 200  # the cap itself is served


@pytest.mark.parametrize("text", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59", "999999999d"])
def test_the_cli_refuses_times_out_of_range_with_a_clear_error(text):
    from datetime import datetime, timezone

    from scheduler.timeparse import parse_time

    with pytest.raises(ValueError, match="out of range"):
        parse_time(text, datetime(2026, 12, 1, tzinfo=timezone.utc))


def test_store_metrics_are_read_once_per_max_age_however_many_scrape(store):
    """Each scrape ran full-table queries: a thousand scrapes, a thousand scans."""
    import threading

    from sqlalchemy import event

    from scheduler.metrics import StoreCollector

    statements = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    now = [100.0]
    collector = StoreCollector(store, max_age_s=10.0, clock=lambda: now[0])
    first = {f.name: f.samples for f in collector.collect()}
    assert statements
    read_once = len(statements)
    scrapes = [threading.Thread(target=lambda: list(collector.collect())) for _ in range(20)]
    for t in scrapes:
        t.start()
    for t in scrapes:
        t.join(60)
    assert len(statements) == read_once  # served from the last read
    assert {f.name: f.samples for f in collector.collect()} == first
    now[0] += 10.0
    list(collector.collect())
    assert len(statements) == 2 * read_once  # and read again once it is max_age old


def test_the_metrics_port_bounds_connections_and_closes_half_sent_requests():
    """1,000 half-sent requests made 1,000 daemon threads and another user's submit took
    15.8 s. Connections beyond the bound are answered 503 at once, and a request that never
    finishes is closed after the read timeout; the port serves again afterwards."""
    import threading
    import urllib.request

    from scheduler.metrics import Metrics

    m = Metrics()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    threads_before = threading.active_count()
    m.serve(port)
    half_sent = []
    try:
        for _ in range(40):
            c = socket.create_connection(("127.0.0.1", port), timeout=60)
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never ends its headers
            half_sent.append(c)
        deadline = time.monotonic() + 60
        answers = []
        for c in half_sent:  # every one is answered or closed by the daemon, none is kept
            c.settimeout(max(0.1, deadline - time.monotonic()))
            got = b""
            try:
                while chunk := c.recv(4096):
                    got += chunk
            except ConnectionResetError:
                pass
            answers.append(got)
        # refused at once with a 503 (or closed: a reset can overtake the answer), never kept
        assert all(a == b"" or a.startswith(b"HTTP/1.0 503") for a in answers)
        assert any(a.startswith(b"HTTP/1.0 503") for a in answers)
        assert m._server.peak_connections <= m._server.max_connections
        assert threading.active_count() <= threads_before + 3  # serve loop, reaper (+1 finishing)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read().decode()
        assert "carbonsched_planner_duration_seconds" in text
    finally:
        for c in half_sent:
            c.close()
        m.stop()
