"""The columns of a job that `queue` and `show` list, read the fast way.

`queue --json` over 10,000 jobs must answer in well under half a second, so listings read
only the columns they show and, on SQLite, take timestamps and JSON columns as the
database's raw text (cheaper than parsing each into Python objects); the JSON objects are
built from these plain tuples by `scheduler.job_view.jobs_json`, which unpacks them in
LISTED_COLUMNS order (a column added here is added there too).
"""

from __future__ import annotations

from sqlalchemy import Select, String, select, type_coerce

from scheduler.store.models import jobs

LISTED_COLUMNS = ("id", "name", "state", "reason", "owner_name", "owner_uid", "gpu_ids", "planned_gpu_ids",
                  "gpus", "gpu_mem_gib", "node", "planned_node", "submitted_at", "planned_start",
                  "started_at", "ended_at", "deadline", "est_runtime_s", "time_limit_s", "latency_slo_ms",
                  "workload", "prompts", "exit_code", "energy_j", "energy_method", "gco2", "est_energy_j",
                  "est_gco2", "explanation", "attempts", "argv", "cwd", "cancel_requested_at",
                  "max_delay_s", "est_gco2_if_now", "est_runtime_planned_s", "binding", "deadline_miss",
                  "time_limit_factor", "tokens", "reported_prompts", "reported_input_tokens",
                  "reported_output_tokens", "ttft_slo_ms", "tpot_slo_ms", "planned_max_batch",
                  "planned_precision", "planned_tp", "held_at", "begin_at", "dependency", "array_job_id",
                  "array_task_id", "array_max_running", "stdout_path", "stderr_path", "planned_power_limit_w",
                  "power_limit_w", "power_limit_note", "est_uncapped_energy_j", "est_uncapped_gco2",
                  "est_uncapped_runtime_s", "interruptible", "checkpoint_signal", "checkpoint_grace_s",
                  "min_run_s", "resume_cost_s", "max_segments", "done_fraction", "resume_count",
                  "checkpoints_ignored", "first_started_at", "planned_segments", "planned_interrupt_at",
                  "planned_resume_at", "hold_kind", "held_by", "output_truncated", "purged_at", "account", "qos",
                  "gpu_fraction", "mig_profile", "gpu_instance")
_TIMES = {"submitted_at", "planned_start", "started_at", "ended_at", "deadline", "cancel_requested_at",
          "held_at", "begin_at", "first_started_at", "planned_interrupt_at", "planned_resume_at", "purged_at"}
_JSONS = {"gpu_ids", "planned_gpu_ids", "argv", "planned_segments"}


def job_select(dialect: str) -> Select:
    """SELECT of the LISTED_COLUMNS of `jobs` (no condition, no order: the caller's); on
    SQLite times and JSON come back as raw text."""
    cols = []
    for name in LISTED_COLUMNS:
        col = jobs.c[name]
        if dialect == "sqlite" and (name in _TIMES or name in _JSONS):
            col = type_coerce(col, String).label(name)
        cols.append(col)
    return select(*cols)

