"""A submit request checked field by field, as the new job's row: each bad field is refused
with a one-line reason naming its flag, and nothing is stored (`RequestError`).

`job_row` checks the job itself (command, GPUs, runtime, deadline, workload, environment,
interruptible pieces); `slurm_habits` the Slurm-style options (--hold, --begin,
--dependency, --array, --output/--error); `KnownWorkloads` the workload names the model or
this cluster's learned profiles know.
"""

from __future__ import annotations

import difflib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import select

from scheduler import interruptible
from scheduler.daemon.access import Caller, RequestError, account
from scheduler.daemon.admission import MAX_GPUS
from scheduler.job_specs import (BEGIN_REASON, HELD_REASON, check_log_pattern, dependency_text, never_satisfied,
                                 parse_array, parse_dependency)
from scheduler.lifecycle import State
from scheduler.store import Store
from scheduler.store.models import workload_profiles
from scheduler.timeparse import iso

MAX_ARGV = 4096
MAX_ARGV_BYTES = 256 * 1024
MAX_ENV = 256
MAX_RUNTIME_S = 30 * 86400
MIN_RUNTIME_S = 1.0  # shorter estimates and limits are typos (1e-300 s), not jobs
MAX_DEADLINE_AHEAD_S = 366 * 86400
LEARNED_TTL_S = 5.0  # how long the learned workload names are cached for submit's check

WORKLOAD_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}\Z")
CUSTOM_WORKLOAD_RE = re.compile(r"^custom:[a-z0-9][a-z0-9_.-]{0,55}\Z")  # a class of one's own, no model
PARAMETRIC_WORKLOAD_RE = re.compile(r"^llm:[a-z0-9_.,=]{1,60}\Z")  # policies.model.operating_point.parse_spec
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
NAME_RE = re.compile(r"^[\w .,:@+=/-]{1,255}\Z")
# Set by carbonsched itself; a user may not override them.
RESERVED_ENV = {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                "CUDA_DEVICE_ORDER", "CARBONSCHED_JOB_ID", "CARBONSCHED_NODE", "CARBONSCHED_METRICS_FILE",
                "CARBONSCHED_MAX_BATCH", "CARBONSCHED_PRECISION", "CARBONSCHED_TP",
                "CARBONSCHED_ARRAY_TASK_ID", "CARBONSCHED_ARRAY_JOB_ID", "CARBONSCHED_ARRAY_TASK_COUNT",
                "HOME", "USER", "LOGNAME", "LD_PRELOAD", "LD_LIBRARY_PATH", *interruptible.ENV_NAMES}
# Every field a submit request may carry.
SUBMIT_FIELDS = frozenset({
    "argv", "name", "gpus", "gpu_mem_gib", "deadline", "latency_slo_ms", "ttft_slo_ms", "tpot_slo_ms", "workload",
    "prompts", "tokens", "est_runtime_s", "time_limit_s", "cwd", "env", "max_retries", "max_delay_s",
    "hold", "begin", "dependency", "array", "stdout_path", "stderr_path",
    "interruptible", "checkpoint_signal", "checkpoint_grace_s", "min_run_s", "resume_cost_s",
    "max_segments", "account", "qos", "gpu_fraction", "mig_profile"})


