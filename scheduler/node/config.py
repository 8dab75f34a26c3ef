"""What one node agent is configured with (`carbonsched agent`, or the daemon's own agent)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_OUTPUT_LIMIT_BYTES = 1024 * 2**20  # job_output_limit_mib's default


@dataclass(frozen=True)
class AgentConfig:
    node: str
    zone: str
    state_dir: Path
    grace_s: float = 10.0
    heartbeat_s: float = 2.0
    sample_hz: float = 1.0
    # Node power that is not the GPUs' (CPUs, fans, NICs), shared among jobs by GPU count.
    # 0 leaves it out of job energy.
    node_static_w: float = 0.0
    # Below this much free space where job logs and run records live, the node takes no new
    # jobs (its GPUs show as unhealthy with the reason) until space is freed.
    min_free_disk_mib: float = 256.0
    # Copy jobs' output into the store for `logs` on the head (scheduler.node.log_shipper);
    # off for the daemon's own agent, whose log files the daemon reads itself.
    ship_logs: bool = True
    # Where interruptible jobs' checkpoint directories live (scheduler.node.checkpoint);
    # None: STATE_DIR/checkpoints. Storage shared by the nodes lets a checkpoint job move.
    checkpoint_root: Path | None = None
    # Where job logs live (None: STATE_DIR/logs): a disk apart from the store's, so a full log
    # disk never stops the store; and how many bytes of stdout and stderr together each job
    # keeps there (scheduler.node.output_limit; None: no limit). Issue 48.
    log_dir: Path | None = None
    output_limit_bytes: int | None = DEFAULT_OUTPUT_LIMIT_BYTES
    # Time-sliced sharing the operator declares: each GPU of this node without hardware
    # partitioning (no MIG mode) is offered as this many shares of 1/N of it (its memory
    # divided alike) to fractional jobs, and no longer whole. 1: whole GPUs only. Nothing
    # isolates the shares: the jobs on one GPU must keep to their memory share themselves.
    gpu_shares: int = 1

    @property
    def checkpoints(self) -> Path:
        return self.checkpoint_root or self.state_dir / "checkpoints"
