"""time limits that follow the plan: jobs.time_limit_factor

A limit derived from --est-runtime (est x time_limit_factor) is re-derived when the job is
planned, from the runtime estimated on the chosen GPUs; an explicit --time-limit has no
factor and binds the plan. Jobs queued before this revision keep the limit they have (no
factor: it binds as an explicit one would).

Revision ID: 3f1d6c2a8e47
Revises: 07dcb1e63119
Create Date: 2026-12-01 10:40:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '3f1d6c2a8e47'
down_revision = '07dcb1e63119'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('time_limit_factor', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('time_limit_factor')
