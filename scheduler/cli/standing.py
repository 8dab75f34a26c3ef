"""`carbonsched share` (like Slurm's `sshare`) and `carbonsched priority` (like `sprio`):
where accounts and waiting jobs stand, as the planner computes it.

    carbonsched share [--json]       shares, usage, effective usage and fair-share factor, and
                                     each account limit with this period's usage against it
    carbonsched priority [--json]    each waiting job's priority and its components

A user sees the accounts and their own lines; an operator sees everyone's. Only the
standard library is imported at module level.
"""

from __future__ import annotations

import json
import sys

from scheduler.cli.common import EXIT_OK, api_client, register


def add_parser(subparsers) -> None:
    """Add the `share` and `priority` verbs; registers their handlers in VERBS."""
    s = subparsers.add_parser("share", help="fair share per account and user: shares, usage, factor (like sshare)")
    s.add_argument("--json", action="store_true", help="print the JSON document (keys: docs/json-keys.md)")
    p = subparsers.add_parser("priority", help="each waiting job's priority and its components (like sprio)")
    p.add_argument("--json", action="store_true", help="print the JSON document (keys: docs/json-keys.md)")
    register("share", cmd_share)
    register("priority", cmd_priority)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def cmd_share(args, config) -> int:
    doc = api_client(args, config).request("GET", "/share")
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return EXIT_OK
    from scheduler.text_table import table

    usage_key = f"raw_usage_{doc['currency']}"
    print(table(["ACCOUNT", "USER", "RAW SHARES", "NORM SHARES", f"RAW USAGE ({doc['currency'].upper()})",
                 "EFFECTV USAGE", "FAIRSHARE"],
                [[r["account"], r["user"] or "", f"{r['raw_shares']:g}", _fmt(r["norm_shares"]),
                  _fmt(r[usage_key], 2), _fmt(r["effective_usage"]), _fmt(r["fair_share_factor"])]
                 for r in doc["associations"]]))
    print(f"usage decays with a half-life of {doc['half_life_s'] / 86400:g} days")
    budgets = doc.get("budgets") or []
    if budgets:
        print()
        print(table(["ACCOUNT", "LIMIT", "PERIOD", "USED", "USED %", "NOTE"],
                    [[b["account"], f"{_LIMIT_WORD.get(b['currency'], b['currency'])} {b['text']}",
                      f"{b['period_start'][:10]}..{b['period_end'][:10]}", f"{b['used']:.4g} {b['unit']}",
                      f"{100 * b['used_fraction']:.0f}", "80 % reached" if b["warning"] else ""]
                     for b in budgets]))
        print("used: this period's finished jobs as measured and running jobs as planned, each times its "
              "QOS usage factor, over the account and everything under it")
    return EXIT_OK


_LIMIT_WORD = {"kgco2e": "co2", "kwh": "energy", "gpu_hours": "gpu_hours"}


def cmd_priority(args, config) -> int:
    doc = api_client(args, config).request("GET", "/priority")
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return EXIT_OK
    if not doc["jobs"]:
        print("no waiting jobs")
        return EXIT_OK
    from scheduler.text_table import table

    print(table(["JOBID", "ACCOUNT", "USER", "QOS", "PRIORITY", "FAIRSHARE", "QOS PRIO", "AGE", "JOBSIZE"],
                [[str(j["job_id"]), j["account"], j["user"], j["qos"], f"{j['priority']:.0f}",
                  f"{j['fair_share']:.0f}", f"{j['qos_priority']:.0f}", f"{j['age']:.0f}", f"{j['job_size']:.0f}"]
                 for j in doc["jobs"]]))
    w = doc["weights"]
    print(f"weights: fair share {w['fair_share']:g}, QOS {w['qos']:g}, age {w['age']:g}, job size {w['job_size']:g}")
    return EXIT_OK
