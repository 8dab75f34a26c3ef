"""Quality of service: named levels a job is submitted under (`submit --qos NAME`), from the
config's `[qos.NAME]` tables over three built-in levels that exist without any configuration.

A QOS says how much a job's standing and its carbon freedom are worth to its owner:

- `priority`: the QOS term of the job's priority (higher first; normalised by the highest).
- `defer`: how far carbon may move the job. `urgent`: it starts on the first free GPUs that
  fit, never held for carbon; `normal`: at most `max_defer` after it could start; `flexible`:
  anywhere up to its deadline (or its `--max-delay`).
- `usage_factor`: its usage is charged times this to its account's fair share; a job that
  accepts deferral is charged less, which is the reason to accept it.
- `min_saving_g`, `min_saving_pct`: the smallest saving worth waiting for, in grams and in
  percent of the job's run-now emissions; a wait must save both, or the job runs now on free
  GPUs.
- `max_gpus_running_per_user`, `max_jobs_queued_per_user`: per-user limits in this QOS
  (the planner holds a user's jobs beyond the first, REASON `QOSMaxGPUPerUserLimit`:
  `scheduler.standing`; submit refuses beyond the second).
- `default_time_limit`: the limit of a job given none at all (no `--time`, `--time-limit` or
  `--est-runtime`); unset: the site's `default_time_limit`, capped at `max_time_limit`.
  `max_time_limit`: a job asking for more is refused at submit; unset: only the hard 30 d.

Configured like

    [qos.urgent]              # change some fields of a built-in level
    max_jobs_queued_per_user = 20
    [qos.debug]               # a level of the site's own: starts from `normal`'s fields
    priority = 50
    defer = "urgent"
    max_time_limit = "30m"

The built-in levels, and why:

- `normal` (the default QOS): priority 10, defer at most 2 h unless the job gives its own
  `--deadline` or `--max-delay` (then that bounds it: the user chose the slack), usage
  factor 1, worth waiting for from 2 g and 10 %. Seen in use: a 5 s job was planned 79
  minutes out on an idle cluster to save 0.08 g. A 5 s job on an H100 (700 W) uses about
  1 Wh, 0.4 g at 400 g/kWh: no wait can save 2 g, so short jobs run now. One H100-minute
  at 700 W emits about 4.7 g at 400 g/kWh, so a job of a few H100-minutes can be worth a
  wait; a half-hour job saving 15 % (about 10 g) is held for its greener half-hour. 10 % is
  about a day-ahead intensity forecast's error: a smaller planned saving may not be real.
  2 h is a wait a user of a batch queue tolerates without resubmitting elsewhere, and
  reaches the next cleaner hours of most grids' daily curve.
- `flexible`: priority 0, defer up to the deadline, usage factor 0.5, worth waiting for from
  0.5 g and 5 %. Half the charge is the incentive to let carbon choose; it still does not
  wait for forecast noise (5 %) or a rounding error (0.5 g).
- `urgent`: priority 100, never deferred, usage factor 1.5, at most 100 jobs queued per
  user. It takes the first free GPUs whatever their carbon, so it costs more of the share
  (otherwise every job would be urgent), and the queue limit keeps the lane short for the
  latency-sensitive work it is for.
- The priorities normalise to QOS factors 1 (urgent), 0.1 (normal) and 0 (flexible): with
  the default weights (`scheduler.priority`: QOS 20000, fair share 10000) urgent is 18000
  points above normal, more than the whole fair-share range, so an urgent job ranks above
  every normal and flexible job; normal is 2000 above flexible, a fair-share gap of 0.2, so
  between those two fair share still decides across accounts. A site level placed between
  them (e.g. `debug`, priority 50: factor 0.5) ranks above normal by 8000 points, within
  the fair-share range: only a level above 60 (a QOS component above normal's 2000 plus
  fair share's 10000) ranks above all normal work.
- No built-in sets `max_gpus_running_per_user`, `default_time_limit` or `max_time_limit`
  (a one-user install must not meet limits it did not choose): every job without a limit
  gets the site's `default_time_limit` (24 h; `scheduler.settings`), long enough that a job
  that merely forgot `--time` is not killed, finite so a hung job frees its GPUs within a
  day. It stays above the planner's runtime for a job without an estimate on any GPU the
  catalog knows, so defaulted jobs are planned exactly as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from scheduler.timeparse import format_duration, parse_duration

URGENT, NORMAL, FLEXIBLE = "urgent", "normal", "flexible"
DEFER_KINDS = (URGENT, NORMAL, FLEXIBLE)
#: The QOS of a job submitted without `--qos`.
DEFAULT_QOS = NORMAL
#: The time limit of a job given none whose QOS has no default (the `default_time_limit` setting).
DEFAULT_TIME_LIMIT_S = 86400.0
#: The longest time limit any job may have, whatever its QOS (as `--time-limit` allows).
MAX_TIME_LIMIT_S = 30 * 86400.0
NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,63}\Z")


@dataclass(frozen=True)
class Qos:
    """One QOS level; the fields are the `[qos.NAME]` keys (durations in seconds here)."""

    name: str
    priority: int
    defer: str  # urgent | normal | flexible
    max_defer_s: float | None  # defer "normal" only: how long carbon may hold the job
    usage_factor: float
    min_saving_g: float
    min_saving_pct: float
    max_gpus_running_per_user: int | None = None
    max_jobs_queued_per_user: int | None = None
    default_time_limit_s: float | None = None
    max_time_limit_s: float | None = None

    def time_limit_for(self, site_default_s: float) -> float:
        """The limit of a job of this QOS given none: its own default, else the site's,
        never above its maximum."""
        limit = self.default_time_limit_s if self.default_time_limit_s is not None else site_default_s
        return min(limit, self.max_time_limit_s) if self.max_time_limit_s is not None else limit

    def carbon_bounds(self, own_slack: bool) -> dict[str, float | None]:
        """What this level lets carbon do with one job, as the policies' `QueuedJob` fields:
        `urgent` never defers (0); `normal` defers at most `max_defer_s`, unless the job
        gave its own deadline or maximum delay (`own_slack`: the user chose that slack, and
        it bounds the job); `flexible` up to its deadline; and the least saving worth waiting for."""
        if self.defer == URGENT:
            max_defer: float | None = 0.0
        elif self.defer == NORMAL and not own_slack:
            max_defer = self.max_defer_s
        else:
            max_defer = None
        return {"max_defer_s": max_defer, "min_saving_gco2": self.min_saving_g,
                "min_saving_frac": self.min_saving_pct / 100.0}

    def as_json(self) -> dict:
        """The level as the API and `--json` give it (durations in seconds)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


