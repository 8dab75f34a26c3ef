"""Scheduling policies: pure functions from a Snapshot of the world to a Plan.

Nothing in this package does I/O or imports `scheduler` or `telemetry`, so the daemon and
the simulator run exactly the same policy code.
"""

from policies.base import Policy, get_policy, policy_names
from policies.types import (Assignment, CarbonCurve, Estimate, GpuSlot, Plan, PowerCap, Profile, QueuedJob,
                            Snapshot)

__all__ = [
    "Assignment",
    "CarbonCurve",
    "Estimate",
    "GpuSlot",
    "Plan",
    "Policy",
    "PowerCap",
    "Profile",
    "QueuedJob",
    "Snapshot",
    "get_policy",
    "policy_names",
]
