"""What both long-running processes share: the head-node daemon (`scheduler.daemon.main`) and
the node agent (`scheduler.node.main`). One instance per state directory, SIGTERM/SIGINT stop
cleanly, APScheduler for periodic work with ticks that coalesce and back off while the
database is unreachable, and the stall check their systemd watchdog relies on.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.exc import DatabaseError, OperationalError

from scheduler.store import Store

log = logging.getLogger(__name__)


class DaemonError(RuntimeError):
    """The daemon or the agent cannot start; the message says why and what to do."""


DB_BACKOFF_MAX_S = 30.0


def is_unreachable(e: BaseException) -> bool:
    """Whether an error means the database cannot be reached (server down or restarting,
    network gone), as opposed to a bug or a bad row."""
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

    if isinstance(e, DBAPIError) and e.connection_invalidated:
        return True
    if isinstance(e, (OperationalError, InterfaceError)):
        text = str(getattr(e, "orig", e)).lower()
        return not ("database is locked" in text or "no such table" in text or "syntax" in text)
    return False


class CoalescedJob:
    """Runs `fn` from APScheduler on its interval and on demand.

    Wake-ups that arrive while it runs are folded into one more run, after a gap that grows
    with how long the last run took (so a slow planner over a long queue is not re-run
    back to back while submissions pour in). Once `stopping` is set it neither runs nor
    asks the scheduler for anything, so shutdown never waits on it.
    """

    def __init__(self, scheduler: BackgroundScheduler, job_id: str, fn, *, min_gap_s: float,
                 stopping: threading.Event, max_gap_s: float = 5.0, gap_factor: float = 2.0,
                 clock=time.monotonic) -> None:
        self._scheduler = scheduler
        self._clock = clock
        self._id = job_id
        self._fn = fn
        self._min_gap_s = min_gap_s
        self._max_gap_s = max_gap_s
        self._stopping = stopping
        self._lock = threading.Lock()
        self._dirty = False
        self._running = False
        self._wake_pending = False
        self._gap_s = min_gap_s
        self._gap_factor = gap_factor
        self.last_end = self._clock()  # when a run last finished (watchdog liveness)
        # While the database is unreachable, runs back off (1 s doubling to DB_BACKOFF_MAX_S)
        # and the outage is logged once, not once per tick.
        self._db_failures = 0
        self._retry_at = 0.0
        self._outage_logged_at = 0.0

    @property
    def job_id(self) -> str:
        return self._id

    def run(self) -> None:
        with self._lock:
            if self._running:  # an interval run while a wake-up run is going: fold it in
                self._dirty = True
                return
            self._running = True
            self._wake_pending = False
        try:
            while not self._stopping.is_set():
                with self._lock:
                    self._dirty = False
                started = self._clock()
                if started < self._retry_at:  # backing off from a database outage
                    self.last_end = started  # alive, just waiting: not a reason to restart us
                    return
                try:
                    self._fn()
                except Exception as e:
                    self._on_failure(e)
                else:
                    if self._db_failures:
                        log.warning("%s: database reachable again after %d failed attempt(s)",
                                    self._id, self._db_failures)
                        self._db_failures, self._retry_at = 0, 0.0
                self.last_end = self._clock()
                took = self.last_end - started
                self._gap_s = min(self._max_gap_s, max(self._min_gap_s, self._gap_factor * took))
                with self._lock:
                    if not self._dirty:
                        return
                self._stopping.wait(self._gap_s)  # a wake-up came in while running: coalesce
        finally:
            with self._lock:
                self._running = False

    def _on_failure(self, e: Exception) -> None:
        if not is_unreachable(e):
            log.exception("%s tick failed; will retry on the next tick", self._id)
            return
        self._db_failures += 1
        now = self._clock()
        self._retry_at = now + min(DB_BACKOFF_MAX_S, 2.0 ** (self._db_failures - 1))
        if self._db_failures == 1:
            lines = str(getattr(e, "orig", None) or e).strip().splitlines()
            log.error("%s: database unreachable (%s); running jobs continue, retrying with back-off",
                      self._id, lines[0] if lines else type(e).__name__)
            self._outage_logged_at = now
        elif now - self._outage_logged_at >= 60.0:
            log.warning("%s: database still unreachable after %d attempts", self._id, self._db_failures)
            self._outage_logged_at = now

    def state(self) -> str:
        """One line on this job's flags, for the SIGUSR2 diagnostics."""
        now = self._clock()
        with self._lock:
            return (f"{self._id}: running={self._running} dirty={self._dirty} wake_pending={self._wake_pending} "
                    f"last run ended {now - self.last_end:.1f}s ago, gap {self._gap_s:.2f}s"
                    + (f", backing off {self._retry_at - now:.1f}s more" if self._retry_at > now else ""))

    def wake(self) -> None:
        if self._stopping.is_set():
            return
        with self._lock:
            self._dirty = True
            if self._running or self._wake_pending:
                return
            self._wake_pending = True
        when = datetime.now(timezone.utc) + timedelta(seconds=self._gap_s)
        try:
            self._scheduler.modify_job(self._id, next_run_time=when)
        except Exception as e:  # the scheduler is not running (starting up or shut down)
            log.debug("could not wake %s: %s", self._id, e)
            with self._lock:
                self._wake_pending = False


# What a process can say about its own state beside its threads' stacks (SIGUSR2): name ->
# a function returning lines. The daemon registers its periodic jobs' next runs and the
# agent what it would claim, so a job that waits for no visible reason can be explained.
_DIAGNOSTICS: dict[str, Callable[[], list[str]]] = {}
DIAGNOSTIC_TIMEOUT_S = 5.0


