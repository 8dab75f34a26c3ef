"""Job trace adapters: GAIA, Alibaba GPU v2023, LLM request logs and a generic CSV.

Every adapter returns a `JobTrace`: jobs with an arrival offset in seconds from the trace's
origin, the GPUs they take, their runtime on the reference GPU (H100; the energy model
scales it to other models) or their prompts and workload class. `to_queued_jobs` then
places the trace on the carbon data's calendar and adds deadlines.

Formats, told apart by the header row (or named with `fmt`):

- `gaia`: `arrival_time,length,cpus` (GAIA, ASPLOS'24). Times are seconds or hours and
  the files do not say which (pai_1k is in seconds, pai-100k in hours): unless `time_unit`
  is given, a trace whose longest job is under 300 (GAIA's own minimum job length in
  seconds) is read as hours, otherwise as seconds. `cpus` is taken as the GPU count.
- `alibaba`: the Alibaba GPU trace v2023 pod list, `name,cpu_milli,memory_mib,num_gpu,
  gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time` (seconds
  from the trace start). Arrival = creation, runtime = deletion - scheduled. CPU-only pods,
  pods never scheduled and pods without a deletion time are skipped (and counted). A pod
  with a GPU share (`gpu_milli` < 1000) takes one whole GPU. `qos` LS (latency-sensitive)
  pods get no slack: they must run as soon as they can.
- `llm`: request logs `TIMESTAMP,ContextTokens,GeneratedTokens` (Azure LLM inference trace
  2023). Batching rule: requests in arrival order are cut into batches of at most
  `llm_batch_prompts` (default 1000) requests spanning at most `llm_batch_window_s`
  (default 15 min); a batch is submitted when its last request arrives, as one 1-GPU job of
  workload class `llm_workload` (default llm-chat-8b: the Azure conversation trace; llm-code
  suits its code trace) with prompts = requests (tokens are kept for the report).
- `generic`: one job per row, columns (case-insensitive; aliases in brackets):
  `submit_time` [submit, submitted_at, arrival, arrival_time, time] (ISO 8601 or a number of
  `time_unit`s from the trace start), `gpus` [num_gpu, gpu_count] (default 1),
  `runtime_s` [runtime, duration_s, duration, est_runtime_s] (seconds or a duration such as
  90m) or `work_gpu_h` [gpu_hours] (GPU-hours on the reference GPU: runtime = work / gpus),
  `workload` [class, workload_class], `prompts`, `deadline` (ISO or offset) or `slack`
  [slack_s] (a duration), `gpu_mem_gib` [memory_gib, mem_gib], `latency_slo_ms`,
  `name` [id], `interruptible` (checkpoint, pause, or empty / none / no: one piece; issue
  30: the job may be planned in segments, with the simulation's --min-run / --resume-cost),
  and who submitted it: `user`, `account` and `qos` (each optional: a job without an
  account is the `default` account's, one without a QOS is `normal`; accounts are
  compared by fair share, QOS levels give priority and how far carbon may defer a job).
  A row needs a submit time and one of runtime, work or prompts+workload.

A bad row raises TraceFormatError with the file and line number.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

log = logging.getLogger(__name__)

FORMATS = ("gaia", "alibaba", "llm", "generic")
TIME_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0}
GAIA_MIN_LENGTH_S = 300.0
DEFAULT_LLM_BATCH_PROMPTS = 1000
DEFAULT_LLM_BATCH_WINDOW_S = 900.0
DEFAULT_LLM_WORKLOAD = "llm-chat-8b"  # the Azure conversation trace; use llm-code for its code trace
ALIBABA_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos",
                   "pod_phase", "creation_time", "deletion_time", "scheduled_time")


class TraceFormatError(ValueError):
    """A job trace that cannot be read: file, line (None for the whole file) and why."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path, self.line, self.message = path, line, message
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace, before it is placed on the calendar.

    `arrival_s` is seconds from the trace origin; `est_runtime_s` is on the reference GPU
    (None for a workload job whose runtime follows from its prompts); `deadline_s` is an
    absolute offset like `arrival_s`, `slack_s` a per-job slack: both None when the trace
    has none (the simulation's --slack then applies).
    """

    arrival_s: float
    gpus: int
    est_runtime_s: float | None
    workload: str | None = None
    prompts: int | None = None
    gpu_mem_gib: float = 0.0
    latency_slo_ms: float | None = None
    deadline_s: float | None = None
    slack_s: float | None = None
    name: str = ""
    tokens: int | None = None
    interruptible: str | None = None  # "checkpoint" | "pause" | None: one piece (issue 30)
    user: str | None = None  # who submitted it (None: the trace does not say)
    account: str | None = None  # the account it is charged to (None: `default`)
    qos: str | None = None  # its quality of service (None: `normal`)


@dataclass
class JobTrace:
    """Jobs sorted by arrival, with where they came from and what was skipped and why."""

    path: str
    fmt: str
    jobs: list[TraceJob]
    origin: datetime | None = None  # the absolute time of offset 0, when the trace has one
    time_unit: str = "s"
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def span_s(self) -> float:
        return self.jobs[-1].arrival_s - self.jobs[0].arrival_s if self.jobs else 0.0


def detect_format(header: list[str]) -> str | None:
    """The trace format a header row belongs to, or None."""
    cols = {c.strip().lower().lstrip("\ufeff") for c in header}
    if {"timestamp", "contexttokens", "generatedtokens"} <= cols:
        return "llm"
    if {"num_gpu", "creation_time"} <= cols:
        return "alibaba"
    if {"arrival_time", "length"} <= cols:
        return "gaia"
    if _pick(cols, _GENERIC["submit"]) and (_pick(cols, _GENERIC["runtime"]) or _pick(cols, _GENERIC["work"])
                                            or _pick(cols, _GENERIC["prompts"])):
        return "generic"
    return None


def read_jobs(
    path: str | Path,
    *,
    fmt: str | None = None,
    time_unit: str | None = None,
    llm_batch_prompts: int = DEFAULT_LLM_BATCH_PROMPTS,
    llm_batch_window_s: float = DEFAULT_LLM_BATCH_WINDOW_S,
    llm_workload: str = DEFAULT_LLM_WORKLOAD,
) -> JobTrace:
    """Read a job trace file in any supported format (detected from the header by default)."""
    name = str(path)
    if fmt is not None and fmt not in FORMATS:
        raise TraceFormatError(name, None, f"unknown trace format {fmt!r}; use one of {', '.join(FORMATS)}")
    if time_unit is not None and time_unit not in TIME_UNITS_S:
        raise TraceFormatError(name, None, f"unknown time unit {time_unit!r}; use s, m or h")
    try:
        text = Path(path).read_text("utf-8-sig")
    except FileNotFoundError:
        raise TraceFormatError(name, None, "no such file") from None
    except IsADirectoryError:
        raise TraceFormatError(name, None, "is a directory, not a CSV file") from None
    except UnicodeDecodeError:
        raise TraceFormatError(name, None, "not UTF-8 text") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise TraceFormatError(name, 1, "empty file") from None
    found = detect_format(header)
    fmt = fmt or found
    if fmt is None:
        raise TraceFormatError(name, 1, "unrecognised header; expected GAIA (arrival_time,length,cpus), "
                                        "Alibaba v2023 (name,...,num_gpu,...,creation_time,...), LLM "
                                        "(TIMESTAMP,ContextTokens,GeneratedTokens) or a generic CSV "
                                        f"with submit_time and runtime_s (got {','.join(header)[:120]!r})")
    cols = [c.strip().lower().lstrip("\ufeff") for c in header]
    rows = _rows(reader, name, len(cols))
    if fmt == "gaia":
        trace = _read_gaia(name, cols, rows, time_unit)
    elif fmt == "alibaba":
        trace = _read_alibaba(name, cols, rows)
    elif fmt == "llm":
        if llm_batch_prompts < 1 or llm_batch_window_s <= 0:
            raise TraceFormatError(name, None, "LLM batches need at least 1 prompt and a positive window")
        trace = _read_llm(name, cols, rows, llm_batch_prompts, llm_batch_window_s, llm_workload)
    else:
        trace = _read_generic(name, cols, rows, time_unit)
    if not trace.jobs:
        raise TraceFormatError(name, None, "no usable jobs in the trace"
                               + (f" (skipped: {_skips(trace.skipped)})" if trace.skipped else ""))
    trace.jobs.sort(key=lambda j: j.arrival_s)
    if trace.skipped:
        log.info("%s: skipped %s", name, _skips(trace.skipped))
    return trace


def _skips(skipped: dict[str, int]) -> str:
    return ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))


def _rows(reader, name: str, ncols: int):
    """(line, record) for each non-empty row, checking the field count."""
    try:
        for record in reader:
            if not record or (len(record) == 1 and not record[0].strip()):
                continue
            if len(record) != ncols:
                raise TraceFormatError(name, reader.line_num, f"expected {ncols} fields, got {len(record)}")
            yield reader.line_num, record
    except csv.Error as e:
        raise TraceFormatError(name, reader.line_num, f"bad CSV: {e}") from None


def _number(text: str, what: str, name: str, line: int, *, minimum: float | None = 0.0) -> float:
    try:
        v = float(text)
    except ValueError:
        raise TraceFormatError(name, line, f"malformed {what} {text!r} (expected a number)") from None
    if not math.isfinite(v):
        raise TraceFormatError(name, line, f"{what} {text!r} is not a finite number")
    if minimum is not None and v < minimum:
        raise TraceFormatError(name, line, f"{what} {text!r} is below {minimum:g}")
    return v


def _count(text: str, what: str, name: str, line: int, *, minimum: int = 1) -> int:
    v = _number(text, what, name, line, minimum=minimum)
    if v != int(v):
        raise TraceFormatError(name, line, f"{what} {text!r} is not a whole number")
    return int(v)


def _read_gaia(name: str, cols: list[str], rows, time_unit: str | None) -> JobTrace:
    i_arr, i_len = cols.index("arrival_time"), cols.index("length")
    i_cpus = cols.index("cpus") if "cpus" in cols else None
    raw: list[tuple[float, float, int]] = []
    for line, r in rows:
        arrival = _number(r[i_arr], "arrival_time", name, line)
        length = _number(r[i_len], "length", name, line)
        if length <= 0:
            raise TraceFormatError(name, line, f"length {r[i_len]!r} must be positive")
        width = _count(r[i_cpus], "cpus", name, line) if i_cpus is not None else 1
        raw.append((arrival, length, width))
    if time_unit is None:
        longest = max((x[1] for x in raw), default=0.0)
        time_unit = "h" if longest < GAIA_MIN_LENGTH_S else "s"
        log.info("%s: GAIA times read as %s (longest job %.4g; use --time-unit to override)",
                 name, {"h": "hours", "s": "seconds"}[time_unit], longest)
    k = TIME_UNITS_S[time_unit]
    jobs = [TraceJob(arrival_s=a * k, gpus=w, est_runtime_s=length * k, name=f"gaia-{i}")
            for i, (a, length, w) in enumerate(raw)]
    return JobTrace(path=name, fmt="gaia", jobs=jobs, time_unit=time_unit)


def _read_alibaba(name: str, cols: list[str], rows) -> JobTrace:
    missing = [c for c in ("num_gpu", "creation_time", "deletion_time", "scheduled_time") if c not in cols]
    if missing:
        raise TraceFormatError(name, 1, f"Alibaba pod list without column(s) {', '.join(missing)}")
    ix = {c: cols.index(c) for c in ALIBABA_COLUMNS if c in cols}
    jobs: list[TraceJob] = []
    skipped: dict[str, int] = {}

    def skip(why: str) -> None:
        skipped[why] = skipped.get(why, 0) + 1

    for line, r in rows:
        gpus = _count(r[ix["num_gpu"]], "num_gpu", name, line, minimum=0)
        if gpus == 0:
            skip("CPU-only pods")
            continue
        created = _number(r[ix["creation_time"]], "creation_time", name, line)
        if not r[ix["scheduled_time"]].strip():
            skip("pods never scheduled")
            continue
        if not r[ix["deletion_time"]].strip():
            skip("pods still running at the trace end")
            continue
        scheduled = _number(r[ix["scheduled_time"]], "scheduled_time", name, line)
        deleted = _number(r[ix["deletion_time"]], "deletion_time", name, line)
        if scheduled < created:
            raise TraceFormatError(name, line, "scheduled_time is before creation_time")
        if deleted <= scheduled:
            skip("pods with no runtime")
            continue
        qos = r[ix["qos"]].strip().upper() if "qos" in ix else ""
        jobs.append(TraceJob(arrival_s=created, gpus=gpus, est_runtime_s=deleted - scheduled,
                             slack_s=0.0 if qos == "LS" else None,
                             name=r[ix["name"]].strip() if "name" in ix else f"pod-{line}"))
    return JobTrace(path=name, fmt="alibaba", jobs=jobs, skipped=skipped)


def _parse_timestamp(text: str, name: str, line: int) -> datetime:
    t = text.strip()
    # Azure writes 7 fractional digits; Python takes at most 6.
    if "." in t:
        head, _, frac = t.partition(".")
        digits = "".join(ch for ch in frac if ch.isdigit())
        rest = frac[len(digits):]
        t = f"{head}.{digits[:6]}{rest}"
    try:
        value = datetime.fromisoformat(t)
    except ValueError:
        raise TraceFormatError(name, line, f"malformed time {text!r} (expected ISO 8601)") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def _read_llm(name: str, cols: list[str], rows, batch_prompts: int, window_s: float,
              workload: str) -> JobTrace:
    i_t, i_ctx, i_gen = cols.index("timestamp"), cols.index("contexttokens"), cols.index("generatedtokens")
    requests: list[tuple[datetime, int]] = []
    for line, r in rows:
        at = _parse_timestamp(r[i_t], name, line)
        tokens = _count(r[i_ctx], "ContextTokens", name, line, minimum=0) + \
            _count(r[i_gen], "GeneratedTokens", name, line, minimum=0)
        requests.append((at, tokens))
    requests.sort(key=lambda x: x[0])
    if not requests:
        return JobTrace(path=name, fmt="llm", jobs=[])
    origin = requests[0][0]
    jobs: list[TraceJob] = []
    batch: list[tuple[datetime, int]] = []

    def flush() -> None:
        last = batch[-1][0]
        jobs.append(TraceJob(arrival_s=(last - origin).total_seconds(), gpus=1, est_runtime_s=None,
                             workload=workload, prompts=len(batch), name=f"llm-batch-{len(jobs) + 1}",
                             tokens=sum(t for _, t in batch)))
        batch.clear()

    for req in requests:
        if batch and (len(batch) >= batch_prompts or (req[0] - batch[0][0]).total_seconds() > window_s):
            flush()
        batch.append(req)
    flush()
    return JobTrace(path=name, fmt="llm", jobs=jobs, origin=origin)


_GENERIC = {
    "submit": ("submit_time", "submit", "submitted_at", "arrival", "arrival_time", "time"),
    "gpus": ("gpus", "num_gpu", "gpu_count"),
    "runtime": ("runtime_s", "runtime", "duration_s", "duration", "est_runtime_s"),
    "work": ("work_gpu_h", "gpu_hours"),
    "workload": ("workload", "class", "workload_class"),
    "prompts": ("prompts",),
    "deadline": ("deadline",),
    "slack": ("slack", "slack_s"),
    "memory": ("gpu_mem_gib", "memory_gib", "mem_gib"),
    "slo": ("latency_slo_ms",),
    "name": ("name", "id"),
    "interruptible": ("interruptible", "interrupt"),
    "user": ("user", "user_name", "username"),
    "account": ("account",),
    "qos": ("qos",),
}


def _pick(cols, names: tuple[str, ...]) -> str | None:
    for n in names:
        if n in cols:
            return n
    return None


def _duration(text: str, what: str, name: str, line: int) -> float:
    from scheduler.timeparse import parse_duration

    try:
        return parse_duration(text)
    except ValueError as e:
        raise TraceFormatError(name, line, f"{what}: {e}") from None


def _read_generic(name: str, cols: list[str], rows, time_unit: str | None) -> JobTrace:
    ix = {key: cols.index(c) for key, names in _GENERIC.items() if (c := _pick(cols, names))}
    if "submit" not in ix:
        raise TraceFormatError(name, 1, "generic trace without a submit_time column")
    unit_s = TIME_UNITS_S[time_unit or "s"]
    parsed: list[tuple[datetime | float, TraceJob, datetime | float | None]] = []
    for line, r in rows:
        def get(key: str) -> str:
            return r[ix[key]].strip() if key in ix else ""

        submit = _time_or_offset(get("submit"), unit_s, "submit_time", name, line)
        gpus = _count(get("gpus"), "gpus", name, line) if get("gpus") else 1
        runtime = None
        if get("runtime"):
            runtime = _duration(get("runtime"), "runtime", name, line)
        elif get("work"):
            runtime = _number(get("work"), "work_gpu_h", name, line) * 3600.0 / gpus
        workload = get("workload") or None
        prompts = _count(get("prompts"), "prompts", name, line) if get("prompts") else None
        if runtime is None and not (workload and prompts):
            raise TraceFormatError(name, line, "a job needs runtime_s, work_gpu_h, or workload and prompts")
        if runtime is not None and runtime <= 0:
            raise TraceFormatError(name, line, "runtime must be positive")
        deadline = _time_or_offset(get("deadline"), unit_s, "deadline", name, line) if get("deadline") else None
        slack = _duration(get("slack"), "slack", name, line) if get("slack") else None
        cut = get("interruptible").lower() or None
        if cut in ("none", "no", "false", "0", "-"):
            cut = None
        if cut not in (None, "checkpoint", "pause"):
            raise TraceFormatError(name, line, f"interruptible: checkpoint, pause or empty, got {cut!r}")
        job = TraceJob(
            arrival_s=0.0, gpus=gpus, est_runtime_s=runtime, workload=workload, prompts=prompts,
            gpu_mem_gib=_number(get("memory"), "gpu_mem_gib", name, line) if get("memory") else 0.0,
            latency_slo_ms=_number(get("slo"), "latency_slo_ms", name, line) if get("slo") else None,
            slack_s=slack, name=get("name") or f"job-{line - 1}", interruptible=cut,
            user=get("user") or None, account=_tenant_name(get("account"), "account", name, line),
            qos=_tenant_name(get("qos").lower(), "qos", name, line))
        parsed.append((submit, job, deadline))
    if not parsed:
        return JobTrace(path=name, fmt="generic", jobs=[])
    kinds = {isinstance(s, datetime) for s, _, _ in parsed} | {isinstance(d, datetime) for _, _, d in parsed
                                                               if d is not None}
    if len(kinds) > 1:
        raise TraceFormatError(name, None, "submit times and deadlines mix ISO times and offsets; use one kind")
    origin = min(s for s, _, _ in parsed) if isinstance(parsed[0][0], datetime) else None

    def offset(t: datetime | float) -> float:
        return (t - origin).total_seconds() if origin is not None else float(t)

    jobs = []
    for submit, job, deadline in parsed:
        arrival = offset(submit)
        d = offset(deadline) if deadline is not None else None
        if d is not None and d <= arrival:
            raise TraceFormatError(name, None, f"job {job.name}: deadline is not after its submit time")
        jobs.append(replace(job, arrival_s=arrival, deadline_s=d))
    return JobTrace(path=name, fmt="generic", jobs=jobs, origin=origin, time_unit=time_unit or "s")


def _tenant_name(text: str, what: str, name: str, line: int) -> str | None:
    """An account or QOS name of a trace row (None where empty): letters, digits and `._-`,
    accounts nested by `/` (e.g. research/nlp)."""
    if not text:
        return None
    allowed = "/._-" if what == "account" else "._-"
    if not all(c.isalnum() or c in allowed for c in text) or text.startswith("/") or text.endswith("/") \
            or "//" in text:
        raise TraceFormatError(name, line, f"{what}: {text!r} is not a name (letters, digits, {allowed})")
    return text


def _time_or_offset(text: str, unit_s: float, what: str, name: str, line: int) -> datetime | float:
    if not text:
        raise TraceFormatError(name, line, f"empty {what}")
    try:
        return float(text) * unit_s
    except ValueError:
        return _parse_timestamp(text, name, line)


def clamp_widths(trace: JobTrace, max_gpus: int) -> int:
    """Cap job widths at `max_gpus` (the widest one-node job); return how many were capped.

    Jobs never span nodes here, as in the daemon. A capped job keeps its GPU-hours (its
    runtime grows by the same factor), so the work and energy of the trace are preserved.
    """
    capped = 0
    for i, job in enumerate(trace.jobs):
        if job.gpus > max_gpus:
            factor = job.gpus / max_gpus
            runtime = job.est_runtime_s * factor if job.est_runtime_s is not None else None
            trace.jobs[i] = replace(job, gpus=max_gpus, est_runtime_s=runtime)
            capped += 1
    return capped


def shift_origin(trace: JobTrace, start: datetime | None, carbon_start: datetime) -> datetime:
    """The absolute time of the trace's offset 0.

    `start` (the --start option) aligns the first arrival with that date. Without it a trace
    with its own dates keeps them; one with only offsets starts at the carbon data's start.
    """
    first = trace.jobs[0].arrival_s if trace.jobs else 0.0
    if start is not None:
        return start - timedelta(seconds=first)
    if trace.origin is not None:
        return trace.origin
    return carbon_start - timedelta(seconds=first)
