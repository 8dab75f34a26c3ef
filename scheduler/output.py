"""Human-readable tables for the CLI. Times are shown in the local time zone."""

from __future__ import annotations

from datetime import datetime

from scheduler.timeparse import format_duration


def local_time(text: str | None, with_date: bool = False) -> str:
    if not text:
        return "-"
    t = datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone()
    today = datetime.now().astimezone().date()
    if with_date or t.date() != today:
        return t.strftime("%Y-%m-%d %H:%M:%S")
    return t.strftime("%H:%M:%S")


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def _energy(j: float | None) -> str:
    if j is None:
        return "-"
    if j >= 3.6e6:
        return f"{j / 3.6e6:.2f} kWh"
    if j >= 3600:
        return f"{j / 3600:.1f} Wh"
    return f"{j:.0f} J"


def _gpus(job: dict) -> str:
    if not job.get("gpus"):
        return str(job.get("gpus_requested", "-"))
    model = job.get("gpu_model") or "gpu"
    return f"{job.get('node') or '?'}:{model}:{','.join(str(g) for g in job['gpus'])}"


def jobs_table(jobs: list[dict]) -> str:
    if not jobs:
        return "no jobs"
    rows = []
    for j in jobs:
        when = j["started_at"] or (j["planned_start"] if j["state"] == "PLANNED" else None)
        rows.append([str(j["id"]), j["name"][:24], j["owner"], j["state"], _gpus(j),
                     local_time(j["submitted_at"]), local_time(when), local_time(j["ended_at"]),
                     "-" if j["exit_code"] is None else str(j["exit_code"]), _energy(j["energy_j"])])
    return table(["ID", "NAME", "OWNER", "STATE", "GPUS", "SUBMITTED", "START", "END", "EXIT",
                  "ENERGY"], rows)


def job_detail(job: dict) -> str:
    runtime = None
    if job["started_at"] and job["ended_at"]:
        runtime = (datetime.fromisoformat(job["ended_at"].replace("Z", "+00:00"))
                   - datetime.fromisoformat(job["started_at"].replace("Z", "+00:00"))).total_seconds()
    fields = [
        ("job", f"{job['id']} ({job['name']})"), ("state", job["state"]),
        ("reason", job.get("reason") or "-"), ("owner", f"{job['owner']} (uid {job['owner_uid']})"),
        ("command", " ".join(job["argv"])), ("directory", job["cwd"]),
        ("gpus", f"{job['gpus_requested']} x >= {job['gpu_mem_gib']:g} GiB"
                 + (f" -> {_gpus(job)}" if job.get("gpus") else "")),
        ("workload", job.get("workload") or "-"), ("prompts", str(job.get("prompts") or "-")),
        ("est. runtime", format_duration(job.get("est_runtime_s"))),
        ("time limit", format_duration(job.get("time_limit_s"))),
        ("deadline", local_time(job.get("deadline"), True)),
        ("submitted", local_time(job["submitted_at"], True)),
        ("planned start", local_time(job["planned_start"], True)),
        ("started", local_time(job["started_at"], True)),
        ("ended", local_time(job["ended_at"], True)),
        ("runtime", format_duration(runtime)),
        ("exit code", "-" if job["exit_code"] is None else str(job["exit_code"])),
        ("energy", _energy(job["energy_j"]) + (f" ({job['energy_method']})" if job.get("energy_method") else "")),
        ("gCO2", "-" if job["gco2"] is None else f"{job['gco2']:.1f} g"),
        ("plan", job.get("explanation") or "-"),
    ]
    width = max(len(k) for k, _ in fields)
    lines = [f"{k.rjust(width)}: {v}" for k, v in fields]
    if job.get("events"):
        lines.append("")
        lines.append("history:")
        for e in job["events"]:
            who = "system" if e["actor_uid"] is None else f"uid {e['actor_uid']}"
            lines.append(f"  {local_time(e['at'], True)}  {(e['from'] or '-'):>9} -> {e['to']:<9} "
                         f"{who}: {e['reason'] or ''}")
    return "\n".join(lines)


def nodes_table(nodes: list[dict]) -> str:
    if not nodes:
        return "no nodes registered"
    rows = []
    for n in nodes:
        status = "up" if n["up"] else "DOWN"
        tag = " (emulated)" if n.get("emulated") else ""
        for g in n["gpus"]:
            job = str(g["job"]) if g["job"] is not None else ("busy" if g.get("busy") else "-")
            util = g.get("utilization_pct")
            rows.append([n["name"] + tag, n["zone"], status, f"{g['vendor']}:{g['index']}", g["model"],
                         f"{g['memory_gib']:g}", "-" if g["power_w"] is None else f"{g['power_w']:.0f}",
                         "-" if util is None else f"{util:.0f}%", _energy(g.get("energy_today_j")),
                         "yes" if g["healthy"] else "NO", job])
    return table(["NODE", "ZONE", "STATUS", "GPU", "MODEL", "MEM_GIB", "POWER_W", "UTIL", "TODAY",
                  "HEALTHY", "JOB"], rows)


def plan_table(plan: list[dict]) -> str:
    if not plan:
        return "nothing queued"
    rows = [[str(p["job"]), p["node"] or "-", ",".join(map(str, p["gpus"] or [])) or "-",
             local_time(p["start"]), "-" if p["gco2"] is None else f"{p['gco2']:.1f}", p["reason"]]
            for p in plan]
    return table(["JOB", "NODE", "GPUS", "START", "GCO2", "REASON"], rows)
