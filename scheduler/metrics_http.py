"""The HTTP endpoint of `--metrics-port`: bounded, so a port opened to the network cannot
take the daemon down.

prometheus_client's own server starts a thread per connection and waits on each without a
timeout: 1,000 half-sent requests made 1,000 daemon threads (issue 48). Here at most
`max_connections` are served at once (more are answered 503 and closed at once), each
socket read times out after `timeout_s`, and a connection is closed after `deadline_s`
however slowly it trickles in, by one reaper thread for all of them.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 8  # a Prometheus or two, and a person with curl
READ_TIMEOUT_S = 5.0  # one socket read of a request
DEADLINE_S = 15.0  # a whole connection, request and reply
_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 5\r\n"
         b"Connection: close\r\nContent-Length: 42\r\n\r\ntoo many metrics connections; retry later\n")


class MetricsServer(ThreadingHTTPServer):
    """Prometheus text exposition of `registry` on (addr, port), one request per connection."""

    daemon_threads = True
    # Connections waiting to be accepted (the default, 5, left a flood of half-sent requests
    # in SYN retries for about two minutes, and a real scrape among them waited seconds): the
    # accept loop answers those beyond `max_connections` with a 503 at once.
    request_queue_size = 128
    block_on_close = False

    def __init__(self, addr: str, port: int, registry: CollectorRegistry, *,
                 max_connections: int = MAX_CONNECTIONS, read_timeout_s: float = READ_TIMEOUT_S,
                 deadline_s: float = DEADLINE_S) -> None:
        self.address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self.registry = registry
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.deadline_s = deadline_s
        self.refused = 0
        self.peak_connections = 0
        self._lock = threading.Lock()
        self._open: dict[socket.socket, float] = {}  # connection -> monotonic deadline
        self._stop = threading.Event()
        super().__init__((addr, port), _handler(read_timeout_s))
        self._reaper = threading.Thread(target=self._reap, name="metrics-reaper", daemon=True)
        self._reaper.start()

    def process_request(self, request, client_address) -> None:
        with self._lock:
            full = len(self._open) >= self.max_connections
            if not full:
                self._open[request] = time.monotonic() + self.deadline_s
                self.peak_connections = max(self.peak_connections, len(self._open))
        if full:
            self.refused += 1
            try:
                request.setblocking(False)  # best effort: never wait on a client here
                request.recv(65536)  # what has come of its request: unread, the close would reset
                request.send(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        request.settimeout(self.read_timeout_s)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self._lock:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def _reap(self) -> None:
        """Cut connections past their deadline (a client that sends a byte every few seconds
        never trips the read timeout)."""
        while not self._stop.wait(min(1.0, self.deadline_s / 4)):
            now = time.monotonic()
            with self._lock:
                late = [s for s, deadline in self._open.items() if deadline <= now]
            for s in late:
                try:
                    s.shutdown(socket.SHUT_RDWR)  # its thread sees EOF and ends
                except OSError:
                    pass

    def handle_error(self, request, client_address) -> None:
        log.debug("metrics connection from %s failed", client_address, exc_info=True)

    def server_close(self) -> None:
        self._stop.set()
        super().server_close()


def _handler(read_timeout_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = read_timeout_s
        server: MetricsServer

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in ("/", "/metrics"):
                self.send_error(404, "only /metrics is served here")
                return
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            data = encoder(self.server.registry)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt, *args) -> None:
            log.debug("metrics %s", fmt % args)

    return Handler