def job_row(body: object, caller: Caller, now: datetime, *, time_limit_factor: float,
            check_workload: Callable[[str], None]) -> dict:
    """A submit's body as the new job's row (columns of `jobs`), each field checked in turn:
    the first bad one is refused (RequestError) with its flag named. `check_workload` refuses
    a plain workload name the cluster does not know (`KnownWorkloads.check`). The Slurm-style
    options are checked apart (`slurm_habits`)."""
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    unknown = sorted(set(body) - SUBMIT_FIELDS)
    if unknown:
        raise RequestError(400, f"unknown field(s) in submit request: {', '.join(unknown)}")
    argv, name = _command(body)
    n_gpus, mem = _gpus(body)
    fraction, profile = _slice(body, n_gpus)
    est, limit, factor = _runtime(body, time_limit_factor)
    deadline = _deadline(body, now, est)
    max_delay = _optional_number(body.get("max_delay_s"), "max_delay_s")
    if max_delay is not None and not 0 < max_delay <= MAX_RUNTIME_S:
        raise RequestError(400, f"--max-delay must be positive and at most 30d (got {max_delay:g}s): "
                                "it is how long after submission the job may start at the latest")
    slos, workload = _workload(body, check_workload)
    prompts, tokens, retries = _counts(body)
    cwd, env = _environment(body)
    pieces = _validate_interruptible(body, est, limit if factor is None else None)
    owner, groups = account(caller.uid, caller.gid)
    return dict(**pieces,
        name=name, state=State.PENDING.value, reason="waiting for the planner",
        owner_uid=caller.uid, owner_gid=caller.gid,
        owner_groups=groups, owner_name=owner,
        argv=argv, cwd=cwd, env=env, gpus=n_gpus, gpu_mem_gib=mem, deadline=deadline,
        gpu_fraction=fraction, mig_profile=profile,
        latency_slo_ms=slos["latency_slo_ms"], ttft_slo_ms=slos["ttft_slo_ms"],
        tpot_slo_ms=slos["tpot_slo_ms"], workload=workload, prompts=prompts, tokens=tokens, est_runtime_s=est,
        time_limit_s=limit, time_limit_factor=factor, max_retries=retries, attempts=0, submitted_at=now,
        plan_rev=0,
        max_delay_s=max_delay,
    )


def _command(body: dict) -> tuple[list[str], str]:
    """The command (argv) and the job's name (default: the program's base name)."""
    argv = body.get("argv")
    if not isinstance(argv, list) or not argv:
        raise RequestError(400, "empty command: give the command after --, e.g. "
                                "`carbonsched submit -- python infer.py`")
    if not all(isinstance(a, str) for a in argv) or not argv[0].strip():
        raise RequestError(400, "command must be a list of strings with a non-empty program")
    if len(argv) > MAX_ARGV or sum(len(a) for a in argv) > MAX_ARGV_BYTES:
        raise RequestError(413, f"command too long (at most {MAX_ARGV} arguments, "
                                f"{MAX_ARGV_BYTES // 1024} KiB)")
    if any("\x00" in a for a in argv):
        raise RequestError(400, "command arguments may not contain NUL bytes")

    name = body.get("name") or os.path.basename(argv[0])[:255]
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise RequestError(400, "job name must be 1-255 letters, digits, spaces or . , : @ + = / - _")
    return argv, name


def _gpus(body: dict) -> tuple[int, float]:
    """How many GPUs, and the memory each must have (GiB; 0: any)."""
    n_gpus = _int(body.get("gpus", 1), "gpus")
    mem = _number(body.get("gpu_mem_gib", 0), "gpu_mem_gib")
    if mem < 0:
        raise RequestError(400, f"--gpu-mem must not be negative (got {mem:g})")
    if not 1 <= n_gpus <= MAX_GPUS:
        raise RequestError(400, f"--gpus must be between 1 and {MAX_GPUS} (got {n_gpus})")
    return n_gpus, mem


