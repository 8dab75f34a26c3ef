"""`carbonsched daemon`: wiring of store, planner, local agent and API; signals; systemd."""

from __future__ import annotations

import fcntl
import gc
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler

from policies.catalog import parse_fleet
from scheduler.accounting import Accountant, AccountingConfig, api_routes as accounting_routes
from scheduler.agent import Agent, AgentConfig, default_node_name
from scheduler.api import ApiServer, UidLimits
from scheduler.carbon import CarbonConfig, CarbonSignals
from scheduler.metrics import GpuCollector, Metrics, StoreCollector
from scheduler.planner import Planner, SiteConfig, make_policy, preview_rows
from scheduler.planner_process import PlannerProcess, PlannerSpec, PreviewProcess
from scheduler.samples import DEFAULT_RETENTION_S, SampleStore
from scheduler.sdnotify import Watchdog, notify as sd_notify
from scheduler.service import Caller, JobService, ServiceConfig, admin_gids
from scheduler.store import SchemaError, Store
from scheduler.timeparse import iso
from scheduler.watchdog import DEFAULT_NODE_LOST_AFTER_S, NodeReaper
from telemetry.gpu import EmulatedBackend, EmulatedModel, GpuBackend
from telemetry.gpu.detect import probe_backends

log = logging.getLogger(__name__)

DEFAULT_EMULATED_FLEET = "2xMI300X,2xH100"
PLANNER_LOAD_TIMEOUT_S = 15.0


@dataclass
class DaemonConfig:
    db_url: str
    socket_path: Path
    state_dir: Path
    emulate: str | None = None
    zone: str = "local"
    policy: str = "cpsat"
    plan_interval_s: float = 15.0
    # Incremental planning: ticks keep earlier plans between full re-plans this far apart.
    full_replan_s: float | None = None  # None: every tick re-plans every queued job
    dispatch_interval_s: float = 1.0
    node: str = field(default_factory=default_node_name)
    admin_groups: list[str] = field(default_factory=list)
    time_limit_factor: float = 2.0
    grace_s: float = 10.0
    local_agent: bool | None = None  # None: on for SQLite, or when --emulate is given
    sample_hz: float = 1.0
    metrics_port: int | None = None
    node_lost_after_s: float = DEFAULT_NODE_LOST_AFTER_S
    sample_retention_s: float = DEFAULT_RETENTION_S
    node_static_w: float = 0.0
    carbon: dict = field(default_factory=dict)  # the config file's [carbon] table
    carbon_refresh_s: float = 300.0
    site: SiteConfig = field(default_factory=SiteConfig)  # PUE and power caps per zone
    accounting: AccountingConfig = field(default_factory=AccountingConfig)  # [accounting]: prices
    # Plan in a child process (default): a long tick then never holds the API's interpreter
    # lock. Measured on 2 cores at 300 submits/s: p99 78-134 ms vs 366-394 ms in a thread.
    planner_process: bool = True
    min_free_disk_mib: float = 256.0  # the local agent takes no jobs below this free log space
    api_limits: UidLimits = field(default_factory=UidLimits)  # what one uid may take of the API


class DaemonError(RuntimeError):
    """The daemon cannot start; the message says why and what to do."""


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


DISPATCH_STALL_S = 120.0


def _stalled(job: CoalescedJob, interval_s: float) -> str | None:
    """Why a periodic tick looks wedged (no run finished for far longer than its interval)."""
    idle_s = time.monotonic() - job.last_end
    limit_s = max(DISPATCH_STALL_S, 20 * interval_s)
    return f"no {job.job_id} tick finished for {idle_s:.0f}s" if idle_s > limit_s else None


class InProcessPlanner:
    """Planner ticks on an APScheduler worker thread of the daemon (`--no-planner-process`).

    A tick rests `gap_factor` times its own duration before the next wake-up is served, so a
    long queue under a stream of submissions costs the API at most a sixth of the
    interpreter. `PlannerProcess` is the same contract in a child process."""

    def __init__(self, scheduler: BackgroundScheduler, planner: Planner, *, stopping: threading.Event,
                 on_tick) -> None:
        self._planner = planner
        self._on_tick = on_tick
        self._job = CoalescedJob(scheduler, "planner", self._tick, min_gap_s=0.2, max_gap_s=10.0,
                                 gap_factor=5.0, stopping=stopping)
        self.interval_target = self._job.run

    def _tick(self) -> None:
        started = time.monotonic()
        stats = self._planner.tick()
        self._on_tick(time.monotonic() - started, stats.planned + stats.moved + stats.withdrawn)

    def start(self) -> None:
        """Nothing to start: APScheduler runs the ticks."""

    def wait_loaded(self, timeout_s: float) -> bool:
        """Ready at once: the planner lives in this process."""
        return True

    def wake(self) -> None:
        self._job.wake()

    def stop(self) -> None:
        """Nothing to stop: the scheduler's shutdown ends the ticks."""


