"""Alembic environment: runs against the connection carbonsched hands in, or a URL."""

from __future__ import annotations

import os

from alembic import context

from scheduler.store.engine import make_engine
import scheduler.store.models  # noqa: F401  (every table on Base.metadata)
from scheduler.store.base import Base

config = context.config
target_metadata = Base.metadata


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = (context.get_x_argument(as_dictionary=True).get("db")
           or os.environ.get("CARBONSCHED_DB") or "sqlite:///alembic-scratch.db")
    engine = make_engine(url)
    with engine.connect() as conn:
        _run(conn)
        conn.commit()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("carbonsched migrations run online only; pass -x db=URL")
run_migrations_online()
