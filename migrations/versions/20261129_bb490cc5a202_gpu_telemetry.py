"""gpu telemetry

Revision ID: bb490cc5a202
Revises: 29f5dfb2c07f
Create Date: 2026-11-29 15:36:01.600469
"""
from alembic import op
import sqlalchemy as sa


revision = 'bb490cc5a202'
down_revision = '29f5dfb2c07f'
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('gpu_power_minutes',
    sa.Column('gpu_id', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('minute_s', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('min_w', sa.Float(), nullable=True),
    sa.Column('mean_w', sa.Float(), nullable=True),
    sa.Column('max_w', sa.Float(), nullable=True),
    sa.Column('energy_j', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('gpu_id', 'minute_s', name=op.f('pk_gpu_power_minutes'))
    )
    op.create_table('gpu_samples',
    sa.Column('minute_s', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('gpu_id', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('t_s', sa.Float(), nullable=False),
    sa.Column('power_w', sa.Float(), nullable=True),
    sa.Column('energy_j', sa.Float(), nullable=True),
    sa.Column('utilization_pct', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('minute_s', 'gpu_id', 't_s', name=op.f('pk_gpu_samples')),
    sqlite_with_rowid=False,
    )

    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.add_column(sa.Column('utilization_pct', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('energy_day', sa.String(length=10), nullable=True))
        batch_op.add_column(sa.Column('energy_day_j', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('unhealthy_reason', sa.Text(), nullable=True))




def downgrade() -> None:

    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.drop_column('unhealthy_reason')
        batch_op.drop_column('energy_day_j')
        batch_op.drop_column('energy_day')
        batch_op.drop_column('utilization_pct')

    op.drop_table('gpu_samples')
    op.drop_table('gpu_power_minutes')

