"""issue 16: carbon_zone_versions (a per-zone counter of carbon data changes)

Every write of a zone's carbon data (import, provider refresh) bumps its row in the same
transaction, so the planner (another process) sees fresh data on its next tick.

Revision ID: 0ddf46c558cb
Revises: 8e3f1a6b2c55
Create Date: 2026-12-01 10:50:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0ddf46c558cb'
down_revision = '8e3f1a6b2c55'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('carbon_zone_versions',
    sa.Column('zone', sa.String(length=64), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('zone', name=op.f('pk_carbon_zone_versions'))
    )


def downgrade() -> None:
    op.drop_table('carbon_zone_versions')
