"""`carbonsched daemon`: wiring of store, planner, local agent and API; signals; systemd."""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler

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
from scheduler.node.agent import DEFAULT_OUTPUT_LIMIT_BYTES, Agent, AgentConfig, default_node_name
from scheduler.node.emulation import EmulationError, make_emulation
from scheduler.node.main import AgentRunConfig, make_backend, make_slurm_agent
from scheduler.policy_tables import warm_policy_tables
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

PLANNER_LOAD_TIMEOUT_S = 15.0


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
    # its jobs are handed to Slurm, see scheduler.node.slurm_agent) with the [slurm] table.
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

    def wait_loaded(self, timeout_s: float) -> bool:
        """Ready at once: the planner lives in this process."""
        return True

    def wake(self) -> None:
        self._job.wake()

    def stop(self) -> None:
        """Nothing to stop: the scheduler's shutdown ends the ticks."""


class Daemon(ServiceProcess):
    lock_name = "daemon.lock"

    def __init__(self, config: DaemonConfig) -> None:
        super().__init__(config.state_dir)
        self.config = config

    def run(self) -> None:
        cfg = self.config
        store = self._open(cfg.db_url)
        self._prepare_schema(store)
        # Before the planner and preview processes start: they load what this one computed.
        log.info("policy tables %s", warm_policy_tables())
        bind_state_dir(cfg.state_dir, store_id(store))  # before any run record or log is touched
        if cfg.log_dir is not None and Path(cfg.log_dir) != Path(cfg.state_dir) / "logs":
            bind_log_dir(cfg.log_dir, store_id(store))
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
            # With a planner process this one never plans: the policy is only checked (building
            # cpsat here would import OR-Tools, about a second of CPU, for nothing).
            policy = None if cfg.planner_process else make_policy(cfg.policy, plan_interval_s=cfg.plan_interval_s)
            policy_name = check_policy(cfg.policy) if policy is None else policy.name
        except ValueError as e:
            raise DaemonError(str(e)) from None

        scheduler = new_scheduler()
        carbon = CarbonSignals(store, CarbonConfig.from_config({"carbon": cfg.carbon}))
        _warn_if_zone_has_no_data(cfg.zone, {"carbon": cfg.carbon}, carbon)
        if preview_proc is not None:
            preview = preview_proc.rows
        else:
            planner = Planner(store, policy, carbon=carbon, site=cfg.site, plan_interval_s=cfg.plan_interval_s,
                              full_replan_s=cfg.full_replan_s)
            plan_proc = InProcessPlanner(scheduler, planner, stopping=self.stop_event, on_tick=after_tick)
            preview = lambda: preview_rows(planner)  # noqa: E731

        agent = None
        local = cfg.local_agent
        if local is None:
            local = store.dialect == "sqlite" or cfg.emulate is not None
        if cfg.truth and cfg.executor == "slurm":
            raise DaemonError("--truth emulates jobs run by the local executor; Slurm runs them itself")
        if local and cfg.executor == "slurm":
            agent = make_slurm_agent(store, AgentRunConfig(
                db_url=cfg.db_url, state_dir=cfg.state_dir, node=cfg.node, zone=cfg.zone,
                emulate=cfg.emulate, sample_hz=cfg.sample_hz, grace_s=cfg.grace_s,
                node_static_w=cfg.node_static_w, min_free_disk_mib=cfg.min_free_disk_mib),
                cfg.slurm or SlurmConfig(), on_change=plan_proc.wake,
                on_finished=lambda job_id, note: accountant.account(job_id, energy_note=note))
        elif local:
            backend = make_backend(cfg.emulate, cfg.node, cfg.state_dir)
            try:
                emulation = make_emulation(cfg.truth, backend)
            except EmulationError as e:
                raise DaemonError(str(e)) from None
            agent = Agent(store, backend, AgentConfig(node=cfg.node, zone=cfg.zone,
                                                      state_dir=cfg.state_dir, grace_s=cfg.grace_s,
                                                      sample_hz=cfg.sample_hz,
                                                      node_static_w=cfg.node_static_w,
                                                      min_free_disk_mib=cfg.min_free_disk_mib,
                                                      log_dir=cfg.log_dir,
                                                      output_limit_bytes=cfg.output_limit_bytes,
                                                      ship_logs=False),  # the daemon reads them itself
                          on_change=plan_proc.wake,
                          on_finished=lambda job_id, note: accountant.account(job_id, energy_note=note),
                          emulation=emulation)
        if agent is not None:
            agent.register()
            agent.startup_reconcile()
            metrics.add(GpuCollector(agent))
        dispatch_job = CoalescedJob(scheduler, "dispatch", agent.tick if agent else (lambda: None),
                                    min_gap_s=0.05, max_gap_s=0.5, stopping=self.stop_event)

        service = JobService(
            store,
            ServiceConfig(daemon_uid=os.geteuid(), admin_gids=admin_gids(cfg.admin_groups),
                          time_limit_factor=cfg.time_limit_factor, max_queued_per_user=cfg.max_queued_per_user,
                          max_submit_stored_bytes=cfg.max_submit_stored_bytes,
                          max_stored_bytes_per_user=cfg.max_stored_bytes_per_user),
            log_dir=cfg.log_dir or cfg.state_dir / "logs",
            on_submit=plan_proc.wake, on_cancel=dispatch_job.wake,
        )
        accountant = Accountant(store, site=cfg.site, carbon=carbon, config=cfg.accounting)
        api = ApiServer(cfg.socket_path, service,
                        extra_routes={("GET", "plan"): lambda caller, q: plan_preview(preview(), service, caller),
                                      **accounting_routes(accountant, service), **profile_routes(store)},
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
            scheduler.add_job(carbon.providers.refresh_all, "interval", seconds=cfg.carbon_refresh_s,
                              id="carbon", max_instances=1, next_run_time=now)
        scheduler.add_job(lambda: samples.rollup(retention_s=cfg.sample_retention_s), "interval",
                          seconds=60, id="rollup", max_instances=1)
        # Finished jobs lose their command, environment and output after the retention.
        scheduler.add_job(lambda: purge_finished_jobs(store, retention_s=cfg.job_retention_s,
                                                      log_dir=service.log_dir),
                          "interval", seconds=PURGE_INTERVAL_S, id="purge", max_instances=1, next_run_time=now)
        # Price finished jobs' carbon, and re-price them as late intensity data arrives.
        scheduler.add_job(accountant.backfill, "interval", seconds=60, id="accounting", max_instances=1)
        if cfg.site.budgets:
            governor = PowerGovernor(store, cfg.site.budgets, cfg.site.caps,
                                     site_nodes=cfg.site.site_budget_nodes(),
                                     on_action=lambda a: metrics.governor_actions.labels(
                                         a.zone, "lower" if a.to_w is not None and (a.from_w is None or a.to_w < a.from_w)
                                         else "raise").inc())

            def govern() -> None:
                actions = governor.tick()
                for zone, r in governor.last.items():
                    metrics.zone_power.labels(zone).set(r.measured_w)
                    metrics.zone_power_cap.labels(zone).set(r.cap_w)
                if actions and dispatch_job is not None:
                    dispatch_job.wake()  # the local agent applies the new limits at once

            scheduler.add_job(govern, "interval", seconds=governor_period_s(cfg.sample_hz), id="governor",
                              max_instances=1, next_run_time=now)
            log.info("power governor on for budget(s) %s", ", ".join(sorted(cfg.site.budgets)))
        reaper = NodeReaper(store, lost_after_s=cfg.node_lost_after_s)
        scheduler.add_job(lambda: plan_proc.wake() if reaper.reap() else None, "interval",
                          seconds=min(15.0, cfg.node_lost_after_s / 4), id="watchdog", max_instances=1,
                          next_run_time=datetime.now(timezone.utc))

        register_diagnostic("daemon", scheduler_diagnostics(
            scheduler, [j for j in (dispatch_job, getattr(plan_proc, "_job", None)) if isinstance(j, CoalescedJob)]))
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
        # Serve once the planner can plan: a daemon that accepts jobs but cannot place them
        # for seconds (the child still importing OR-Tools) is not ready yet.
        if not plan_proc.wait_loaded(PLANNER_LOAD_TIMEOUT_S):
            log.warning("planner process still loading after %gs; serving anyway", PLANNER_LOAD_TIMEOUT_S)
        api.start()
        if cfg.metrics_port is not None:
            metrics.serve(cfg.metrics_port, cfg.metrics_addr)
        watchdog = Watchdog()
        watchdog.add_check("api", api.loop_problem)
        watchdog.add_check("scheduler", lambda: None if scheduler.running else "APScheduler stopped")
        if agent is not None:
            watchdog.add_check("dispatch", lambda: stalled(dispatch_job, cfg.dispatch_interval_s))
        sd_notify("READY=1\nSTATUS=serving")
        log.info("carbonsched daemon ready: db=%s socket=%s policy=%s node=%s%s", store.url,
                 cfg.socket_path, policy_name, cfg.node if agent else "(no local agent)",
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