def _slice(body: dict, n_gpus: int) -> tuple[float | None, str | None]:
    """A slice of one GPU instead of whole GPUs: (--gpu-fraction, --mig), at most one of them,
    with one GPU. The fraction lies in (0, 1); the profile is a MIG profile name
    (canonical spelling, "1g.10gb"). Whether the fleet offers such a slice is asked apart
    (scheduler.daemon.slice_admission)."""
    from policies.model.partitions import normal_profile

    fraction = _optional_number(body.get("gpu_fraction"), "gpu_fraction")
    profile = body.get("mig_profile")
    if fraction is None and profile is None:
        return None, None
    if fraction is not None and profile is not None:
        raise RequestError(400, "give --gpu-fraction or --mig, not both: a MIG profile is itself a share")
    if n_gpus != 1:
        raise RequestError(400, f"--gpu-fraction and --mig ask for a slice of one GPU; --gpus {n_gpus} "
                                "asks for whole GPUs")
    if fraction is not None:
        if not 0 < fraction < 1:
            raise RequestError(400, f"--gpu-fraction must be above 0 and below 1 (got {fraction:g}); "
                                    "a whole GPU is --gpus 1")
        return fraction, None
    canonical = normal_profile(profile) if isinstance(profile, str) and len(profile) <= 32 else None
    if canonical is None:
        raise RequestError(400, f"--mig {str(profile)[:40]!r} is not a MIG profile name: e.g. 1g.10gb, 3g.40gb")
    return None, canonical


def _runtime(body: dict, time_limit_factor: float) -> tuple[float | None, float | None, float | None]:
    """(estimate, time limit, factor): without an explicit --time-limit, an estimate gives a
    derived limit (`time_limit_factor` times it) that follows the GPUs the planner chooses."""
    est = _optional_number(body.get("est_runtime_s"), "est_runtime_s")
    if est is not None and not MIN_RUNTIME_S <= est <= MAX_RUNTIME_S:
        raise RequestError(400, f"--est-runtime must be between 1s and 30d (got {est:g}s)")
    limit = _optional_number(body.get("time_limit_s"), "time_limit_s")
    if limit is not None and not MIN_RUNTIME_S <= limit <= MAX_RUNTIME_S:
        raise RequestError(400, f"--time-limit must be between 1s and 30d (got {limit:g}s)")
    factor = None
    if limit is None and est is not None:  # derived: follows the GPUs the planner chooses
        factor = time_limit_factor
        limit = est * factor
    return est, limit, factor


def _deadline(body: dict, now: datetime, est: float | None) -> datetime | None:
    """The deadline: ahead, within a year, and not sooner than the estimate from now."""
    if body.get("deadline") is None:
        return None
    deadline = parse_iso_time(body["deadline"], "deadline")
    if deadline <= now:
        raise RequestError(400, f"deadline {iso(deadline)} is in the past")
    if deadline > now + timedelta(seconds=MAX_DEADLINE_AHEAD_S):
        raise RequestError(400, f"deadline {iso(deadline)} is more than a year ahead")
    if est is not None and deadline < now + timedelta(seconds=est):
        raise RequestError(400, f"deadline {iso(deadline)} is sooner than the estimated "
                                f"runtime ({est:g}s) from now: it cannot be met")
    return deadline


def _workload(body: dict, check_workload: Callable[[str], None]) -> tuple[dict[str, float | None], str | None]:
    """The latency SLOs and the workload class, which must have a latency model for them."""
    slos = {}
    for key, flag in (("latency_slo_ms", "--latency-slo"), ("ttft_slo_ms", "--ttft-slo"),
                      ("tpot_slo_ms", "--tpot-slo")):
        slos[key] = _optional_number(body.get(key), key)
        if slos[key] is not None and not 0 < slos[key] <= 3_600_000:
            raise RequestError(400, f"{flag} must be between 0 and 3600000 ms (got {slos[key]:g})")
    workload = body.get("workload")
    if workload is not None and (not isinstance(workload, str) or not (
            WORKLOAD_RE.match(workload) or PARAMETRIC_WORKLOAD_RE.match(workload)
            or CUSTOM_WORKLOAD_RE.match(workload))):
        raise RequestError(400, f"bad workload class {workload!r}: use lower-case letters, digits "
                                "and . _ - (e.g. llm-inference, finetune, eval), llm:SIZE (e.g. llm:70b) "
                                "or custom:NAME")
    _check_latency_model(workload, slos)
    if workload is not None and WORKLOAD_RE.match(workload):
        check_workload(workload)
    return slos, workload


