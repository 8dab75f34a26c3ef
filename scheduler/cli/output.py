"""Human-readable tables for the CLI. Times are shown in the local time zone."""

from __future__ import annotations

import shlex
from datetime import datetime

from policies.types import J_PER_KWH
from scheduler.job_specs import wait_word
from scheduler.text_table import printable, small_grams, table
from scheduler.timeparse import format_duration


def local_time(text: str | None, with_date: bool = False) -> str:
    if not text:
        return "-"
    t = datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone()
    today = datetime.now().astimezone().date()
    if with_date or t.date() != today:
        return t.strftime("%Y-%m-%d %H:%M:%S")
    return t.strftime("%H:%M:%S")


def local_minute(text: str) -> str:
    """A moment to the minute in local time: "HH:MM" today, "YYYY-MM-DD HH:MM" on another day, so
    a pause that ends after midnight never reads as today's."""
    return local_time(text)[:-3]


def _energy(j: float | None) -> str:
    if j is None:
        return "-"
    if j >= J_PER_KWH:
        return f"{j / J_PER_KWH:.2f} kWh"
    if j >= 3600:
        return f"{j / 3600:.1f} Wh"
    return f"{j:.0f} J"


def energy_unit(values) -> tuple[float, str]:
    """One unit for a column of energies (J, Wh or kWh, by the largest), so a column never
    mixes units: (joules per unit, unit name)."""
    top = max((v for v in values if v is not None), default=0.0)
    if top >= J_PER_KWH:
        return J_PER_KWH, "kWh"
    if top >= 3600:
        return 3600.0, "Wh"
    return 1.0, "J"


def _energy_in(j: float | None, unit: tuple[float, str]) -> str:
    if j is None:
        return "-"
    per, name = unit
    return f"{j:.0f} J" if name == "J" else f"{j / per:.2f} {name}"


def _gpus(job: dict) -> str:
    if not job.get("gpus"):
        return str(job.get("gpus_requested", "-"))
    model = job.get("gpu_model") or "gpu"
    return f"{job.get('node') or '?'}:{model}:{','.join(str(g) for g in job['gpus'])}"


def _grams(g: float | None) -> str:
    if g is None:
        return "-"
    if g >= 10_000:
        return f"{g / 1000:.1f} kg"
    return f"{g:.1f} g" if g >= 1 else small_grams(g)


def _job_gco2(j: dict) -> str:
    """Measured gCO2 once known, else the plan's estimate marked with ~."""
    if j.get("gco2") is not None:
        return _grams(j["gco2"])
    if j.get("est_gco2") is not None and j["state"] in ("PENDING", "PLANNED", "RUNNING"):
        return "~" + _grams(j["est_gco2"]) + (" !" if j.get("deadline_miss") else "")
    return "-"


def shown_state(job: dict) -> str:
    """The state a person reads: a RUNNING job being stopped (a cancel in its grace period)
    is CANCELLING, as squeue shows CG."""
    if job["state"] == "RUNNING" and job.get("cancel_requested"):
        return "CANCELLING"
    return job["state"]


def jobs_table(jobs: list[dict]) -> str:
    if not jobs:
        return "no jobs"
    rows = []
    unit = energy_unit(j["energy_j"] for j in jobs)  # one unit for the whole ENERGY column
    for j in jobs:
        when = j["started_at"] or (j["planned_start"] if j["state"] == "PLANNED" else None)
        rows.append([str(j["id"]), j["name"][:24], j["owner"], shown_state(j), _gpus(j),
                     local_time(j["submitted_at"]), local_time(when), local_time(j["ended_at"]),
                     "-" if j["exit_code"] is None else str(j["exit_code"]), _energy_in(j["energy_j"], unit),
                     _job_gco2(j),
                     # why a PENDING job waits, as squeue's REASON: the planner's word for it;
                     # a pause job stopped by its plan says until when (issue 30); a PLANNED
                     # job behind other work says whose, in squeue's word (`show` has the rest)
                     (j.get("reason") or "-") if j["state"] == "PENDING"
                     else f"paused until {local_minute(j['paused_until'])}" if j.get("paused_until")
                     else f"({wait_word(j.get('reason'))})" if j["state"] == "PLANNED" and wait_word(j.get("reason"))
                     else ""])
    return table(["ID", "NAME", "OWNER", "STATE", "GPUS", "SUBMITTED", "START", "END", "EXIT",
                  "ENERGY", "GCO2(~EST)", "REASON"], rows)