def new_scheduler() -> BackgroundScheduler:
    """APScheduler for periodic work: late runs coalesce into one, never pile up."""
    return BackgroundScheduler(timezone=timezone.utc,
                               job_defaults={"coalesce": True, "max_instances": 2,
                                             "misfire_grace_time": None})


def make_backend(emulate: str | None, node: str) -> GpuBackend:
    """The GPU backend for the local agent: --emulate, else real GPUs, else a loud emulation."""
    if emulate:
        spec = emulate
    else:
        backend, broken = probe_backends()
        if backend is not None:
            return backend
        if broken:
            names = ", ".join(f"{name} ({err})" for name, err in broken)
            raise DaemonError(f"GPU backend installed but broken: {names}. Fix the driver, or pass "
                              "--emulate SPEC to run an emulated fleet deliberately")
        spec = DEFAULT_EMULATED_FLEET
        log.warning("no GPU found (no NVML or amdsmi device): EMULATING a fleet of %s. "
                    "Power and energy figures are modelled, not measured.", spec)
    models = [EmulatedModel(model=m.name, vendor=m.vendor, memory_gib=m.memory_gib,
                            idle_w=m.idle_w, tdp_w=m.tdp_w) for m in parse_fleet(spec)]
    log.warning("EMULATED GPUs on node %s: %s (no real hardware is measured)", node, spec)
    return EmulatedBackend(models, node=node)


class _Service:
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
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._take_instance_lock()
        return Store(db_url)

    def _release_instance_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


