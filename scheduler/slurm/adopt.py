"""Adopting users' own `sbatch` jobs: a job submitted held (`sbatch --hold`) into a
carbon-aware partition with a comment that starts with `carbonsched` becomes a carbonsched
job (PENDING, then planned like any other); the agent then places it with `scontrol update`
and releases it at its planned start. Its Slurm job id is kept in `jobs.slurm_job_id`
(unique: two agents sweeping at once never adopt one job twice).

    sbatch --hold -p carbon --gres=gpu:1 --time=30 \\
        --comment="carbonsched deadline=6h workload=llm-inference prompts=5000 est-runtime=20m" job.sh
"""

from __future__ import annotations

import grp
import logging
import pwd
from datetime import datetime

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from scheduler.accounts import AccountError, charge_account, read_associations
from scheduler.job_specs import parse_gpu_mem_gib
from scheduler.jobs.store import adopted_waiting, ended_here, insert_job, known_slurm_ids
from scheduler.lifecycle import State, transition
from scheduler.slurm.commands import SlurmCommands, SlurmError
from scheduler.slurm.config import SlurmConfig
from scheduler.slurm.jobs import SlurmJob, adoption_request, requested_gpus
from scheduler.store import Store
from scheduler.timeparse import parse_duration, parse_time

log = logging.getLogger(__name__)

# est-runtime given, no --time: the limit is this many times the estimate (as submit's default).
TIME_LIMIT_FACTOR = 2.0


class AdoptionError(ValueError):
    """A held job's carbonsched comment that cannot be read."""


def job_row(sj: SlurmJob, now: datetime) -> dict:
    """The carbonsched job a held Slurm job becomes (ValueError on unreadable hints)."""
    hints = adoption_request(sj.comment) or {}
    unknown = set(hints) - {"deadline", "workload", "prompts", "tokens", "est-runtime", "gpu-mem", "slo-ms"}
    if unknown:
        raise AdoptionError(f"unknown word(s) {', '.join(sorted(unknown))}")
    try:
        est = parse_duration(hints["est-runtime"]) if "est-runtime" in hints else None
        deadline = None
        if "deadline" in hints:
            base = sj.submit_time or now
            deadline = parse_time(hints["deadline"], base)
        prompts = int(hints["prompts"]) if "prompts" in hints else None
        tokens = int(hints["tokens"]) if "tokens" in hints else None
        mem = parse_gpu_mem_gib(hints.get("gpu-mem", "0"))
        slo = float(hints["slo-ms"]) if "slo-ms" in hints else None
    except (ValueError, KeyError) as e:
        raise AdoptionError(str(e)) from None
    limit = sj.time_limit_min * 60.0 if sj.time_limit_min else (est * TIME_LIMIT_FACTOR if est else None)
    try:
        groups = [g.gr_gid for g in grp.getgrall() if sj.user_name in g.gr_mem]
    except KeyError:
        groups = []
    try:
        owner = pwd.getpwuid(sj.user_id).pw_name
    except KeyError:
        owner = sj.user_name or str(sj.user_id)
    return dict(
        name=(sj.name or f"slurm-{sj.job_id}")[:255], state=State.PENDING.value,
        reason=f"adopted from Slurm job {sj.job_id}; waiting for the planner",
        owner_uid=sj.user_id, owner_gid=sj.group_id, owner_groups=groups, owner_name=owner,
        argv=[f"slurm:{sj.job_id}"], cwd=sj.cwd or "/", env={},
        gpus=max(1, requested_gpus(sj.tres_per_node)), gpu_mem_gib=mem, deadline=deadline,
        latency_slo_ms=slo, workload=hints.get("workload"), prompts=prompts, tokens=tokens,
        est_runtime_s=est, time_limit_s=limit, time_limit_factor=None, max_retries=0, attempts=0,
        submitted_at=now, plan_rev=0, slurm_job_id=sj.job_id)


