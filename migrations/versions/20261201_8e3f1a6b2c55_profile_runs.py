"""profile runs: the recent runs behind each learned workload profile

Revision ID: 8e3f1a6b2c55
Revises: 5b2e9d7c4a10
Create Date: 2026-12-01 11:30:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '8e3f1a6b2c55'
down_revision = '5b2e9d7c4a10'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('workload_profiles', schema=None) as batch_op:
        batch_op.add_column(sa.Column('runs', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('workload_profiles', schema=None) as batch_op:
        batch_op.drop_column('runs')