def _estimate_line(gco2: float | None, per_prompt: float | None) -> str:
    if gco2 is None:
        return "-"
    return _grams(gco2) + (f" ({small_grams(per_prompt)}/prompt)" if per_prompt is not None else "")


def _saving(planned: float | None, now: float | None) -> str:
    if planned is None or now is None or now <= 0:
        return ""
    return f"; the plan saves {100 * (now - planned) / now:.0f}%"


def _time_limit(job: dict) -> str:
    """The limit and where it comes from: explicit (binds the plan) or derived (follows it)."""
    limit, factor = job.get("time_limit_s"), job.get("time_limit_factor")
    if limit is None:
        return "-"
    if factor is None:
        return f"{format_duration(limit)} (--time-limit: no plan runs longer)"
    planned, est = job.get("est_runtime_planned_s"), job.get("est_runtime_s")
    if not planned:
        basis = "--est-runtime until planned"
    elif est is not None and est >= planned:  # never below the user's own estimate x factor
        basis = "--est-runtime: the planned GPUs are expected to be faster"
    else:
        basis = "the planned GPUs' runtime"
    return f"{format_duration(limit)} ({factor:g} x {basis})"


def _work(job: dict) -> str:
    """Prompts and tokens: what the job reported in its metrics file, and what was declared."""
    def count(n: int | None, what: str) -> str | None:
        return None if n is None else f"{n:,} {what}"

    reported = [c for c in (count(job.get("reported_prompts"), "prompts"),
                            count(job.get("reported_input_tokens"), "input tokens"),
                            count(job.get("reported_output_tokens"), "output tokens")) if c]
    declared = [c for c in (count(job.get("prompts"), "prompts"), count(job.get("tokens"), "output tokens")) if c]
    parts = ([", ".join(reported) + " (reported)"] if reported else []) + \
        ([", ".join(declared) + " (declared)"] if declared else [])
    return "; ".join(parts) or "-"


def _slos(job: dict) -> str:
    given = [f"{name} p95 <= {job[key]:g} ms" for name, key in (("TTFT", "ttft_slo_ms"), ("TPOT", "tpot_slo_ms"),
                                                                ("latency", "latency_slo_ms"))
             if job.get(key) is not None]
    workload = job.get("workload")
    if given:
        return ", ".join(given)
    if workload and job.get("latency_model", True):  # `show`'s job says whether the class has one
        return "the workload's defaults"
    return "- (no latency model for this workload)" if workload else "-"


def _point(job: dict) -> str:
    p = job.get("operating_point")
    if not p:
        return "-"
    return (f"batch {p['max_batch']} {str(p['precision']).upper()} TP{p['tp']} "
            "(CARBONSCHED_MAX_BATCH, CARBONSCHED_PRECISION, CARBONSCHED_TP)")


def power_limit_text(planned_w, applied_w, note, uncapped_gco2=None, capped_gco2=None) -> str:
    """The GPU power limit of a job for `show` and the receipt (issue 29)."""
    if planned_w is None and applied_w is None:
        return "- (the GPUs' default)"
    text = f"planned {planned_w:g} W per GPU" if planned_w is not None else "none planned"
    if applied_w is not None:
        text += f", applied {applied_w:g} W (CARBONSCHED_POWER_LIMIT_W)"
    elif note:
        text += f"; {note}"
    if uncapped_gco2 is not None and capped_gco2 is not None:
        text += f"; estimate {capped_gco2:.1f} g vs {uncapped_gco2:.1f} g at the default limit"
    return text


def _hold_field(job: dict) -> list[tuple[str, str]]:
    """`show`'s hold line: who holds the job and who may release it (none when not held)."""
    if not job.get("hold"):
        return []
    by = f" (uid {job['held_by']})" if job.get("held_by") is not None else ""
    if job["hold"] == "operator":
        return [("hold", f"operator hold{by}: only an operator can release it (JobHeldAdmin)")]
    return [("hold", f"user hold{by}: `carbonsched release {job['id']}` plans it (JobHeldUser)")]


