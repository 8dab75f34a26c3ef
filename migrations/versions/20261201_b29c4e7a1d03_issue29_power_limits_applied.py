"""issue 29: the planner's power limit per job, what the agent applied, the GPUs' default limit

Jobs: planned_power_limit_w (the per-GPU limit the plan chose; NULL: the default), the
estimate without a cap beside the planned one (est_uncapped_energy_j, est_uncapped_gco2,
est_uncapped_runtime_s), and what the agent applied (power_limit_w; NULL: ran uncapped) with
power_limit_note (why a planned limit was not applied). GPUs: power_limit_default_w.

Revision ID: b29c4e7a1d03
Revises: a28f0c3d5e71
Create Date: 2026-12-01 22:30:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = 'b29c4e7a1d03'
down_revision = 'a28f0c3d5e71'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('planned_power_limit_w', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('est_uncapped_energy_j', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('est_uncapped_gco2', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('est_uncapped_runtime_s', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('power_limit_w', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('power_limit_note', sa.Text(), nullable=True))
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.add_column(sa.Column('power_limit_default_w', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.drop_column('power_limit_default_w')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('power_limit_note')
        batch_op.drop_column('power_limit_w')
        batch_op.drop_column('est_uncapped_runtime_s')
        batch_op.drop_column('est_uncapped_gco2')
        batch_op.drop_column('est_uncapped_energy_j')
        batch_op.drop_column('planned_power_limit_w')
