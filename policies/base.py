"""The Policy interface and the registry of policies by name."""

from __future__ import annotations

import importlib
import inspect
from typing import NamedTuple, Protocol

from policies.types import Plan, Snapshot


class Policy(Protocol):
    """A scheduling policy: a pure function of a snapshot."""

    name: str

    def plan(self, snapshot: Snapshot) -> Plan:
        """Return where and when each queued job should run."""
        ...


# name -> (module, class): a policy's module is imported only when it is asked for, so
# `fifo` does not pay for OR-Tools and numpy (the planner child starts faster too).
_POLICIES = {
    "fifo": ("policies.solvers.fifo", "FifoPolicy"),
    "greedy": ("policies.solvers.greedy", "GreedyPolicy"),
    "cpsat": ("policies.solvers.cpsat", "CpsatPolicy"),
    "oracle": ("policies.solvers.oracle", "OraclePolicy"),
    "edf": ("policies.solvers.edf", "EdfPolicy"),
}


def policy_names() -> list[str]:
    """Names accepted by `get_policy`, for `--policy` and error messages."""
    return sorted(_POLICIES)


def get_policy(name: str, **params: object) -> Policy:
    """Return a fresh policy object by name, with constructor parameters (e.g.
    `get_policy("cpsat", max_time_s=5, workers=2)`); ValueError names the known ones."""
    if name not in _POLICIES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(policy_names())}")
    module, cls = _POLICIES[name]
    factory = getattr(importlib.import_module(module), cls)
    options = [p for p in inspect.signature(factory).parameters if p not in ("self", "name", "args", "kwargs")]
    unknown = [k for k in params if k not in options]
    if unknown:
        raise ValueError(f"policy {name!r} has no option {', '.join(map(repr, unknown))}; "
                         f"its options: {', '.join(options) or 'none'}")
    try:
        return factory(**params)
    except TypeError as e:
        raise ValueError(f"bad parameters for policy {name!r}: {e}") from e


class PolicySpec(NamedTuple):
    """A policy by name with constructor parameters, as written `NAME:key=value:key=value`."""

    name: str
    params: dict[str, object]


def _value(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_policy_spec(text: str, defaults: dict[str, object] | None = None) -> PolicySpec:
    """`cpsat:max_time_s=0.5:lateness_g_per_gpu_h=200` -> PolicySpec("cpsat", {...}), the
    parameters over `defaults`. ValueError names the known policies, or the bad option."""
    name, *opts = text.strip().split(":")
    if name not in _POLICIES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(policy_names())}")
    params: dict[str, object] = dict(defaults or {})
    for opt in opts:
        key, sep, value = opt.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"bad policy option {opt!r} in {text!r}; expected key=value, "
                             "e.g. cpsat:max_time_s=0.5")
        params[key.strip()] = _value(value.strip())
    return PolicySpec(name, params)