BUILT_IN: dict[str, Qos] = {
    URGENT: Qos(URGENT, priority=100, defer=URGENT, max_defer_s=None, usage_factor=1.5, min_saving_g=0.0,
                min_saving_pct=0.0, max_jobs_queued_per_user=100),
    NORMAL: Qos(NORMAL, priority=10, defer=NORMAL, max_defer_s=2 * 3600.0, usage_factor=1.0, min_saving_g=2.0,
                min_saving_pct=10.0),
    FLEXIBLE: Qos(FLEXIBLE, priority=0, defer=FLEXIBLE, max_defer_s=None, usage_factor=0.5, min_saving_g=0.5,
                  min_saving_pct=5.0),
}


class QosConfigError(ValueError):
    """Problems with `[qos.*]`: `errors` has one line each, naming `[qos.NAME] key`."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


class QosTable:
    """The QOS levels of a site: the built-in ones as configured, and the site's own."""

    def __init__(self, levels: Mapping[str, Qos] | None = None) -> None:
        self.levels: dict[str, Qos] = dict(BUILT_IN if levels is None else levels)

    def __contains__(self, name: object) -> bool:
        return name in self.levels

    def names(self) -> list[str]:
        return sorted(self.levels)

    def priorities(self) -> dict[str, int]:
        """Each level's priority by name (what the priority's QOS factor is normalised over)."""
        return {name: q.priority for name, q in self.levels.items()}

    def usage_factors(self) -> dict[str, float]:
        """Each level's usage factor by name (what fair share charges usage times)."""
        return {name: q.usage_factor for name, q in self.levels.items()}

    def get(self, name: str | None) -> Qos:
        """The level named `name` (None: the default QOS); KeyError with a one-line message
        naming the known levels."""
        key = DEFAULT_QOS if name is None else name
        try:
            return self.levels[key]
        except KeyError:
            raise KeyError(f"unknown QOS {key!r}; known: {', '.join(self.names())}") from None


