"""The JSON shape of a job, and a fast path for listing thousands of them.

`queue --json` over 10,000 jobs must answer in well under half a second, so listings read
only the columns they show, take timestamps and JSON columns as the database's raw text
where that is cheaper (SQLite), and build each object from a plain tuple: the SELECT is
`scheduler.jobs.views.job_select`, and `jobs_json` unpacks its LISTED_COLUMNS in order.
The JSON object's key order is the one `jobs_json` writes; add keys freely, never rename
(DESIGN.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timezone

from sqlalchemy import Connection, select

from scheduler import interruptible
from scheduler.store.models import gpus, job_segments


def gpu_map(conn: Connection) -> dict[int, tuple[int, str]]:
    """GPU id -> (node-local index, model), to show jobs' GPUs as their owners see them."""
    return {r.id: (r.index, r.model) for r in conn.execute(select(gpus.c.id, gpus.c.index, gpus.c.model))}


def _iso_raw(value) -> str | None:
    """ISO 8601 UTC from SQLite's stored 'YYYY-MM-DD HH:MM:SS[.ffffff]' or an aware datetime."""
    if value is None:
        return None
    if isinstance(value, str):
        return f"{value[:10]}T{value[11:19]}Z"
    return value.isoformat()[:19] + "Z"  # the engine keeps sessions in UTC


def _seconds_raw(start, end) -> float | None:
    """Seconds from `start` to `end` as stored (SQLite's text or an aware datetime), to the
    microsecond: the times in the JSON are whole seconds."""
    if start is None or end is None:
        return None
    a, b = (datetime.fromisoformat(v) if isinstance(v, str) else v for v in (start, end))
    if (a.tzinfo is None) != (b.tzinfo is None):
        a, b = a.replace(tzinfo=None), b.replace(tzinfo=None)
    return (b - a).total_seconds()


def _json_raw(value):
    if value is None or not isinstance(value, str):
        return value
    return json.loads(value)


def _per(gco2: float | None, prompts: int | None) -> float | None:
    return gco2 / prompts if gco2 is not None and prompts else None


def _segments_iso(data) -> list[list[str]] | None:
    if not data:
        return None
    return [[_iso_raw(datetime.fromisoformat(a)), _iso_raw(datetime.fromisoformat(b))] for a, b in data]


def _paused_until(state: str, kind: str | None, data) -> str | None:
    """When a RUNNING pause job that its plan has stopped now is continued (else null)."""
    if state != "RUNNING" or kind != interruptible.PAUSE or not data:
        return None
    until = interruptible.paused_until(interruptible.segments_from_json(data), datetime.now(timezone.utc))
    return _iso_raw(until)


