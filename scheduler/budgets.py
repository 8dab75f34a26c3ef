"""Carbon allocations: an account's budget of GPU-hours, kWh and kgCO2e per period, and the
arithmetic that enforces it the way Slurm enforces `GrpTRESMins`.

- **A limit** is an amount in one currency per period: `co2=500kg/month`,
  `energy=800kWh/quarter`, `gpu_hours=1000/month`, `co2=2t/2026-11-01..2026-12-31` (a date
  range, both days included; outside it the limit does not bind). `parse_limit` reads the
  CLI's `--limit`, with one-line mistakes (`BudgetError`). Periods are UTC calendar months
  and quarters.
- **Inherited down the tree.** A job is held to its account's own limits and to every
  ancestor's; what counts against an account's limit is its whole subtree's usage.
- **What is spent** in a period: the finished jobs that ended in it (their measured
  GPU-hours, kWh and kgCO2e; a figure not measured yet counts at the plan's estimate), the
  running jobs at their plan's estimates, and the queued jobs let through before this one
  (committed, in priority order), each times its QOS's usage factor (Slurm's `UsageFactor`
  applies to `GrpTRESMins` the same way).
- **A job whose estimate would take** its account or an ancestor over a limit waits with a
  REASON naming the limit (`AssocGrpCO2Limit`, `AssocGrpEnergyLimit`,
  `AssocGrpGPUHoursLimit`); it is let through again when the next period begins. A job
  whose estimate alone is over a whole limit is refused at submit. Running jobs are never
  stopped for a limit.
- **Grace.** `flexible_grace_pct` lets jobs of a `flexible`-QOS that far over (off: 0).

Plain data in, plain data out: nothing here reads the store or a clock (`scheduler.jobs.usage`
reads the usage, `scheduler.account_limits` the limits).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone

from policies.types import J_PER_KWH

CURRENCIES = ("gpu_hours", "kwh", "kgco2e")
#: `--limit KEY=...`: the user's word for each currency
KEYS = {"co2": "kgco2e", "energy": "kwh", "gpu_hours": "gpu_hours"}
WORD = {v: k for k, v in KEYS.items()}
#: Slurm-style REASON codes, one per currency
REASON_CODE = {"kgco2e": "AssocGrpCO2Limit", "kwh": "AssocGrpEnergyLimit", "gpu_hours": "AssocGrpGPUHoursLimit"}
UNIT = {"kgco2e": "kg", "kwh": "kWh", "gpu_hours": "GPU-h"}
# unit -> factor to the stored unit (kg, kWh, GPU-hours); None: no unit written
_UNITS = {"kgco2e": {"g": 1e-3, "kg": 1.0, "t": 1000.0},
          "kwh": {"wh": 1e-3, "kwh": 1.0, "mwh": 1000.0},
          "gpu_hours": {None: 1.0, "h": 1.0}}
_AMOUNT_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*\Z", re.I)
_RANGE_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})\.\.(\d{4}-\d{2}-\d{2})\Z")
WARN_FRACTION = 0.8
MAX_AMOUNT = 1e12


class BudgetError(ValueError):
    """A malformed or impossible limit, one line."""


@dataclass(frozen=True)
class Limit:
    """At most `amount` (kg, kWh or GPU-hours by `currency`) per `period`."""

    currency: str
    amount: float
    period: str  # month | quarter | YYYY-MM-DD..YYYY-MM-DD

    def text(self) -> str:
        """As the CLI shows it: `500 kg/month`."""
        return f"{_num(self.amount)} {UNIT[self.currency]}/{self.period}"

    def as_json(self) -> dict:
        return {"amount": self.amount, "unit": UNIT[self.currency], "period": self.period, "text": self.text()}


def _num(x: float) -> str:
    return f"{x:.4g}" if x < 1e4 else f"{x:,.0f}"


def parse_period(text: str) -> str:
    """`month`, `quarter`, or `YYYY-MM-DD..YYYY-MM-DD` (start no later than end)."""
    t = text.strip().lower()
    if t in ("month", "quarter"):
        return t
    m = _RANGE_RE.match(t)
    if not m:
        raise BudgetError(f"bad period {text!r}: use month, quarter or a date range like 2026-11-01..2026-12-31")
    try:
        start, end = date.fromisoformat(m.group(1)), date.fromisoformat(m.group(2))
    except ValueError:
        raise BudgetError(f"bad date in period {text!r}") from None
    if end < start:
        raise BudgetError(f"period {text!r} ends before it starts")
    return t


def parse_limit(text: object) -> tuple[str, Limit | None]:
    """`co2=500kg/month` -> ("kgco2e", Limit); `co2=none` -> ("kgco2e", None): remove it.
    Mistakes are one-line `BudgetError`s naming what to write instead."""
    if not isinstance(text, str) or "=" not in text:
        raise BudgetError(f"--limit {text!r}: write KEY=AMOUNT/PERIOD, e.g. co2=500kg/month "
                          f"(keys: {', '.join(KEYS)})")
    key, _, value = text.partition("=")
    key = key.strip().lower()
    if key not in KEYS:
        raise BudgetError(f"--limit {text!r}: unknown key {key!r}; use {', '.join(KEYS)}")
    currency = KEYS[key]
    if value.strip().lower() == "none":
        return currency, None
    amount_text, slash, period_text = value.partition("/")
    if not slash:
        raise BudgetError(f"--limit {text!r}: give a period after /, e.g. {key}={amount_text.strip() or '500'}"
                          f"{'' if currency == 'gpu_hours' else UNIT[currency]}/month")
    m = _AMOUNT_RE.match(amount_text)
    if not m:
        raise BudgetError(f"--limit {text!r}: bad amount {amount_text.strip()!r}")
    units = _UNITS[currency]
    unit = m.group(2).lower() or None
    if unit not in units:
        names = ", ".join(u for u in units if u)
        raise BudgetError(f"--limit {text!r}: {key} takes "
                          + (f"a unit: {names} (e.g. {key}=500{names.split(', ')[1]}/month)" if None not in units
                             else "a number of GPU-hours (e.g. gpu_hours=1000/month)"))
    amount = float(m.group(1)) * units[unit]
    if not (0 < amount <= MAX_AMOUNT) or not math.isfinite(amount):
        raise BudgetError(f"--limit {text!r}: the amount must be above 0")
    try:
        period = parse_period(period_text)
    except BudgetError as e:
        raise BudgetError(f"--limit {text!r}: {e}") from None
    return currency, Limit(currency, amount, period)


def period_window(period: str, now: datetime) -> tuple[datetime, datetime] | None:
    """The [start, end) of the period holding `now` (UTC); None for a date range `now` is
    outside of (the limit does not bind then)."""
    now = now.astimezone(timezone.utc)
    if period == "month":
        start = datetime(now.year, now.month, 1, tzinfo=timezone.utc)
        end = datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=timezone.utc)
        return start, end
    if period == "quarter":
        first = 3 * ((now.month - 1) // 3) + 1
        start = datetime(now.year, first, 1, tzinfo=timezone.utc)
        end = datetime(now.year + (first == 10), (first + 2) % 12 + 1, 1, tzinfo=timezone.utc)
        return start, end
    m = _RANGE_RE.match(period)
    if not m:
        raise BudgetError(f"bad period {period!r}")
    start, end = _range_window(m)
    return (start, end) if start <= now < end else None


def _range_window(m: re.Match) -> tuple[datetime, datetime]:
    """A matched date range `FIRST..LAST` as UTC [start, end): both days included."""
    start = datetime.fromisoformat(m.group(1)).replace(tzinfo=timezone.utc)
    return start, datetime.fromisoformat(m.group(2)).replace(tzinfo=timezone.utc) + timedelta(days=1)


@dataclass(frozen=True)
class Usage:
    """An amount in every currency (GPU-hours, kWh, kgCO2e), already times its usage factor."""

    gpu_hours: float = 0.0
    kwh: float = 0.0
    kgco2e: float = 0.0

    @classmethod
    def of(cls, gpu_s: float, energy_j: float, gco2: float) -> Usage:
        """The usage of GPU-seconds, joules and grams (a run's or a plan's measured units)."""
        return cls(gpu_s / 3600.0, energy_j / J_PER_KWH, gco2 / 1000.0)

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.gpu_hours + other.gpu_hours, self.kwh + other.kwh, self.kgco2e + other.kgco2e)

    def times(self, factor: float) -> Usage:
        return Usage(self.gpu_hours * factor, self.kwh * factor, self.kgco2e * factor)

    def get(self, currency: str) -> float:
        return getattr(self, currency)


@dataclass(frozen=True)
class Charged:
    """Usage charged to `account` at `at` (a finished job: when it ended; a running one:
    now); with `window`, the sum of a period's finished jobs, counted only against limits of
    exactly that period."""

    account: str
    at: datetime
    usage: Usage
    window: tuple[datetime, datetime] | None = None


@dataclass(frozen=True)
class LimitStanding:
    """An account's standing against one of its limits in the current period."""

    account: str
    limit: Limit
    start: datetime
    end: datetime
    used: float  # the subtree's usage and commitments in the period

    @property
    def fraction(self) -> float:
        return self.used / self.limit.amount

    def as_json(self) -> dict:
        return {"account": self.account, "currency": self.limit.currency, **self.limit.as_json(),
                "period_start": _iso(self.start), "period_end": _iso(self.end), "used": self.used,
                "used_fraction": self.fraction, "warning": self.fraction >= WARN_FRACTION}


