"""Submit's check of a job against its account's limits (`scheduler.budgets`): a job whose
estimate alone is over a whole limit of its account or of an ancestor could never start, so
it is refused at once (400, one line; the CLI exits 2), as Slurm refuses such a job with
`DenyOnLimit`. A job that only has to wait for the next period is accepted: the planner holds it.

The estimate errs low, so that only a job over the limit however it is placed is refused:
GPUs x its own runtime estimate (else its time limit), at the lowest power of the fleet's GPU
models running a generic job (`policies.model.energy.generic_power_w`) and the lowest carbon
intensity the fleet's zones have now (without one, kgCO2e is left to the planner), times
its QOS's usage factor.

The limits, the tree and the fleet are read at most every `TTL_S` (and at once after an
operator changes accounts), so a submit where no account has a limit costs no query.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import select

from scheduler.account_limits import read_limits
from scheduler.budgets import Budgets, Usage
from scheduler.daemon.access import RequestError, ServiceConfig
from scheduler.store import Store
from scheduler.store.account_models import accounts
from scheduler.store.models import gpus, nodes


class SubmitBudget:
    """`check(row)`: refuse a job alone over a whole limit of its account or an ancestor."""

    TTL_S = 5.0

    def __init__(self, store: Store, config: ServiceConfig, *, clock: Callable[[], datetime],
                 carbon: Any = None, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.config = config
        self.carbon = carbon  # scheduler.carbon_signal.CarbonSignal; None: kgCO2e not checked here
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._cached: tuple[float, tuple] | None = None

    def invalidate(self) -> None:
        """Forget the cached limits (an operator changed accounts)."""
        with self._lock:
            self._cached = None

    def _read(self) -> tuple:
        with self._lock:
            cached = self._cached
        if cached is not None and self._monotonic() - cached[0] < self.TTL_S:
            return cached[1]
        with self.store.read() as conn:
            limits = read_limits(conn)
            parents = {r.name: r.parent for r in conn.execute(select(accounts.c.name, accounts.c.parent))} \
                if limits else {}
            fleet = list(conn.execute(select(gpus.c.model, nodes.c.zone).join(nodes, nodes.c.name == gpus.c.node_name)
                                      .distinct())) if limits else []
        value = (limits, parents, sorted({m for m, _ in fleet}), sorted({z for _, z in fleet if z}))
        with self._lock:
            self._cached = (self._monotonic(), value)
        return value

    def check(self, row: dict) -> None:
        """Raise RequestError(400) when the job `row` (account, QOS, GPUs and runtime set) is
        alone over a whole limit."""
        limits, parents, models, zones = self._read()
        if not limits:
            return
        now = self._clock()
        budgets = Budgets(limits, parents, now, flexible_grace_pct=self.config.flexible_grace_pct)
        if not any(a in limits for a in budgets.chain(row["account"])):
            return
        qos = self.config.qos.levels.get(row["qos"])
        need = self.floor(row, models, zones, now).times(qos.usage_factor if qos is not None else 1.0)
        why = budgets.alone_over(row["account"], need, flexible=qos is not None and qos.defer == "flexible")
        if why is not None:
            raise RequestError(400, f"refused: {why}")

    def floor(self, row: dict, models: list[str], zones: list[str], now: datetime) -> Usage:
        """The least the job could cost (see the module's docstring), before its usage factor."""
        from policies.model.energy import generic_power_w

        runtime_s = row.get("est_runtime_s") or row.get("time_limit_s") or 0.0
        gpu_hours = int(row.get("gpus") or 1) * runtime_s / 3600.0
        power_w = min((generic_power_w(m) for m in models), default=generic_power_w("?"))
        kwh = gpu_hours * power_w / 1000.0
        intensities = []
        for zone in zones if self.carbon is not None else ():
            value = self.carbon.intensity(zone, now)
            if value is not None:
                intensities.append(value.gco2_per_kwh)
        return Usage(gpu_hours, kwh, kwh * min(intensities) / 1000.0 if intensities else 0.0)
