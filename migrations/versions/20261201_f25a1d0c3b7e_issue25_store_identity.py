"""store identity: a random id per store, so per-job files on disk are bound to one store

Revision ID: f25a1d0c3b7e
Revises: e18a4f2c7b31
Create Date: 2026-12-01 19:30:00.000000
"""
import uuid
from datetime import datetime, timezone

from alembic import op
import sqlalchemy as sa


revision = 'f25a1d0c3b7e'
down_revision = 'e18a4f2c7b31'
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        'store_identity',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('store_id', sa.String(length=32), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_store_identity')),
    )
    op.bulk_insert(table, [{'id': 1, 'store_id': uuid.uuid4().hex,
                            'created_at': datetime.now(timezone.utc)}])


def downgrade() -> None:
    op.drop_table('store_identity')