def register_diagnostic(name: str, fn: Callable[[], list[str]]) -> None:
    """Add `fn`'s lines to every SIGUSR2 dump of this process, under `name`."""
    _DIAGNOSTICS[name] = fn


def _diagnostic_lines() -> list[str]:
    out = []
    for name, fn in list(_DIAGNOSTICS.items()):
        try:
            out += [f"{name}: {line}" for line in fn()]
        except Exception as e:  # noqa: BLE001 - a diagnostic must never take the process down
            out.append(f"{name}: could not be read: {type(e).__name__}: {e}")
    return out


def log_thread_stacks() -> None:
    """Log the current stack of every thread of this process and the registered diagnostics,
    in one record.

    Runs as a Python-level signal handler (SIGUSR2), on the main thread between bytecodes,
    where reading other threads' frames is safe; `faulthandler`'s C-level dump of all
    threads from inside the signal can crash the process while those threads run (seen:
    SIGSEGV in about one dump in twelve under load). The diagnostics (which may read the
    database) run on a thread of their own, waited for at most DIAGNOSTIC_TIMEOUT_S: never
    inside the handler, where the interrupted code may hold a lock they need."""
    try:
        names = {t.ident: t.name for t in threading.enumerate()}
        parts = [f"Thread {names.get(ident, '?')} (0x{ident:x}), most recent call last:\n"
                 + "".join(traceback.format_stack(frame))
                 for ident, frame in sys._current_frames().items()]
    except Exception:  # noqa: BLE001
        log.exception("could not log the threads' stacks")
        return

    def finish() -> None:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(_diagnostic_lines()), name="diagnostics",
                                  daemon=True)
        reader.start()
        reader.join(DIAGNOSTIC_TIMEOUT_S)
        said = list(lines) if not reader.is_alive() else \
            list(lines) + [f"(diagnostics still running after {DIAGNOSTIC_TIMEOUT_S:g}s)"]
        log.warning("stacks of %d threads (SIGUSR2):\n%s\ndiagnostics:\n%s\nend of stacks", len(parts),
                    "\n".join(parts), "\n".join(said) or "(none registered)")

    threading.Thread(target=finish, name="stack-dump", daemon=True).start()


DISPATCH_STALL_S = 120.0


def stalled(job: CoalescedJob, interval_s: float) -> str | None:
    """Why a periodic tick looks wedged (no run finished for far longer than its interval)."""
    idle_s = time.monotonic() - job.last_end
    limit_s = max(DISPATCH_STALL_S, 20 * interval_s)
    return f"no {job.job_id} tick finished for {idle_s:.0f}s" if idle_s > limit_s else None


def scheduler_diagnostics(scheduler: BackgroundScheduler, jobs: list[CoalescedJob]) -> Callable[[], list[str]]:
    """SIGUSR2 diagnostic lines of a process's periodic work: APScheduler's state and each
    job's next run, and the flags of the coalesced ticks."""
    def lines() -> list[str]:
        now = datetime.now(timezone.utc)
        out = [f"APScheduler running={scheduler.running}"]
        for job in scheduler.get_jobs():
            nxt = job.next_run_time
            out.append(f"job {job.id}: next run " + (f"in {(nxt - now).total_seconds():.1f}s" if nxt else "none (paused)"))
        return out + [j.state() for j in jobs]
    return lines


def new_scheduler() -> BackgroundScheduler:
    """APScheduler for periodic work: late runs coalesce into one, never pile up."""
    return BackgroundScheduler(timezone=timezone.utc,
                               job_defaults={"coalesce": True, "max_instances": 2,
                                             "misfire_grace_time": None})


class ServiceProcess:
    """What the daemon and the standalone agent share: one instance per state directory,
    SIGTERM/SIGINT stop cleanly."""

    lock_name = "service.lock"

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.stop_event = threading.Event()
        self._lock_fd: int | None = None

    def _install_signals(self) -> None:
        def stop(signum, frame):
            log.info("received %s", signal.Signals(signum).name)
            self.stop_event.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        # `kill -USR2 PID` logs every thread's stack (the journal under systemd): what an
        # operator needs when a tick seems stuck, without stopping the daemon.
        signal.signal(signal.SIGUSR2, lambda signum, frame: log_thread_stacks())

    def _take_instance_lock(self) -> None:
        path = self.state_dir / self.lock_name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DaemonError(f"another carbonsched {self.lock_name.split('.')[0]} is using "
                              f"{self.state_dir}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _open(self, db_url: str) -> Store:
        """Claim the state directory (one instance per directory) and open the store."""
        if not self.state_dir.exists():
            # Traversable, not listable: jobs reach their own log and metrics files by name.
            self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
            self.state_dir.chmod(0o711)
        self._take_instance_lock()
        store = Store(db_url)
        try:
            store.is_empty()  # reads the schema: a file that is no database says so here
        except DatabaseError as e:
            if isinstance(e, OperationalError):
                raise  # a server not up yet: the caller's own handling (and retries) apply
            raise DaemonError(f"cannot use the store {store.url}: {str(e.orig).strip() or type(e.orig).__name__} "
                              "(is it a carbonsched database?)") from None
        return store

    def _release_instance_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def exit_when_orphaned(poll_s: float = 1.0) -> threading.Thread:
    """In a helper process (planner, plan preview): exit at once when the process that
    started it is gone. A daemon killed with SIGKILL cannot stop its helpers, and a helper
    left behind (re-parented to init) would pile up over crashes, with the multiprocessing
    resource tracker it keeps alive (issue 28). Polls the parent pid, since
    PR_SET_PDEATHSIG fires when the starting *thread* ends, which an API thread soon does."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(0)

    t = threading.Thread(target=watch, name="orphan-watch", daemon=True)
    t.start()
    return t