def slurm_account(conn: Connection, sj: SlurmJob, owner: str) -> str:
    """The account a user's own Slurm job is charged to here (adopted or observed): its
    Slurm account where carbonsched has that account and the user in it, else the user's
    default (`charge_account`), so fair share counts the work where Slurm does."""
    snapshot = read_associations(conn)
    try:
        return charge_account(snapshot, owner, sj.account or None)
    except AccountError:
        return charge_account(snapshot, owner, None)


def observed_row(sj: SlurmJob, now: datetime) -> dict:
    """The carbonsched job a Slurm GPU job from outside carbonsched becomes once seen running
    (for its receipt): no hints, its Slurm limit, no retries."""
    row = job_row(SlurmJob(**{**sj.__dict__, "comment": "carbonsched"}), now)
    row.update(reason=f"observed running in Slurm (job {sj.job_id}); not planned by carbonsched",
               submitted_at=sj.submit_time or now)
    return row


def adopt_held(store: Store, slurm_jobs: list[SlurmJob], config: SlurmConfig, now: datetime,
               *, refused: set[int] | None = None) -> list[int]:
    """Make carbonsched jobs of the held, carbonsched-commented jobs in the configured
    partitions that are not adopted yet. Returns the new carbonsched job ids."""
    candidates = [j for j in slurm_jobs if j.held and j.partition in config.partitions
                  and j.carbonsched_id is None and adoption_request(j.comment) is not None
                  and j.job_id not in (refused or set())]
    if not candidates:
        return []
    with store.read() as conn:
        known = known_slurm_ids(conn, [j.job_id for j in candidates])
    new: list[int] = []
    for sj in candidates:
        if sj.job_id in known:
            continue
        try:
            row = job_row(sj, now)
        except AdoptionError as e:
            log.warning("Slurm job %s is not adopted: its comment %r cannot be read (%s); it stays held",
                        sj.job_id, sj.comment, e)
            if refused is not None:
                refused.add(sj.job_id)
            continue

        def tx(conn: Connection, row=row, sj=sj) -> int:
            return insert_job(conn, {**row, "account": slurm_account(conn, sj, row["owner_name"])},
                              row["owner_uid"], now)

        try:
            job_id = store.transact(tx)
        except IntegrityError:
            continue  # another agent adopted it first
        log.info("adopted Slurm job %s (%s, uid %s) as carbonsched job %s", sj.job_id, sj.name,
                 sj.user_id, job_id)
        new.append(job_id)
    return new


def follow_adopted(store: Store, slurm: SlurmCommands, slurm_jobs: list[SlurmJob]) -> int:
    """Keep adopted jobs that are not placed yet in step with Slurm, both ways: cancelled in
    Slurm -> CANCELLED here; cancelled (or failed) here while still held -> scancel there.
    Returns how many jobs changed."""
    by_id = {j.job_id: j for j in slurm_jobs}
    held_ids = [j.job_id for j in slurm_jobs if j.held]
    with store.read() as conn:
        waiting = adopted_waiting(conn)
        to_scancel = ended_here(conn, held_ids)
    changed = 0
    for job_id, slurm_id in waiting:
        sj = by_id.get(slurm_id)
        if sj is not None and sj.active:
            continue
        why = (f"Slurm job {slurm_id} ended {sj.state} before carbonsched placed it (scancel?)"
               if sj is not None else f"Slurm no longer knows job {slurm_id}")
        if store.transact(lambda conn, job_id=job_id, why=why: transition(
                conn, job_id, State.CANCELLED, actor_uid=None, reason=why,
                expect=(State.PENDING, State.PLANNED))):
            log.info("job %s: %s", job_id, why)
            changed += 1
    for job_id, slurm_id in to_scancel:
        try:
            slurm.run(["scancel", str(slurm_id)])
            log.info("job %s ended here before it was placed: cancelled its held Slurm job %s",
                     job_id, slurm_id)
            changed += 1
        except SlurmError as e:
            log.error("job %s: scancel of its held Slurm job %s failed: %s", job_id, slurm_id, e)
    return changed
