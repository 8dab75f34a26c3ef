"""The daemon's HTTP/JSON API on a Unix socket.

The caller's uid and gid come from SO_PEERCRED on the connection, never from the request.
Bodies are capped in size and must be JSON; errors are JSON `{"error": ...}` with an HTTP
status that says what kind of mistake it was.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import socketserver
import stat
import struct
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import orjson
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from scheduler.accounting.accountant import Accountant
from scheduler.accounting.ledger import NotFound
from scheduler.accounting.reports import GROUPINGS, parse_period
from scheduler.daemon.access import Caller, RequestError
from scheduler.daemon.service import JobService
from scheduler.daemon.submit_checks import parse_iso_time
from scheduler.profiles import learned_view
from scheduler.store import Store
from scheduler.text_table import printable

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
API_VERSION = "v1"
#: Job ids one cancel/hold/release request may name: each is a transaction of its own, and
#: 130,000 of them held a database connection for minutes (issue 48). `cancel` in Slurm's
#: habits takes a handful; a script with more sends batches.
MAX_IDS_PER_REQUEST = 1000
#: Values one listing filter (`state=`, `user=`, `name=`) may have: 1,001 names made a query
#: SQLite refuses ("expression tree is too large"), which read as a database outage.
MAX_FILTER_VALUES = 100
#: Database connections kept for the daemon's own loops (planner, local agent's dispatch and
#: sampler, watchdog) that API requests may never take: one user's requests cannot stop
#: the jobs of everyone from being planned and started.
RESERVED_DB_CONNECTIONS = 4


@dataclass(frozen=True)
class UidLimits:
    """What one uid may take of the daemon, so one user (or a runaway script) cannot starve
    the others: requests per second (a token bucket with `burst`), requests being served at
    once, and open connections. Measured capacity on 2 cores is ~700-1,200 submits/s."""

    rate_per_s: float = 1000.0
    burst: float = 2000.0
    max_inflight: int = 32
    max_connections: int = 256
    # Requests whose cost grows with the store or a file (job listings, reports, exports, plan
    # previews, logs: 8 parallel listings of ~24k jobs took another user's submit p99 to 2.1 s,
    # 32 parallel reads of a 4 MiB log another user's health check to 3.2 s): at most this
    # many of one uid at once.
    max_expensive_inflight: int = 2
    # Requests of one uid being worked on at once; its other requests wait their turn, asleep,
    # without the GIL. Every runnable request thread takes its share of the interpreter, so 64
    # threads of one user's flood took another user's submit from 2 ms to a p50 of 34 ms.
    # One more than `max_expensive_inflight`: a user's cheap requests still go through while
    # two of their listings run.
    max_active: int = 3
    # How long a connection whose request was refused with 429 is left unread: the refusal is
    # answered at once, but a flooding client cannot spin the daemon on a stream of refusals.
    refused_pause_s: float = 0.25
    # How long a request waits for one of the database connections the API may use (all of
    # them busy: other users' requests) before it is answered 503 with Retry-After.
    db_wait_s: float = 5.0


#: (method, first path part) of the requests counted by `UidLimits.max_expensive_inflight`.
EXPENSIVE = frozenset({("GET", "jobs"), ("GET", "report"), ("GET", "export"), ("GET", "plan")})


def is_expensive(method: str, parts: list[str]) -> bool:
    """Whether a request (its path split, `v1` first) counts against `max_expensive_inflight`:
    a listing, report, export or plan preview, or a job's log (up to `MAX_LOG_CHUNK_BYTES`
    read and escaped into JSON)."""
    if len(parts) == 2:
        return (method, parts[1]) in EXPENSIVE
    return method == "GET" and len(parts) == 4 and parts[1] == "jobs" and parts[3] == "logs"


def limits_for_pool(limits: UidLimits, pool_connections: int | None) -> tuple[UidLimits, int | None]:
    """(per-uid limits, API-wide slots) for a store whose pool holds `pool_connections`
    (None: no fixed pool). The API may use all but `RESERVED_DB_CONNECTIONS` of them, and one
    uid at most half of those at once, so another user's request and the daemon's own loops
    always find a connection (issue 48: one uid's 32 requests in flight emptied a pool of 15,
    and others' submits failed)."""
    if pool_connections is None:
        return limits, None
    slots = max(2, pool_connections - RESERVED_DB_CONNECTIONS)
    per_uid = max(1, slots // 2)
    if limits.max_inflight > per_uid:
        log.info("API: at most %d requests in progress per uid (not %d): the database pool has %d "
                 "connections, %d of them for the API", per_uid, limits.max_inflight, pool_connections, slots)
        limits = replace(limits, max_inflight=per_uid)
    return limits, slots


class _UidGate:
    """Per-uid token buckets and counters behind one lock (a few dict operations per request)."""

    def __init__(self, limits: UidLimits, clock=time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[int, list[float]] = {}  # uid -> [tokens, last refill]
        self._inflight: dict[int, int] = {}
        self._expensive: dict[int, int] = {}
        self._connections: dict[int, int] = {}
        self.rejected = 0

    def enter_expensive(self, uid: int) -> None:
        """Admit one expensive request of `uid` or raise RequestError(429); pair with
        `leave_expensive`."""
        with self._lock:
            n = self._expensive.get(uid, 0)
            if n >= self.limits.max_expensive_inflight:
                self.rejected += 1
                raise RequestError(429, f"uid {uid} already has {n} listing/report/export/plan/logs request(s) "
                                        f"in progress (limit {self.limits.max_expensive_inflight}); retry when "
                                        "one has finished")
            self._expensive[uid] = n + 1

    def leave_expensive(self, uid: int) -> None:
        with self._lock:
            _decrement(self._expensive, uid)

    def enter(self, uid: int) -> None:
        """Admit one request of `uid` or raise RequestError(429); pair with `leave`."""
        lim = self.limits
        with self._lock:
            now = self._clock()
            bucket = self._buckets.setdefault(uid, [lim.burst, now])
            bucket[0] = min(lim.burst, bucket[0] + (now - bucket[1]) * lim.rate_per_s)
            bucket[1] = now
            if bucket[0] < 1.0:
                self.rejected += 1
                wait_s = (1.0 - bucket[0]) / lim.rate_per_s
                raise RequestError(429, f"too many requests from uid {uid} (limit {lim.rate_per_s:g}/s); "
                                        f"retry in {max(wait_s, 0.01):.2f}s")
            if self._inflight.get(uid, 0) >= lim.max_inflight:
                self.rejected += 1
                raise RequestError(429, f"uid {uid} already has {lim.max_inflight} requests in progress; "
                                        "retry when one has finished")
            bucket[0] -= 1.0
            self._inflight[uid] = self._inflight.get(uid, 0) + 1

    def leave(self, uid: int) -> None:
        with self._lock:
            _decrement(self._inflight, uid)

    def connect(self, uid: int) -> bool:
        """Count a new connection of `uid`; False when it has too many open already."""
        with self._lock:
            n = self._connections.get(uid, 0)
            if n >= self.limits.max_connections:
                self.rejected += 1
                return False
            self._connections[uid] = n + 1
            return True

    def disconnect(self, uid: int) -> None:
        with self._lock:
            _decrement(self._connections, uid)


class _UidTurns:
    """At most `per_uid` requests of one uid worked on at once; the others of that uid wait,
    in arrival order, and each finished request wakes one waiter of its own uid only."""

    def __init__(self, per_uid: int) -> None:
        self.per_uid = per_uid
        self._lock = threading.Lock()
        self._uids: dict[int, list] = {}  # uid -> [active, waiting, Condition]

    @contextmanager
    def turn(self, uid: int):
        with self._lock:
            entry = self._uids.get(uid)
            if entry is None:
                entry = self._uids[uid] = [0, 0, threading.Condition(self._lock)]
            entry[1] += 1
            while entry[0] >= self.per_uid:
                entry[2].wait()
            entry[1] -= 1
            entry[0] += 1
        try:
            yield
        finally:
            with self._lock:
                entry[0] -= 1
                if entry[1]:
                    entry[2].notify()
                elif not entry[0]:
                    del self._uids[uid]


def _decrement(counts: dict[int, int], uid: int) -> None:
    """One less for `uid`; a count that reaches zero is removed (the dicts stay small)."""
    n = counts.get(uid, 1) - 1
    if n > 0:
        counts[uid] = n
    else:
        counts.pop(uid, None)


class _DbSlots:
    """The database connections API requests may hold at once (all uids together): a request
    waits up to `wait_s` for one, then is answered 503 with Retry-After rather than waiting on
    the pool and failing (or taking the connections the planner and agents need)."""

    def __init__(self, slots: int | None, wait_s: float) -> None:
        self.slots = slots
        self.wait_s = wait_s
        self._free = threading.BoundedSemaphore(slots) if slots else None

    def __enter__(self) -> None:
        if self._free is not None and not self._free.acquire(timeout=self.wait_s):
            raise RequestError(503, f"the daemon is busy: all {self.slots} database connections for API "
                                    "requests are in use; retry in a moment")

    def __exit__(self, *exc) -> None:
        if self._free is not None:
            self._free.release()


def peer_credentials(sock: socket.socket) -> Caller:
    """The connecting process's (pid, uid, gid) as the kernel knows them."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Caller(uid=uid, gid=gid, pid=pid)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "ApiServer"

    def log_message(self, fmt, *args):  # route http.server's access log to logging
        log.debug("api %s", fmt % args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (bad request line, unsupported method, oversized headers)
        as JSON like every other error, not its HTML page."""
        if code == 501:
            code, message = 405, f"method {self.command!r} is not supported; use GET, POST or DELETE"
        text = message or self.responses.get(code, ("error",))[0]
        data = orjson.dumps({"error": text})
        self.close_connection = True
        try:
            self.send_response(code, text)
            self.send_header("Content-Type", "application/json")
            self.send_header("Connection", "close")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD" and code >= 200 and code not in (204, 304):
                self.wfile.write(data)
        except OSError:
            pass

    def handle_one_request(self) -> None:
        """One request in its uid's turn (`UidLimits.max_active`). The turn is taken once the
        request has begun to arrive, so an idle kept-alive connection holds none; after a 429
        the connection is left unread for `refused_pause_s`."""
        try:
            if not self.rfile.peek(1):
                self.close_connection = True
                return
        except (OSError, ValueError):
            self.close_connection = True
            return
        if self._uid is None:
            self._uid = peer_credentials(self.connection).uid
        self._refused = False
        with self.server.turns.turn(self._uid):
            super().handle_one_request()
        if self._refused and not self.close_connection:
            time.sleep(self.server.gate.limits.refused_pause_s)

    _uid: int | None = None
    _refused = False

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        self._body_read = False
        try:
            if self.server.stopping:
                self.close_connection = True
                raise RequestError(503, "the daemon is shutting down; retry in a moment")
            caller = peer_credentials(self.connection)
            gate = self.server.gate
            gate.enter(caller.uid)
            try:
                body = self._read_body() if method in ("POST", "DELETE") else None
                url = urlsplit(self.path)
                parts = [p for p in url.path.split("/") if p]
                expensive = is_expensive(method, parts)
                if expensive:
                    gate.enter_expensive(caller.uid)
                try:
                    with self.server.db_slots:
                        status, payload = self.server.router(method, url.path, parse_qs(url.query), body, caller)
                finally:
                    if expensive:
                        gate.leave_expensive(caller.uid)
            finally:
                gate.leave(caller.uid)
        except RequestError as e:
            # One clear line: a message that quotes the request shows its controls escaped.
            status, payload = e.status, {"error": printable(e.message)}
            self._refused = status == 429
        except PoolTimeout:
            # Every connection of the pool is in use (the daemon's loops and API requests): busy,
            # not down; a 503 to retry, no outage warning.
            status, payload = 503, {"error": "the daemon's database connections are all in use; retry in a moment"}
            self.server.note_pool_exhausted()
        except DBAPIError as e:
            # The database is down or unreachable: a 503 to retry, and one warning per outage
            # in the log (not a traceback per request).
            status, payload = 503, {"error": "the database cannot be reached now; retry in a moment"}
            self.server.note_db_outage(e)
        except Exception:
            log.exception("API request %s %s failed", method, self.path)
            status, payload = 500, {"error": "internal error in the daemon; see its log"}
        if status < 500:
            self.server.note_db_ok()
        data = encode_reply(payload)
        if not self._body_read and _has_body(self.headers):
            # Refused before its body was read (429, 503, GET with a body...): what is left
            # on the connection is not the next request. Close it rather than parse it as one.
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if status in (429, 503):
            self.send_header("Retry-After", "1")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self):
        length = self.headers.get("Content-Length")
        if length is None:
            if self.headers.get("Transfer-Encoding"):
                self.close_connection = True
                raise RequestError(411, "chunked bodies are not accepted; send Content-Length")
            return None
        try:
            n = int(length)
        except ValueError:
            self.close_connection = True
            raise RequestError(400, "bad Content-Length") from None
        if n < 0 or n > MAX_BODY_BYTES:
            self.close_connection = True  # do not read an oversized body
            raise RequestError(413, f"request body too large ({n} bytes; limit {MAX_BODY_BYTES})")
        raw = self.rfile.read(n)
        if len(raw) < n:
            self.close_connection = True
            raise RequestError(400, f"request body ended after {len(raw)} of {n} bytes")
        self._body_read = True
        if not raw:
            return None
        try:
            # orjson, not json: it refuses what cannot be stored and shown again, i.e. lone
            # surrogates ("\ud800") and invalid UTF-8, numbers beyond a double or 64 bits,
            # NaN/Infinity, and nesting deeper than 1,024, each as a clear 400.
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise RequestError(400, f"request body is not valid JSON: {e}") from None


def _has_body(headers) -> bool:
    length = headers.get("Content-Length")
    return bool(headers.get("Transfer-Encoding")) or (length is not None and length.strip() != "0")


def encode_reply(payload) -> bytes:
    """The reply as JSON bytes (orjson: a 10,000-job listing is ~7 MB). Text that UTF-8
    cannot carry (a lone surrogate stored before the API refused them) is shown as U+FFFD
    rather than failing the whole reply: no stored row may break a listing."""
    try:
        return orjson.dumps(payload)
    except TypeError as e:  # orjson.JSONEncodeError
        log.warning("reply holds text that is not valid UTF-8 (%s); shown with U+FFFD", e)
        return orjson.dumps(_valid_text(payload))


def _valid_text(value):
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_valid_text(k): _valid_text(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_valid_text(v) for v in value]
    return value


class ApiServer(socketserver.UnixStreamServer):
    """One thread per connection (kept alive by clients), admitted per uid by `UidLimits`."""

    allow_reuse_address = False
    request_queue_size = 128

    def __init__(self, path: Path, service: JobService, *, extra_routes=None,
                 limits: UidLimits | None = None) -> None:
        self.path = Path(path)
        self.service = service
        limits, slots = limits_for_pool(limits or UidLimits(), service.store.pool_connections())
        self.gate = _UidGate(limits)
        self.turns = _UidTurns(limits.max_active)
        self.db_slots = _DbSlots(slots, limits.db_wait_s)
        self._pool_full_logged_at = -1e9
        self.extra_routes = extra_routes or {}
        _remove_stale_socket(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(str(self.path), _Handler)
        # Anyone may connect; who they are comes from SO_PEERCRED, not from the file mode.
        os.chmod(self.path, 0o666)
        self._thread: threading.Thread | None = None
        self.stopping = False
        self.loop_at = time.monotonic()
        self._db_down_since: float | None = None
        self._refused_logged_at: dict[int, float] = {}
        self._refusals: queue.Queue = queue.Queue(maxsize=64)
        threading.Thread(target=self._refuse_connections, name="api-refuse", daemon=True).start()

    def note_db_outage(self, e: DBAPIError) -> None:
        if self._db_down_since is None:
            self._db_down_since = time.monotonic()
            log.warning("API: the database cannot be reached (%s); answering 503 until it is back",
                        str(e.orig).strip().splitlines()[0] if e.orig else e)

    def note_pool_exhausted(self) -> None:
        now = time.monotonic()
        if now - self._pool_full_logged_at >= 60.0:  # one line a minute
            self._pool_full_logged_at = now
            log.warning("API: every database connection of the pool is in use; answering 503 (logged once a "
                        "minute)")

    def note_db_ok(self) -> None:
        if self._db_down_since is not None:
            log.warning("API: the database is back after %.0fs", time.monotonic() - self._db_down_since)
            self._db_down_since = None

    def process_request(self, request, client_address) -> None:
        """Refuse a uid's connection beyond its limit before it gets a thread."""
        try:
            uid = peer_credentials(request).uid
        except OSError:
            self.shutdown_request(request)
            return
        if not self.gate.connect(uid):
            now = time.monotonic()
            if now - self._refused_logged_at.get(uid, -1e9) >= 60.0:  # one line a minute per uid
                self._refused_logged_at[uid] = now
                log.warning("uid %s has %d connections open; refusing more (logged once a minute)", uid,
                            self.gate.limits.max_connections)
            try:
                self._refusals.put_nowait((request, uid))
            except queue.Full:  # a flood: no answer for these, just closed
                self.shutdown_request(request)
            return
        threading.Thread(target=self._serve_connection, args=(request, client_address, uid),
                         name="api-conn", daemon=True).start()

    def _refuse_connections(self) -> None:
        """Answer refused connections with a 429 the client can read: their request is read
        first (briefly, bounded), since closing a socket with unread data resets it and the
        client would only see "connection reset" instead of why. One thread for all of them,
        off the accept loop."""
        while True:
            request, uid = self._refusals.get()
            body = orjson.dumps({"error": f"too many open connections for uid {uid} "
                                          f"(limit {self.gate.limits.max_connections}); close some and retry"})
            try:
                request.settimeout(0.2)
                seen = b""
                while b"\r\n\r\n" not in seen and len(seen) < 65536:
                    chunk = request.recv(65536)
                    if not chunk:
                        break
                    seen += chunk
                request.sendall(b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                                b"Connection: close\r\nRetry-After: 1\r\nContent-Length: "
                                + str(len(body)).encode() + b"\r\n\r\n" + body)
            except OSError:
                pass
            self.shutdown_request(request)

    def _serve_connection(self, request, client_address, uid: int) -> None:
        try:
            self.finish_request(request, client_address)
        except (BrokenPipeError, ConnectionResetError) as e:
            # The client went away before its reply (a timed-out probe, a killed CLI): not
            # the daemon's failure, and no traceback for it.
            log.debug("API client went away before its reply: %s", e)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self.gate.disconnect(uid)

    def handle_error(self, request, client_address) -> None:
        log.exception("API connection failed")

    def service_actions(self) -> None:
        """Called by serve_forever on every turn of its loop: proof the accept loop is alive."""
        self.loop_at = time.monotonic()

    def loop_problem(self, stall_s: float = 30.0) -> str | None:
        """Why the API looks wedged (for the systemd watchdog), None when it is serving."""
        if self._thread is None or not self._thread.is_alive():
            return "API thread is not running"
        idle_s = time.monotonic() - self.loop_at
        return f"API accept loop has not turned for {idle_s:.0f}s" if idle_s > stall_s else None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="api", daemon=True)
        self._thread.start()
        log.info("API listening on %s", self.path)

    def stop(self) -> None:
        self.stopping = True  # kept-alive connections get 503 and are closed from now on
        self.shutdown()
        self.server_close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    # -- routing ------------------------------------------------------------------------

    def router(self, method: str, path: str, query: dict, body, caller: Caller):
        svc = self.service
        parts = [p for p in path.split("/") if p]
        if not parts or parts[0] != API_VERSION:
            raise RequestError(404, f"unknown API path {path}")
        parts = parts[1:]
        route = (method, *parts[:1])
        if route == ("GET", "health"):
            return 200, svc.health()
        if route == ("POST", "jobs") and len(parts) == 1:
            return 201, svc.submit(caller, body)
        if route == ("GET", "jobs") and len(parts) == 1:
            states = [s.upper() for s in _query_list(query, "state")]
            limit = _query_int(query, "limit")
            users = _query_list(query, "user")
            names = _query_list(query, "name")
            return 200, svc.list_jobs(caller, include_done=_flag(query, "all"),
                                      states=states or None, limit=limit, users=users or None,
                                      names=names or None, since=_query_time(query, "since"),
                                      until=_query_time(query, "until"),
                                      array_job_id=_query_int(query, "array"))
        if parts[:1] == ["jobs"] and len(parts) >= 2:
            job_id = _job_id(parts[1])
            if method == "GET" and len(parts) == 2:
                return 200, svc.get_job(caller, job_id)
            if method == "GET" and parts[2:] == ["logs"]:
                stream = query.get("stream", ["stdout"])[0]
                return 200, svc.logs(caller, job_id, stream=stream,
                                     tail_bytes=_query_int(query, "tail_bytes"),
                                     offset=_query_int(query, "offset"))
            if method == "POST" and parts[2:] == ["cancel"]:
                return 200, svc.cancel(caller, [job_id])[0]
        if route == ("POST", "cancel"):
            ids = body.get("ids") if isinstance(body, dict) else None
            if not isinstance(ids, list):
                raise RequestError(400, 'cancel body must be {"ids": [JOB, ...]}')
            return 200, svc.cancel(caller, _job_ids(ids, "cancel"))
        if route in (("POST", "hold"), ("POST", "release")) and len(parts) == 1:
            ids = body.get("ids") if isinstance(body, dict) else None
            if not isinstance(ids, list):
                raise RequestError(400, f'{parts[0]} body must be {{"ids": [JOB, ...]}}')
            return 200, svc.hold(caller, _job_ids(ids, parts[0]), held=parts[0] == "hold")
        if route == ("POST", "profiles") and parts[1:] == ["reset"]:
            return 200, svc.reset_profiles(caller, body)
        if route in (("POST", "drain"), ("POST", "resume")) and len(parts) == 1:
            return 200, svc.drain(caller, body, drained=parts[0] == "drain")
        if route == ("GET", "nodes"):
            return 200, svc.nodes(caller)
        if parts[:1] in (["accounts"], ["users"]):
            return svc.accounts.route(method, parts, query, body, caller)
        if parts[:1] in (["share"], ["priority"]):
            return svc.standing.route(method, parts, query, body, caller)
        handler = self.extra_routes.get(route)
        if handler is not None:
            return 200, handler(caller, query)
        raise RequestError(404, f"unknown API call {method} {path}")


def _job_id(v) -> int:
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise RequestError(400, f"job id must be a number (got {v!r})") from None
    if isinstance(v, bool) or not 1 <= n < 2**63:
        raise RequestError(400, f"job id must be a positive 64-bit number (got {v!r})")
    return n


def _job_ids(ids: list, verb: str) -> list[int]:
    """The job ids of a cancel/hold/release body, at most `MAX_IDS_PER_REQUEST` of them."""
    if len(ids) > MAX_IDS_PER_REQUEST:
        raise RequestError(400, f"{verb} takes at most {MAX_IDS_PER_REQUEST} job ids per request (got "
                                f"{len(ids)}); send them in batches")
    return [_job_id(i) for i in ids]


def _query_list(query: dict, name: str) -> list[str]:
    """A listing filter's values (repeated and comma-separated), at most `MAX_FILTER_VALUES`."""
    values = [v for raw in query.get(name, []) for v in raw.split(",") if v]
    if len(values) > MAX_FILTER_VALUES:
        raise RequestError(400, f"at most {MAX_FILTER_VALUES} {name} filters per listing (got {len(values)})")
    return values


def _flag(query: dict, name: str) -> bool:
    return query.get(name, ["0"])[0].lower() in ("1", "true", "yes")


def _query_int(query: dict, name: str) -> int | None:
    if name not in query:
        return None
    try:
        n = int(query[name][0])
    except ValueError:
        raise RequestError(400, f"{name} must be an integer") from None
    if not 0 <= n < 2**63:
        raise RequestError(400, f"{name} must be between 0 and 2^63-1")
    return n


def _query_time(query: dict, name: str) -> datetime | None:
    """An ISO 8601 time with its zone from the query string (the CLI sends UTC)."""
    return parse_iso_time(query[name][0], name) if name in query else None


def _remove_stale_socket(path: Path) -> None:
    """Delete a socket file left by a dead daemon; refuse if a live daemon answers on it."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise RuntimeError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError, socket.timeout):
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise RuntimeError(f"another carbonsched daemon is already listening on {path}")


def accounting_routes(accountant: Accountant, service: JobService) -> dict:
    """Routes for `ApiServer(extra_routes=...)`: GET /v1/report, /v1/export, /v1/receipt.

    A user sees only their own jobs, root or an admin group everyone's, as with `queue`
    (`service.is_admin`, `service.get_job` for the receipt's access check).
    """
    def scope(caller) -> int | None:
        return None if service.is_admin(caller) else caller.uid

    def period(query: dict) -> tuple[datetime, datetime]:
        try:
            return parse_period(query.get("since", [None])[0], query.get("until", [None])[0],
                                accountant._clock())
        except ValueError as e:
            raise RequestError(400, str(e)) from None
        except OverflowError:  # e.g. since=999999999d: before year 1
            raise RequestError(400, "the report period is out of range") from None

    def report(caller, query: dict) -> dict:
        since, until = period(query)
        by = query.get("by", ["user"])[0]
        if by not in GROUPINGS:
            raise RequestError(400, f"unknown grouping {by!r}; use one of {', '.join(GROUPINGS)}")
        return accountant.report(since, until, by=by, owner_uid=scope(caller))

    def export(caller, query: dict) -> dict:
        since, until = period(query)
        if query.get("by", [None])[0] == "account":  # a statement per account: usage and charges
            return accountant.statement(since, until, owner_uid=scope(caller))
        return accountant.export(since, until, owner_uid=scope(caller))  # any other `by`: as before

    def receipt(caller, query: dict) -> dict:
        raw = query.get("job", [None])[0]
        if raw is None:
            raise RequestError(400, "receipt needs ?job=ID")
        job_id = _job_id(raw)
        service.get_job(caller, job_id)  # 404 / 403 exactly as `show`
        try:
            return accountant.receipt(job_id)
        except NotFound as e:
            raise RequestError(404, str(e)) from None

    return {("GET", "report"): report, ("GET", "export"): export, ("GET", "receipt"): receipt}


def profile_routes(store: Store) -> dict:
    """Routes for `ApiServer(extra_routes=...)`: GET /v1/profiles[?workload=W], the learned
    workload profiles beside the seeds they correct (`scheduler.profiles.learned_view`).

    Every user may read them: they are the fleet's figures per (workload, GPU model), the
    ones the planner uses for everyone's jobs, and name no job, user or command. A database
    that cannot be read answers 503.
    """
    def profiles(caller, query: dict) -> dict:
        workload = query.get("workload", [None])[0]
        try:
            with store.read() as conn:
                return {"profiles": learned_view(conn, workload or None)}
        except DBAPIError as e:  # the database is down: say so (the CLI shows the model's figures)
            log.warning("GET /profiles: cannot read the store: %s", e.orig)
            raise RequestError(503, "the database cannot be read now") from None

    return {("GET", "profiles"): profiles}
