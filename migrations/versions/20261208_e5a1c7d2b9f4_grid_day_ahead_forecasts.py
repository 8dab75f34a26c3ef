"""grid operators' day-ahead wind and solar forecasts

grid_day_ahead: per zone, UTC hour, production type (solar, wind, wind_onshore,
wind_offshore) and issue time, the hour's mean generation forecast in MW, whether the source
imputed it, its source and when it was imported. New table only; nothing existing changes.

Revision ID: e5a1c7d2b9f4
Revises: 7c2e4a9f1b36
Create Date: 2026-12-08 02:10:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = 'e5a1c7d2b9f4'
down_revision = '7c2e4a9f1b36'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'grid_day_ahead',
        sa.Column('zone', sa.String(length=64), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('production_type', sa.String(length=16), nullable=False),
        sa.Column('issued_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('mw', sa.Float(), nullable=False),
        sa.Column('imputed', sa.Boolean(), nullable=False),
        sa.Column('source', sa.String(length=64), nullable=False),
        sa.Column('imported_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('zone', 'at', 'production_type', 'issued_at', name=op.f('pk_grid_day_ahead')),
    )


def downgrade() -> None:
    op.drop_table('grid_day_ahead')
