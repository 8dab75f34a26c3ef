"""The daemon's policy, by the name the config gives: built for the plan interval, guarded by
its fallbacks, and refused with the reason when it can only run in the simulator.
"""

from __future__ import annotations

from policies import Policy
from policies.base import get_policy, parse_policy_spec
from policies.solvers.guard import guarded_policy

MAX_CPSAT_TIME_LIMIT_S = 10.0
SIMULATION_ONLY = {"oracle": "it needs perfect knowledge of future arrivals and of the actual "
                             "carbon intensity; use it in `carbonsched simulate --policy oracle`"}


def make_policy(name: str, *, plan_interval_s: float = 15.0) -> Policy:
    """The daemon's policy by name, tuned to the plan interval.

    A time-limited solver (cpsat) gets min(10 s, interval / 2), so a tick finishes well
    before the next one is due. Simulation-only policies are refused with the reason.
    ValueError names the known policies for an unknown name.
    """
    if name in SIMULATION_ONLY:
        raise ValueError(f"policy {name!r} cannot run in the daemon: {SIMULATION_ONLY[name]}")
    spec = parse_policy_spec(name)
    params = dict(spec.params)
    if "max_time_s" not in params and hasattr(get_policy(spec.name, **params), "max_time_s"):
        params["max_time_s"] = max(0.1, min(MAX_CPSAT_TIME_LIMIT_S, plan_interval_s / 2))
    # a policy that raises never fails a tick: jobs without any option are set aside first,
    # then cpsat -> greedy -> fifo (policies.solvers.guard)
    return guarded_policy(spec.name, params)


def check_policy(name: str) -> str:
    """The name of the daemon's policy `name`, with the ValueError `make_policy` would raise
    for a bad one. A policy without parameters is not built: a daemon whose planner runs in
    a process of its own never plans, and building cpsat imports OR-Tools (about a second
    of CPU at every start)."""
    if name in SIMULATION_ONLY:
        raise ValueError(f"policy {name!r} cannot run in the daemon: {SIMULATION_ONLY[name]}")
    spec = parse_policy_spec(name)
    if spec.params:
        make_policy(name)  # a parameter is checked by the policy's constructor
    return spec.name
