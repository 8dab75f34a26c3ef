"""issue 20: the Slurm job a carbonsched job is

A job adopted from a plain `sbatch` (held in a carbon-aware partition) keeps its Slurm job
id here; unique, so two agents sweeping Slurm at once never adopt one Slurm job twice.

Revision ID: 3a7d5c1e9f20
Revises: c17a0e5b9d21
Create Date: 2026-12-01 13:45:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '3a7d5c1e9f20'
down_revision = 'c17a0e5b9d21'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('slurm_job_id', sa.BigInteger(), nullable=True))
        batch_op.create_index('ix_jobs_slurm_job_id', ['slurm_job_id'], unique=True)


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_jobs_slurm_job_id')
        batch_op.drop_column('slurm_job_id')
