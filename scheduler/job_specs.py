"""The Slurm-style job options carbonsched takes (issue 28), parsed in one place for the CLI
(to refuse a mistake before anything is sent) and the API edge (which trusts no client):

- `--dependency=afterok:12[:13][,afterany:14][,afternotok:15]`: wait until those jobs ended
  COMPLETED (afterok), ended at all (afterany) or ended otherwise (afternotok). Several
  conditions separated by `,` must all hold (Slurm's `?`, "any of", is not supported).
- `--array 0-99%8`, `1,3,5`, `0-20:5`: one job per index, at most `%N` active at once.
- `--output` / `--error` patterns: `%j` job id, `%A` array id, `%a` array index, `%u` user, `%%`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scheduler.lifecycle import TERMINAL, State

DEPENDENCY_KINDS = ("afterok", "afterany", "afternotok")

# Why a job the planner leaves alone waits, as `queue`'s REASON says it (squeue's word in
# brackets); the planner stores them each tick, `submit --hold` at once.
HELD_REASON = "held (JobHeldUser): `carbonsched release` plans it"
OPERATOR_HELD_REASON = "held by an operator (JobHeldAdmin): only an operator's `carbonsched release` plans it"
BEGIN_REASON = "before its --begin time (BeginTime)"
# Whose work a queued job waits behind (squeue's words, the last words of its REASON): jobs of
# a higher priority, or running jobs and jobs of its own priority (scheduler.daemon.wait_reasons).
PRIORITY_WORD, RESOURCES_WORD = "Priority", "Resources"


def wait_word(reason: str | None) -> str | None:
    """The word a REASON ends with in brackets, `Priority` or `Resources`; None: neither."""
    if reason:
        for word in (PRIORITY_WORD, RESOURCES_WORD):
            if reason.endswith(f"({word})"):
                return word
    return None


MAX_ARRAY_TASKS = 1000  # Slurm's default MaxArraySize is 1001 (indices 0-1000)
MAX_ARRAY_INDEX = 100_000
MAX_DEPENDENCIES = 64


@dataclass(frozen=True)
class Dependency:
    kind: str
    job_id: int

    def text(self) -> str:
        return f"{self.kind}:{self.job_id}"


def parse_dependency(text: str) -> list[Dependency]:
    """`afterok:12:13,afterany:14` -> [Dependency('afterok', 12), ...]; ValueError otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("empty --dependency; e.g. afterok:12 (also afterany, afternotok)")
    if "?" in text:
        raise ValueError("--dependency with '?' (any of) is not supported; separate conditions with ','")
    out: list[Dependency] = []
    for part in text.strip().split(","):
        kind, _, ids = part.strip().partition(":")
        if kind not in DEPENDENCY_KINDS:
            raise ValueError(f"--dependency {part.strip()!r}: use {', '.join(DEPENDENCY_KINDS)} "
                             "followed by :JOB[:JOB...]")
        if not ids:
            raise ValueError(f"--dependency {part.strip()!r}: no job id after {kind}:")
        for j in ids.split(":"):
            if not j.isdigit() or not 1 <= int(j) < 2**63:
                raise ValueError(f"--dependency {part.strip()!r}: {j!r} is not a job id")
            dep = Dependency(kind, int(j))
            if dep not in out:
                out.append(dep)
    if len(out) > MAX_DEPENDENCIES:
        raise ValueError(f"--dependency names {len(out)} jobs; at most {MAX_DEPENDENCIES}")
    return out


ENDED_STATES = frozenset(s.value for s in TERMINAL)
NEVER_SATISFIED_REASON = "(DependencyNeverSatisfied): it can only be cancelled"


def never_satisfied(dep: Dependency, state: str) -> bool:
    """Whether `dep` can never hold, its job having ended in `state`: afterok on a job that
    ended otherwise than COMPLETED, afternotok on one that COMPLETED."""
    if state not in ENDED_STATES:
        return False
    if dep.kind == "afterok":
        return state != State.COMPLETED.value
    return dep.kind == "afternotok" and state == State.COMPLETED.value


def dependency_text(deps: list[Dependency]) -> str:
    """The canonical text: kinds grouped in order of first appearance, `afterok:12:13,afterany:14`."""
    groups: dict[str, list[int]] = {}
    for d in deps:
        groups.setdefault(d.kind, []).append(d.job_id)
    return ",".join(f"{k}:" + ":".join(map(str, ids)) for k, ids in groups.items())