def job_detail(job: dict) -> str:
    runtime = job.get("runtime_s")  # exact; the times below are whole seconds
    if runtime is None and job["started_at"] and job["ended_at"]:
        runtime = (datetime.fromisoformat(job["ended_at"].replace("Z", "+00:00"))
                   - datetime.fromisoformat(job["started_at"].replace("Z", "+00:00"))).total_seconds()
    fields = [
        ("job", f"{job['id']} ({job['name']})"), ("state", shown_state(job)),
        ("reason", job.get("reason") or "-"), *_hold_field(job),
        ("owner", f"{job['owner']} (uid {job['owner_uid']})"),
        *([("account", f"{job['account']} (QOS {job.get('qos') or '-'})")] if job.get("account") else []),
        ("command", shlex.join(job["argv"])), ("directory", job["cwd"]),
        ("gpus", _slice_asked(job) or f"{job['gpus_requested']}" + (f" x >= {job['gpu_mem_gib']:g} GiB" if job["gpu_mem_gib"]
                                                else " (any GPU memory)")
                 + (f" -> {_gpus(job)}" if job.get("gpus") else "")),
        ("workload", job.get("workload") or "-"), ("work", _work(job)),
        ("est. runtime", format_duration(job.get("est_runtime_s"))
         + (f" (planned GPUs: {format_duration(job['est_runtime_planned_s'])})"
            if job.get("est_runtime_planned_s") else "")),
        ("max delay", format_duration(job.get("max_delay_s"))),
        ("time limit", _time_limit(job)),
        ("deadline", local_time(job.get("deadline"), True)),
        ("submitted", local_time(job["submitted_at"], True)),
        ("planned start", local_time(job["planned_start"], True)),
        ("started", local_time(job["started_at"], True)),
        ("ended", local_time(job["ended_at"], True)),
        ("runtime", format_duration(runtime)),
        ("exit code", "-" if job["exit_code"] is None else str(job["exit_code"])),
        ("energy", _energy(job["energy_j"]) + (f" ({job['energy_method']}"
                                               + (", emulated GPUs: not measured" if
                                                  job["energy_method"].startswith("modelled") else "") + ")"
                                               if job.get("energy_method") else "")),
        ("gCO2", "-" if job["gco2"] is None else _grams(job["gco2"])
         + (f" ({small_grams(job['gco2_per_prompt'])}/prompt, {job['prompts_source']})"
            if job.get("gco2_per_prompt") is not None else "")),
        ("latency SLOs", _slos(job)),
        ("operating point", _point(job)),
        ("power limit", power_limit_text(job.get("planned_power_limit_w"), job.get("power_limit_w"),
                                         job.get("power_limit_note"), job.get("est_uncapped_gco2"),
                                         job.get("est_gco2"))),
        ("plan", job.get("explanation") or "-"),
        ("est. energy", _energy(job.get("est_energy_j"))),
        ("est. gCO2", _estimate_line(job.get("est_gco2"), job.get("est_gco2_per_prompt"))),
        ("if run now", _estimate_line(job.get("est_gco2_if_now"), job.get("est_gco2_if_now_per_prompt"))
         + _saving(job.get("est_gco2"), job.get("est_gco2_if_now"))),
        ("binding", job.get("binding") or "-"),
    ]
    if job.get("deadline_miss"):
        fields.append(("DEADLINE", "cannot be met on any GPU: planned as soon as possible"))
    fields += interruptible_fields(job)
    width = max(len(k) for k, _ in fields)
    lines = [f"{k.rjust(width)}: {printable(str(v))}" for k, v in fields]
    if job.get("events"):
        lines.append("")
        lines.append("history:")
        for e in job["events"]:
            who = "system" if e["actor_uid"] is None else f"uid {e['actor_uid']}"
            lines.append(f"  {local_time(e['at'], True)}  {(e['from'] or '-'):>9} -> {e['to']:<9} "
                         f"{who}: {printable(e['reason'] or '')}")
    return "\n".join(lines)


