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


def get_policy(name: str) -> Policy:
    """Return a fresh policy object by name; ValueError names the known ones."""
    factories = _registry()
    if name not in factories:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(factories))}")
    return factories[name]()


def _registry() -> dict[str, type]:
    from policies.fifo import FifoPolicy

    return {"fifo": FifoPolicy}
