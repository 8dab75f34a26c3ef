"""issue 30: interruptible jobs (checkpoint and resume, pause in place) and their segments

Jobs: interruptible, checkpoint_signal, checkpoint_grace_s, min_run_s, resume_cost_s,
max_segments (what the user submitted); done_fraction, resume_count, checkpoints_ignored,
first_started_at (progress across segments); planned_segments, planned_interrupt_at,
planned_resume_at (the plan). New table job_segments: one row per run or pause of an
interruptible job, with its energy and gCO2.

Revision ID: c30e1b7d9a42
Revises: b29c4e7a1d03
Create Date: 2026-12-02 01:40:00.000000
"""
from alembic import op
import sqlalchemy as sa



revision = 'c30e1b7d9a42'
down_revision = 'b29c4e7a1d03'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('interruptible', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('checkpoint_signal', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('checkpoint_grace_s', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('min_run_s', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('resume_cost_s', sa.Float(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('max_segments', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('done_fraction', sa.Float(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('resume_count', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('checkpoints_ignored', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('first_started_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('planned_segments', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('planned_interrupt_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('planned_resume_at', sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        'job_segments',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
        sa.Column('job_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
        sa.Column('seq', sa.Integer(), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('outcome', sa.String(length=32), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('node', sa.String(length=255), nullable=True),
        sa.Column('gpu_ids', sa.JSON(), nullable=True),
        sa.Column('energy_j', sa.Float(), nullable=True),
        sa.Column('energy_method', sa.String(length=32), nullable=True),
        sa.Column('gco2', sa.Float(), nullable=True),
        sa.Column('lost_s', sa.Float(), server_default='0', nullable=False),
        sa.Column('done_fraction', sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_segments_job_id_jobs'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_job_segments')),
        sa.UniqueConstraint('job_id', 'seq', name='uq_job_segments_job_id_seq'),
    )
    with op.batch_alter_table('job_segments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_segments_job_id'), ['job_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('job_segments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_segments_job_id'))
    op.drop_table('job_segments')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        for name in ('planned_resume_at', 'planned_interrupt_at', 'planned_segments', 'first_started_at',
                     'checkpoints_ignored', 'resume_count', 'done_fraction', 'max_segments', 'resume_cost_s',
                     'min_run_s', 'checkpoint_grace_s', 'checkpoint_signal', 'interruptible'):
            batch_op.drop_column(name)
