"""`carbonsched daemon`: wiring of store, planner, local agent and API; signals; systemd."""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from datetime import datetime, timezone
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler

from policies import Policy
from scheduler.accounting.accountant import Accountant
from scheduler.accounting.config import AccountingConfig
from scheduler.carbon import CarbonSignals
from scheduler.carbon_config import CarbonConfig
from scheduler.daemon.access import Caller, ServiceConfig, admin_gids
from scheduler.daemon.api import ApiServer, UidLimits, accounting_routes, profile_routes
from scheduler.daemon.planner import Planner, preview_rows
from scheduler.daemon.planner_process import PlannerProcess, PlannerSpec, PreviewProcess
from scheduler.daemon.policy_factory import check_policy, make_policy
from scheduler.daemon.power_governor import PowerGovernor, governor_period_s
from scheduler.daemon.retention import DEFAULT_RETENTION_S as DEFAULT_JOB_RETENTION_S
from scheduler.daemon.retention import PURGE_INTERVAL_S, purge_finished_jobs
from scheduler.daemon.service import JobService
from scheduler.daemon.watchdog import DEFAULT_NODE_LOST_AFTER_S, NodeReaper
from scheduler.metrics import GpuCollector, Metrics, StoreCollector
from scheduler.node.agent import Agent, default_node_name
from scheduler.node.config import DEFAULT_OUTPUT_LIMIT_BYTES, AgentConfig
from scheduler.node.emulation import EmulationError, make_emulation
from scheduler.node.main import AgentRunConfig, make_backend, make_slurm_agent
from scheduler.policy_tables import warm_policy_tables
from scheduler.qos import DEFAULT_TIME_LIMIT_S, QosTable
from scheduler.process import (CoalescedJob, DaemonError, ServiceProcess, new_scheduler, register_diagnostic,
                               scheduler_diagnostics, stalled)
from scheduler.samples import DEFAULT_RETENTION_S, SampleStore
from scheduler.site import SiteConfig
from scheduler.slurm.config import SlurmConfig
from scheduler.sdnotify import Watchdog, notify as sd_notify
from scheduler.state_dir import bind_log_dir, bind_state_dir
from scheduler.store import SchemaError, Store
from scheduler.store.identity import store_id

log = logging.getLogger(__name__)

PLANNER_LOAD_WAIT_S = 60.0  # then the policy tables are loaded (or computed) here all the same


@dataclass
class DaemonConfig:
    db_url: str
    socket_path: Path
    state_dir: Path
    emulate: str | None = None
    truth: str | None = None  # the local agent's emulated truth (scheduler.node.emulation)
    zone: str = "local"
    policy: str = "cpsat"
    plan_interval_s: float = 15.0
    # Incremental planning: ticks keep earlier plans between full re-plans this far apart.
    full_replan_s: float | None = None  # None: every tick re-plans every queued job
    dispatch_interval_s: float = 1.0
    node: str = field(default_factory=default_node_name)
    admin_groups: list[str] = field(default_factory=list)
    time_limit_factor: float = 2.0
    # The limit of a job given none whose QOS has no default (scheduler.qos), and the QOS levels.
    default_time_limit_s: float = DEFAULT_TIME_LIMIT_S
    qos: QosTable = field(default_factory=QosTable)
    # [priority] weights and [fair_share] half-life, currency (scheduler.standing); None: defaults
    standing: Any = None
    grace_s: float = 10.0
    local_agent: bool | None = None  # None: on for SQLite, or when --emulate is given
    sample_hz: float = 1.0
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"  # loopback unless the operator opens it
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
    gpu_shares: int = 1  # the local agent's declared time-sliced shares per GPU
    log_dir: Path | None = None  # job logs; None: STATE_DIR/logs (issue 48: a disk of their own)
    output_limit_bytes: int | None = DEFAULT_OUTPUT_LIMIT_BYTES  # stdout + stderr kept per job
    api_limits: UidLimits = field(default_factory=UidLimits)  # what one uid may take of the API
    max_queued_per_user: int | None = 5000  # jobs one user may have waiting (None: no limit)
    # What one submit and one user's unpurged jobs may store (issue 48; None: no limit), and
    # how long finished jobs keep their command, environment and output (scheduler.daemon.retention).
    max_submit_stored_bytes: int | None = 16 * 2**20
    max_stored_bytes_per_user: int | None = 2**30
    job_retention_s: float = DEFAULT_JOB_RETENTION_S
    # The local agent's executor: "local" processes, or "slurm" (this host is a Slurm node;
    # its jobs are handed to Slurm, see scheduler.node.slurm_launcher) with the [slurm] table.
    executor: str = "local"
    slurm: SlurmConfig | None = None


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

    def wake(self) -> None:
        self._job.wake()

    def stop(self) -> None:
        """Nothing to stop: the scheduler's shutdown ends the ticks."""


