"""issue 18: TTFT/TPOT SLOs and the planned operating point

Per job: the p95 time-to-first-token and time-per-output-token limits (ms) beside the
per-prompt latency SLO, and the operating point the plan chose on its GPUs (batch limit,
precision, tensor-parallel degree), which the agent hands to the job's environment.

Revision ID: e18a4f2c7b31
Revises: 3a7d5c1e9f20
Create Date: 2026-12-01 14:10:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = 'e18a4f2c7b31'
down_revision = '3a7d5c1e9f20'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('ttft_slo_ms', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('tpot_slo_ms', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('planned_max_batch', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('planned_precision', sa.String(length=8), nullable=True))
        batch_op.add_column(sa.Column('planned_tp', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('planned_tp')
        batch_op.drop_column('planned_precision')
        batch_op.drop_column('planned_max_batch')
        batch_op.drop_column('tpot_slo_ms')
        batch_op.drop_column('ttft_slo_ms')