_MEM_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([KMGT])(?:I?B)?|B)?\s*$", re.IGNORECASE)
_MEM_GIB = {None: 1.0, "K": 1.0 / 1024 ** 2, "M": 1.0 / 1024, "G": 1.0, "T": 1024.0}


def parse_gpu_mem_gib(text: str) -> float:
    """GPU memory per GPU in GiB, as `--gpu-mem` and Slurm's `--mem` take it: a number is GiB,
    or with a unit K, M, G, T (also KB/KiB, MB/MiB, GB/GiB, TB/TiB; powers of 1024, as Slurm
    counts): `80`, `80G`, `80GB`, `81920M`. ValueError with an example otherwise. GB and GiB
    are one here on purpose: a data sheet's "80GB" is the card's nominal size, which
    `--gpu-mem 80` already matches."""
    m = _MEM_RE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a memory size; e.g. 80, 80GB or 40960M")
    gib = float(m.group(1)) * _MEM_GIB[m.group(2).upper() if m.group(2) else None]
    if gib > 100_000:
        raise ValueError(f"{text!r} is more GPU memory than any GPU has")
    return gib


@dataclass(frozen=True)
class ArraySpec:
    indices: tuple[int, ...]
    max_running: int | None

    def text(self) -> str:
        return _ranges(self.indices) + (f"%{self.max_running}" if self.max_running else "")


def parse_array(text: str) -> ArraySpec:
    """`0-99%8`, `1,3,5`, `0-20:5` (step) -> the indices and the throttle; ValueError otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("empty --array; e.g. 0-99 or 0-99%8 (at most 8 running at once)")
    body, pct, limit = text.strip().partition("%")
    max_running = None
    if pct:
        if not limit.isdigit() or int(limit) < 1:
            raise ValueError(f"--array {text!r}: %N must be a whole number of at least 1")
        max_running = int(limit)
    indices: list[int] = []
    for part in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part.strip())
        if not m:
            raise ValueError(f"--array {text!r}: {part.strip()!r} is not N, N-M or N-M:STEP")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if hi < lo or step < 1:
            raise ValueError(f"--array {text!r}: {part.strip()!r} is an empty range")
        if hi > MAX_ARRAY_INDEX:
            raise ValueError(f"--array {text!r}: indices go up to {MAX_ARRAY_INDEX}")
        if (hi - lo) // step + 1 + len(indices) > MAX_ARRAY_TASKS:
            raise ValueError(f"--array {text!r}: at most {MAX_ARRAY_TASKS} tasks in one array")
        indices.extend(range(lo, hi + 1, step))
    unique = tuple(sorted(set(indices)))
    return ArraySpec(unique, max_running)


def _ranges(indices: tuple[int, ...]) -> str:
    parts, start, prev = [], None, None
    for i in indices:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            parts.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = i
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(parts)


_PATTERN = re.compile(r"%(.)")


def check_log_pattern(text: str, flag: str) -> str:
    """An --output/--error pattern: an absolute path (the CLI makes it so) without NULs, with
    only the known % escapes; ValueError otherwise."""
    if not isinstance(text, str) or not text.startswith("/") or "\x00" in text or len(text) > 4096:
        raise ValueError(f"{flag} must be an absolute path (got {text!r})")
    for m in _PATTERN.finditer(text.replace("%%", "")):
        if m.group(1) not in "jAau":
            raise ValueError(f"{flag} {text!r}: unknown %{m.group(1)} (known: %j job id, %A array id, "
                             "%a array index, %u user, %% a percent sign)")
    return text


def expand_log_pattern(text: str, *, job_id: int, user: str, array_job_id: int | None = None,
                       array_task_id: int | None = None) -> str:
    """The path a job's --output/--error pattern names, as Slurm's sbatch expands it."""
    values = {"j": str(job_id), "u": user, "A": str(array_job_id if array_job_id is not None else job_id),
              "a": str(array_task_id) if array_task_id is not None else "4294967294", "%": "%"}
    return _PATTERN.sub(lambda m: values.get(m.group(1), m.group(0)), text)