@dataclass
class _Running:
    """What one run of the daemon has built, filled in step by step (`Daemon.run`). Callbacks
    made before a part exists (the planner's tick waking dispatch, a finished job priced by
    the accountant) read it from here when they are called."""

    store: Store
    metrics: Metrics
    scheduler: BackgroundScheduler | None = None
    carbon: CarbonSignals | None = None
    plan_proc: PlannerProcess | InProcessPlanner | None = None
    preview_proc: PreviewProcess | None = None
    preview: Callable[[], list[dict]] | None = None
    policy_name: str = ""
    agent: Agent | None = None
    dispatch_job: CoalescedJob | None = None
    service: JobService | None = None
    accountant: Accountant | None = None
    api: ApiServer | None = None


class Daemon(ServiceProcess):
    lock_name = "daemon.lock"

    def __init__(self, config: DaemonConfig) -> None:
        super().__init__(config.state_dir)
        self.config = config

    def run(self) -> None:
        """Open the store, start the planner, the local agent and the API, serve until told to
        stop, then stop it all (running jobs keep running: a restart adopts them)."""
        cfg = self.config
        store = self._open_store()
        metrics = Metrics()
        metrics.add(StoreCollector(store))
        run = _Running(store=store, metrics=metrics)
        self._start_planner_process(run)
        policy = self._policy(run)
        run.scheduler = new_scheduler()
        run.carbon = CarbonSignals(store, CarbonConfig.from_config({"carbon": cfg.carbon}))
        _warn_if_zone_has_no_data(cfg.zone, {"carbon": cfg.carbon}, run.carbon)
        self._planner_or_preview(run, policy)
        run.agent = self._local_agent(run)
        if run.agent is not None:
            run.agent.register()
            run.agent.startup_reconcile()
            metrics.add(GpuCollector(run.agent))
        run.dispatch_job = CoalescedJob(run.scheduler, "dispatch", run.agent.tick if run.agent else (lambda: None),
                                        min_gap_s=0.05, max_gap_s=0.5, stopping=self.stop_event)
        self._api(run)
        self._schedule(run)
        watchdog = self._start(run)
        try:
            while not self.stop_event.wait(watchdog.ping_every_s):
                watchdog.ping_if_healthy()
        finally:
            self._shut_down(run)

    def _open_store(self) -> Store:
        """The store at its current schema, the state (and log) directory bound to the store's
        id; the policy tables warm when this process plans."""
        cfg = self.config
        store = self._open(cfg.db_url)
        self._prepare_schema(store)
        if not cfg.planner_process:  # the planner plans in this process: it needs them first
            log.info("policy tables %s", warm_policy_tables())
        # Else not before serving: nothing this process runs before "ready" needs them (the
        # planner process warms them itself: computed, on a first start, and stored for
        # every later process), and `_warm_tables_later` loads them here after that.
        bind_state_dir(cfg.state_dir, store_id(store))  # before any run record or log is touched
        if cfg.log_dir is not None and Path(cfg.log_dir) != Path(cfg.state_dir) / "logs":
            bind_log_dir(cfg.log_dir, store_id(store))
        return store

    def _after_tick(self, run: _Running, duration_s: float, changed: int) -> None:
        """Each planner tick: its duration into the metrics; dispatch woken when it changed plans."""
        run.metrics.planner_duration.labels(self.config.policy).observe(duration_s)
        if changed and run.dispatch_job is not None:
            run.dispatch_job.wake()

    def _start_planner_process(self, run: _Running) -> None:
        """Start the planner in a process of its own (the default), and make the preview's."""
        cfg = self.config
        if cfg.planner_process:
            spec = PlannerSpec(db_url=cfg.db_url, policy=cfg.policy, log_level=logging.getLogger().level,
                               plan_interval_s=cfg.plan_interval_s, carbon=dict(cfg.carbon), site=cfg.site,
                               full_replan_s=cfg.full_replan_s, qos=cfg.qos,
                               flexible_grace_pct=cfg.accounting.flexible_grace_pct, standing=cfg.standing)
            # Started first: the child's imports (OR-Tools alone takes ~0.7 s) overlap the
            # rest of startup, so the first plan follows "ready" closely.
            run.plan_proc = PlannerProcess(spec, on_tick=lambda d, n: self._after_tick(run, d, n))
            run.plan_proc.start()
            # `carbonsched plan` runs the policy too: in a process of its own, so a preview
            # over a long queue never holds the API's interpreter lock either.
            run.preview_proc = PreviewProcess(spec)

    def _policy(self, run: _Running) -> Policy | None:
        """The policy this process plans with (None: the planner process plans), its name in
        `run.policy_name`; DaemonError for a bad one."""
        cfg = self.config
        try:
            # With a planner process this one never plans: the policy is only checked (building
            # cpsat here would import OR-Tools, about a second of CPU, for nothing).
            policy = None if cfg.planner_process else make_policy(cfg.policy, plan_interval_s=cfg.plan_interval_s)
            run.policy_name = check_policy(cfg.policy) if policy is None else policy.name
        except ValueError as e:
            raise DaemonError(str(e)) from None
        return policy

    def _planner_or_preview(self, run: _Running, policy: Policy | None) -> None:
        """The plan preview from the preview process, or (`--no-planner-process`) the planner
        in this process, ticking on the scheduler's threads, and its preview."""
        cfg = self.config
        if run.preview_proc is not None:
            run.preview = run.preview_proc.rows
            return
        from scheduler.standing import Standing, StandingSettings

        planner = Planner(run.store, policy, carbon=run.carbon, site=cfg.site,
                          plan_interval_s=cfg.plan_interval_s, full_replan_s=cfg.full_replan_s,
                          standing=Standing(cfg.qos, replace(cfg.standing or StandingSettings(),
                                                             flexible_grace_pct=cfg.accounting.flexible_grace_pct)))
        run.plan_proc = InProcessPlanner(run.scheduler, planner, stopping=self.stop_event,
                                         on_tick=lambda d, n: self._after_tick(run, d, n))
        run.preview = lambda: preview_rows(planner)

    def _local_agent(self, run: _Running) -> Agent | None:
        """This host's agent (local processes or Slurm), when the daemon runs jobs itself:
        by default on SQLite or with --emulate."""
        cfg = self.config
        local = cfg.local_agent
        if local is None:
            local = run.store.dialect == "sqlite" or cfg.emulate is not None
        if cfg.truth and cfg.executor == "slurm":
            raise DaemonError("--truth emulates jobs run by the local executor; Slurm runs them itself")

        def on_finished(job_id: int, note: str | None) -> None:
            run.accountant.account(job_id, energy_note=note)

        if local and cfg.executor == "slurm":
            return make_slurm_agent(run.store, AgentRunConfig(
                db_url=cfg.db_url, state_dir=cfg.state_dir, node=cfg.node, zone=cfg.zone,
                emulate=cfg.emulate, sample_hz=cfg.sample_hz, grace_s=cfg.grace_s,
                node_static_w=cfg.node_static_w, min_free_disk_mib=cfg.min_free_disk_mib,
                gpu_shares=cfg.gpu_shares),
                cfg.slurm or SlurmConfig(), on_change=run.plan_proc.wake, on_finished=on_finished)
        if not local:
            return None
        backend = make_backend(cfg.emulate, cfg.node, cfg.state_dir)
        try:
            emulation = make_emulation(cfg.truth, backend)
        except EmulationError as e:
            raise DaemonError(str(e)) from None
        return Agent(run.store, backend, AgentConfig(node=cfg.node, zone=cfg.zone,
                                                     state_dir=cfg.state_dir, grace_s=cfg.grace_s,
                                                     sample_hz=cfg.sample_hz,
                                                     node_static_w=cfg.node_static_w,
                                                     min_free_disk_mib=cfg.min_free_disk_mib,
                                                     gpu_shares=cfg.gpu_shares,
                                                     log_dir=cfg.log_dir,
                                                     output_limit_bytes=cfg.output_limit_bytes,
                                                     ship_logs=False),  # the daemon reads them itself
                     on_change=run.plan_proc.wake, on_finished=on_finished, emulation=emulation)

    def _api(self, run: _Running) -> None:
        """The job service, the accountant and the API server over them (not serving yet)."""
        cfg = self.config
        run.service = service = JobService(
            run.store,
            ServiceConfig(daemon_uid=os.geteuid(), admin_gids=admin_gids(cfg.admin_groups),
                          time_limit_factor=cfg.time_limit_factor, max_queued_per_user=cfg.max_queued_per_user,
                          default_time_limit_s=cfg.default_time_limit_s, qos=cfg.qos,
                          flexible_grace_pct=cfg.accounting.flexible_grace_pct, standing=cfg.standing,
                          max_submit_stored_bytes=cfg.max_submit_stored_bytes,
                          max_stored_bytes_per_user=cfg.max_stored_bytes_per_user),
            log_dir=cfg.log_dir or cfg.state_dir / "logs",
            on_submit=run.plan_proc.wake, on_cancel=run.dispatch_job.wake, carbon=run.carbon,
        )
        run.accountant = Accountant(run.store, site=cfg.site, carbon=run.carbon, config=cfg.accounting,
                                    usage_factors=cfg.qos.usage_factors())
        run.api = ApiServer(cfg.socket_path, service,
                            extra_routes={("GET", "plan"): lambda caller, q: plan_preview(run.preview(), service, caller),
                                          **accounting_routes(run.accountant, service), **profile_routes(run.store)},
                            limits=cfg.api_limits)

    def _schedule(self, run: _Running) -> None:
        """The daemon's periodic work on the scheduler: planning, dispatch, carbon refresh,
        sample rollup, purge of finished jobs, accounting, the power governor, the watchdog."""
        cfg, scheduler, store = self.config, run.scheduler, run.store
        now = datetime.now(timezone.utc)
        scheduler.add_job(run.plan_proc.interval_target, "interval", seconds=cfg.plan_interval_s,
                          id="planner", next_run_time=now)
        if run.agent is not None:
            scheduler.add_job(run.dispatch_job.run, "interval", seconds=cfg.dispatch_interval_s,
                              id="dispatch", next_run_time=now)
        else:
            scheduler.add_job(lambda: None, "interval", hours=24, id="dispatch")
        samples = SampleStore(store)
        if any(z.provider for z in run.carbon.config.zones.values()):
            # Live providers are called within their budgets (the store is the shared gate).
            scheduler.add_job(run.carbon.providers.refresh_all, "interval", seconds=cfg.carbon_refresh_s,
                              id="carbon", max_instances=1, next_run_time=now)
        scheduler.add_job(lambda: samples.rollup(retention_s=cfg.sample_retention_s), "interval",
                          seconds=60, id="rollup", max_instances=1)
        # Finished jobs lose their command, environment and output after the retention.
        scheduler.add_job(lambda: purge_finished_jobs(store, retention_s=cfg.job_retention_s,
                                                      log_dir=run.service.log_dir),
                          "interval", seconds=PURGE_INTERVAL_S, id="purge", max_instances=1, next_run_time=now)
        # Price finished jobs' carbon, and re-price them as late intensity data arrives.
        scheduler.add_job(run.accountant.backfill, "interval", seconds=60, id="accounting", max_instances=1)
        if cfg.site.budgets:
            self._schedule_governor(run, now)
        reaper = NodeReaper(store, lost_after_s=cfg.node_lost_after_s)
        scheduler.add_job(lambda: run.plan_proc.wake() if reaper.reap() else None, "interval",
                          seconds=min(15.0, cfg.node_lost_after_s / 4), id="watchdog", max_instances=1,
                          next_run_time=datetime.now(timezone.utc))

    def _schedule_governor(self, run: _Running, now: datetime) -> None:
        """The power governor: it keeps each zone's and site's GPU power under its budget."""
        cfg, metrics = self.config, run.metrics
        governor = PowerGovernor(run.store, cfg.site.budgets, cfg.site.caps,
                                 site_nodes=cfg.site.site_budget_nodes(),
                                 on_action=lambda a: metrics.governor_actions.labels(
                                     a.zone, "lower" if a.to_w is not None and (a.from_w is None or a.to_w < a.from_w)
                                     else "raise").inc())

        def govern() -> None:
            actions = governor.tick()
            for zone, r in governor.last.items():
                metrics.zone_power.labels(zone).set(r.measured_w)
                metrics.zone_power_cap.labels(zone).set(r.cap_w)
            if actions and run.dispatch_job is not None:
                run.dispatch_job.wake()  # the local agent applies the new limits at once

        run.scheduler.add_job(govern, "interval", seconds=governor_period_s(cfg.sample_hz), id="governor",
                              max_instances=1, next_run_time=now)
        log.info("power governor on for budget(s) %s", ", ".join(sorted(cfg.site.budgets)))

    def _start(self, run: _Running) -> Watchdog:
        """Start everything and say READY to systemd; the watchdog `run` pings while the API,
        the scheduler and dispatch are healthy."""
        cfg, agent, scheduler, plan_proc, api = self.config, run.agent, run.scheduler, run.plan_proc, run.api
        register_diagnostic("daemon", scheduler_diagnostics(
            scheduler, [j for j in (run.dispatch_job, getattr(plan_proc, "_job", None)) if isinstance(j, CoalescedJob)]))
        if agent is not None:
            register_diagnostic("agent", agent.diagnose)
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
        # Serve at once, without waiting for the planner process to load its policy (OR-Tools
        # alone: about a second, far more on a loaded host): jobs submitted meanwhile are in
        # the store, and the wake-ups sent for them wait in the child's pipe, so its first
        # tick plans them once it has loaded ("planner process ready" in the log).
        api.start()
        if cfg.metrics_port is not None:
            run.metrics.serve(cfg.metrics_port, cfg.metrics_addr)
        watchdog = Watchdog()
        watchdog.add_check("api", api.loop_problem)
        watchdog.add_check("scheduler", lambda: None if scheduler.running else "APScheduler stopped")
        if agent is not None:
            watchdog.add_check("dispatch", lambda: stalled(run.dispatch_job, cfg.dispatch_interval_s))
        sd_notify("READY=1\nSTATUS=serving")
        if isinstance(plan_proc, PlannerProcess):
            threading.Thread(target=self._warm_tables_later, args=(plan_proc,), name="policy-tables",
                             daemon=True).start()
        log.info("carbonsched daemon ready: db=%s socket=%s policy=%s node=%s%s", run.store.url,
                 cfg.socket_path, run.policy_name, cfg.node if agent else "(no local agent)",
                 f"; systemd watchdog every {watchdog.interval_s:g}s" if watchdog.enabled else "")
        return watchdog

    def _warm_tables_later(self, plan_proc: PlannerProcess) -> None:
        """The policy tables in this process (admission and accounting use the seed profiles),
        once the planner process has loaded them, so a first start computes them once, in the
        planner process, not twice at once on the same cores; a request that needs them
        before this computes them itself (the same figures)."""
        if not plan_proc.wait_loaded(PLANNER_LOAD_WAIT_S):
            log.warning("planner process still loading after %gs; loading the policy tables here", PLANNER_LOAD_WAIT_S)
        if not self.stop_event.is_set():
            log.info("policy tables %s", warm_policy_tables())

    def _shut_down(self, run: _Running) -> None:
        """Stop serving and planning; running jobs keep running and are adopted on restart."""
        sd_notify("STOPPING=1")
        log.info("stopping: running jobs keep running and are adopted on restart")
        self.stop_event.set()
        run.api.stop()
        run.metrics.stop()
        run.scheduler.shutdown(wait=True)
        run.plan_proc.stop()
        if run.preview_proc is not None:
            run.preview_proc.stop()
        if run.agent is not None:
            run.agent.stop()
            run.agent.backend.close()
        run.store.dispose()
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



def plan_preview(rows: list[dict], service: JobService, caller: Caller) -> list[dict]:
    """The rows of a plan preview (`scheduler.daemon.planner.plan_rows`) the caller may see: their
    own jobs, or every job for an admin."""
    visible = {j["id"] for j in service.list_jobs(caller, states=["PENDING", "PLANNED"])}
    return [r for r in rows if r["job"] in visible]


def _warn_if_zone_has_no_data(zone: str, config: dict, carbon: CarbonSignals) -> None:
    """Say loudly, once at start, that this node's zone cannot be priced (issue 28)."""
    from sqlalchemy.exc import SQLAlchemyError

    from scheduler.zone_check import zone_without_data

    try:
        with_data = {z["zone"] for z in carbon.zones() if z["actual_rows"] or z["forecast_rows"]}
    except SQLAlchemyError as e:  # a warning must never stop the daemon
        log.debug("could not list the zones with carbon data: %s", e)
        with_data = None
    warning = zone_without_data(zone, config, with_data)
    if warning:
        log.warning("%s", warning)