def interruptible_fields(job: dict) -> list[tuple[str, str]]:
    """`show` lines of an interruptible job (issue 30): its kind and knobs, progress, the
    planned segments, "paused until HH:MM" while a pause job is stopped, and each segment
    run so far with its energy and gCO2."""
    kind = job.get("interruptible")
    if not kind:
        return []
    knobs = [kind]
    if kind == "checkpoint":
        knobs.append(f"signal {job.get('checkpoint_signal')}, grace {format_duration(job.get('checkpoint_grace_s'))}")
    if job.get("min_run_s"):
        knobs.append(f"min run {format_duration(job['min_run_s'])}")
    if job.get("resume_cost_s"):
        knobs.append(f"resume cost {format_duration(job['resume_cost_s'])}")
    if job.get("max_segments"):
        knobs.append(f"at most {job['max_segments']} segments")
    out = [("interruptible", ", ".join(knobs)),
           ("progress", f"{100 * (job.get('done_fraction') or 0):.0f}% done, {job.get('resume_count') or 0} "
                        f"segment(s) run" + (f", ignored {job['checkpoints_ignored']} checkpoint request(s)"
                                             if job.get("checkpoints_ignored") else ""))]
    if job.get("planned_segments"):
        out.append(("segments", ", ".join(f"{local_time(a)}-{local_time(b)}" for a, b in job["planned_segments"])))
    if job.get("paused_until"):
        out.append(("paused", f"paused until {local_minute(job['paused_until'])}"))
    elif job.get("state") == "RUNNING" and job.get("planned_interrupt_at") and kind == "checkpoint":
        out.append(("checkpoint at", local_time(job["planned_interrupt_at"])))
    for seg in job.get("segments") or []:
        cost = _energy(seg.get("energy_j")) + ("" if seg.get("gco2") is None else f", {seg['gco2']:.1f} g")
        lost = f", lost {format_duration(seg['lost_s'])} of work" if seg.get("lost_s") else ""
        out.append((f"segment {seg['seq']}", f"{seg['kind']} {local_time(seg['start'])}-{local_time(seg['end'])} "
                                             f"{seg['outcome']}: {cost}{lost}"))
    return out


def nodes_table(nodes: list[dict]) -> str:
    if not nodes:
        return "no nodes registered"
    rows = []
    reasons = False
    for n in nodes:
        tag = " (emulated)" if n.get("emulated") else ""
        for g in n["gpus"]:
            job = str(g["job"]) if g["job"] is not None else ("busy" if g.get("busy") else "-")
            util = g.get("utilization_pct")
            limit = g.get("power_limit_w")
            # like `sinfo -R`: a drained GPU says so, with who drained it, when and why
            if not n["up"]:
                status, reason = "DOWN", "no heartbeat"
            elif g.get("drained"):
                status = "DRAINING" if g.get("busy") else "DRAINED"
                reason = " ".join(x for x in (g.get("drain_reason") or "", _drained_by(g)) if x)
            else:
                status, reason = "up", "" if g["healthy"] else (g.get("unhealthy_reason") or "")
            reasons = reasons or bool(reason)
            if g.get("instances"):
                job = "-"  # the jobs are on its slices, one line each below
            rows.append([n["name"] + tag, n["zone"], status, f"{g['vendor']}:{g['index']}", _model(g),
                         f"{g['memory_gib']:g}", "-" if g["power_w"] is None else f"{g['power_w']:.0f}",
                         "-" if limit is None else f"{limit:.0f}",
                         "-" if util is None else f"{util:.0f}%", _energy(g.get("energy_today_j")),
                         "yes" if g["healthy"] else "NO", job, reason or "-"])
            rows += [_slice_row(n, g, k, i, tag) for k, i in enumerate(g.get("instances") or [])]
    headers = ["NODE", "ZONE", "STATUS", "GPU", "MODEL", "MEM_GIB", "POWER_W", "LIMIT_W", "UTIL",
               "TODAY", "HEALTHY", "JOB", "REASON"]
    if not reasons:
        headers, rows = headers[:-1], [r[:-1] for r in rows]
    return table(headers, rows)


def _slice_asked(job: dict) -> str | None:
    """`show`'s GPUS line for a slice job: what it asked for and the instance it ran on."""
    if job.get("mig_profile") is None and job.get("gpu_fraction") is None:
        return None
    asked = (f"MIG {job['mig_profile']}" if job.get("mig_profile") else f"{job['gpu_fraction']:g} of a GPU")
    if job.get("gpu_mem_gib"):
        asked += f" with >= {job['gpu_mem_gib']:g} GiB"
    return asked + (f" on {job['gpu_instance']}" if job.get("gpu_instance") else "")


def _model(g: dict) -> str:
    """The GPU's model with its partition layout: MIG mode, an AMD partition's mode and share."""
    extra = []
    if g.get("mig_enabled"):
        extra.append("MIG")
    if g.get("partition_mode"):
        extra.append(f"{g['partition_mode']} 1/{g.get('partitions') or 1}")
    if g.get("memory_partition") and g.get("memory_partition") != "NPS1":
        extra.append(g["memory_partition"])
    return g["model"] + (f" ({', '.join(extra)})" if extra else "")


