"""The planner in a process of its own, so a long tick never holds the API's GIL.

Planning a queue of thousands of jobs is seconds of pure Python. In the daemon's process
that would stall every API thread for as long (one interpreter lock), so the daemon runs
the planner in a child process started with `spawn` (no fork of a threaded process), wakes
it through a pipe (APScheduler's interval job and every submit do), and hears back each
tick's duration and whether anything changed. Wake-ups that arrive during a tick fold into
one more tick. If the child dies, the next wake-up starts a new one.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from typing import Any

log = logging.getLogger(__name__)

DUTY_GAP_FACTOR = 5.0
PLANNER_NICE = 10
MAX_GAP_S = 10.0


@dataclass(frozen=True)
class PlannerSpec:
    """Everything the child needs to build its own Store and Planner (plain, picklable data)."""

    db_url: str
    policy: str
    log_level: int = logging.INFO
    plan_interval_s: float = 15.0
    carbon: dict[str, Any] = field(default_factory=dict)  # the config file's [carbon] table
    site: Any = None  # scheduler.site.SiteConfig; None: PUE 1.0, no power caps
    full_replan_s: float | None = None  # incremental planning between full re-plans; None: off
    qos: Any = None  # scheduler.qos.QosTable; None: the built-in levels
    flexible_grace_pct: float = 0.0  # [accounting] flexible_grace_pct (scheduler.budgets)
    standing: Any = None  # scheduler.standing.StandingSettings ([priority], [fair_share]); None: defaults


def build_planner(spec: PlannerSpec, store) -> Any:
    """The Planner a spec describes: its policy tuned to the interval, carbon from the store."""
    from scheduler.carbon import CarbonSignals
    from scheduler.carbon_config import CarbonConfig
    from scheduler.daemon.planner import Planner
    from scheduler.daemon.policy_factory import make_policy

    signals = CarbonSignals(store, CarbonConfig.from_config({"carbon": spec.carbon}))
    from scheduler.qos import QosTable
    from scheduler.standing import Standing, StandingSettings

    return Planner(store, make_policy(spec.policy, plan_interval_s=spec.plan_interval_s),
                   carbon=signals, site=spec.site, plan_interval_s=spec.plan_interval_s,
                   full_replan_s=spec.full_replan_s,
                   standing=Standing(spec.qos or QosTable(),
                                     replace(spec.standing or StandingSettings(),
                                             flexible_grace_pct=spec.flexible_grace_pct)))


def _child_main(spec: PlannerSpec, conn, min_gap_s: float) -> None:
    from scheduler.process import exit_when_orphaned

    exit_when_orphaned()  # a daemon killed with -9 leaves no planner behind
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Planning is background work: when CPUs are short, requests and the database go first.
    os.nice(PLANNER_NICE)
    logging.basicConfig(level=spec.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from scheduler.policy_tables import warm_policy_tables
    from scheduler.store import Store

    warm_policy_tables()
    store = Store(spec.db_url)
    planner = build_planner(spec, store)
    planner.seed_profiles()
    conn.send(("loaded", 0.0, 0))  # imports done (OR-Tools takes a while): ready to plan
    try:
        while True:
            msg = conn.recv()
            if msg == "stop":
                return
            while conn.poll():  # fold queued wake-ups into this tick
                if conn.recv() == "stop":
                    return
            conn.send(("started", 0.0, 0))  # the parent may send the next wake-up from now on
            started = time.monotonic()
            try:
                stats = planner.tick()
                conn.send(("tick", time.monotonic() - started, stats.planned + stats.moved + stats.withdrawn))
            except Exception:
                log.exception("planner tick failed; will retry on the next tick")
                conn.send(("error", time.monotonic() - started, 0))
            # Coalesce bursts: rest DUTY_GAP_FACTOR times as long as the tick took, so planning
            # a long queue under a stream of submissions takes at most a sixth of a core and
            # leaves the rest to the API and the database.
            took = time.monotonic() - started
            time.sleep(min(MAX_GAP_S, max(min_gap_s, DUTY_GAP_FACTOR * took)))
    except (EOFError, KeyboardInterrupt):
        return
    finally:
        store.dispose()


_preview_planner = None  # the preview worker's Planner (one per worker process)


def _preview_init(spec: PlannerSpec) -> None:
    global _preview_planner
    from scheduler.process import exit_when_orphaned

    exit_when_orphaned()  # nor a preview worker (and the resource tracker it keeps alive)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(PLANNER_NICE)
    logging.basicConfig(level=spec.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from scheduler.policy_tables import warm_policy_tables
    from scheduler.store import Store

    warm_policy_tables()
    _preview_planner = build_planner(spec, Store(spec.db_url))


def _preview_run() -> list[dict]:
    from scheduler.daemon.planner import preview_rows

    return preview_rows(_preview_planner)


class PreviewProcess:
    """`carbonsched plan` in a worker process: what the policy would do now, as plan rows.

    The policy runs as long as a tick (seconds over thousands of jobs); in the daemon's own
    process that would stall every API thread. The worker is started on the first preview
    and kept for the next ones; a crashed worker is replaced on the next call.
    """

    def __init__(self, spec: PlannerSpec, *, timeout_s: float = 120.0) -> None:
        self.spec = spec
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._stopped = False

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._stopped:
                raise RuntimeError("the daemon is stopping")
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"),
                                                 initializer=_preview_init, initargs=(self.spec,))
            return self._pool

    def rows(self) -> list[dict]:
        for attempt in (1, 2):
            pool = self._executor()
            try:
                return pool.submit(_preview_run).result(timeout=self.timeout_s)
            except BrokenProcessPool:
                log.error("plan preview worker died; starting a new one")
                with self._lock:
                    if self._pool is pool:
                        self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class PlannerProcess:
    """The parent's handle: `wake()` from any thread; `on_tick(duration_s, changed)` is
    called on a reader thread after every tick."""

    def __init__(self, spec: PlannerSpec, *, on_tick: Callable[[float, int], None],
                 min_gap_s: float = 0.2) -> None:
        self.spec = spec
        self._on_tick = on_tick
        self._min_gap_s = min_gap_s
        self._ctx = mp.get_context("spawn")
        self._lock = threading.Lock()
        self._proc = None
        self._conn = None
        self._stopping = False
        # At most one wake-up in flight: the child folds them anyway, and a pipe full of
        # wake-ups would block the API threads that send them.
        self._wake_sent = False
        self._loaded = threading.Event()
        self.interval_target = self.wake

    def start(self) -> None:
        """Start the child (once: a second call while it runs does nothing)."""
        with self._lock:
            if self._proc is not None and self._proc.is_alive():
                return
            self._start_locked()

    def _start_locked(self) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_child_main, args=(self.spec, child, self._min_gap_s),
                                 name="carbonsched-planner", daemon=True)
        self._started_mono = time.monotonic()
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        threading.Thread(target=self._read, args=(parent,), name="planner-results", daemon=True).start()
        log.info("planner process started (pid %s, policy %s)", proc.pid, self.spec.policy)

    def _read(self, conn) -> None:
        while True:
            try:
                kind, duration_s, changed = conn.recv()
            except (EOFError, OSError):
                return
            if kind == "started":
                with self._lock:
                    self._wake_sent = False
                continue
            if kind == "loaded":
                self._loaded.set()
                log.info("planner process ready (its policy loaded in %.1fs)", time.monotonic() - self._started_mono)
                continue
            try:
                self._on_tick(duration_s, changed)
            except Exception:
                log.exception("planner result handler failed")

    def wait_loaded(self, timeout_s: float) -> bool:
        """Wait until the child has built its planner (policy imported, ready to plan)."""
        return self._loaded.wait(timeout_s)

    def wake(self) -> None:
        with self._lock:
            if self._stopping:
                return
            if self._proc is None or not self._proc.is_alive():
                if self._proc is not None:
                    log.error("planner process exited (code %s); starting a new one", self._proc.exitcode)
                self._start_locked()
                self._wake_sent = False
            if self._wake_sent:
                return
            try:
                self._conn.send("wake")
                self._wake_sent = True
            except (BrokenPipeError, OSError) as e:
                log.error("could not wake the planner process: %s", e)

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._lock:
            self._stopping = True
            proc, conn = self._proc, self._conn
        if proc is None:
            return
        try:
            conn.send("stop")
        except (BrokenPipeError, OSError):
            pass
        proc.join(timeout_s)
        if proc.is_alive():
            log.warning("planner process did not stop in %.0fs; terminating it", timeout_s)
            proc.terminate()
            proc.join(5)
        conn.close()
