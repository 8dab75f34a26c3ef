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
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import orjson

from scheduler.service import Caller, JobService, RequestError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
API_VERSION = "v1"


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
            body = self._read_body() if method in ("POST", "DELETE") else None
            url = urlsplit(self.path)
            status, payload = self.server.router(method, url.path, parse_qs(url.query), body, caller)
        except RequestError as e:
            status, payload = e.status, {"error": e.message}
        except Exception:
            log.exception("API request %s %s failed", method, self.path)
            status, payload = 500, {"error": "internal error in the daemon; see its log"}
        data = orjson.dumps(payload)  # C-fast: a 10,000-job listing is ~7 MB of JSON
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
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


class ApiServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = False
    request_queue_size = 128

    def __init__(self, path: Path, service: JobService, *, extra_routes=None) -> None:
        self.path = Path(path)
        self.service = service
        self.extra_routes = extra_routes or {}
        _remove_stale_socket(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(str(self.path), _Handler)
        # Anyone may connect; who they are comes from SO_PEERCRED, not from the file mode.
        os.chmod(self.path, 0o666)
        self._thread: threading.Thread | None = None
        self.stopping = False
        self.loop_at = time.monotonic()

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
            return 200, svc.list_jobs(caller, include_done=_flag(query, "all"),
                                      states=states or None, limit=limit)
        if parts[:1] == ["jobs"] and len(parts) >= 2:
            job_id = _job_id(parts[1])
            if method == "GET" and len(parts) == 2:
                return 200, svc.get_job(caller, job_id)
            if method == "GET" and parts[2:] == ["logs"]:
                stream = query.get("stream", ["stdout"])[0]
                return 200, svc.logs(caller, job_id, stream=stream,
                                     tail_bytes=_query_int(query, "tail_bytes"))
            if method == "POST" and parts[2:] == ["cancel"]:
                return 200, svc.cancel(caller, [job_id])[0]
        if route == ("POST", "cancel"):
            ids = body.get("ids") if isinstance(body, dict) else None
            if not isinstance(ids, list):
                raise RequestError(400, 'cancel body must be {"ids": [JOB, ...]}')
            return 200, svc.cancel(caller, [_job_id(i) for i in ids])
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
    if isinstance(v, bool) or n < 1:
        raise RequestError(400, f"job id must be a positive number (got {v!r})")
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
