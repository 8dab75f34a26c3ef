"""A small JSON-over-HTTP GET with timeouts and retries, on the standard library only.

Every call has a deadline (`timeout_s` covers connecting and the whole body, not just each
socket read). Transient trouble is retried with exponential backoff and jitter: timeouts,
refused or dropped connections, HTTP 408/500/502/503/504, and a 429 whose Retry-After is
short. A 429 with a longer wait raises `GridRateLimited` with the wait, so the caller can
record it and stay quiet instead of burning its API quota. 401/403 raise `GridAuthError`,
other 4xx `GridRequestError`, and a body that is not JSON `GridBadResponse`.

Headers are never logged: they carry the API tokens.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import random
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any

from telemetry.grid.readings import (
    GridAuthError,
    GridBadResponse,
    GridRateLimited,
    GridRequestError,
    GridUnavailable,
)

log = logging.getLogger(__name__)

USER_AGENT = "carbonsched-grid/0.1 (+https://github.com/carbonsched)"
MAX_BODY_BYTES = 16 * 1024 * 1024
TRANSIENT_STATUS = frozenset({408, 500, 502, 503, 504})


def basic_auth_header(username: str, password: str) -> str:
    """The value of an HTTP Basic Authorization header."""
    raw = f"{username}:{password}".encode()
    return "Basic " + base64.b64encode(raw).decode("ascii")


def _retry_after_s(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_message(body: bytes) -> str:
    """The API's own error text from a JSON error body, shortened; else the raw start."""
    text = body[:2000].decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:200]
    if isinstance(data, dict):
        err = data.get("error", data.get("message", data.get("detail")))
        if isinstance(err, dict):
            err = err.get("message", err.get("code", err))
        if err is not None:
            return str(err)[:200]
    return " ".join(text.split())[:200]


def _read_body(resp, deadline: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError("response body took longer than the timeout")
        chunk = resp.read(65536)
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise GridBadResponse(f"response larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def get_json(
    url: str,
    *,
    params: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
    retries: int = 2,
    backoff_s: float = 0.5,
    max_retry_after_s: float = 5.0,
    what: str = "request",
    sleep: Callable[[float], None] = time.sleep,
) -> Any:
    """GET `url` (with `params` as the query string) and return the decoded JSON body.

    `retries` is how many times a transient failure is tried again (so at most
    retries + 1 requests). `what` names the call in errors and logs ("Electricity Maps
    forecast for DE"); the URL's query string is logged, headers never are.
    """
    if params:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        url = f"{url}?{query}" if query else url
    all_headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **(headers or {})}
    delay = backoff_s
    last_problem = "no attempt made"
    for attempt in range(retries + 1):
        if attempt:
            wait = delay * (1 + random.random() * 0.25)
            log.debug("%s: retrying in %.2f s (attempt %d of %d) after %s", what, wait,
                      attempt + 1, retries + 1, last_problem)
            sleep(wait)
            delay *= 2
        request = urllib.request.Request(url, headers=all_headers, method="GET")
        deadline = time.monotonic() + timeout_s
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                body = _read_body(resp, deadline)
        except urllib.error.HTTPError as e:
            status = e.code
            try:
                err_body = e.read() or b""
            except (OSError, http.client.HTTPException):
                err_body = b""
            message = _error_message(err_body)
            e.close()
            if status in (401, 403):
                raise GridAuthError(f"{what}: HTTP {status} (credentials refused): {message}") from None
            if status == 429:
                wait_s = _retry_after_s(e.headers.get("Retry-After") if e.headers else None)
                if attempt < retries and wait_s is not None and wait_s <= max_retry_after_s:
                    last_problem = "HTTP 429"
                    delay = max(delay, wait_s)
                    continue
                raise GridRateLimited(f"{what}: HTTP 429 rate limited: {message}", wait_s) from None
            if status in TRANSIENT_STATUS:
                last_problem = f"HTTP {status}: {message}"
                continue
            raise GridRequestError(f"{what}: HTTP {status}: {message}", status) from None
        except (TimeoutError, socket.timeout) as e:
            last_problem = f"timeout after {timeout_s:g} s ({e})"
            continue
        except urllib.error.URLError as e:
            reason = e.reason
            last_problem = f"connection failed: {reason}"
            if isinstance(reason, (TimeoutError, socket.timeout)):
                last_problem = f"timeout after {timeout_s:g} s"
            continue
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            last_problem = f"connection failed: {type(e).__name__}: {e}"
            continue
        try:
            return json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            snippet = " ".join(body[:80].decode("utf-8", "replace").split())
            raise GridBadResponse(f"{what}: response is not JSON: {snippet!r}") from None
    raise GridUnavailable(f"{what}: gave up after {retries + 1} attempts: {last_problem}")