def jobs_json(rows: Iterable, gpus_by_id: dict[int, tuple[int, str]]) -> list[dict]:
    """Job objects from rows of `scheduler.jobs.views.job_select` (its LISTED_COLUMNS, in order)."""
    out = []
    for (id_, name, state, reason, owner, owner_uid, gpu_ids, planned_gpu_ids, n_gpus, mem, node,
         planned_node, submitted, planned_start, started, ended, deadline, est, limit, slo,
         workload, prompts, exit_code, energy, method, gco2, est_energy, est_gco2, explanation,
         attempts, argv, cwd, cancel_at, max_delay, est_gco2_now, est_runtime_planned, binding,
         deadline_miss, limit_factor, tokens, reported_prompts, reported_in, reported_out, ttft_slo, tpot_slo,
         max_batch, precision, tp, held_at, begin_at, dependency, array_id, array_task, array_max,
         stdout_path, stderr_path, planned_limit_w, limit_w, limit_note, unc_energy, unc_gco2,
         unc_runtime, kind, ck_signal, ck_grace, min_run, resume_cost, max_segments, done_fraction,
         resume_count, ignored, first_started, planned_segments, interrupt_at, resume_at, hold_kind,
         held_by, output_cut, purged_at, account, qos, gpu_fraction, mig_profile, gpu_instance) in rows:
        assigned = _json_raw(gpu_ids) or _json_raw(planned_gpu_ids)
        first = gpus_by_id.get(assigned[0]) if assigned else None
        out.append({
            "id": id_, "name": name, "state": state, "reason": reason,
            "owner": owner, "owner_uid": owner_uid,
            "gpus": [gpus_by_id[g][0] if g in gpus_by_id else g for g in assigned] if assigned else None,
            "gpu_model": first[1] if first else None,
            "gpus_requested": n_gpus, "gpu_mem_gib": mem,
            "node": node or planned_node,
            "submitted_at": _iso_raw(submitted), "planned_start": _iso_raw(planned_start),
            "started_at": _iso_raw(started), "ended_at": _iso_raw(ended),
            "runtime_s": _seconds_raw(started, ended),
            "deadline": _iso_raw(deadline), "est_runtime_s": est, "time_limit_s": limit,
            "latency_slo_ms": slo, "workload": workload, "prompts": prompts,
            "exit_code": exit_code, "energy_j": energy, "energy_method": method, "gco2": gco2,
            "est_energy_j": est_energy, "est_gco2": est_gco2, "explanation": explanation,
            "attempts": attempts, "argv": _json_raw(argv), "cwd": cwd,
            "cancel_requested": cancel_at is not None,
            # The plan's estimate: on its chosen GPUs and start, and the "if run now"
            # counterfactual (policies.pricing.counterfactual); per prompt where the job gave a prompt
            # count. time_limit_factor: the time limit is derived (runtime on the planned GPUs x
            # this); null: an explicit --time-limit (or none).
            "max_delay_s": max_delay, "est_runtime_planned_s": est_runtime_planned,
            "est_gco2_per_prompt": _per(est_gco2, prompts),
            "est_gco2_if_now": est_gco2_now, "est_gco2_if_now_per_prompt": _per(est_gco2_now, prompts),
            "binding": binding, "deadline_miss": bool(deadline_miss),
            "time_limit_factor": limit_factor,
            # Work done: declared at submit (`prompts`, `tokens`: output tokens) and what the
            # job reported in its metrics file (null: not reported). The measured gCO2 per
            # prompt divides by the reported count where there is one, and says which it used.
            "tokens": tokens, "reported_prompts": reported_prompts,
            "reported_input_tokens": reported_in, "reported_output_tokens": reported_out,
            "gco2_per_prompt": _per(gco2, reported_prompts if reported_prompts is not None else prompts),
            "prompts_source": ("reported" if reported_prompts is not None
                               else "declared" if prompts is not None else None),
            # Latency limits (p95, ms; null: the workload preset's default) and the operating
            # point planned on the chosen GPUs (null: no performance-model workload); why it
            # was chosen is in `explanation`.
            "ttft_slo_ms": ttft_slo, "tpot_slo_ms": tpot_slo,
            "operating_point": ({"max_batch": max_batch, "precision": precision, "tp": tp}
                                if max_batch is not None else None),
            # Slurm habits (issue 28): held (not planned until released), not planned before
            # begin_at, waiting on `dependency` ("afterok:12,afterany:13"), a task of array
            # `array_job_id` with index `array_task_id` (at most `array_max_running` active),
            # and where --output/--error send its stdout/stderr (null: carbonsched's own log).
            "held": held_at is not None, "held_at": _iso_raw(held_at), "begin_at": _iso_raw(begin_at),
            # who holds it (issue 48): "user" (its owner: `release` plans it), "operator" (root or
            # an admin group: only an operator releases it, Slurm's admin hold); null: not held
            "hold": (hold_kind or "user") if held_at is not None else None, "held_by": held_by,
            "dependency": dependency, "array_job_id": array_id, "array_task_id": array_task,
            "array_max_running": array_max, "stdout_path": stdout_path, "stderr_path": stderr_path,
            # The GPU power limit (issue 29): what the plan chose (W per GPU; null: the
            # default), what the agent applied (null: ran at the default) and why not, and
            # the plan's estimate at the default limit beside est_energy_j / est_gco2.
            "planned_power_limit_w": planned_limit_w, "power_limit_w": limit_w,
            "power_limit_note": limit_note, "est_uncapped_energy_j": unc_energy,
            "est_uncapped_gco2": unc_gco2, "est_uncapped_runtime_s": unc_runtime,
            # Interruptible jobs (issue 30): the kind (checkpoint | pause; null: one piece) and
            # its knobs; progress across segments (done_fraction of the whole, resume_count
            # segments run); the plan's segments [[start, end], ...] (null: one piece), when
            # the job is asked to checkpoint (planned_interrupt_at) and when it goes on
            # (planned_resume_at), and, for a pause job stopped now, when it continues.
            "interruptible": kind, "checkpoint_signal": ck_signal, "checkpoint_grace_s": ck_grace,
            "min_run_s": min_run, "resume_cost_s": resume_cost, "max_segments": max_segments,
            "done_fraction": done_fraction, "resume_count": resume_count, "checkpoints_ignored": ignored,
            "first_started_at": _iso_raw(first_started),
            "planned_segments": _segments_iso(_json_raw(planned_segments)),
            "planned_interrupt_at": _iso_raw(interrupt_at), "planned_resume_at": _iso_raw(resume_at),
            "paused_until": _paused_until(state, kind, _json_raw(planned_segments)),
            # Storage limits (issue 48): the streams cut at the job's output limit (null: none),
            # and when the finished job's command, environment and output were purged.
            "output_truncated": output_truncated_list(output_cut), "purged_at": _iso_raw(purged_at),
            # The account the job is charged to and its QOS (scheduler.accounts, scheduler.qos).
            "account": account, "qos": qos,
            # A slice of one GPU instead of whole GPUs: the share or MIG profile asked for (null:
            # whole GPUs), and the instance the run held (a MIG device's or a share's UUID; null
            # on whole GPUs and on an AMD compute partition, which is a GPU of its own).
            "gpu_fraction": gpu_fraction, "mig_profile": mig_profile, "gpu_instance": gpu_instance,
        })
    return out


def output_truncated_list(stored: str | None) -> list[str] | None:
    """`jobs.output_truncated` ("stdout,stderr") as the list `show` and the receipt give."""
    return [s for s in stored.split(",") if s] if stored else None


def segment_rows(conn: Connection, job_id: int) -> list[dict]:
    """The recorded segments of an interruptible job, oldest first (`show`, the receipt)."""
    s = job_segments.c
    return [{"seq": r.seq, "kind": r.kind, "outcome": r.outcome, "start": _iso_raw(r.started_at),
             "end": _iso_raw(r.ended_at), "duration_s": (r.ended_at - r.started_at).total_seconds(),
             "node": r.node, "gpu_ids": r.gpu_ids, "energy_j": r.energy_j, "energy_method": r.energy_method,
             "gco2": r.gco2, "lost_s": r.lost_s, "done_fraction": r.done_fraction}
            for r in conn.execute(select(job_segments).where(s.job_id == job_id).order_by(s.seq))]