def _counts(body: dict) -> tuple[int | None, int | None, int]:
    """(prompts, tokens, retries)."""
    prompts = body.get("prompts")
    if prompts is not None:
        prompts = _int(prompts, "prompts")
        if not 1 <= prompts <= 10**12:
            raise RequestError(400, f"--prompts must be between 1 and 10^12 (got {prompts})")
    tokens = body.get("tokens")
    if tokens is not None:
        tokens = _int(tokens, "tokens")
        if not 1 <= tokens <= 10**15:
            raise RequestError(400, f"--tokens must be between 1 and 10^15 (got {tokens})")
    retries = _int(body.get("max_retries", 0), "max_retries")
    if not 0 <= retries <= 10:
        raise RequestError(400, "--retries must be between 0 and 10")
    return prompts, tokens, retries


def _environment(body: dict) -> tuple[str, dict[str, str]]:
    """The working directory (absolute) and the environment, none of it carbonsched's own."""
    cwd = body.get("cwd") or "/"
    if not isinstance(cwd, str) or not cwd.startswith("/") or "\x00" in cwd:
        raise RequestError(400, "working directory must be an absolute path")
    env = body.get("env") or {}
    if not isinstance(env, dict) or len(env) > MAX_ENV:
        raise RequestError(400, f"env must be an object of at most {MAX_ENV} variables")
    for k, v in env.items():
        if not ENV_NAME_RE.match(k) or not isinstance(v, str) or "\x00" in v:
            raise RequestError(400, f"bad environment variable {k!r}")
        if k in RESERVED_ENV:
            raise RequestError(400, f"environment variable {k} is set by carbonsched and "
                                    "cannot be overridden")
    return cwd, env


@dataclass(frozen=True)
class Habits:
    """The validated Slurm-style options of a submit: plain columns, dependencies, array."""

    columns: dict
    deps: list
    array: object | None


def slurm_habits(body: dict, caller: Caller, now: datetime,
                 see_jobs: Callable[[list[int]], dict[int, str]]) -> Habits:
    """--hold, --begin, --dependency, --array, --output/--error (issue 28), checked like
    every other field: a bad one is refused with the flag named and nothing stored.
    `see_jobs` refuses (404 / 403) dependencies on jobs the caller may not see, and gives
    the states of the others: one that can never be satisfied is refused too."""
    cols: dict = {}
    hold = body.get("hold", False)
    if not isinstance(hold, bool):
        raise RequestError(400, "hold must be true or false")
    if hold:
        cols.update(held_at=now, held_by=caller.uid, hold_kind="user", reason=HELD_REASON)
    if body.get("begin") is not None:
        begin = parse_iso_time(body["begin"], "begin")
        if begin > now + timedelta(seconds=MAX_RUNTIME_S * 12):
            raise RequestError(400, f"--begin {iso(begin)} is more than a year away")
        deadline = body.get("deadline")
        if deadline is not None and parse_iso_time(deadline, "deadline") <= begin:
            raise RequestError(400, f"--begin {iso(begin)} is not before the deadline: it cannot be met")
        cols["begin_at"] = begin
        if begin > now and not hold:
            cols["reason"] = BEGIN_REASON
    for key, flag, col in (("stdout_path", "--output", "stdout_path"), ("stderr_path", "--error", "stderr_path")):
        if body.get(key) is not None:
            try:
                cols[col] = check_log_pattern(body[key], flag)
            except ValueError as e:
                raise RequestError(400, str(e)) from None
    deps = []
    if body.get("dependency") is not None:
        try:
            deps = parse_dependency(body["dependency"])
        except ValueError as e:
            raise RequestError(400, str(e)) from None
        states = see_jobs([d.job_id for d in deps])  # 404 / 403: no waiting on the unseen
        for d in deps:
            if never_satisfied(d, states[d.job_id]):
                raise RequestError(400, f"--dependency {d.text()}: job {d.job_id} ended {states[d.job_id]}, "
                                        "so it can never be satisfied (DependencyNeverSatisfied)")
        cols["dependency"] = dependency_text(deps)
    array = None
    if body.get("array") is not None:
        try:
            array = parse_array(body["array"])
        except ValueError as e:
            raise RequestError(400, str(e)) from None
    return Habits(cols, deps, array)


