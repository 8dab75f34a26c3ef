"""How a node's jobs are run: the one seam where the agents of a plain node and of a Slurm
node differ.

The agent (scheduler.node.agent) claims, reconciles and finishes jobs the same way on every
node; a `Launcher` gives it the executor that runs them and says what the running backend
changes: `LocalLauncher` runs them as supervised local processes
(scheduler.node.executor), and `SlurmLauncher` (scheduler.node.slurm_launcher) hands them to
Slurm, which decides when they really start, on which GPUs, and adds its own inventory,
adoption and observation of users' jobs.
"""

from __future__ import annotations

from typing import Protocol

from scheduler.node.config import AgentConfig
from scheduler.node.executor import Executor, JobExecutor, LaunchSpec, RunStatus
from telemetry.gpu import GpuBackend


class Launcher(Protocol):
    """What the agent asks of the backend that runs its jobs."""

    executor: JobExecutor

    def registered(self, devices: list, uuid_of: dict[int, str], gpu_of: dict[str, int]) -> None:
        """The node's GPUs were registered: the backend's devices and the store's ids of
        them (the agent's maps, filled in place on each registration)."""

    def refresh(self) -> bool:
        """Before a tick: read what the backend runs. False: it cannot be read, and the tick
        claims and reconciles nothing (the node only heartbeats, so its jobs are not lost)."""

    def follow(self) -> bool:
        """After a tick: follow what the backend did on its own; whether the store changed."""

    def set_busy(self, uuid: str, busy: bool) -> None:
        """Load (or idle) a GPU as a job starts (ends) on it: an emulated GPU's power follows."""

    def launch_spec(self, job, spec: LaunchSpec) -> LaunchSpec:
        """The spec the executor launches for `job`, from the agent's; OSError: not launchable."""

    def claim_ended(self, job_id: int) -> None:
        """The agent's claim of a job ended (launched or not)."""

    def measured_run(self, job, status: RunStatus):
        """The run whose energy is measured (its id, `gpu_ids` and `started_at`): the job
        as claimed, or as the backend really ran it; None when it never ran."""

    def launched_anyway(self, job) -> bool:
        """A claimed job whose run was never launched by this agent: whether it runs all the
        same (then it is not re-queued)."""

    def forget_orphans(self, running_here: set[int]) -> None:
        """Before the agent stops the runs of jobs not RUNNING here any more: forget those it
        must not stop."""


class LocalLauncher:
    """Jobs run as local processes, each under a supervisor that outlives the agent."""

    def __init__(self, backend: GpuBackend, config: AgentConfig) -> None:
        self.backend = backend
        self.executor = Executor(config.state_dir, grace_s=config.grace_s, log_dir=config.log_dir)

    def registered(self, devices: list, uuid_of: dict[int, str], gpu_of: dict[str, int]) -> None:
        pass

    def refresh(self) -> bool:
        return True

    def follow(self) -> bool:
        return False

    def set_busy(self, uuid: str, busy: bool) -> None:
        self.backend.set_busy(uuid, busy)

    def launch_spec(self, job, spec: LaunchSpec) -> LaunchSpec:
        return spec

    def claim_ended(self, job_id: int) -> None:
        pass

    def measured_run(self, job, status: RunStatus):
        return job

    def launched_anyway(self, job) -> bool:
        return False

    def forget_orphans(self, running_here: set[int]) -> None:
        pass
