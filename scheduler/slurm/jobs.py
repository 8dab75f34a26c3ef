"""Slurm's jobs as carbonsched reads them (`squeue --json`), and what their states mean.

A carbonsched job handed to Slurm carries `--comment=carbonsched:ID` (`#N` added for the
N-th attempt of a retried job), so a restarted agent finds it again instead of submitting
twice. A user's own `sbatch` job asks to be planned by a comment that starts with
`carbonsched` and holds `key=value` words (see `adoption_request`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from scheduler.slurm.commands import SlurmCommands

COMMENT_RE = re.compile(r"^carbonsched:(\d+)(?:#(\d+))?$")

# Slurm states in which the job is still Slurm's to run (queued, starting, running, stopping).
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                           "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING",
                           "STAGE_OUT", "SPECIAL_EXIT"})
# Ended with no word from the job itself: the node or its boot failed, or it was preempted.
# carbonsched calls these LOST (re-queued while the job's retries last).
LOST_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL", "PREEMPTED"})
HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    state: str
    reason: str
    comment: str
    user_id: int
    group_id: int
    user_name: str
    partition: str
    name: str
    nodes: str
    cwd: str
    tres_per_node: str
    time_limit_min: int | None
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    exit_status: int  # the wait status: exit code << 8 | signal
    gpu_idx: tuple[int, ...] = field(default=())
    account: str = ""
    qos: str = ""

    @property
    def held(self) -> bool:
        return self.state == "PENDING" and self.reason in HELD_REASONS

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def exit_code(self) -> int:
        return (self.exit_status >> 8) & 0xFF

    @property
    def signal(self) -> int:
        return self.exit_status & 0x7F

    @property
    def carbonsched_id(self) -> int | None:
        m = COMMENT_RE.match(self.comment)
        return int(m.group(1)) if m else None

    @property
    def carbonsched_attempt(self) -> int | None:
        m = COMMENT_RE.match(self.comment)
        return (int(m.group(2)) if m.group(2) else 1) if m else None


def comment_for(job_id: int, attempt: int) -> str:
    """The comment that names a carbonsched job's Slurm job (one per attempt)."""
    return f"carbonsched:{job_id}" if attempt <= 1 else f"carbonsched:{job_id}#{attempt}"


def _time(value) -> datetime | None:
    if not value:
        return None
    return datetime.fromtimestamp(int(value), timezone.utc)


def gres_indices(details: list[str] | None) -> tuple[int, ...]:
    """GPU indices from squeue's gres_detail, e.g. ['gpu:h100:2(IDX:0,2-3)'] -> (0, 2, 3)."""
    out: list[int] = []
    for d in details or []:
        m = re.search(r"IDX:([0-9,\-]+)", d)
        if not m:
            continue
        for part in m.group(1).split(","):
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(set(out)))


def parse_job(raw: dict) -> SlurmJob:
    """One job of `squeue --json` (Slurm 22.05's field names)."""
    limit = raw.get("time_limit")
    return SlurmJob(
        job_id=int(raw["job_id"]), state=str(raw.get("job_state") or ""),
        reason=str(raw.get("state_reason") or ""), comment=str(raw.get("comment") or "").strip(),
        user_id=int(raw.get("user_id", -1)), group_id=int(raw.get("group_id", -1)),
        user_name=str(raw.get("user_name") or ""), partition=str(raw.get("partition") or ""),
        name=str(raw.get("name") or ""), nodes=str(raw.get("nodes") or ""),
        cwd=str(raw.get("current_working_directory") or "/"),
        tres_per_node=str(raw.get("tres_per_node") or ""),
        time_limit_min=int(limit) if isinstance(limit, int) else None,
        submit_time=_time(raw.get("submit_time")), start_time=_time(raw.get("start_time")),
        end_time=_time(raw.get("end_time")), exit_status=int(raw.get("exit_code") or 0),
        gpu_idx=gres_indices(raw.get("gres_detail")),
        account=str(raw.get("account") or ""), qos=str(raw.get("qos") or ""))


def list_jobs(slurm: SlurmCommands) -> list[SlurmJob]:
    """Every job slurmctld remembers (running, queued, and ended within MinJobAge)."""
    return [parse_job(j) for j in slurm.json(["squeue", "--json"]).get("jobs", [])]


def requested_gpus(tres_per_node: str) -> int:
    """GPUs per node a job asked for: 'gres:gpu:2', 'gres:gpu:h100:1', 'gres/gpu=2' -> n."""
    m = re.search(r"gres[:/]gpu(?::[A-Za-z0-9_.\-]+)?[:=](\d+)", tres_per_node)
    if m:
        return int(m.group(1))
    return 1 if re.search(r"gres[:/]gpu\b", tres_per_node) else 0


def adoption_request(comment: str) -> dict[str, str] | None:
    """The planning hints of a user's own sbatch job, or None when it asks for none.

    `--comment="carbonsched deadline=6h workload=llm-inference prompts=5000 est-runtime=20m"`
    -> {"deadline": "6h", "workload": "llm-inference", ...}. A bare `carbonsched` asks for
    planning with the defaults.
    """
    words = comment.split()
    if not words or words[0] != "carbonsched":
        return None
    hints: dict[str, str] = {}
    for w in words[1:]:
        key, sep, value = w.partition("=")
        if sep:
            hints[key.strip().lower().replace("_", "-")] = value.strip()
    return hints