class KnownWorkloads:
    """The workload names a submit may use: the model's presets and the classes this
    cluster has learned profiles of (read from the store at most every `LEARNED_TTL_S`)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._learned: tuple[float, set[str]] | None = None

    def _learned_workloads(self) -> set[str]:
        """Workload classes this cluster has learned profiles of (cached like the inventory)."""
        now = time.monotonic()
        cached = self._learned
        if cached is not None and now - cached[0] < LEARNED_TTL_S:
            return cached[1]
        with self.store.read() as conn:
            names = set(conn.execute(select(workload_profiles.c.workload).distinct()).scalars())
        self._learned = (now, names)
        return names

    def check(self, workload: str) -> None:
        """A plain workload name must be one the model or this cluster knows: a typo
        (`llm-chat-7b`) would otherwise be planned as nothing in particular while `show`
        promised the workload's defaults (issue 28). Own classes are `custom:NAME`."""
        from policies.model.perf_model import preset_names

        known = set(preset_names()) | self._learned_workloads()
        if workload in known:
            return
        close = difflib.get_close_matches(workload, sorted(known), n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise RequestError(400, f"unknown workload {workload!r}: {hint}known: {', '.join(sorted(known))}; "
                                f"or llm:SIZE (e.g. llm:70b), or custom:{workload} for a class of your own "
                                "(planned without a performance model, learned from its runs)")


def _validate_interruptible(body: dict, est_runtime_s: float | None, time_limit_s: float | None) -> dict:
    """The interruptible-job fields of a submit (issue 30) as job columns, each refused with
    a one-line reason naming its flag: an unknown kind, a signal a job cannot catch, a
    segment longer than the job, knobs given without --interruptible."""
    kind = body.get("interruptible")
    knobs = {k: body.get(k) for k in ("checkpoint_signal", "checkpoint_grace_s", "min_run_s", "resume_cost_s",
                                      "max_segments") if body.get(k) is not None}
    if kind is None:
        if knobs:
            flags = ", ".join("--" + k.removesuffix("_s").replace("_", "-") for k in knobs)
            raise RequestError(400, f"{flags} need --interruptible checkpoint|pause")
        return {}
    if kind not in interruptible.KINDS:
        raise RequestError(400, f"--interruptible must be one of {', '.join(interruptible.KINDS)} (got {kind!r})")
    if kind == interruptible.PAUSE:
        for k, flag in (("checkpoint_signal", "--checkpoint-signal"), ("checkpoint_grace_s", "--checkpoint-grace")):
            if k in knobs:
                raise RequestError(400, f"{flag} is for --interruptible checkpoint; a pause job is stopped "
                                        "and continued in place")
    out: dict = {"interruptible": kind}
    if kind == interruptible.CHECKPOINT:
        sig = body.get("checkpoint_signal", interruptible.DEFAULT_SIGNAL)
        if not isinstance(sig, (str, int)) or isinstance(sig, bool):
            raise RequestError(400, "--checkpoint-signal must be a signal name such as SIGUSR1")
        try:
            out["checkpoint_signal"] = interruptible.signal_name(str(sig))
        except ValueError as e:
            raise RequestError(400, str(e)) from None
        grace = _optional_number(body.get("checkpoint_grace_s"), "checkpoint_grace_s")
        if grace is None:
            grace = interruptible.DEFAULT_GRACE_S
        if not 1 <= grace <= interruptible.MAX_GRACE_S:
            raise RequestError(400, f"--checkpoint-grace must be between 1s and 1h (got {grace:g}s)")
        out["checkpoint_grace_s"] = grace
    min_run = _optional_number(body.get("min_run_s"), "min_run_s")
    if min_run is not None:
        if not MIN_RUNTIME_S <= min_run <= MAX_RUNTIME_S:
            raise RequestError(400, f"--min-run must be between 1s and 30d (got {min_run:g}s)")
        longest = est_runtime_s if est_runtime_s is not None else time_limit_s
        if longest is not None and min_run > longest:
            what = "--est-runtime" if est_runtime_s is not None else "--time-limit"
            raise RequestError(400, f"--min-run {min_run:g}s is longer than the job's {what} of {longest:g}s: "
                                    "no segment could be that long")
    out["min_run_s"] = min_run
    cost = _optional_number(body.get("resume_cost_s"), "resume_cost_s")
    cost = 0.0 if cost is None else cost
    if not 0 <= cost <= MAX_RUNTIME_S:
        raise RequestError(400, f"--resume-cost must be between 0s and 30d (got {cost:g}s)")
    if est_runtime_s is not None and cost >= est_runtime_s:
        raise RequestError(400, f"--resume-cost {cost:g}s is not shorter than the job's --est-runtime of "
                                f"{est_runtime_s:g}s: every resume would cost more than the whole job")
    out["resume_cost_s"] = cost
    segs = body.get("max_segments")
    if segs is not None:
        segs = _int(segs, "max_segments")
        if not 1 <= segs <= interruptible.MAX_SEGMENTS:
            raise RequestError(400, f"--max-segments must be between 1 and {interruptible.MAX_SEGMENTS} "
                                    f"(got {segs})")
    out["max_segments"] = segs
    return out


def _int(v: object, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(400, f"{field} must be an integer (got {v!r})")
    return v


def _number(v: object, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
        raise RequestError(400, f"{field} must be a finite number (got {v!r})")
    return float(v)


def _optional_number(v: object, field: str) -> float | None:
    return None if v is None else _number(v, field)


def _check_latency_model(workload: str | None, slos: dict[str, float | None]) -> None:
    """A parametric workload must parse, and an SLO needs a workload with a latency model:
    planned without one, the SLO would bind nothing (issue 18), so such a job is refused."""
    from policies.model.operating_point import WorkloadSpecError, has_latency_model, latency_model_names, parse_spec

    if workload is not None and workload.startswith("llm:"):
        try:
            spec = parse_spec(workload)
            if not spec.total_params_b > 0:
                raise WorkloadSpecError(f"{workload!r} has no parameters; give the model's size, e.g. llm:70b")
        except WorkloadSpecError as e:
            raise RequestError(400, f"bad workload: {e}") from None
    given = [k for k, v in slos.items() if v is not None]
    if given and not has_latency_model(workload):
        flags = ", ".join("--" + k.removesuffix("_ms").replace("_", "-") for k in given)
        what = f"workload {workload!r} has" if workload else "a job without --workload has"
        raise RequestError(400, f"{flags}: {what} no latency model, so the SLO could not be planned for; "
                                f"workloads with one: {', '.join(latency_model_names())}")


def parse_iso_time(v: object, field: str) -> datetime:
    """A request's ISO 8601 time with its zone, in UTC; a 400 naming `field` otherwise."""
    if not isinstance(v, str):
        raise RequestError(400, f"{field} must be an ISO 8601 time")
    try:
        t = datetime.fromisoformat(v)
    except ValueError:
        raise RequestError(400, f"{field} {v!r} is not an ISO 8601 time") from None
    if t.tzinfo is None:
        raise RequestError(400, f"{field} {v!r} has no time zone; send UTC, e.g. 2026-12-01T02:00:00Z")
    try:
        return t.astimezone(timezone.utc)
    except OverflowError:  # e.g. 9999-12-31T23:59:59-23:59: past year 9999 in UTC
        raise RequestError(400, f"{field} {v!r} is out of range") from None
