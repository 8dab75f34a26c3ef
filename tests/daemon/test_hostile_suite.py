"""The hostile-input suite of issue 25, on SQLite and PostgreSQL: hypothesis over request
shapes and field values (lone surrogates, controls, huge and tiny numbers, NaN, deep
nesting, wrong types) against a real ApiServer, JobService and store.

For every request: the answer is 2xx, 4xx, 429 or 503, never a 500 (or any other 5xx); the
daemon keeps serving; a refused request stores nothing; and every stored row renders, in
`queue` and `show` (the CLI's own renderers, with no raw terminal control in them) and as
`--json`.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from databases import DB_KINDS, database_for
from scheduler.cli.client import Client
from scheduler.cli.output import job_detail, jobs_table
from scheduler.daemon.access import ServiceConfig
from scheduler.daemon.api import ApiServer
from scheduler.daemon.service import JobService
from scheduler.store import Store
from scheduler.store.models import jobs
from test_api_hostile import raw_exchange, responses

EXAMPLES = int(os.environ.get("CARBONSCHED_FUZZ_EXAMPLES", "800")) // 4
ALLOWED = lambda status: 200 <= status < 300 or 400 <= status < 500 or status == 503  # noqa: E731
CONTROLS = {chr(c) for c in range(32)} | {chr(c) for c in range(0x7f, 0xa0)} | {"\u202e", "\u2028"}


@pytest.fixture(scope="module", params=DB_KINDS)
def server(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    with database_for(request.param, root) as url:
        store = Store(url)
        store.upgrade()
        service = JobService(store, ServiceConfig(daemon_uid=os.getuid()), log_dir=root / "logs")
        api = ApiServer(root / "s.sock", service)
        api.start()
        yield api, store
        api.stop()
        store.dispose()


# Text of every kind, with the characters that break things drawn often: lone surrogates
# (category Cs), NUL, escape and other controls, newlines, bidi overrides.
NASTY = ["\ud800", "\udfff", "\x00", "\x1b", "\n", "\r", "\u202e", "\x9b", "\u2028", "\ufeff"]
any_text = st.text(st.one_of(st.characters(blacklist_categories=()), st.sampled_from(NASTY)), max_size=30)
hostile_numbers = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                            st.sampled_from([0, 1, -1, 1e-300, 1e308, 2**63, 2**64, 10**400]))
values = st.recursive(st.one_of(st.none(), st.booleans(), hostile_numbers, any_text),
                      lambda inner: st.one_of(st.lists(inner, max_size=3),
                                              st.dictionaries(any_text, inner, max_size=3)), max_leaves=8)
fields = st.sampled_from(["argv", "name", "gpus", "gpu_mem_gib", "deadline", "latency_slo_ms", "ttft_slo_ms",
                          "tpot_slo_ms", "workload", "prompts", "tokens", "est_runtime_s", "time_limit_s", "cwd",
                          "env", "max_retries", "max_delay_s"])
# Mostly well-formed submits with one or two hostile fields, so that some are accepted.
plausible = st.fixed_dictionaries({"argv": st.tuples(st.sampled_from(["echo", "/bin/sh", "python3"]),
                                                     st.lists(any_text, max_size=3)).map(lambda t: [t[0], *t[1]])},
                                   optional={
    "name": any_text, "cwd": any_text.map(lambda t: "/" + t), "env": st.dictionaries(
        st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,8}\Z"), any_text, max_size=2),
    "workload": st.one_of(any_text, st.sampled_from(["llm-inference", "llm:70b", "llm:0b", "eval"])),
    "deadline": st.one_of(any_text, st.sampled_from(["2099-01-01T00:00:00Z", "9999-12-31T23:59:59-23:59",
                                                     "2027-01-01T00:00:00+14:00"])),
    "est_runtime_s": hostile_numbers, "gpus": hostile_numbers, "prompts": hostile_numbers})
bodies = st.one_of(plausible, st.dictionaries(fields, values, max_size=6), values)


def encode(body) -> bytes:
    """JSON as a client might send it: surrogates as \\ud800 escapes, NaN as NaN."""
    return json.dumps(body).encode()


def job_ids(store) -> set[int]:
    with store.read() as conn:
        return set(conn.execute(jobs.select().with_only_columns(jobs.c.id)).scalars())


def renders(api, job_id: int) -> None:
    c = Client(api.path)
    shown = c.job(job_id)
    listed = [j for j in c.jobs(include_done=True) if j["id"] == job_id]
    raw = json.loads(c.request_raw("GET", "/jobs", {"all": "1"}))  # `queue --json`
    assert listed and any(j["id"] == job_id for j in raw)
    for text in (job_detail(shown), jobs_table(listed)):
        assert not CONTROLS & set(text.replace("\n", "")), text
        text.encode("utf-8")  # printable to a UTF-8 terminal


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies)
def test_every_submit_is_answered_cleanly_and_every_stored_row_renders(server, body):
    api, store = server
    before = job_ids(store)
    try:
        data = encode(body)
    except (ValueError, OverflowError):  # not even JSON-encodable
        return
    raw = raw_exchange(api.path, b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                                 b"Connection: close\r\n\r\n" % len(data) + data)
    (status, payload), = responses(raw)
    assert ALLOWED(status), (status, payload)
    after = job_ids(store)
    if status == 201:
        assert after - before == {payload["id"]}
        renders(api, payload["id"])
    else:
        assert after == before and isinstance(payload.get("error"), str) and payload["error"]
        assert "\n" not in payload["error"]  # one clear line


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(method=st.sampled_from(["GET", "POST", "DELETE"]),
       path=st.sampled_from(["/v1/jobs", "/v1/jobs/1", "/v1/jobs/1/logs", "/v1/cancel", "/v1/jobs/1/cancel",
                             "/v1/drain", "/v1/resume", "/v1/nodes", "/v1/health"]),
       query=st.dictionaries(st.sampled_from(["limit", "all", "state", "stream", "tail_bytes"]),
                             st.one_of(any_text, hostile_numbers.map(str)), max_size=2),
       body=st.one_of(st.none(), values))
def test_every_request_shape_is_answered_cleanly(server, method, path, query, body):
    from urllib.parse import urlencode

    api, store = server
    before = job_ids(store)
    target = path + ("?" + urlencode({k: v.encode("utf-8", "surrogatepass") for k, v in query.items()})
                     if query else "")
    data = b"" if body is None else encode(body)
    raw = raw_exchange(api.path, f"{method} {target} HTTP/1.1\r\nHost: x\r\n".encode()
                       + (b"Content-Length: %d\r\n" % len(data) if body is not None else b"")
                       + b"Connection: close\r\n\r\n" + data)
    for status, payload in responses(raw):
        assert ALLOWED(status), (status, payload)
    assert job_ids(store) == before  # none of these submits
    assert Client(api.path).request("GET", "/health") is not None


def test_the_suite_ran_on_both_stores_and_stored_some_rows(server):
    api, store = server
    assert len(job_ids(store)) > 0  # some plausible submits were accepted and rendered
