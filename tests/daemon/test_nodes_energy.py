"""`nodes --json` names its two energies for what they are: `energy_counter_j`, the GPU's own
counter as last read (it restarts with the driver or the emulator), and `energy_today_j`,
what the node measured since local midnight across such restarts; so a GPU whose counter
restarted shows today's energy above its counter, and no key claims otherwise."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

from scheduler.daemon.access import Caller, ServiceConfig
from scheduler.daemon.service import JobService
from scheduler.node.heartbeat import write_heartbeat

import fleet

ROOT = Caller(uid=0, gid=0)


def _reading(counter_j: float) -> SimpleNamespace:
    return SimpleNamespace(power_w=300.0, energy_j=counter_j, utilization_pct=50.0)


def test_a_restarted_counter_and_todays_energy_are_two_keys(store, tmp_path):
    now = datetime.now(timezone.utc)
    (gid,) = fleet.add_node(store, "n1", at=now)
    write_heartbeat(store, "n1", now, {"n1-0": _reading(90_000.0)}, {gid: 1_000.0}, {}, {"n1-0": gid})
    write_heartbeat(store, "n1", now, {"n1-0": _reading(50.0)}, {gid: 200.0}, {}, {"n1-0": gid})  # restarted
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path)
    (gpu,) = service.nodes(ROOT)[0]["gpus"]
    assert (gpu["energy_counter_j"], gpu["energy_today_j"]) == (50.0, 1_200.0)
    assert "energy_j" not in gpu
