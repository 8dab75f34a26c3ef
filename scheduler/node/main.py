"""`carbonsched agent`: the process of one GPU node in a multi-node cluster, sharing only
the store with the head-node daemon: its GPU backend, the agent, the dispatch tick,
Prometheus metrics and systemd notifications."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from scheduler.metrics import GpuCollector, Metrics
from scheduler.clock import utcnow
from scheduler.fleet_spec import parse_emulated_fleet
from scheduler.node.agent import Agent
from scheduler.node.config import DEFAULT_OUTPUT_LIMIT_BYTES, AgentConfig
from scheduler.node.emulation import EmulationError, make_emulation
from scheduler.node.slurm_launcher import SlurmLauncher
from scheduler.process import (CoalescedJob, DaemonError, ServiceProcess, new_scheduler, register_diagnostic,
                               scheduler_diagnostics, stalled)
from scheduler.policy_tables import warm_policy_tables
from scheduler.sdnotify import Watchdog, notify as sd_notify
from scheduler.slurm.commands import SlurmCommands, SlurmError
from scheduler.slurm.config import SlurmConfig
from scheduler.slurm.inventory import read_node
from scheduler.state_dir import bind_log_dir, bind_state_dir
from scheduler.store import SchemaError
from scheduler.store.identity import store_id
from telemetry.gpu import EmulatedBackend, GpuBackend
from telemetry.gpu.detect import probe_backends

log = logging.getLogger(__name__)

DEFAULT_EMULATED_FLEET = "2xMI300X,2xH100"


EMULATED_LIMITS_FILE = "emulated-power-limits.json"


def make_backend(emulate: str | None, node: str, state_dir: Path | None = None) -> GpuBackend:
    """The GPU backend for the local agent: --emulate, else real GPUs, else a loud emulation.
    An emulated fleet keeps its GPUs' power limits in the state directory, as real boards keep
    theirs across an agent restart (issue 29's crash recovery is tested against that)."""
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
    models = parse_emulated_fleet(spec)
    log.warning("EMULATED GPUs on node %s: %s (no real hardware is measured)", node, spec)
    return EmulatedBackend(models, node=node,
                           limits_path=state_dir / EMULATED_LIMITS_FILE if state_dir is not None else None)


@dataclass
class AgentRunConfig:
    db_url: str
    state_dir: Path
    node: str
    zone: str
    emulate: str | None = None
    truth: str | None = None  # the emulated fleet's hidden truth (scheduler.node.emulation)
    sample_hz: float = 1.0
    dispatch_interval_s: float = 1.0
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"  # loopback unless the operator opens it
    grace_s: float = 10.0
    node_static_w: float = 0.0
    min_free_disk_mib: float = 256.0
    gpu_shares: int = 1  # declared time-sliced shares per GPU (scheduler.node.config)
    log_dir: Path | None = None  # job logs; None: STATE_DIR/logs
    output_limit_bytes: int | None = DEFAULT_OUTPUT_LIMIT_BYTES  # stdout + stderr kept per job
    executor: str = "local"  # or "slurm": jobs are handed to Slurm (scheduler.node.slurm_launcher)
    slurm: SlurmConfig | None = None


def agent_config(cfg: AgentRunConfig, zone: str) -> AgentConfig:
    return AgentConfig(node=cfg.node, zone=zone, state_dir=cfg.state_dir, grace_s=cfg.grace_s,
                       sample_hz=cfg.sample_hz, node_static_w=cfg.node_static_w,
                       min_free_disk_mib=cfg.min_free_disk_mib, log_dir=cfg.log_dir,
                       gpu_shares=cfg.gpu_shares,
                       output_limit_bytes=cfg.output_limit_bytes)


def make_slurm_agent(store, cfg: AgentRunConfig, slurm_config: SlurmConfig, **agent_kwargs) -> Agent:
    """The agent of a Slurm node, its jobs handed to Slurm (`SlurmLauncher`): zone and GPUs
    from Slurm (`sinfo`), emulated from its GRES where no real GPU is found (or `--emulate`
    says so)."""
    slurm = SlurmCommands(slurm_config.conf, timeout_s=slurm_config.timeout_s)
    try:
        info = read_node(slurm, slurm_config, cfg.node)
    except SlurmError as e:
        raise DaemonError(f"Slurm executor: {e}") from None
    if not info.gpus:
        raise DaemonError(f"Slurm node {cfg.node} has no GPU GRES (Gres=gpu:TYPE:N in slurm.conf)")
    zone = info.zone or cfg.zone
    if info.zone is None:
        log.warning("Slurm node %s has no %sXX feature; using zone %s", cfg.node,
                    slurm_config.zone_feature_prefix, zone)
    emulate = cfg.emulate
    backend = None
    if emulate is None:
        backend, broken = probe_backends()
        if backend is None:
            emulate = info.fleet_spec()
    if backend is None:
        backend = make_backend(emulate, cfg.node, cfg.state_dir)
    config = agent_config(cfg, zone)
    launcher = SlurmLauncher(store, backend, config, slurm=slurm, slurm_config=slurm_config, node_info=info,
                             clock=agent_kwargs.get("clock", utcnow))
    return Agent(store, backend, config, launcher=launcher, **agent_kwargs)


class AgentRunner(ServiceProcess):
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
        bind_state_dir(cfg.state_dir, store_id(store))  # before any run record or log is touched
        if cfg.log_dir is not None and Path(cfg.log_dir) != Path(cfg.state_dir) / "logs":
            bind_log_dir(cfg.log_dir, store_id(store))
        log.info("policy tables %s", warm_policy_tables())
        if cfg.truth and cfg.executor == "slurm":
            raise DaemonError("--truth emulates jobs run by the local executor; Slurm runs them itself")
        if cfg.executor == "slurm":
            agent = make_slurm_agent(store, cfg, cfg.slurm or SlurmConfig())
            backend = agent.backend
        else:
            backend = make_backend(cfg.emulate, cfg.node, cfg.state_dir)
            try:
                emulation = make_emulation(cfg.truth, backend)
            except EmulationError as e:
                raise DaemonError(str(e)) from None
            agent = Agent(store, backend, agent_config(cfg, cfg.zone), emulation=emulation)
        agent.register()
        agent.startup_reconcile()
        metrics = Metrics()
        metrics.add(GpuCollector(agent))
        scheduler = new_scheduler()
        tick = CoalescedJob(scheduler, "dispatch", agent.tick, min_gap_s=0.05, max_gap_s=0.5,
                            stopping=self.stop_event)
        scheduler.add_job(tick.run, "interval", seconds=cfg.dispatch_interval_s, id="dispatch",
                          next_run_time=datetime.now(timezone.utc))
        register_diagnostic("agent process", scheduler_diagnostics(scheduler, [tick]))
        if hasattr(agent, "diagnose"):
            register_diagnostic("agent", agent.diagnose)
        self._install_signals()
        agent.start_sampling()
        scheduler.start()
        if cfg.metrics_port is not None:
            metrics.serve(cfg.metrics_port, cfg.metrics_addr)
        watchdog = Watchdog()
        watchdog.add_check("scheduler", lambda: None if scheduler.running else "APScheduler stopped")
        watchdog.add_check("dispatch", lambda: stalled(tick, cfg.dispatch_interval_s))
        sd_notify("READY=1\nSTATUS=agent serving")
        log.info("carbonsched agent ready: node=%s zone=%s db=%s sampling at %g Hz, %s executor",
                 cfg.node, agent.config.zone, store.url, cfg.sample_hz, cfg.executor)
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