def _ended(period: str, now: datetime) -> bool:
    """Whether `period` is a date range that is over at `now`."""
    m = _RANGE_RE.match(period)
    return m is not None and now >= datetime.fromisoformat(m.group(2)).replace(tzinfo=timezone.utc) + timedelta(days=1)


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class Budgets:
    """The limits of an account tree at one moment, and what each account's subtree has spent
    and committed: `admit` lets a job through or says why it waits.

    `limits`: account -> {currency: Limit}; `parents`: account -> parent (None: top level);
    `charges`: every job's usage in (or around) the current periods; `now`: the moment the
    periods are taken at."""

    limits: Mapping[str, Mapping[str, Limit]]
    parents: Mapping[str, str | None]
    now: datetime
    charges: Iterable[Charged] = ()
    flexible_grace_pct: float = 0.0
    _used: dict[tuple[str, str], float] = field(default_factory=dict)
    _windows: dict[tuple[str, str], tuple[datetime, datetime]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for account, by_currency in self.limits.items():
            for currency, limit in by_currency.items():
                window = period_window(limit.period, self.now)
                if window is not None:
                    self._windows[(account, currency)] = window
                    self._used[(account, currency)] = 0.0
        for c in self.charges:
            for key in self._bound(c.account):
                start, end = self._windows[key]
                if (c.window == (start, end)) if c.window is not None else start <= c.at < end:
                    self._used[key] += c.usage.get(key[1])

    def chain(self, account: str) -> list[str]:
        """`account` and its ancestors, nearest first (cycles and unknown parents stop it)."""
        out = [account]
        parent = self.parents.get(account)
        while parent is not None and parent not in out:
            out.append(parent)
            parent = self.parents.get(parent)
        return out

    def _bound(self, account: str) -> list[tuple[str, str]]:
        """The (account, currency) limits in force now that a job of `account` counts against."""
        return [(a, c) for a in self.chain(account) for c in CURRENCIES if (a, c) in self._windows]

    def binds(self, account: str) -> bool:
        return bool(self._bound(account))

    def _allowance(self, key: tuple[str, str], flexible: bool) -> float:
        amount = self.limits[key[0]][key[1]].amount
        return amount * (1 + self.flexible_grace_pct / 100.0) if flexible else amount

    def admit(self, account: str, estimate: Usage, *, flexible: bool = False) -> str | None:
        """None, and the estimate committed against every limit it counts against, when it
        fits all of them; else the REASON of the first it would go over (the job's own
        account first, then its ancestors), nothing committed."""
        for key in self._bound(account):
            used, need = self._used[key], estimate.get(key[1])
            if used + need > self._allowance(key, flexible) * (1 + 1e-9):
                return self.reason(key, need)
        for key in self._bound(account):
            self._used[key] += estimate.get(key[1])
        return None

    def reason(self, key: tuple[str, str], need: float) -> str:
        account, currency = key
        limit = self.limits[account][currency]
        return (f"account {account}: {WORD[currency]} limit {limit.text()}, {_num(self._used[key])} "
                f"{UNIT[currency]} used or committed, this job ~{_num(need)} {UNIT[currency]} "
                f"({REASON_CODE[currency]})")

    def alone_over(self, account: str, estimate: Usage, *, flexible: bool = False) -> str | None:
        """Why a job can never run under its limits (its estimate alone is over a whole
        limit in force now or in a period to come; a date range that has ended is not), or None."""
        for a in self.chain(account):
            for currency, limit in self.limits.get(a, {}).items():
                if _ended(limit.period, self.now):
                    continue
                need = estimate.get(currency)
                allowed = limit.amount * (1 + self.flexible_grace_pct / 100.0) if flexible else limit.amount
                if need > allowed * (1 + 1e-9):
                    return (f"this job needs ~{_num(need)} {UNIT[currency]}, more than account {a}'s whole "
                            f"{WORD[currency]} limit of {limit.text()}: it could never start under it "
                            f"({REASON_CODE[currency]})")
        return None

    def standings(self) -> list[LimitStanding]:
        """Every limit in force now with what its subtree has used and committed."""
        return [LimitStanding(a, self.limits[a][c], *self._windows[(a, c)], self._used[(a, c)])
                for (a, c) in sorted(self._windows)]


_MONTH_RE = re.compile(r"^(\d{4})-(\d{2})\Z")
_QUARTER_RE = re.compile(r"^(\d{4})-q([1-4])\Z")


def named_period(text: str) -> tuple[datetime, datetime]:
    """A statement's period (`export --period`): a month `2026-11`, a quarter `2026-Q4`, or a
    date range `2026-11-01..2026-12-31` (both days included), as UTC [start, end)."""
    t = text.strip().lower()
    if m := _MONTH_RE.match(t):
        year, month = int(m.group(1)), int(m.group(2))
        if not 1 <= month <= 12:
            raise BudgetError(f"--period {text!r}: no month {month}")
        return period_window("month", datetime(year, month, 1, tzinfo=timezone.utc))  # type: ignore[return-value]
    if m := _QUARTER_RE.match(t):
        first = 3 * (int(m.group(2)) - 1) + 1
        return period_window("quarter", datetime(int(m.group(1)), first, 1, tzinfo=timezone.utc))  # type: ignore[return-value]
    try:
        parse_period(t)
    except BudgetError:
        raise BudgetError(f"--period {text!r}: use a month (2026-11), a quarter (2026-Q4) or a date range "
                          "(2026-11-01..2026-12-31)") from None
    return _range_window(_RANGE_RE.match(t))
