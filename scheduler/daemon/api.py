"""The daemon's HTTP/JSON API on a Unix socket.

The caller's uid and gid come from SO_PEERCRED on the connection, never from the request.
Bodies are capped in size and must be JSON; errors are JSON `{"error": ...}` with an HTTP
status that says what kind of mistake it was.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import stat
import struct
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import orjson
from sqlalchemy.exc import DBAPIError

from scheduler.accounting import GROUPINGS, Accountant, NotFound, parse_period
from scheduler.daemon.service import Caller, JobService, RequestError
from scheduler.profiles import learned_view
from scheduler.store import Store

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
API_VERSION = "v1"


@dataclass(frozen=True)
class UidLimits:
    """What one uid may take of the daemon, so one user (or a runaway script) cannot starve
    the others: requests per second (a token bucket with `burst`), requests being served at
    once, and open connections. Measured capacity on 2 cores is ~700-1,200 submits/s."""

    rate_per_s: float = 1000.0
    burst: float = 2000.0
    max_inflight: int = 32
    max_connections: int = 256


class _UidGate:
    """Per-uid token buckets and counters behind one lock (a few dict operations per request)."""

    def __init__(self, limits: UidLimits, clock=time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[int, list[float]] = {}  # uid -> [tokens, last refill]
        self._inflight: dict[int, int] = {}
        self._connections: dict[int, int] = {}
        self.rejected = 0

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


def _decrement(counts: dict[int, int], uid: int) -> None:
    """One less for `uid`; a count that reaches zero is removed (the dicts stay small)."""
    n = counts.get(uid, 1) - 1
    if n > 0:
        counts[uid] = n
    else:
        counts.pop(uid, None)


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

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
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
                status, payload = self.server.router(method, url.path, parse_qs(url.query), body, caller)
            finally:
                gate.leave(caller.uid)
        except RequestError as e:
            status, payload = e.status, {"error": e.message}
        except Exception:
            log.exception("API request %s %s failed", method, self.path)
            status, payload = 500, {"error": "internal error in the daemon; see its log"}
        data = orjson.dumps(payload)  # C-fast: a 10,000-job listing is ~7 MB of JSON
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if status == 429:
            self.send_header("Retry-After", "1")
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
        if not raw:
            return None
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(400, f"request body is not valid JSON: {e}") from None


class ApiServer(socketserver.UnixStreamServer):
    """One thread per connection (kept alive by clients), admitted per uid by `UidLimits`."""

    allow_reuse_address = False
    request_queue_size = 128

    def __init__(self, path: Path, service: JobService, *, extra_routes=None,
                 limits: UidLimits | None = None) -> None:
        self.path = Path(path)
        self.service = service
        self.gate = _UidGate(limits or UidLimits())
        self.extra_routes = extra_routes or {}
        _remove_stale_socket(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(str(self.path), _Handler)
        # Anyone may connect; who they are comes from SO_PEERCRED, not from the file mode.
        os.chmod(self.path, 0o666)
        self._thread: threading.Thread | None = None
        self.stopping = False
        self.loop_at = time.monotonic()

    def process_request(self, request, client_address) -> None:
        """Refuse a uid's connection beyond its limit before it gets a thread."""
        try:
            uid = peer_credentials(request).uid
        except OSError:
            self.shutdown_request(request)
            return
        if not self.gate.connect(uid):
            log.warning("uid %s has %d connections open; refusing another", uid,
                        self.gate.limits.max_connections)
            body = orjson.dumps({"error": f"too many open connections for uid {uid} "
                                          f"(limit {self.gate.limits.max_connections})"})
            try:
                request.sendall(b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                                b"Connection: close\r\nRetry-After: 1\r\nContent-Length: "
                                + str(len(body)).encode() + b"\r\n\r\n" + body)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        threading.Thread(target=self._serve_connection, args=(request, client_address, uid),
                         name="api-conn", daemon=True).start()

    def _serve_connection(self, request, client_address, uid: int) -> None:
        try:
            self.finish_request(request, client_address)
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
            states = [s.upper() for v in query.get("state", []) for s in v.split(",") if s]
            limit = _query_int(query, "limit")
            users = [u for v in query.get("user", []) for u in v.split(",") if u]
            names = [n for v in query.get("name", []) for n in v.split(",") if n]
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
            return 200, svc.cancel(caller, [_job_id(i) for i in ids])
        if route in (("POST", "hold"), ("POST", "release")) and len(parts) == 1:
            ids = body.get("ids") if isinstance(body, dict) else None
            if not isinstance(ids, list):
                raise RequestError(400, f'{parts[0]} body must be {{"ids": [JOB, ...]}}')
            return 200, svc.hold(caller, [_job_id(i) for i in ids], held=parts[0] == "hold")
        if route in (("POST", "drain"), ("POST", "resume")) and len(parts) == 1:
            return 200, svc.drain(caller, body, drained=parts[0] == "drain")
        if route == ("GET", "nodes"):
            return 200, svc.nodes(caller)
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


def _flag(query: dict, name: str) -> bool:
    return query.get(name, ["0"])[0].lower() in ("1", "true", "yes")


def _query_int(query: dict, name: str) -> int | None:
    if name not in query:
        return None
    try:
        n = int(query[name][0])
    except ValueError:
        raise RequestError(400, f"{name} must be an integer") from None
    if n < 0:
        raise RequestError(400, f"{name} must not be negative")
    return n


def _query_time(query: dict, name: str) -> datetime | None:
    """An ISO 8601 time with its zone from the query string (the CLI sends UTC)."""
    if name not in query:
        return None
    text = query[name][0]
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise RequestError(400, f"{name} {text!r} is not an ISO 8601 time") from None
    if t.tzinfo is None:
        raise RequestError(400, f"{name} {text!r} has no time zone")
    return t.astimezone(timezone.utc)


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

    def report(caller, query: dict) -> dict:
        since, until = period(query)
        by = query.get("by", ["user"])[0]
        if by not in GROUPINGS:
            raise RequestError(400, f"unknown grouping {by!r}; use one of {', '.join(GROUPINGS)}")
        return accountant.report(since, until, by=by, owner_uid=scope(caller))

    def export(caller, query: dict) -> dict:
        since, until = period(query)
        return accountant.export(since, until, owner_uid=scope(caller))

    def receipt(caller, query: dict) -> dict:
        raw = query.get("job", [None])[0]
        try:
            job_id = int(raw)
        except (TypeError, ValueError):
            raise RequestError(400, f"receipt needs ?job=ID (got {raw!r})") from None
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
