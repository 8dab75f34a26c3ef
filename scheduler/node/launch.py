"""What a claimed job is launched with (`LaunchSpec`): its command as its owner runs it, its
environment (the owner's identity, its GPUs, the planned operating point, interruptible
jobs' checkpoint seam) and what its supervisor keeps for it (time limit, grace period, log
files and output limit, start readings)."""

from __future__ import annotations

import pwd
from pathlib import Path

from scheduler import interruptible
from scheduler.node import checkpoint, job_metrics
from scheduler.node.config import AgentConfig
from scheduler.node.executor import JobExecutor, LaunchSpec


def launch_spec(job, executor: JobExecutor, config: AgentConfig, vendor: str, indices: list[int],
                energy_start: dict, emulated_env: dict[str, str] | None = None, *,
                visible: dict[str, str] | None = None) -> LaunchSpec:
    """The spec of one run of `job` (a `jobs` row) on the GPUs of `vendor` numbered `indices`
    by the driver; `energy_start`: the GPUs' readings at its start (scheduler.node.run_energy);
    `emulated_env`: what an emulated fleet tells the job (scheduler.node.emulation);
    `visible`: the visible-devices environment of a job on a slice of a GPU (a MIG device by
    its UUID, scheduler.node.slice_claims), instead of `visible_devices_env`."""
    out, err = executor.log_paths(job.id)
    env = dict(job.env or {})
    env.update(emulated_env or {})  # the emulation seam (scheduler.node.emulation)
    env.update(_identity_env(job.owner_uid, job.owner_name))
    env.update(visible if visible is not None else visible_devices_env(vendor, indices))
    env["CARBONSCHED_JOB_ID"] = str(job.id)
    env["CARBONSCHED_NODE"] = config.node
    metrics = executor.metrics_path(job.id)
    env[job_metrics.ENV_VAR] = str(metrics)
    env.update(operating_point_env(job.planned_max_batch, job.planned_precision, job.planned_tp))
    extra = {"start_readings": energy_start}
    if job.interruptible:
        env_i, extra_i = _interruptible_launch(job, out.parent, config.checkpoints)
        env.update(env_i)
        extra.update(extra_i)
    return LaunchSpec(job_id=job.id, argv=redirected_argv(job), cwd=job.cwd, env=env,
                      uid=job.owner_uid, gid=job.owner_gid, groups=list(job.owner_groups or []),
                      time_limit_s=job.time_limit_s, grace_s=config.grace_s,
                      stdout=str(out), stderr=str(err), metrics_file=str(metrics),
                      output_limit_bytes=config.output_limit_bytes, extra=extra)


def _interruptible_launch(job, log_dir: Path, checkpoints: Path) -> tuple[dict[str, str], dict]:
    """What an interruptible job's run is told (CARBONSCHED_RESUME_COUNT, its checkpoint
    directory, the checkpoint request file) and what its supervisor keeps for it: when to
    ask it to checkpoint, with which signal and grace period, or when to stop and continue it."""
    ckdir = checkpoint.ensure_job_dir(checkpoints, job.id, job.owner_uid, job.owner_gid)
    env = {interruptible.ENV_INTERRUPTIBLE: job.interruptible,
           interruptible.ENV_RESUME_COUNT: str(job.resume_count or 0),
           interruptible.ENV_CHECKPOINT_DIR: str(ckdir)}
    extra: dict = {"interruptible": job.interruptible}
    if job.interruptible == interruptible.CHECKPOINT:
        request = log_dir / f"{job.id}.checkpoint"
        env[interruptible.ENV_CHECKPOINT_FILE] = str(request)
        extra.update(checkpoint_file=str(request),
                     checkpoint_signal=interruptible.signal_number(job.checkpoint_signal or "SIGUSR1"),
                     checkpoint_grace_s=float(job.checkpoint_grace_s or interruptible.DEFAULT_GRACE_S),
                     checkpoint_at=job.planned_interrupt_at.isoformat() if job.planned_interrupt_at else None,
                     min_run_s=job.min_run_s)
    elif job.planned_segments:
        extra["pause_segments"] = job.planned_segments
    return env, extra


def redirected_argv(job) -> list[str]:
    """The job's command, with `--output`/`--error` applied by a shell that runs as the job's
    owner in its working directory: the files are opened with the owner's rights, never
    root's. Without them, the command itself (its output goes to carbonsched's log)."""
    from scheduler.job_specs import expand_log_pattern

    argv = list(job.argv)
    if not getattr(job, "stdout_path", None) and not getattr(job, "stderr_path", None):
        return argv
    names = dict(job_id=job.id, user=job.owner_name, array_job_id=job.array_job_id,
                 array_task_id=job.array_task_id)
    out = expand_log_pattern(job.stdout_path, **names) if job.stdout_path else None
    err = expand_log_pattern(job.stderr_path, **names) if job.stderr_path else out
    if out is None:
        return ["/bin/sh", "-c", 'exec 2>"$1"; shift; exec "$@"', "carbonsched-redirect", err, *argv]
    if err == out:
        return ["/bin/sh", "-c", 'exec >"$1" 2>&1; shift; exec "$@"', "carbonsched-redirect", out, *argv]
    return ["/bin/sh", "-c", 'exec >"$1" 2>"$2"; shift 2; exec "$@"', "carbonsched-redirect", out, err, *argv]


def visible_devices_env(vendor: str, indices: list[int]) -> dict[str, str]:
    """The environment that confines a process to its GPUs.

    NVIDIA: CUDA_VISIBLE_DEVICES lists NVML/PCI-order indices (CUDA_DEVICE_ORDER=PCI_BUS_ID
    makes CUDA count the same way). AMD: ROCR_VISIBLE_DEVICES selects the physical GPUs;
    HIP and CUDA_VISIBLE_DEVICES then count within that selection, so they get 0..n-1.
    """
    physical = ",".join(str(i) for i in indices)
    renumbered = ",".join(str(i) for i in range(len(indices)))
    if vendor == "amd":
        return {"ROCR_VISIBLE_DEVICES": physical, "HIP_VISIBLE_DEVICES": renumbered,
                "CUDA_VISIBLE_DEVICES": renumbered}
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": physical}


def _identity_env(uid: int, name: str) -> dict[str, str]:
    try:
        pw = pwd.getpwuid(uid)
        return {"HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name,
                "SHELL": pw.pw_shell or "/bin/sh"}
    except KeyError:
        return {"USER": name, "LOGNAME": name}


def operating_point_env(max_batch: int | None, precision: str | None, tp: int | None) -> dict[str, str]:
    """The planned operating point for the job's serving engine (policies.model.operating_point):
    CARBONSCHED_MAX_BATCH (vLLM max_num_seqs), CARBONSCHED_PRECISION (bf16, fp8, fp4) and
    CARBONSCHED_TP (tensor-parallel degree; the job's GPUs / TP are data-parallel replicas).
    Empty when the plan has none (no performance-model workload)."""
    if max_batch is None:
        return {}
    return {"CARBONSCHED_MAX_BATCH": str(max_batch), "CARBONSCHED_PRECISION": str(precision or ""),
            "CARBONSCHED_TP": str(tp or 1)}
