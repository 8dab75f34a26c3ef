"""What one user does in `two_user_audit.py`, run as that user (`runuser -u USER -- python3
audit_client.py VERB < JSON`): the attacker's floods and the other user's timed requests.

It needs only the standard library and `scheduler.cli.client` (what the CLI itself needs), so
it runs with the system's python3 from a copy of the code every user can read. Each verb
prints one JSON object on stdout.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from scheduler.cli.client import ApiError, Client, DaemonUnreachable


def _status_of(call) -> int:
    """The HTTP status a call ended with (599: the daemon could not be reached)."""
    try:
        call()
        return 200
    except ApiError as e:
        return e.status
    except DaemonUnreachable:
        return 599


def submit_latency(socket_path: str, n: int, pause_s: float, argv: list[str], est_runtime_s: float) -> dict:
    """`n` submits one after the other over one kept-alive connection, as `carbonsched submit`
    sends them; the latency of each (ms) and every status that was not 201/200."""
    client = Client(socket_path)
    latencies_ms: list[float] = []
    statuses: Counter = Counter()
    ids: list[int] = []
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            ids.append(client.submit(argv=argv, cwd="/", env={"PATH": "/usr/bin:/bin"},
                                     est_runtime_s=est_runtime_s)["id"])
            statuses[200] += 1
        except ApiError as e:
            statuses[e.status] += 1
        except DaemonUnreachable:
            statuses[599] += 1
        latencies_ms.append((time.perf_counter() - t0) * 1000.0)
        time.sleep(pause_s)
    return {"latencies_ms": latencies_ms, "statuses": dict(statuses), "ids": ids}


def _flood(socket_path: str, threads: int, stop_file: str, max_s: float, one) -> dict:
    """Run `one(client)` in a loop on `threads` threads, each with its own connection, until
    `stop_file` exists (or `max_s` passed); the statuses every call ended with."""
    statuses: Counter = Counter()
    lock = threading.Lock()
    deadline = time.monotonic() + max_s

    def worker() -> None:
        client = Client(socket_path, timeout=60)
        while not os.path.exists(stop_file) and time.monotonic() < deadline:
            status = _status_of(lambda: one(client))
            with lock:
                statuses[status] += 1
            if status == 599:
                time.sleep(0.01)

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {"statuses": dict(statuses), "calls": sum(statuses.values())}


def hold_flood(socket_path: str, threads: int, stop_file: str, max_s: float, ids: int) -> dict:
    """The audit's attack 5: `POST /v1/hold {"ids": [1..ids]}` from many threads."""
    body = list(range(1, ids + 1))
    return _flood(socket_path, threads, stop_file, max_s, lambda c: c.hold(body))


def log_flood(socket_path: str, threads: int, stop_file: str, max_s: float, job: int) -> dict:
    """The audit's attack 6: read a job's whole log, reply after reply, from many threads."""

    def read_all(client: Client) -> None:
        offset = 0
        while True:
            reply = client.logs(job, offset=offset)
            if reply.get("next_offset") is None or reply["next_offset"] >= reply.get("size", 0):
                return
            offset = reply["next_offset"]
    return _flood(socket_path, threads, stop_file, max_s, read_all)


def half_sent(host: str, port: int, connections: int, hold_s: float) -> dict:
    """The audit's attack 7: open connections to the metrics port, send half a request, keep
    them open; how many the server accepted and how many it closed within `hold_s`."""
    opened, refused = [], 0
    t0 = time.monotonic()
    for _ in range(connections):
        try:
            s = socket.create_connection((host, port), timeout=2)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            opened.append(s)
        except OSError:
            refused += 1
    connect_s = time.monotonic() - t0
    time.sleep(hold_s)
    answered_busy = closed = still_open = 0
    for s in opened:
        s.setblocking(False)
        try:
            data = s.recv(64)
            if not data:
                closed += 1
            elif b" 503 " in data.split(b"\r\n", 1)[0]:
                answered_busy += 1
            else:
                closed += 1  # answered otherwise (a timeout reply), then closed
        except BlockingIOError:
            still_open += 1
        except OSError:
            closed += 1
        s.close()
    return {"opened": len(opened), "refused": refused, "answered_busy": answered_busy, "closed_by_server": closed,
            "still_open": still_open, "connect_s": connect_s}


def call(socket_path: str, method: str, path: str, body=None, query=None) -> dict:
    """One request; its status and reply (or error)."""
    client = Client(socket_path)
    try:
        return {"status": 200, "reply": client.request(method, path, body, query)}
    except ApiError as e:
        return {"status": e.status, "error": str(e)}
    except DaemonUnreachable as e:
        return {"status": 599, "error": str(e)}


def read_file(path: str) -> dict:
    """Whether this user can read `path` (a secret must not be)."""
    try:
        Path(path).read_bytes()
        return {"readable": True}
    except OSError as e:
        return {"readable": False, "error": e.strerror}


VERBS = {"submit_latency": submit_latency, "hold_flood": hold_flood,
         "log_flood": log_flood, "half_sent": half_sent, "call": call, "read_file": read_file}

if __name__ == "__main__":
    verb, args = sys.argv[1], json.load(sys.stdin)
    json.dump(VERBS[verb](**args), sys.stdout)
