"""issue 17: GPU power limits and reported memory

Per GPU: the enforced power limit and its range (W), and the memory the driver reported
(GiB) beside the nominal capacity that `memory_gib` now holds.

Revision ID: c17a0e5b9d21
Revises: 0ddf46c558cb
Create Date: 2026-12-01 10:45:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = 'c17a0e5b9d21'
down_revision = '0ddf46c558cb'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.add_column(sa.Column('memory_reported_gib', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('power_limit_w', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('power_limit_min_w', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('power_limit_max_w', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.drop_column('power_limit_max_w')
        batch_op.drop_column('power_limit_min_w')
        batch_op.drop_column('power_limit_w')
        batch_op.drop_column('memory_reported_gib')
