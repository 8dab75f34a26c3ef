"""issue 28: drain reasons, holds, --begin, dependencies, job arrays, --output/--error, logs in the store

GPUs: who drained them, when and why. Jobs: held_at/held_by, begin_at, the dependency text,
the array a task belongs to (array_job_id, array_task_id, array_max_running), and the
--output/--error paths. New tables: job_dependencies (one row per afterok/afterany/afternotok
edge, read by the planner's filter) and job_log_chunks (a job's output copied into the store
by the agent that ran it, for `logs` on the head node).

Revision ID: a28f0c3d5e71
Revises: f25a1d0c3b7e
Create Date: 2026-12-01 19:30:00.000000
"""
from alembic import op
import sqlalchemy as sa



revision = 'a28f0c3d5e71'
down_revision = 'f25a1d0c3b7e'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.add_column(sa.Column('drain_reason', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('drained_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('drained_by', sa.Integer(), nullable=True))
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('held_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('held_by', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('begin_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('dependency', sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column('array_job_id', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('array_task_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('array_max_running', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('stdout_path', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('stderr_path', sa.Text(), nullable=True))
        batch_op.create_index(batch_op.f('ix_jobs_array_job_id'), ['array_job_id'], unique=False)
    op.create_table(
        'job_dependencies',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
        sa.Column('job_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
        sa.Column('on_job_id', sa.BigInteger(), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_dependencies_job_id_jobs'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_job_dependencies')),
    )
    op.create_index(op.f('ix_job_dependencies_job_id'), 'job_dependencies', ['job_id'], unique=False)
    op.create_index(op.f('ix_job_dependencies_on_job_id'), 'job_dependencies', ['on_job_id'], unique=False)
    op.create_table(
        'job_log_chunks',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
        sa.Column('job_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
        sa.Column('stream', sa.String(length=8), nullable=False),
        sa.Column('offset', sa.BigInteger(), nullable=False),
        sa.Column('data', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_log_chunks_job_id_jobs'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_job_log_chunks')),
    )
    op.create_index('ix_job_log_chunks_job_id_stream_offset', 'job_log_chunks', ['job_id', 'stream', 'offset'],
                    unique=False)


def downgrade() -> None:
    op.drop_index('ix_job_log_chunks_job_id_stream_offset', table_name='job_log_chunks')
    op.drop_table('job_log_chunks')
    op.drop_index(op.f('ix_job_dependencies_on_job_id'), table_name='job_dependencies')
    op.drop_index(op.f('ix_job_dependencies_job_id'), table_name='job_dependencies')
    op.drop_table('job_dependencies')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_array_job_id'))
        for c in ('stderr_path', 'stdout_path', 'array_max_running', 'array_task_id', 'array_job_id',
                  'dependency', 'begin_at', 'held_by', 'held_at'):
            batch_op.drop_column(c)
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        for c in ('drained_by', 'drained_at', 'drain_reason'):
            batch_op.drop_column(c)