def qos_table(config: Mapping[str, Any]) -> QosTable:
    """The QOS levels of a whole config (its `[qos.NAME]` tables over the built-ins);
    QosConfigError (a ValueError) with one line per problem, each naming `[qos.NAME] key`."""
    table = config.get("qos", {})
    if not isinstance(table, Mapping):
        raise QosConfigError(["[qos] must be a table of levels, e.g. [qos.urgent]"])
    levels = dict(BUILT_IN)
    errors: list[str] = []
    for name, body in table.items():
        if not isinstance(name, str) or not NAME_RE.match(name):
            errors.append(f"[qos.{name}]: a QOS name is lower-case letters, digits, _ and -, starting with a letter")
            continue
        if not isinstance(body, Mapping):
            errors.append(f"[qos.{name}] must be a table of settings")
            continue
        try:
            levels[name] = _level(name, body, levels.get(name, replace(BUILT_IN[NORMAL], name=name)))
        except ValueError as e:
            errors.append(f"[qos.{name}] {e}")
    if errors:
        raise QosConfigError(errors)
    return QosTable(levels)


def check_qos_config(table: Any, whole: Mapping[str, Any]) -> list[str]:
    """Problems with the config's `[qos.*]` tables, one line each (`carbonsched config check`
    puts `[qos]` before each: `[qos] urgent: priority: must be ...`)."""
    try:
        qos_table(whole)
    except QosConfigError as e:
        return [re.sub(r"^\[qos\.([^\]]*)\]:? ", r"\1: ", line).removeprefix("[qos] ") for line in e.errors]
    return []


_KEYS = ("priority", "defer", "max_defer", "usage_factor", "min_saving_g", "min_saving_pct",
         "max_gpus_running_per_user", "max_jobs_queued_per_user", "default_time_limit", "max_time_limit")


def _level(name: str, body: Mapping[str, Any], base: Qos) -> Qos:
    """`base` with the fields `body` sets; ValueError naming the first bad key."""
    unknown = sorted(set(body) - set(_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(_KEYS)}")
    changes: dict[str, Any] = {}
    if "priority" in body:
        changes["priority"] = _whole(body["priority"], "priority", 0, 1_000_000)
    if "defer" in body:
        defer = body["defer"]
        if defer not in DEFER_KINDS:
            raise ValueError(f"defer: must be one of {', '.join(DEFER_KINDS)} (got {defer!r})")
        changes["defer"] = defer
        if defer != NORMAL:
            changes["max_defer_s"] = None
    for key, lo, hi in (("usage_factor", 0.0, 100.0), ("min_saving_g", 0.0, 1e9), ("min_saving_pct", 0.0, 100.0)):
        if key in body:
            changes[key] = _real(body[key], key, lo, hi)
    for key in ("max_gpus_running_per_user", "max_jobs_queued_per_user"):
        if key in body:
            changes[key] = _whole(body[key], key, 1, 10_000_000)
    for key in ("max_defer", "default_time_limit", "max_time_limit"):
        if key in body:
            changes[key + "_s"] = _limit(body[key], key)
    level = replace(base, **changes)
    if "max_defer" in body and level.defer != NORMAL:
        raise ValueError(f"max_defer: only a defer = \"normal\" level has one (this one is {level.defer!r})")
    if level.defer == NORMAL and level.max_defer_s is None:
        level = replace(level, max_defer_s=BUILT_IN[NORMAL].max_defer_s)
    if (level.default_time_limit_s is not None and level.max_time_limit_s is not None
            and level.default_time_limit_s > level.max_time_limit_s):
        raise ValueError(f"default_time_limit {format_duration(level.default_time_limit_s)} is above "
                         f"max_time_limit {format_duration(level.max_time_limit_s)}")
    return level


def _whole(v: Any, key: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key}: must be a whole number from {lo} to {hi} (got {v!r})")
    return v


def _real(v: Any, key: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise ValueError(f"{key}: must be a number from {lo:g} to {hi:g} (got {v!r})")
    return float(v)


def _limit(v: Any, key: str) -> float:
    """A duration (`90m`, `2d`; a bare number is seconds) from 1 s to 30 d."""
    try:
        seconds = parse_duration(str(v)) if not isinstance(v, bool) else -1.0
    except ValueError as e:
        raise ValueError(f"{key}: {e}") from None
    if not 1.0 <= seconds <= MAX_TIME_LIMIT_S:
        raise ValueError(f"{key}: must be a duration from 1s to 30d (got {v!r})")
    return seconds
