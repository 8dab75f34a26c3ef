"""The Policy interface and the registry of policies by name."""

from __future__ import annotations

from typing import Protocol

from policies.model import Plan, Snapshot


class Policy(Protocol):
    """A scheduling policy: a pure function of a snapshot."""

    name: str

    def plan(self, snapshot: Snapshot) -> Plan:
        """Return where and when each queued job should run."""
        ...


def policy_names() -> list[str]:
    """Names accepted by `get_policy`, for `--policy` and error messages."""
    return sorted(_registry())


def get_policy(name: str, **params: object) -> Policy:
    """Return a fresh policy object by name, with constructor parameters (e.g.
    `get_policy("cpsat", max_time_s=5, workers=2)`); ValueError names the known ones."""
    factories = _registry()
    if name not in factories:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(factories))}")
    try:
        return factories[name](**params)
    except TypeError as e:
        raise ValueError(f"bad parameters for policy {name!r}: {e}") from e


def _registry() -> dict[str, type]:
    from policies.cpsat import CpsatPolicy
    from policies.fifo import FifoPolicy
    from policies.greedy import GreedyPolicy
    from policies.oracle import OraclePolicy

    return {"fifo": FifoPolicy, "greedy": GreedyPolicy, "cpsat": CpsatPolicy, "oracle": OraclePolicy}
