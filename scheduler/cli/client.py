"""A small client of the daemon's Unix-socket API (standard library only: the CLI must start fast)."""

from __future__ import annotations

import http.client
import json
import os
import socket
from pathlib import Path
from urllib.parse import urlencode

ROOT_SOCKET = Path("/run/carbonsched/carbonsched.sock")


class ApiError(Exception):
    """The daemon refused a request; `status` is its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class DaemonUnreachable(Exception):
    """Nothing answers on the socket."""


def user_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "carbonsched"


def default_state_dir() -> Path:
    env = os.environ.get("CARBONSCHED_STATE_DIR")
    if env:
        return Path(env)
    return Path("/var/lib/carbonsched") if os.geteuid() == 0 else user_state_dir()


def default_socket_path() -> Path:
    """Where the CLI looks for the daemon: $CARBONSCHED_SOCKET, the system socket, else ours."""
    env = os.environ.get("CARBONSCHED_SOCKET")
    if env:
        return Path(env)
    if os.geteuid() == 0 or ROOT_SOCKET.exists():
        return ROOT_SOCKET
    return default_state_dir() / "carbonsched.sock"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class Client:
    """One connection to the daemon, reused across requests (HTTP/1.1 keep-alive)."""

    def __init__(self, socket_path: str | Path | None = None, *, timeout: float = 30.0) -> None:
        self.socket_path = str(socket_path or default_socket_path())
        self.timeout = timeout
        self._conn: _UnixConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(self, method: str, path: str, body: object = None, query: dict | None = None):
        """Call the API; the decoded JSON reply, or ApiError / DaemonUnreachable."""
        status, raw = self._call(method, path, body, query)
        try:
            payload = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            raise ApiError(status, f"daemon sent a non-JSON reply (HTTP {status})") from None
        if status >= 400:
            msg = payload.get("error") if isinstance(payload, dict) else None
            raise ApiError(status, msg or f"HTTP {status}")
        return payload

    def request_raw(self, method: str, path: str, query: dict | None = None) -> bytes:
        """Call the API and return the reply's JSON bytes undecoded (for `--json` output)."""
        status, raw = self._call(method, path, None, query)
        if status >= 400:
            try:
                msg = json.loads(raw).get("error")
            except (json.JSONDecodeError, AttributeError):
                msg = None
            raise ApiError(status, msg or f"HTTP {status}")
        return raw

    def _call(self, method: str, path: str, body: object, query: dict | None) -> tuple[int, bytes]:
        url = "/v1" + path + (("?" + urlencode(query, doseq=True)) if query else "")
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = _UnixConnection(self.socket_path, self.timeout)
            try:
                self._conn.request(method, url, body=data, headers=headers)
                resp = self._conn.getresponse()
                raw = resp.read()
                break
            except (FileNotFoundError, ConnectionRefusedError) as e:
                self.close()
                raise DaemonUnreachable(
                    f"cannot reach the carbonsched daemon at {self.socket_path} ({e.strerror}); "
                    "is `carbonsched daemon` running? (set --socket or CARBONSCHED_SOCKET)") from None
            except PermissionError:
                self.close()
                raise DaemonUnreachable(f"permission denied on {self.socket_path}") from None
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()  # a kept-alive connection the daemon closed: retry once, fresh
                if attempt == 2:
                    raise DaemonUnreachable(f"the daemon at {self.socket_path} closed the connection") from None
        return resp.status, raw

    # Convenience wrappers used by the CLI and tests.

    def submit(self, **fields) -> dict:
        return self.request("POST", "/jobs", fields)

    def jobs(self, *, include_done: bool = False, states: list[str] | None = None, **filters) -> list[dict]:
        return self.request("GET", "/jobs", query=_jobs_query(include_done, states, **filters))

    def jobs_raw(self, *, include_done: bool = False, states: list[str] | None = None, **filters) -> bytes:
        return self.request_raw("GET", "/jobs", query=_jobs_query(include_done, states, **filters))

    def hold(self, job_ids: list[int]) -> list[dict]:
        return self.request("POST", "/hold", {"ids": job_ids})

    def release(self, job_ids: list[int]) -> list[dict]:
        return self.request("POST", "/release", {"ids": job_ids})

    def job(self, job_id: int) -> dict:
        return self.request("GET", f"/jobs/{job_id}")

    def cancel(self, job_ids: list[int]) -> list[dict]:
        return self.request("POST", "/cancel", {"ids": job_ids})

    def logs(self, job_id: int, stream: str = "stdout", tail_bytes: int | None = None,
             offset: int | None = None) -> dict:
        q = {"stream": stream}
        if tail_bytes:
            q["tail_bytes"] = str(tail_bytes)
        if offset is not None:
            q["offset"] = str(offset)
        return self.request("GET", f"/jobs/{job_id}/logs", query=q)

    def nodes(self) -> list[dict]:
        return self.request("GET", "/nodes")

    def plan(self) -> list[dict]:
        return self.request("GET", "/plan")


def _jobs_query(include_done: bool, states: list[str] | None, *, users: list[str] | None = None,
                names: list[str] | None = None, since: str | None = None, until: str | None = None,
                array: int | None = None) -> dict | None:
    q: dict = {}
    if include_done:
        q["all"] = "1"
    if states:
        q["state"] = ",".join(states)
    if users:
        q["user"] = ",".join(users)
    if names:
        q["name"] = names
    if since:
        q["since"] = since
    if until:
        q["until"] = until
    if array is not None:
        q["array"] = str(array)
    return q or None