def _slice_row(n: dict, g: dict, k: int, i: dict, tag: str) -> list[str]:
    """One slice of a shared GPU under its GPU's line: `nvidia:0/1` `MIG 1g.10gb` or `share 1/4`."""
    job = str(i["job"]) if i.get("job") is not None else ("busy" if i.get("busy") else "-")
    kind = "MIG" if i["kind"] == "mig" else i["kind"]
    return [n["name"] + tag, n["zone"], "up" if i["healthy"] else "GONE", f"{g['vendor']}:{g['index']}/{k}",
            f"  {kind} {i['profile']}", f"{i['memory_gib']:g}", "-", "-", "-", "-",
            "yes" if i["healthy"] and g["healthy"] else "NO", job, "-"]


def _drained_by(g: dict) -> str:
    who = g.get("drained_by")
    at = g.get("drained_at")
    if who is None and at is None:
        return ""
    return "(" + " ".join(x for x in ((f"uid {who}" if who is not None else ""),
                                      (local_time(at, True) if at else "")) if x) + ")"


def plan_table(plan: list[dict]) -> str:
    """The policy's plan, one job a line, and a total: planned gCO2 against each job's "if run
    now" counterfactual (over the jobs with both figures)."""
    if not plan:
        return "nothing queued"
    rows = []
    for p in plan:
        where = "-"
        if p.get("model"):
            where = f"{p['model']}@{p.get('zone') or '?'}"
        flags = ("PINNED " if p.get("pinned") else "") + ("DEADLINE-MISS " if p.get("deadline_miss") else "")
        rows.append([str(p["job"]), p["node"] or "-", where, ",".join(map(str, p["gpus"] or [])) or "-",
                     local_time(p["start"]), _grams(p.get("gco2")), _grams(p.get("gco2_if_now")),
                     (flags + (p["reason"] or "")).strip()])
    lines = [table(["JOB", "NODE", "GPU@ZONE", "GPUS", "START", "GCO2", "IF_NOW", "REASON"], rows)]
    both = [p for p in plan if p.get("gco2") is not None and p.get("gco2_if_now") is not None]
    planned = sum(p["gco2"] for p in both)
    now = sum(p["gco2_if_now"] for p in both)
    total = f"total: {_grams(planned)} planned vs {_grams(now)} if run now"
    if now > 0:
        total += f" (saving {100 * (now - planned) / now:.1f}%)"
    total += f" over {len(both)} of {len(plan)} jobs"
    unplaced = sum(1 for p in plan if p["node"] is None)
    blind = [p for p in plan if p["node"] is not None and p.get("priced_blind_g_per_kwh") is not None]
    if blind:
        price = blind[0]["priced_blind_g_per_kwh"]
        total += f"; {len(blind)} priced blind at {price:.0f} g/kWh (no carbon data for their zone)"
    if unplaced:
        total += f"; {unplaced} not placed"
    lines.append(total)
    return "\n".join(lines)


def jobs_fields(jobs: list[dict], spec: str, *, header: bool = True) -> str:
    """`queue --format id,name,state:10,...`: the chosen keys of each job's JSON, in columns
    (like squeue -o); FIELD:WIDTH truncates a column. ValueError names an unknown key."""
    fields: list[tuple[str, int | None]] = []
    for item in spec.split(","):
        name, _, width = item.strip().partition(":")
        if not name:
            continue
        if width and not width.isdigit():
            raise ValueError(f"{item!r}: the width after ':' must be a number")
        fields.append((name, int(width) if width else None))
    if not fields:
        raise ValueError("no fields given; e.g. --format id,name,state")
    known = set(jobs[0]) if jobs else None
    if known is not None:
        bad = [f for f, _ in fields if f not in known]
        if bad:
            raise ValueError(f"unknown field(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")

    def cell(v, width: int | None) -> str:
        text = "-" if v is None else ",".join(map(str, v)) if isinstance(v, list) else \
            ("yes" if v else "no") if isinstance(v, bool) else str(v)
        return text[:width] if width else text

    rows = [[cell(j.get(f), w) for f, w in fields] for j in jobs]
    headers = [f.upper() for f, _ in fields]
    if not header:
        return "\n".join("  ".join(r) for r in rows)
    return table(headers, rows) if rows else "  ".join(headers)