class Daemon(_Service):
    lock_name = "daemon.lock"

    def __init__(self, config: DaemonConfig) -> None:
        super().__init__(config.state_dir)
        self.config = config

    def run(self) -> None:
        cfg = self.config
        store = self._open(cfg.db_url)
        self._prepare_schema(store)
        metrics = Metrics()
        metrics.add(StoreCollector(store))
        dispatch_job: CoalescedJob | None = None

        def after_tick(duration_s: float, changed: int) -> None:
            metrics.planner_duration.labels(cfg.policy).observe(duration_s)
            if changed and dispatch_job is not None:
                dispatch_job.wake()

        preview_proc = None
        if cfg.planner_process:
            spec = PlannerSpec(db_url=cfg.db_url, policy=cfg.policy, log_level=logging.getLogger().level,
                               plan_interval_s=cfg.plan_interval_s, carbon=dict(cfg.carbon), site=cfg.site,
                               full_replan_s=cfg.full_replan_s)
            # Started first: the child's imports (OR-Tools alone takes ~0.7 s) overlap the
            # rest of startup, so the first plan follows "ready" closely.
            plan_proc = PlannerProcess(spec, on_tick=after_tick)
            plan_proc.start()
            # `carbonsched plan` runs the policy too: in a process of its own, so a preview
            # over a long queue never holds the API's interpreter lock either.
            preview_proc = PreviewProcess(spec)
        try:
            policy = make_policy(cfg.policy, plan_interval_s=cfg.plan_interval_s)
        except ValueError as e:
            raise DaemonError(str(e)) from None

        scheduler = new_scheduler()
        carbon = CarbonSignals(store, CarbonConfig.from_config({"carbon": cfg.carbon}))
        # For previews (`carbonsched plan`) and --no-planner-process ticks.
        planner = Planner(store, policy, carbon=carbon, site=cfg.site, plan_interval_s=cfg.plan_interval_s,
                          full_replan_s=cfg.full_replan_s)
        if preview_proc is not None:
            preview = preview_proc.rows
        else:
            plan_proc = InProcessPlanner(scheduler, planner, stopping=self.stop_event, on_tick=after_tick)
            preview = lambda: preview_rows(planner)  # noqa: E731

        agent = None
        local = cfg.local_agent
        if local is None:
            local = store.dialect == "sqlite" or cfg.emulate is not None
        if local:
            backend = make_backend(cfg.emulate, cfg.node)
            agent = Agent(store, backend, AgentConfig(node=cfg.node, zone=cfg.zone,
                                                      state_dir=cfg.state_dir, grace_s=cfg.grace_s,
                                                      sample_hz=cfg.sample_hz,
                                                      node_static_w=cfg.node_static_w,
                                                      min_free_disk_mib=cfg.min_free_disk_mib),
                          on_change=plan_proc.wake,
                          on_finished=lambda job_id, note: accountant.account(job_id, energy_note=note))
            agent.register()
            agent.startup_reconcile()
            metrics.add(GpuCollector(agent))
        dispatch_job = CoalescedJob(scheduler, "dispatch", agent.tick if agent else (lambda: None),
                                    min_gap_s=0.05, max_gap_s=0.5, stopping=self.stop_event)

        service = JobService(
            store,
            ServiceConfig(daemon_uid=os.geteuid(), admin_gids=admin_gids(cfg.admin_groups),
                          time_limit_factor=cfg.time_limit_factor),
            log_dir=cfg.state_dir / "logs",
            on_submit=plan_proc.wake, on_cancel=dispatch_job.wake,
        )
        accountant = Accountant(store, site=cfg.site, carbon=carbon, config=cfg.accounting)
        api = ApiServer(cfg.socket_path, service,
                        extra_routes={("GET", "plan"): lambda caller, q: plan_preview(preview(), service, caller),
                                      **accounting_routes(accountant, service)},
                        limits=cfg.api_limits)

        now = datetime.now(timezone.utc)
        scheduler.add_job(plan_proc.interval_target, "interval", seconds=cfg.plan_interval_s,
                          id="planner", next_run_time=now)
        if agent is not None:
            scheduler.add_job(dispatch_job.run, "interval", seconds=cfg.dispatch_interval_s,
                              id="dispatch", next_run_time=now)
        else:
            scheduler.add_job(lambda: None, "interval", hours=24, id="dispatch")
        samples = SampleStore(store)
        if any(z.provider for z in carbon.config.zones.values()):
            # Live providers are called within their budgets (the store is the shared gate).
            scheduler.add_job(carbon.refresh_all, "interval", seconds=cfg.carbon_refresh_s,
                              id="carbon", max_instances=1, next_run_time=now)
        scheduler.add_job(lambda: samples.rollup(retention_s=cfg.sample_retention_s), "interval",
                          seconds=60, id="rollup", max_instances=1)
        # Price finished jobs' carbon, and re-price them as late intensity data arrives.
        scheduler.add_job(accountant.backfill, "interval", seconds=60, id="accounting", max_instances=1)
        reaper = NodeReaper(store, lost_after_s=cfg.node_lost_after_s)
        scheduler.add_job(lambda: plan_proc.wake() if reaper.reap() else None, "interval",
                          seconds=min(15.0, cfg.node_lost_after_s / 4), id="watchdog", max_instances=1,
                          next_run_time=datetime.now(timezone.utc))

        self._install_signals()
        # Everything built so far lives as long as the daemon: keep it out of the cyclic
        # collector's way, and collect less often, so requests see shorter GC pauses.
        gc.collect()
        gc.freeze()
        gc.set_threshold(10_000, 20, 50)
        if agent is not None:
            agent.start_sampling()
        plan_proc.start()
        scheduler.start()
        # Serve once the planner can plan: a daemon that accepts jobs but cannot place them
        # for seconds (the child still importing OR-Tools) is not ready yet.
        if not plan_proc.wait_loaded(PLANNER_LOAD_TIMEOUT_S):
            log.warning("planner process still loading after %gs; serving anyway", PLANNER_LOAD_TIMEOUT_S)
        api.start()
        if cfg.metrics_port is not None:
            metrics.serve(cfg.metrics_port)
        watchdog = Watchdog()
        watchdog.add_check("api", api.loop_problem)
        watchdog.add_check("scheduler", lambda: None if scheduler.running else "APScheduler stopped")
        if agent is not None:
            watchdog.add_check("dispatch", lambda: _stalled(dispatch_job, cfg.dispatch_interval_s))
        sd_notify("READY=1\nSTATUS=serving")
        log.info("carbonsched daemon ready: db=%s socket=%s policy=%s node=%s%s", store.url,
                 cfg.socket_path, policy.name, cfg.node if agent else "(no local agent)",
                 f"; systemd watchdog every {watchdog.interval_s:g}s" if watchdog.enabled else "")
        try:
            while not self.stop_event.wait(watchdog.ping_every_s):
                watchdog.ping_if_healthy()
        finally:
            sd_notify("STOPPING=1")
            log.info("stopping: running jobs keep running and are adopted on restart")
            self.stop_event.set()
            api.stop()
            metrics.stop()
            scheduler.shutdown(wait=True)
            plan_proc.stop()
            if preview_proc is not None:
                preview_proc.stop()
            if agent is not None:
                agent.stop()
                agent.backend.close()
            store.dispose()
            self._release_instance_lock()
            log.info("stopped")

    def _prepare_schema(self, store: Store) -> None:
        if store.is_empty():
            log.info("empty database: creating the schema")
            store.upgrade()
            return
        try:
            store.require_current(f"carbonsched db upgrade --db {store.url}")
        except SchemaError as e:
            raise DaemonError(str(e)) from None



