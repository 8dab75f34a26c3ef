"""Who each simulated job belongs to: its user, account and QOS, read from the trace's
`user`, `account` and `qos` columns. A job without an account is the `default` account's
(a trace without the column is one account, as a one-user install is). A job with a QOS
follows that level's rules (`scheduler.qos`: how far carbon may defer it, the least saving
worth a wait, its priority and usage factor); a job without one follows the scenario's slack
alone, as every simulated job did before QOS existed, and is reported under `none`. The
simulator prices and plans the same jobs whoever owns them; ownership decides priority
(fair share, QOS) and how the run's figures are reported per account and per QOS.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.fair_share import jain_index, water_fill
from scheduler.simulate.metrics import percentile
from scheduler.simulate.traces import JobTrace

DEFAULT_ACCOUNT = "default"
NO_QOS = "none"  # the report's name for jobs the trace gives no QOS


@dataclass(frozen=True, slots=True)
class Tenant:
    """The owner of one job: who submitted it (None: the trace does not say), the account it
    is charged to and its QOS (None: the scenario's slack alone)."""

    user: str | None = None
    account: str = DEFAULT_ACCOUNT
    qos: str | None = None


def tenants_of(trace: JobTrace) -> dict[int, Tenant]:
    """Each job's owner by the id the scenario gives it (1..N in trace order)."""
    return {i + 1: Tenant(tj.user, tj.account or DEFAULT_ACCOUNT, tj.qos) for i, tj in enumerate(trace.jobs)}


def account_shares(tenants: dict[int, Tenant], shares: dict[str, int] | None = None) -> dict[str, int]:
    """The raw shares of every account that owns a job: those `shares` gives (a scenario's
    choice), 1 for the rest (a trace's accounts are equal unless told otherwise)."""
    given = shares or {}
    bad = {a: s for a, s in given.items() if not isinstance(s, int) or s < 0}
    if bad:
        raise ValueError(f"account shares must be whole numbers >= 0: {bad}")
    return {a: given.get(a, 1) for a in sorted({t.account for t in tenants.values()} | set(given))}


def run_spans(r) -> list[tuple[float, float]]:
    """The spans (epoch s) a finished or running record held its GPUs doing work."""
    if r.segment_log:
        return [(s, e) for s, e, _, _ in r.segment_log]
    if r.start_s is not None and r.end_s is not None:
        return [(r.start_s, r.end_s)]
    return []


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _window_pairs(records: list, tenants: dict[int, Tenant], capacity_gpus: int, window_s: float):
    """(delivered, asked) GPU-seconds per account in each busy window (`window_s`, from the
    first arrival to the last end).

    In each window an account asks for the GPUs of each of its jobs that has arrived and not
    finished (waiting or running: what it could use then), and is delivered the GPU-seconds
    its jobs ran. A window is busy where the jobs together ask for more GPUs than the cluster
    has: only there do accounts compete for them."""
    spans = []
    for r in records:
        runs = run_spans(r)
        end = r.end_s if r.end_s is not None else max((e for _, e in runs), default=r.arrival_s)
        spans.append((tenants.get(r.job.id, Tenant()).account, len(r.gpu_ids) or r.job.gpus, r.arrival_s, end, runs))
    t0 = min(s[2] for s in spans)
    n = max(1, int((max(s[3] for s in spans) - t0) // window_s) + 1)
    asked: list[dict[str, float]] = [{} for _ in range(n)]
    got: list[dict[str, float]] = [{} for _ in range(n)]
    for account, gpus, arrive, end, runs in spans:
        for k in range(int((arrive - t0) // window_s), min(n, int((end - t0) // window_s) + 1)):
            w0 = t0 + k * window_s
            asked[k][account] = asked[k].get(account, 0.0) + gpus * _overlap(arrive, end, w0, w0 + window_s)
            ran = sum(_overlap(s, e, w0, w0 + window_s) for s, e in runs)
            if ran:
                got[k][account] = got[k].get(account, 0.0) + gpus * ran
    for k in range(n):
        if sum(asked[k].values()) > capacity_gpus * window_s * (1 + 1e-9):
            yield got[k], asked[k]


def tenant_figures(records: list, tenants: dict[int, Tenant], shares: dict[str, int], *,
                   capacity_gpus: int, window_s: float = 3600.0) -> dict:
    """The run's figures per account and per QOS, and Jain's fairness index over accounts.

    Over the busy period (`_window_pairs`: the windows in which the jobs asked for more GPUs
    than the cluster has), per account: `gpu_hours`, the work its jobs ran there;
    `share_delivered`, its part of all that work; `share_target`, its fair part, window by
    window (`water_fill`: the window's delivered GPU-seconds split by shares, none above
    what the account asked for in it) and summed. Waits (start - submit) and `kgco2` are over
    all its finished jobs. `fairness.jain` is over accounts' delivered / target ratios (1:
    every account got its fair part); None without a busy window."""
    if not records:
        return {"accounts": {}, "qos": {}, "fairness": {"jain": None, "busy_windows": 0}}
    waits: dict[str, list[float]] = {a: [] for a in shares}
    qos_waits: dict[str, list[float]] = {}
    grams: dict[str, float] = {a: 0.0 for a in shares}
    for r in records:
        owner = tenants.get(r.job.id, Tenant())
        grams[owner.account] = grams.get(owner.account, 0.0) + r.gco2 + r.lost_gco2
        if r.state == "done" and r.start_s is not None:
            waits.setdefault(owner.account, []).append(r.start_s - r.arrival_s)
            qos_waits.setdefault(owner.qos or NO_QOS, []).append(r.start_s - r.arrival_s)
    delivered, targets, busy = _busy_targets(records, tenants, shares, capacity_gpus, window_s)
    total = sum(delivered.values())
    accounts = {}
    for a in sorted(set(grams) | set(delivered)):
        accounts[a] = {"shares": shares.get(a, 0), "gpu_hours": delivered.get(a, 0.0) / 3600.0,
                       "share_target": targets.get(a, 0.0) / total if total else None,
                       "share_delivered": delivered.get(a, 0.0) / total if total else None,
                       "wait_p50_s": percentile(waits.get(a, []), 50), "wait_p95_s": percentile(waits.get(a, []), 95),
                       "kgco2": grams.get(a, 0.0) / 1000.0}
    ratios = [v["share_delivered"] / v["share_target"] for v in accounts.values()
              if v["share_target"] and v["share_delivered"] is not None]
    return {"accounts": accounts,
            "qos": {q: {"jobs": len(w), "wait_p50_s": percentile(w, 50), "wait_p95_s": percentile(w, 95)}
                    for q, w in sorted(qos_waits.items())},
            "fairness": {"jain": jain_index(ratios), "busy_windows": busy}}


def _busy_targets(records: list, tenants: dict[int, Tenant], shares: dict[str, int], capacity_gpus: int,
                  window_s: float) -> tuple[dict[str, float], dict[str, float], int]:
    """Per account over the busy windows: GPU-seconds delivered, and the fair target
    water-filled window by window."""
    delivered: dict[str, float] = {}
    targets: dict[str, float] = {}
    busy = 0
    weights = {a: float(s) for a, s in shares.items()}
    for got, asked in _window_pairs(records, tenants, capacity_gpus, window_s):
        busy += 1
        fair = water_fill(sum(got.values()), weights, asked)
        for a, v in got.items():
            delivered[a] = delivered.get(a, 0.0) + v
        for a, v in fair.items():
            targets[a] = targets.get(a, 0.0) + v
    return delivered, targets, busy
