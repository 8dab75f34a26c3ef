"""GPU slices in the store on SQLite and PostgreSQL: the migration that adds them goes down
and up (gpu_instances, the partition columns of gpus, the slice columns of jobs), the models
match the migrated schema, and an instance goes with its GPU."""

from __future__ import annotations

from alembic import command
from sqlalchemy import delete, insert, inspect, select

from scheduler.store.engine import alembic_config
from scheduler.store.models import gpu_instances, gpus, nodes
from scheduler.clock import utcnow

REVISION = "3978d32687ad"  # adds gpu_instances and the slice columns
BEFORE = "b7d3e9a1c4f2"


def columns(conn, table: str) -> set[str]:
    return {c["name"] for c in inspect(conn).get_columns(table)}


def test_the_migration_goes_down_and_up(store):
    assert store.schema_revision() == REVISION and store.check() == []
    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), BEFORE)
    with store.engine.connect() as conn:
        assert "gpu_instances" not in set(inspect(conn).get_table_names())
        assert not {"partition_mode", "partitions", "memory_partition", "mig_enabled"} & columns(conn, "gpus")
        assert not {"gpu_fraction", "mig_profile", "gpu_instance"} & columns(conn, "jobs")
    assert store.schema_revision() == BEFORE
    store.upgrade()
    assert store.check() == []
    with store.engine.connect() as conn:
        assert {"partition_mode", "partitions", "memory_partition", "mig_enabled"} <= columns(conn, "gpus")


def test_an_instance_goes_with_its_gpu_and_existing_gpus_default_to_whole(store):
    def tx(conn):
        conn.execute(insert(nodes).values(name="n1", zone="DE", backend="nvml", emulated=False,
                                          registered_at=utcnow()))
        gid = conn.execute(insert(gpus).values(node_name="n1", index=0, uuid="GPU-1", model="H100",
                                               vendor="nvidia", memory_gib=80.0).returning(gpus.c.id)).scalar_one()
        conn.execute(insert(gpu_instances).values(gpu_id=gid, node_name="n1", uuid="MIG-1", kind="mig",
                                                  profile="1g.10gb", fraction=1 / 7, memory_gib=10.0,
                                                  device="MIG-1", healthy=True))
        return gid

    gid = store.transact(tx)
    with store.read() as conn:
        g = conn.execute(select(gpus).where(gpus.c.id == gid)).one()
        assert (g.partitions, g.mig_enabled, g.partition_mode) == (1, False, None)
    store.transact(lambda conn: conn.execute(delete(gpus).where(gpus.c.id == gid)))
    with store.read() as conn:
        assert conn.execute(select(gpu_instances)).all() == []
