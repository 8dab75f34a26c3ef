"""SQLAlchemy models of the store: nodes, GPUs, jobs, the job event audit trail, and the
workload profiles learned from this cluster's completed jobs.

Every datetime column is timezone-aware UTC on the Python side, whatever the database.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

# The other tables of the store, registered on Base.metadata with these: whoever imports the
# models (the schema check, Alembic) sees every table.
import scheduler.store.account_models  # noqa: F401
import scheduler.store.carbon_models  # noqa: F401
import scheduler.store.grid_models  # noqa: F401
import scheduler.store.identity  # noqa: F401
import scheduler.store.telemetry_models  # noqa: F401
from scheduler.store.base import Base, UTCDateTime


class Node(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    zone: Mapped[str] = mapped_column(String(64))
    backend: Mapped[str] = mapped_column(String(32))
    emulated: Mapped[bool] = mapped_column(Boolean, default=False)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_heartbeat: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Gpu(Base):
    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("node_name", "vendor", "index", name="uq_gpus_node_vendor_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node_name: Mapped[str] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(128), unique=True)
    model: Mapped[str] = mapped_column(String(64))
    vendor: Mapped[str] = mapped_column(String(16))
    # The nominal capacity `submit --gpu-mem` is matched against (the data sheet's, see
    # policies.model.catalog.nominal_memory_gib), and what the driver reported, in GiB.
    memory_gib: Mapped[float] = mapped_column(Float)
    memory_reported_gib: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The board power limit the driver enforces now, and the range it may be set to, in W
    # (a compute partition's equal share of its card's). The energy model never estimates a
    # GPU above its current limit.
    power_limit_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_limit_min_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_limit_max_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The limit the board returns to when nobody has set one (issue 29: the agent restores it).
    power_limit_default_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    # Healthy but closed to new work by an operator (maintenance); running jobs finish.
    drained: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    power_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    energy_j: Mapped[float | None] = mapped_column(Float, nullable=True)
    utilization_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Energy drawn since local midnight of `energy_day` (the node's calendar day), in J.
    energy_day: Mapped[str | None] = mapped_column(String(10), nullable=True)
    energy_day_j: Mapped[float | None] = mapped_column(Float, nullable=True)
    unhealthy_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Who drained the GPU, when and why (`drain --reason`); NULL while it is not drained.
    drain_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    drained_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    drained_by: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The job holding this GPU. Claims set it with a conditional UPDATE, so two jobs can
    # never hold one GPU; deliberately no foreign key (jobs and gpus reference each other).
    job_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True, index=True)
    # The GPU's partition layout as its driver reports it: an AMD compute partition's mode
    # (DPX, QPX, CPX; NULL: a whole card), how many partitions its card has, the card's memory
    # partition mode (NPS1, NPS4; NULL: not reported); whether NVIDIA MIG mode is on (then
    # the GPU runs jobs only on its instances in gpu_instances, never whole).
    partition_mode: Mapped[str | None] = mapped_column(String(8), nullable=True)
    partitions: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    memory_partition: Mapped[str | None] = mapped_column(String(8), nullable=True)
    mig_enabled: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class GpuInstance(Base):
    """A slice of a GPU that one job holds alone: an NVIDIA MIG instance, or a time-sliced
    share the operator declared (`gpu_shares`). The agent writes its node's instances at
    registration; a claim takes one with a conditional UPDATE of `job_id`, as for GPUs."""

    __tablename__ = "gpu_instances"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"), index=True)
    node_name: Mapped[str] = mapped_column(String(255), index=True)
    # "MIG-<uuid>" for a MIG instance, "<GPU uuid>/share-<n>" for a declared share.
    uuid: Mapped[str] = mapped_column(String(128), unique=True)
    kind: Mapped[str] = mapped_column(String(8))  # mig | share
    # The MIG profile (1g.10gb), or the share ("1/4").
    profile: Mapped[str] = mapped_column(String(32))
    # Its share of the GPU (a MIG profile's compute slices over the GPU's; 1/N for a share),
    # its memory in GiB, and for MIG its compute slices and GPU instance id.
    fraction: Mapped[float] = mapped_column(Float)
    memory_gib: Mapped[float] = mapped_column(Float)
    slices: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpu_instance_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # What the job's visible-devices variable names: "MIG-<uuid>", or the GPU's index.
    device: Mapped[str] = mapped_column(String(128))
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    job_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True, index=True)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_state_planned_node", "state", "planned_node"),
        Index("ix_jobs_owner_uid_state", "owner_uid", "state"),
        # Period reports and accounting backfill (scheduler/accounting/).
        Index("ix_jobs_ended_at", "ended_at"),
        Index("ix_jobs_owner_uid_ended_at", "owner_uid", "ended_at"),
        Index("ix_jobs_accounted_at", "accounted_at"),
        # Jobs of an account waiting or running (`account delete`, fair share).
        Index("ix_jobs_account_state", "account", "state"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    name: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)

    owner_uid: Mapped[int] = mapped_column(Integer)
    owner_gid: Mapped[int] = mapped_column(Integer)
    owner_groups: Mapped[list] = mapped_column(JSON)
    owner_name: Mapped[str] = mapped_column(String(255))
    # The account the job is charged to (scheduler.accounts: the user's default, else
    # `default`) and its QOS (scheduler.qos: `normal` unless `submit --qos`). No foreign key:
    # a finished job keeps its account's name after the account is gone.
    account: Mapped[str] = mapped_column(String(255), default="default", server_default="default")
    qos: Mapped[str] = mapped_column(String(64), default="normal", server_default="normal")
    argv: Mapped[list] = mapped_column(JSON)
    cwd: Mapped[str] = mapped_column(Text)
    env: Mapped[dict] = mapped_column(JSON)

    gpus: Mapped[int] = mapped_column(Integer)
    gpu_mem_gib: Mapped[float] = mapped_column(Float, default=0.0)
    # A slice of one GPU instead of whole GPUs (`submit --gpu-fraction` / `--mig`): the share
    # asked for, or the NVIDIA MIG profile; NULL for whole-GPU jobs. `gpu_instance` is the
    # instance the run holds (gpu_instances.uuid; NULL on an AMD partition, a GPU of its own).
    gpu_fraction: Mapped[float | None] = mapped_column(Float, nullable=True)
    mig_profile: Mapped[str | None] = mapped_column(String(32), nullable=True)
    gpu_instance: Mapped[str | None] = mapped_column(String(128), nullable=True)
    deadline: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    latency_slo_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    # p95 time to first token / per output token limits (ms); NULL: the preset's default.
    ttft_slo_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    tpot_slo_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    workload: Mapped[str | None] = mapped_column(String(64), nullable=True)
    prompts: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    est_runtime_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Start no later than submitted_at + this (None: any time that meets the deadline).
    max_delay_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The run's time limit: the user's --time-limit (binding for the planner), or one derived
    # from --est-runtime, re-derived by the planner from the runtime on the chosen GPUs x
    # `time_limit_factor` (NULL for an explicit limit).
    time_limit_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    time_limit_factor: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_retries: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    submitted_at: Mapped[datetime] = mapped_column(UTCDateTime)

    # The plan (PLANNED): where and when, and what the policy expects it to cost.
    planned_node: Mapped[str | None] = mapped_column(String(255), nullable=True)
    planned_gpu_ids: Mapped[list | None] = mapped_column(JSON, nullable=True)
    planned_start: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    plan_rev: Mapped[int] = mapped_column(Integer, default=0)
    est_energy_j: Mapped[float | None] = mapped_column(Float, nullable=True)
    est_gco2: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The "if run now" counterfactual (policies.pricing.counterfactual), fixed when first planned:
    # what waiting or moving saves.
    est_gco2_if_now: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The runtime the plan expects on its chosen GPUs (profile or catalog estimate).
    est_runtime_planned_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The constraint that shaped the choice (deadline, slo, memory, max_delay, power_cap...).
    binding: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # No feasible placement meets the deadline: planned as soon as possible and flagged.
    deadline_miss: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    explanation: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The operating point chosen on the planned GPUs (policies.model.operating_point): the agent
    # hands it to the job as CARBONSCHED_MAX_BATCH / _PRECISION / _TP. NULL: no workload model.
    planned_max_batch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    planned_precision: Mapped[str | None] = mapped_column(String(8), nullable=True)
    planned_tp: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The GPU power limit the plan chose (W per GPU, policies.pricing.power_cap; NULL: the default),
    # and the estimate the same placement had without it, for `show` and the receipt.
    planned_power_limit_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    est_uncapped_energy_j: Mapped[float | None] = mapped_column(Float, nullable=True)
    est_uncapped_gco2: Mapped[float | None] = mapped_column(Float, nullable=True)
    est_uncapped_runtime_s: Mapped[float | None] = mapped_column(Float, nullable=True)

    # The run (RUNNING and after).
    node: Mapped[str | None] = mapped_column(String(255), nullable=True)
    gpu_ids: Mapped[list | None] = mapped_column(JSON, nullable=True)
    gpu_indices: Mapped[list | None] = mapped_column(JSON, nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    energy_j: Mapped[float | None] = mapped_column(Float, nullable=True)
    energy_method: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # The power limit the agent set on the job's GPUs for its run (W per GPU; NULL: it ran
    # at the default), and why a planned limit was not applied (no privilege, unsupported).
    power_limit_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_limit_note: Mapped[str | None] = mapped_column(Text, nullable=True)
    gco2: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Carbon accounting of the run (scheduler/accounting/): where it ran, how its gCO2 was
    # priced, and when; re-checked while actual intensity data may still arrive.
    zone: Mapped[str | None] = mapped_column(String(64), nullable=True)
    gpu_model: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Output tokens: declared at submit (`--tokens`), the planning hint beside `prompts`.
    tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # What the job itself reported in its metrics file (scheduler/node/job_metrics.py);
    # NULL: not reported. Receipts and reports prefer these to the declared figures.
    reported_prompts: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    reported_input_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    reported_output_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    pue: Mapped[float | None] = mapped_column(Float, nullable=True)
    gco2_signal: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # actual | mixed (gaps priced at the static yearly mean) | static; NULL: no figure.
    gco2_basis: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # Share of the run's energy priced by recorded (actual) intensity, 0-1.
    gco2_coverage: Mapped[float | None] = mapped_column(Float, nullable=True)
    energy_note: Mapped[str | None] = mapped_column(Text, nullable=True)
    accounted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    cancel_requested_by: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # A job adopted from a plain `sbatch` into a carbon-aware partition: its Slurm job id
    # (unique: one Slurm job is adopted once). NULL for jobs submitted to carbonsched.
    slurm_job_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True, index=True, unique=True)

    # Slurm habits (issue 28). A held job (`submit --hold`, `hold JOB`) is not planned until
    # released; nor one whose `--begin` time is ahead, nor one whose dependencies
    # (job_dependencies; `dependency` is their text, e.g. "afterok:12,afterany:13") are not
    # satisfied: scheduler.plannable is the filter.
    held_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    held_by: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # "user": the owner's own hold, the owner releases it; "operator": root or an admin group
    # held another user's job, and only an operator releases it (Slurm's admin hold, issue 48).
    # NULL while not held.
    hold_kind: Mapped[str | None] = mapped_column(String(16), nullable=True)
    begin_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    dependency: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # A task of a job array (`--array 0-99%8`): the array's id (its first task's job id), this
    # task's index (CARBONSCHED_ARRAY_TASK_ID) and the most of its tasks active at once.
    array_job_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True, index=True)
    array_task_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    array_max_running: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # `--output` / `--error`: the paths the job's stdout / stderr go to, written by the job
    # itself as its owner (%j, %A, %a expanded at launch); NULL: carbonsched's own log.
    stdout_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    stderr_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Storage limits (issue 48). stored_bytes: what the request stored for this job (command,
    # environment, paths), counted against the owner's `max_stored_mib_per_user` until the job
    # is purged; purged_at: when its command and environment were dropped after
    # `job_retention` (the row stays: it is the job's accounting record). output_truncated:
    # the streams cut at `job_output_limit_mib` ("stdout", "stderr" or both, comma-separated).
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    purged_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    output_truncated: Mapped[str | None] = mapped_column(String(32), nullable=True)

    # Interruptible jobs (issue 30). `interruptible`: "checkpoint" (told to save its state at
    # the planned end of a segment by `checkpoint_signal` and the checkpoint file, it exits
    # with CHECKPOINT_EXIT_CODE and is re-planned) or "pause" (SIGSTOP/SIGCONT in place, its
    # GPUs held); NULL: one piece. min_run_s: the shortest useful segment; resume_cost_s: the
    # time each resume loses; max_segments: the most segments (NULL: the policy's default).
    interruptible: Mapped[str | None] = mapped_column(String(16), nullable=True)
    checkpoint_signal: Mapped[str | None] = mapped_column(String(16), nullable=True)
    checkpoint_grace_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    min_run_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    resume_cost_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    max_segments: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Progress across segments: the share of the whole job done by the segments run so far
    # (scheduler.node.segments.next_done_fraction has the rule), how many ran, and how many
    # checkpoint requests the job ignored (after one it runs its rest in one piece).
    done_fraction: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    resume_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    checkpoints_ignored: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # When the job's first segment started (started_at is the current segment's start).
    first_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The plan's segments, [[start ISO, end ISO], ...] (NULL: one piece), and the first
    # segment's end (the checkpoint request) and the second's start. A pause job's list is
    # fixed when it starts: the supervisor stops and continues it by it.
    planned_segments: Mapped[list | None] = mapped_column(JSON, nullable=True)
    planned_interrupt_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    planned_resume_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class JobEvent(Base):
    """One state change of one job: the audit trail (who, when, from, to, why)."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    from_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    to_state: Mapped[str] = mapped_column(String(16))
    actor_uid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)


