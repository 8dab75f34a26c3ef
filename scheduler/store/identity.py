"""The store's own identity: a random id made once, when its schema is created.

Job ids are unique within one store only: a daemon restarted on the same state directory
with a new (or restored, or replaced) database numbers its jobs from 1 again. Whatever a
process keeps on disk per job id (run records, logs, metrics files) is therefore bound to
the store's id (`scheduler.state_dir`), so one store's job N never gets another's files.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Integer, String, insert, select
from sqlalchemy.orm import Mapped, mapped_column

from scheduler.clock import utcnow
from scheduler.store.base import Base, UTCDateTime


class StoreIdentity(Base):
    """One row: this store's id (32 hex digits) and when it was made."""

    __tablename__ = "store_identity"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)  # always 1
    store_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


store_identity = StoreIdentity.__table__


def new_store_id() -> str:
    return uuid.uuid4().hex


def store_id(store) -> str:
    """This store's id; made now if its row is missing (a schema created by hand)."""
    with store.read() as conn:
        found = conn.execute(select(store_identity.c.store_id).where(store_identity.c.id == 1)).scalar()
    if found:
        return found

    def make(conn) -> str:
        again = conn.execute(select(store_identity.c.store_id).where(store_identity.c.id == 1)).scalar()
        if again:
            return again
        made = new_store_id()
        conn.execute(insert(store_identity).values(id=1, store_id=made, created_at=utcnow()))
        return made

    return store.transact(make)
