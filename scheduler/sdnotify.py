"""systemd's notify protocol, spoken directly: READY, STATUS, STOPPING and watchdog pings.

No libsystemd: a datagram to `$NOTIFY_SOCKET` is the whole protocol. Outside systemd (no
`NOTIFY_SOCKET`) every call is a no-op, so the daemon runs the same by hand and in tests.

The watchdog (`WatchdogSec=` in the unit) is only worth having if a ping means "this
service works", so `Watchdog.ping_if_healthy` pings only while every registered liveness
check passes: a wedged API thread or a dead scheduler stops the pings and systemd restarts
the daemon, which adopts the running jobs.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


NOTIFY_SEND_TIMEOUT_S = 2.0


def notify(message: str, *, timeout_s: float = NOTIFY_SEND_TIMEOUT_S) -> bool:
    """Send one notify message; False when not under systemd or the send failed.

    The send waits at most `timeout_s`: a datagram socket whose reader has fallen behind
    (its queue holds `net.unix.max_dgram_qlen` messages, 10 by default) blocks a plain send
    for as long as the reader sleeps, and the daemon's main loop, which pings from here and
    says STOPPING from here, must never hang on that.
    """
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout_s)
        try:
            s.connect(addr)
            s.sendall(message.encode())
        except OSError as e:  # socket.timeout is an OSError
            log.warning("sd_notify to %s failed: %s", os.environ.get("NOTIFY_SOCKET"), e)
            return False
    return True


def watchdog_interval_s() -> float | None:
    """The watchdog period systemd asked for (WATCHDOG_USEC), None when there is none or it is
    meant for another process (WATCHDOG_PID)."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("ignoring WATCHDOG_USEC=%r: not a number of microseconds", usec)
        return None
    return value / 1e6 if value > 0 else None


class Watchdog:
    """Pings systemd's watchdog at half its period, while the service's checks pass.

    Checks are (name, fn) pairs; fn returns None when healthy, else what is wrong. A failing
    check is logged once when it starts failing and once when it recovers.
    """

    def __init__(self, interval_s: float | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s if interval_s is not None else watchdog_interval_s()
        self._checks: list[tuple[str, Callable[[], str | None]]] = []
        self._clock = clock
        self._last_ping = float("-inf")
        self._failing: dict[str, str] = {}
        self.pings = 0

    @property
    def enabled(self) -> bool:
        return self.interval_s is not None

    @property
    def ping_every_s(self) -> float:
        """How often the main loop should call `ping_if_healthy` (half the period)."""
        return self.interval_s / 2 if self.interval_s else 1.0

    def add_check(self, name: str, fn: Callable[[], str | None]) -> None:
        self._checks.append((name, fn))

    def problems(self) -> dict[str, str]:
        """Every failing check and why; empty when the service is healthy."""
        found: dict[str, str] = {}
        for name, fn in self._checks:
            try:
                why = fn()
            except Exception as e:  # a check that raises is a failing check, with its reason
                why = f"check raised {type(e).__name__}: {e}"
            if why:
                found[name] = why
        for name, why in found.items():
            if name not in self._failing:
                log.error("watchdog: %s is unhealthy (%s); not pinging systemd", name, why)
        for name in set(self._failing) - set(found):
            log.warning("watchdog: %s recovered", name)
        self._failing = found
        return found

    def ping_if_healthy(self) -> bool:
        """Ping when due and healthy; True when a ping was sent."""
        if not self.enabled:
            return False
        now = self._clock()
        if now - self._last_ping < self.ping_every_s * 0.9:
            return False
        if self.problems():
            return False
        self._last_ping = now
        if notify("WATCHDOG=1"):
            self.pings += 1
            return True
        return False
