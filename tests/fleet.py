"""A cluster for the tests without a daemon: nodes and GPUs written straight into a store, an
emulated node agent, and the loop that ticks planner and agent until jobs reach a state.

The test files of several areas (core, daemon, node, telemetry) built these each on their
own; here they are once. A plain module beside conftest.py, imported as `fleet` from every
test folder.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from datetime import datetime
from pathlib import Path

from sqlalchemy import insert, select

from policies.model.catalog import parse_fleet
from scheduler.node.agent import Agent
from scheduler.node.config import AgentConfig
from scheduler.store.models import gpus, jobs, nodes
from telemetry.gpu import EmulatedBackend, EmulatedModel

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "LOST")


def add_node(store, name: str, *, at: datetime, zone: str = "DE", model: str = "H100", n: int = 1,
             memory_gib: float = 80.0, vendor: str | None = None, healthy: bool = True,
             heartbeat: datetime | None = None) -> list[int]:
    """An emulated node `name` registered at `at` (last heartbeat `heartbeat`, else `at`) with
    `n` GPUs of `model` (indices 0..n-1, uuids `name-i`); returns the GPUs' ids. The vendor
    is `vendor`, else amd for MI* models and nvidia for the others."""
    vendor = vendor or ("amd" if model.startswith("MI") else "nvidia")
    with store.write() as conn:
        conn.execute(insert(nodes).values(name=name, zone=zone, backend="emulated", emulated=True,
                                          registered_at=at, last_heartbeat=heartbeat or at))
        return [conn.execute(insert(gpus).values(node_name=name, index=i, uuid=f"{name}-{i}", model=model,
                                                 vendor=vendor, memory_gib=memory_gib, healthy=healthy)
                             .returning(gpus.c.id)).scalar_one() for i in range(n)]


def emulated_agent(store, fleet: str, *, state_dir: Path, seed: int = 7, **config) -> Agent:
    """A registered, reconciled node agent `n1` in zone DE over an emulated `fleet`
    (`2xH100`); `config` is the rest of its AgentConfig. The caller stops it."""
    backend = EmulatedBackend([EmulatedModel(m.name, m.vendor, m.memory_gib, m.idle_w, m.tdp_w)
                               for m in parse_fleet(fleet)], node="n1", seed=seed)
    agent = Agent(store, backend, AgentConfig(node="n1", zone="DE", state_dir=state_dir, **config))
    agent.register()
    agent.startup_reconcile()
    return agent


def job_states(store, job_ids: Iterable[int]) -> dict[int, str]:
    """Each job's state, by id."""
    ids = list(job_ids)
    with store.read() as conn:
        found = dict(conn.execute(select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(ids))).all())
    return {i: found[i] for i in ids}


def tick_until(store, job_ids: Iterable[int], states: Collection[str], *ticking, timeout_s: float,
               during: Callable[[dict[int, str]], object] | None = None) -> dict[int, str]:
    """Tick each of `ticking` (a planner, an agent: anything with `tick()`), in order, every
    50 ms until every job is in one of `states`; returns their states. `during(states)` runs
    after each look. Bounded: TimeoutError after `timeout_s` with the states they were in."""
    ids = list(job_ids)
    deadline = time.monotonic() + timeout_s
    seen: dict[int, str] = {}
    while time.monotonic() < deadline:
        for part in ticking:
            part.tick()
        seen = job_states(store, ids)
        if during is not None:
            during(seen)
        if all(s in states for s in seen.values()):
            return seen
        time.sleep(0.05)
    raise TimeoutError(f"jobs still {seen}")
