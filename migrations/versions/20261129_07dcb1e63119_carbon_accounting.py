"""carbon accounting: where each job ran, how its gCO2 was priced, indexes for period reports

Revision ID: 07dcb1e63119
Revises: a94597c19f41
Create Date: 2026-11-29 19:30:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '07dcb1e63119'
down_revision = 'a94597c19f41'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('zone', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('gpu_model', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('tokens', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('pue', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('gco2_signal', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('gco2_basis', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('gco2_coverage', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('energy_note', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('accounted_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index('ix_jobs_ended_at', ['ended_at'], unique=False)
        batch_op.create_index('ix_jobs_owner_uid_ended_at', ['owner_uid', 'ended_at'], unique=False)
        batch_op.create_index('ix_jobs_accounted_at', ['accounted_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_jobs_accounted_at')
        batch_op.drop_index('ix_jobs_owner_uid_ended_at')
        batch_op.drop_index('ix_jobs_ended_at')
        batch_op.drop_column('accounted_at')
        batch_op.drop_column('energy_note')
        batch_op.drop_column('gco2_coverage')
        batch_op.drop_column('gco2_basis')
        batch_op.drop_column('gco2_signal')
        batch_op.drop_column('pue')
        batch_op.drop_column('tokens')
        batch_op.drop_column('gpu_model')
        batch_op.drop_column('zone')
