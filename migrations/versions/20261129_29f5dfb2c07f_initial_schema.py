"""initial schema

Revision ID: 29f5dfb2c07f
Revises: (none: the first revision)
Create Date: 2026-11-29 15:24:48.100167
"""
from alembic import op
import sqlalchemy as sa


revision = '29f5dfb2c07f'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    
    op.create_table('jobs',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('owner_uid', sa.Integer(), nullable=False),
    sa.Column('owner_gid', sa.Integer(), nullable=False),
    sa.Column('owner_groups', sa.JSON(), nullable=False),
    sa.Column('owner_name', sa.String(length=255), nullable=False),
    sa.Column('argv', sa.JSON(), nullable=False),
    sa.Column('cwd', sa.Text(), nullable=False),
    sa.Column('env', sa.JSON(), nullable=False),
    sa.Column('gpus', sa.Integer(), nullable=False),
    sa.Column('gpu_mem_gib', sa.Float(), nullable=False),
    sa.Column('deadline', sa.DateTime(timezone=True), nullable=True),
    sa.Column('latency_slo_ms', sa.Float(), nullable=True),
    sa.Column('workload', sa.String(length=64), nullable=True),
    sa.Column('prompts', sa.BigInteger(), nullable=True),
    sa.Column('est_runtime_s', sa.Float(), nullable=True),
    sa.Column('time_limit_s', sa.Float(), nullable=True),
    sa.Column('max_retries', sa.Integer(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('submitted_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('planned_node', sa.String(length=255), nullable=True),
    sa.Column('planned_gpu_ids', sa.JSON(), nullable=True),
    sa.Column('planned_start', sa.DateTime(timezone=True), nullable=True),
    sa.Column('plan_rev', sa.Integer(), nullable=False),
    sa.Column('est_energy_j', sa.Float(), nullable=True),
    sa.Column('est_gco2', sa.Float(), nullable=True),
    sa.Column('explanation', sa.Text(), nullable=True),
    sa.Column('node', sa.String(length=255), nullable=True),
    sa.Column('gpu_ids', sa.JSON(), nullable=True),
    sa.Column('gpu_indices', sa.JSON(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('energy_j', sa.Float(), nullable=True),
    sa.Column('energy_method', sa.String(length=32), nullable=True),
    sa.Column('gco2', sa.Float(), nullable=True),
    sa.Column('cancel_requested_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancel_requested_by', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs'))
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index('ix_jobs_owner_uid_state', ['owner_uid', 'state'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_state'), ['state'], unique=False)
        batch_op.create_index('ix_jobs_state_planned_node', ['state', 'planned_node'], unique=False)

    op.create_table('nodes',
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('zone', sa.String(length=64), nullable=False),
    sa.Column('backend', sa.String(length=32), nullable=False),
    sa.Column('emulated', sa.Boolean(), nullable=False),
    sa.Column('registered_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_heartbeat', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_nodes'))
    )
    op.create_table('gpus',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('node_name', sa.String(length=255), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('uuid', sa.String(length=128), nullable=False),
    sa.Column('model', sa.String(length=64), nullable=False),
    sa.Column('vendor', sa.String(length=16), nullable=False),
    sa.Column('memory_gib', sa.Float(), nullable=False),
    sa.Column('healthy', sa.Boolean(), nullable=False),
    sa.Column('power_w', sa.Float(), nullable=True),
    sa.Column('energy_j', sa.Float(), nullable=True),
    sa.Column('job_id', sa.BigInteger(), nullable=True),
    sa.ForeignKeyConstraint(['node_name'], ['nodes.name'], name=op.f('fk_gpus_node_name_nodes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_gpus')),
    sa.UniqueConstraint('node_name', 'vendor', 'index', name='uq_gpus_node_vendor_index'),
    sa.UniqueConstraint('uuid', name=op.f('uq_gpus_uuid'))
    )
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_gpus_job_id'), ['job_id'], unique=False)

    op.create_table('job_events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('from_state', sa.String(length=16), nullable=True),
    sa.Column('to_state', sa.String(length=16), nullable=False),
    sa.Column('actor_uid', sa.Integer(), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_events_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job_events'))
    )
    with op.batch_alter_table('job_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_events_job_id'), ['job_id'], unique=False)

    


def downgrade() -> None:
    
    with op.batch_alter_table('job_events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_events_job_id'))

    op.drop_table('job_events')
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_gpus_job_id'))

    op.drop_table('gpus')
    op.drop_table('nodes')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_jobs_state_planned_node')
        batch_op.drop_index(batch_op.f('ix_jobs_state'))
        batch_op.drop_index('ix_jobs_owner_uid_state')

    op.drop_table('jobs')
    
