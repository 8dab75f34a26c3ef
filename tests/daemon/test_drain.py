"""Draining GPUs as an operator addresses them (issue 28): by the names `nodes` prints
(NODE, then VENDOR:INDEX), never two GPUs of a mixed-vendor node for one name, and a
drained GPU shows as DRAINED with its reason, like `sinfo -R`, in the table and in --json.
On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import insert

from scheduler.cli.output import nodes_table
from scheduler.daemon.access import Caller, RequestError, ServiceConfig
from scheduler.daemon.service import JobService
from scheduler.store.models import gpus, nodes

ROOT = Caller(uid=0, gid=0)
T = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def service(store, tmp_path):
    """A mixed-vendor node `vm` (amd:0, amd:1, nvidia:0, nvidia:1) and a one-vendor node `h1`."""
    with store.write() as conn:
        for name in ("vm", "h1"):
            conn.execute(insert(nodes).values(name=name, zone="DE", backend="emulated", emulated=True,
                                              registered_at=T, last_heartbeat=T))
        for vendor, model in (("amd", "MI300X"), ("nvidia", "H100")):
            for i in range(2):
                conn.execute(insert(gpus).values(node_name="vm", index=i, uuid=f"vm-{vendor}-{i}", model=model,
                                                 vendor=vendor, memory_gib=80, healthy=True))
        for i in range(2):
            conn.execute(insert(gpus).values(node_name="h1", index=i, uuid=f"h1-{i}", model="H100",
                                             vendor="nvidia", memory_gib=80, healthy=True))
    return JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs", clock=lambda: T)


def drained(service) -> dict[str, tuple[bool, str | None]]:
    return {g["name"]: (g["drained"], g["drain_reason"]) for n in service.nodes(ROOT) for g in n["gpus"]}


def test_a_gpu_is_drained_by_the_name_nodes_prints_and_only_that_gpu(service):
    names = [f"{n['name']}:{g['vendor']}:{g['index']}" for n in service.nodes(ROOT) for g in n["gpus"]]
    assert "vm:amd:1" in names  # what `nodes` shows as NODE vm, GPU amd:1
    r = service.drain(ROOT, {"target": "vm:amd:1", "reason": "fan noise"}, drained=True)
    assert [g["name"] for g in r["gpus"]] == ["vm:amd:1"]
    state = drained(service)
    assert state["vm:amd:1"] == (True, "fan noise")
    assert [k for k, (d, _) in state.items() if d] == ["vm:amd:1"]


def test_node_colon_index_on_a_mixed_vendor_node_is_refused_as_ambiguous_and_changes_nothing(service):
    with pytest.raises(RequestError) as e:
        service.drain(ROOT, {"target": "vm:1"}, drained=True)
    assert e.value.status == 409
    assert "vm:amd:1 and vm:nvidia:1" in e.value.message
    assert not any(d for d, _ in drained(service).values())


def test_node_colon_index_still_works_where_the_node_has_one_vendor(service):
    r = service.drain(ROOT, {"target": "h1:1"}, drained=True)
    assert [g["name"] for g in r["gpus"]] == ["h1:nvidia:1"]


def test_a_drained_node_shows_drained_with_its_reason_in_json_and_the_table(service):
    service.drain(ROOT, {"target": "h1", "reason": "firmware upgrade"}, drained=True)
    listing = {n["name"]: n for n in service.nodes(ROOT)}
    assert listing["h1"]["state"] == "DRAINED" and listing["vm"]["state"] == "UP"
    g = listing["h1"]["gpus"][0]
    assert (g["state"], g["drain_reason"], g["drained_by"], g["drained_at"]) == (
        "DRAINED", "firmware upgrade", 0, "2026-12-01T12:00:00Z")
    text = nodes_table(service.nodes(ROOT))
    h1_rows = [line for line in text.splitlines() if line.startswith("h1")]
    assert len(h1_rows) == 2 and all("DRAINED" in row and "firmware upgrade" in row for row in h1_rows)
    assert "REASON" in text.splitlines()[0]
    vm_rows = [line for line in text.splitlines() if line.startswith("vm")]
    assert all(" up " in row and "DRAINED" not in row for row in vm_rows)


def test_resume_clears_the_drain_and_its_reason(service):
    service.drain(ROOT, {"target": "vm:nvidia:0", "reason": "x"}, drained=True)
    service.drain(ROOT, {"target": "vm:nvidia:0"}, drained=False)
    assert drained(service)["vm:nvidia:0"] == (False, None)
    assert "REASON" not in nodes_table(service.nodes(ROOT)).splitlines()[0]


def test_an_unknown_target_names_the_forms_it_takes(service):
    with pytest.raises(RequestError) as e:
        service.drain(ROOT, {"target": "vm:intel:3"}, drained=True)
    assert e.value.status == 404 and "NODE:VENDOR:INDEX" in e.value.message
