"""`carbonsched account` and `carbonsched user` (Slurm's `sacctmgr` habits), and submit's
`--account`, `--qos` and `--time`.

    carbonsched account add NAME [--parent P] [--shares N] [--description TEXT]   (operators)
    carbonsched account modify NAME [--shares N] [--description TEXT] [--parent P] [--limit KEY=AMOUNT/PERIOD]
                                                                                  (operators)
    carbonsched account delete NAME                                               (operators)
    carbonsched account list
    carbonsched user add USER --account A [--default]                             (operators)
    carbonsched user modify USER --default-account A                              (operators)
    carbonsched user delete USER [--account A]                                    (operators)
    carbonsched user list [USER]

Every verb takes `--json`. A user may list accounts (seeing only themselves among their
users) and their own associations; changes are an operator's (root, the daemon's user,
`admin_groups`), refused for others with one line (exit 5). Only the standard library is
imported at module level.
"""

from __future__ import annotations

import json
import sys

from scheduler.cli.common import JSON_HELP, EXIT_OK, EXIT_USAGE, CliError, api_client, register


def add_parser(subparsers) -> None:
    """Add the `account` and `user` verbs; registers their handlers in VERBS."""
    a = subparsers.add_parser("account", help="accounts and their fair-share shares (like sacctmgr); "
                                              "changes: root/admins")
    a_sub = a.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, what in (("add", "create an account"), ("modify", "change an account"),
                         ("delete", "delete an account (refused while it has jobs waiting or running, "
                                    "or sub-accounts)")):
        p = a_sub.add_parser(action, help=what)
        p.add_argument("name", help="account name; a / makes it a sub-account (research/nlp is under research)")
        if action != "delete":
            p.add_argument("--parent", metavar="ACCOUNT", help="the account it is under (default: the part of the "
                                                               "name before its last /, else none)")
            p.add_argument("--shares", type=int, metavar="N", help="its fair-share shares (default 1)")
            p.add_argument("--description", metavar="TEXT")
        if action == "modify":
            p.add_argument("--limit", action="append", metavar="KEY=AMOUNT/PERIOD",
                           help="a budget of the account and everything under it: co2=500kg/month, "
                                "energy=800kWh/quarter, gpu_hours=1000/month, co2=2t/2026-11-01..2026-12-31; "
                                "KEY=none removes it (repeatable)")
        p.add_argument("--json", action="store_true", help=JSON_HELP)
    p = a_sub.add_parser("list", help="every account, as a tree, with its shares and users")
    p.add_argument("--json", action="store_true", help=JSON_HELP)

    u = subparsers.add_parser("user", help="which accounts a user may charge, and their default (like sacctmgr); "
                                           "changes: root/admins")
    u_sub = u.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = u_sub.add_parser("add", help="let a user charge an account")
    p.add_argument("user")
    p.add_argument("--account", "-A", required=True, metavar="ACCOUNT")
    p.add_argument("--default", action="store_true", help="make it the user's default account (their first "
                                                          "account is anyway)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p = u_sub.add_parser("modify", help="change a user's default account")
    p.add_argument("user")
    p.add_argument("--default-account", required=True, metavar="ACCOUNT")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p = u_sub.add_parser("delete", help="remove a user from an account, or from all of them")
    p.add_argument("user")
    p.add_argument("--account", "-A", metavar="ACCOUNT", help="only this account (default: every one)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p = u_sub.add_parser("list", help="users and their accounts (yours, unless you are an operator)")
    p.add_argument("user", nargs="?")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    register("account", cmd_account)
    register("user", cmd_user)


def add_submit_options(parser) -> None:
    """submit's --account, --qos and --time (Slurm's -A, -q, -t)."""
    parser.add_argument("--account", "-A", metavar="ACCOUNT",
                        help="charge this account (default: your default account, else `default`)")
    parser.add_argument("--qos", "-q", metavar="NAME", help="quality of service: urgent (never held for carbon), "
                                                             "normal (the default) or flexible (carbon may move it "
                                                             "up to its deadline, charged less), or a site's own")
    parser.add_argument("--time", "-t", metavar="TIME",
                        help="time limit as sbatch takes it: minutes (90), MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
                             "D-HH:MM:SS; like --time-limit (give one of them)")


def submit_fields(args) -> dict:
    """The request fields of submit's --account, --qos and --time; ValueError, one line,
    for a malformed --time or --time given with --time-limit."""
    from scheduler.timeparse import parse_slurm_time

    out: dict = {}
    if args.account is not None:
        out["account"] = args.account
    if args.qos is not None:
        out["qos"] = args.qos
    if args.time is not None:
        if args.time_limit:
            raise ValueError("give --time or --time-limit, not both (they are the same limit)")
        try:
            out["time_limit_s"] = parse_slurm_time(args.time)
        except ValueError as e:
            raise ValueError(f"--time: {e}") from None
    return out


def cmd_account(args, config) -> int:
    client = api_client(args, config)
    if args.action == "list":
        rows = client.request("GET", "/accounts")
        if args.json:
            _print_json(rows)
        else:
            from scheduler.text_table import table

            print(table(["ACCOUNT", "SHARES", "USERS", "LIMITS", "DESCRIPTION"],
                        [["  " * r["depth"] + r["name"], str(r["shares"]), ",".join(r["users"]) or "-",
                          _limits_text(r.get("limits") or {}), r["description"] or "-"] for r in rows]))
        return EXIT_OK
    body: dict = {"name": args.name}
    if args.action != "delete":
        for key in ("parent", "shares", "description"):
            if getattr(args, key) is not None:
                body[key] = getattr(args, key)
        if args.action == "modify" and args.limit:
            from scheduler.budgets import BudgetError, parse_limit

            try:
                for text in args.limit:
                    parse_limit(text)
            except BudgetError as e:
                raise CliError(str(e), EXIT_USAGE) from None
            body["limits"] = args.limit
        if args.action == "modify" and len(body) == 1:
            raise CliError("account modify: nothing to change: give --shares, --description, --parent or --limit",
                           EXIT_USAGE)
    result = client.request("POST", f"/accounts/{args.action}", body)
    if args.json:
        _print_json(result)
    elif args.action == "delete":
        print(f"deleted account {result['name']}" + (f" (and its users {', '.join(result['users'])})"
                                                     if result["users"] else ""))
    else:
        under = f" under {result['parent']}" if result["parent"] else ""
        limits = _limits_text(result.get("limits") or {})
        print(f"{'added' if args.action == 'add' else 'modified'} account {result['name']}{under}: "
              f"{result['shares']} share(s)" + ("" if limits == "-" else f", limits {limits}"))
    return EXIT_OK


def _limits_text(limits: dict) -> str:
    """`co2 500 kg/month, energy 800 kWh/quarter`, or `-`."""
    words = {"kgco2e": "co2", "kwh": "energy", "gpu_hours": "gpu_hours"}
    return ", ".join(f"{words.get(c, c)} {v['text']}" for c, v in limits.items()) or "-"


def cmd_user(args, config) -> int:
    client = api_client(args, config)
    if args.action == "list":
        rows = client.request("GET", "/users", query={"user": args.user} if args.user else None)
        if args.json:
            _print_json(rows)
        else:
            from scheduler.text_table import table

            print(table(["USER", "ACCOUNT", "DEFAULT"],
                        [[r["user"], r["account"], "yes" if r["default"] else ""] for r in rows]))
        return EXIT_OK
    if args.action == "add":
        body = {"user": args.user, "account": args.account, "default": args.default}
    elif args.action == "modify":
        body = {"user": args.user, "default_account": args.default_account}
    else:
        body = {"user": args.user, **({"account": args.account} if args.account else {})}
    result = client.request("POST", f"/users/{args.action}", body)
    if args.json:
        _print_json(result)
    elif args.action == "add":
        print(f"user {result['user']} may charge account {result['account']}"
              + (" (their default)" if result["default"] else ""))
    elif args.action == "modify":
        print(f"user {result['user']}: default account {result['default_account']}")
    else:
        print(f"user {args.user} removed from account(s) {', '.join(r['account'] for r in result)}")
    return EXIT_OK


def _print_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