class JobSegment(Base):
    """One piece of an interruptible job's run (issue 30): a run between two checkpoints, a
    pause in place, or the last run. The job's energy and gCO2 are the sums over its
    segments; the receipt lists them.

    kind: run | pause. outcome: checkpointed (exit 75 after the request), killed (ignored
    the request: its work since the last checkpoint is lost, `lost_s`), paused, continued,
    or how the job ended (completed, failed, ...)."""

    __tablename__ = "job_segments"
    __table_args__ = (UniqueConstraint("job_id", "seq", name="uq_job_segments_job_id_seq"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    outcome: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime] = mapped_column(UTCDateTime)
    node: Mapped[str | None] = mapped_column(String(255), nullable=True)
    gpu_ids: Mapped[list | None] = mapped_column(JSON, nullable=True)
    energy_j: Mapped[float | None] = mapped_column(Float, nullable=True)
    energy_method: Mapped[str | None] = mapped_column(String(32), nullable=True)
    gco2: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Work run but not kept (a job killed after ignoring its checkpoint request), in s.
    lost_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # The job's done_fraction after this segment.
    done_fraction: Mapped[float | None] = mapped_column(Float, nullable=True)


class JobDependency(Base):
    """`--dependency=afterok:ID`: this job waits until job `on_job_id` ended as `kind` says
    (afterok: COMPLETED; afternotok: ended otherwise; afterany: ended at all)."""

    __tablename__ = "job_dependencies"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    on_job_id: Mapped[int] = mapped_column(BigInteger, index=True)
    kind: Mapped[str] = mapped_column(String(16))


class JobLogChunk(Base):
    """A piece of a job's stdout or stderr, copied into the store by the agent that runs it,
    so `carbonsched logs` works on the head node for a job that ran on another node."""

    __tablename__ = "job_log_chunks"
    __table_args__ = (Index("ix_job_log_chunks_job_id_stream_offset", "job_id", "stream", "offset"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    stream: Mapped[str] = mapped_column(String(8))
    offset: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class WorkloadProfile(Base):
    """How one workload class runs on one GPU model here, learned from completed jobs.

    Per GPU, data-parallel over a job's GPUs, like `policies.types.Profile`; the planner
    lays these over the packaged seed profiles.
    """

    __tablename__ = "workload_profiles"
    __table_args__ = (UniqueConstraint("workload", "model", name="uq_workload_profiles_workload_model"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    workload: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(64))
    prompts_per_s: Mapped[float] = mapped_column(Float)
    power_w: Mapped[float] = mapped_column(Float)
    # NULL: unknown (no seed profile gave the latency shape before the first measurement).
    latency_p50_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    latency_p95_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    samples: Mapped[int] = mapped_column(Integer, default=0)
    source: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # The last `policies.model.learning.WINDOW` runs, oldest first: [[prompts_per_s, power_w], ...] per
    # GPU. The figures above are the estimate from them; NULL: learned before runs were kept.
    runs: Mapped[list | None] = mapped_column(JSON, nullable=True)


jobs = Job.__table__
gpus = Gpu.__table__
gpu_instances = GpuInstance.__table__
nodes = Node.__table__
job_events = JobEvent.__table__
job_dependencies = JobDependency.__table__
job_segments = JobSegment.__table__
job_log_chunks = JobLogChunk.__table__
workload_profiles = WorkloadProfile.__table__