@dataclass
class AgentRunConfig:
    db_url: str
    state_dir: Path
    node: str
    zone: str
    emulate: str | None = None
    sample_hz: float = 1.0
    dispatch_interval_s: float = 1.0
    metrics_port: int | None = None
    grace_s: float = 10.0
    node_static_w: float = 0.0
    min_free_disk_mib: float = 256.0


class AgentRunner(_Service):
    """`carbonsched agent`: one GPU node of a multi-node cluster, sharing only the store."""

    lock_name = "agent.lock"

    def __init__(self, config: AgentRunConfig) -> None:
        super().__init__(config.state_dir)
        self.config = config

    def run(self) -> None:
        cfg = self.config
        store = self._open(cfg.db_url)
        try:
            store.require_current(f"carbonsched db upgrade --db {store.url}")
        except SchemaError as e:
            raise DaemonError(f"{e} (the head-node daemon owns the schema)") from None
        backend = make_backend(cfg.emulate, cfg.node)
        agent = Agent(store, backend, AgentConfig(node=cfg.node, zone=cfg.zone, state_dir=cfg.state_dir,
                                                  grace_s=cfg.grace_s, sample_hz=cfg.sample_hz,
                                                  node_static_w=cfg.node_static_w,
                                                  min_free_disk_mib=cfg.min_free_disk_mib))
        agent.register()
        agent.startup_reconcile()
        metrics = Metrics()
        metrics.add(GpuCollector(agent))
        scheduler = new_scheduler()
        tick = CoalescedJob(scheduler, "dispatch", agent.tick, min_gap_s=0.05, max_gap_s=0.5,
                            stopping=self.stop_event)
        scheduler.add_job(tick.run, "interval", seconds=cfg.dispatch_interval_s, id="dispatch",
                          next_run_time=datetime.now(timezone.utc))
        self._install_signals()
        agent.start_sampling()
        scheduler.start()
        if cfg.metrics_port is not None:
            metrics.serve(cfg.metrics_port)
        watchdog = Watchdog()
        watchdog.add_check("scheduler", lambda: None if scheduler.running else "APScheduler stopped")
        watchdog.add_check("dispatch", lambda: _stalled(tick, cfg.dispatch_interval_s))
        sd_notify("READY=1\nSTATUS=agent serving")
        log.info("carbonsched agent ready: node=%s zone=%s db=%s sampling at %g Hz", cfg.node,
                 cfg.zone, store.url, cfg.sample_hz)
        try:
            while not self.stop_event.wait(watchdog.ping_every_s):
                watchdog.ping_if_healthy()
        finally:
            sd_notify("STOPPING=1")
            log.info("stopping agent: running jobs keep running and are adopted on restart")
            metrics.stop()
            scheduler.shutdown(wait=True)
            agent.stop()
            backend.close()
            store.dispose()
            self._release_instance_lock()


def plan_preview(rows: list[dict], service: JobService, caller: Caller) -> list[dict]:
    """The rows of a plan preview (`scheduler.planner.plan_rows`) the caller may see: their
    own jobs, or every job for an admin."""
    visible = {j["id"] for j in service.list_jobs(caller, states=["PENDING", "PLANNED"])}
    return [r for r in rows if r["job"] in visible]
