"""carbon-aware planning: drained GPUs, max delay and plan explanations on jobs,
workload profiles learned from completed jobs

Revision ID: a94597c19f41
Revises: 0550d433e01d
Create Date: 2026-11-29 18:14:05.404749
"""
from alembic import op
import sqlalchemy as sa


revision = 'a94597c19f41'
down_revision = '0550d433e01d'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('workload_profiles',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('workload', sa.String(length=64), nullable=False),
    sa.Column('model', sa.String(length=64), nullable=False),
    sa.Column('prompts_per_s', sa.Float(), nullable=False),
    sa.Column('power_w', sa.Float(), nullable=False),
    sa.Column('latency_p50_ms', sa.Float(), nullable=True),
    sa.Column('latency_p95_ms', sa.Float(), nullable=True),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('source', sa.Text(), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_workload_profiles')),
    sa.UniqueConstraint('workload', 'model', name='uq_workload_profiles_workload_model')
    )
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.add_column(sa.Column('drained', sa.Boolean(), server_default=sa.false(), nullable=False))

    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_delay_s', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('est_gco2_if_now', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('est_runtime_planned_s', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('binding', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('deadline_miss', sa.Boolean(), server_default=sa.false(), nullable=False))



def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('deadline_miss')
        batch_op.drop_column('binding')
        batch_op.drop_column('est_runtime_planned_s')
        batch_op.drop_column('est_gco2_if_now')
        batch_op.drop_column('max_delay_s')

    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.drop_column('drained')

    op.drop_table('workload_profiles')
