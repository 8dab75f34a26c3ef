"""fractions of a GPU: partition layouts, GPU instances and slice requests

gpus: partition_mode, partitions, memory_partition (AMD compute and memory partition modes)
and mig_enabled (NVIDIA MIG mode). gpu_instances: the MIG instances and declared time-sliced
shares of each GPU and the job holding each. jobs: gpu_fraction and mig_profile (what a
fractional submit asked for) and gpu_instance (the instance its run holds). Additions only.

Revision ID: 3978d32687ad
Revises: b7d3e9a1c4f2
Create Date: 2026-12-08 02:30:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '3978d32687ad'
down_revision = 'b7d3e9a1c4f2'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.add_column(sa.Column('partition_mode', sa.String(length=8), nullable=True))
        batch_op.add_column(sa.Column('partitions', sa.Integer(), server_default='1', nullable=False))
        batch_op.add_column(sa.Column('memory_partition', sa.String(length=8), nullable=True))
        batch_op.add_column(sa.Column('mig_enabled', sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('gpu_fraction', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('mig_profile', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('gpu_instance', sa.String(length=128), nullable=True))
    op.create_table(
        'gpu_instances',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('gpu_id', sa.Integer(), nullable=False),
        sa.Column('node_name', sa.String(length=255), nullable=False),
        sa.Column('uuid', sa.String(length=128), nullable=False),
        sa.Column('kind', sa.String(length=8), nullable=False),
        sa.Column('profile', sa.String(length=32), nullable=False),
        sa.Column('fraction', sa.Float(), nullable=False),
        sa.Column('memory_gib', sa.Float(), nullable=False),
        sa.Column('slices', sa.Integer(), nullable=True),
        sa.Column('gpu_instance_id', sa.Integer(), nullable=True),
        sa.Column('device', sa.String(length=128), nullable=False),
        sa.Column('healthy', sa.Boolean(), nullable=False),
        sa.Column('job_id', sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], name=op.f('fk_gpu_instances_gpu_id_gpus'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_gpu_instances')),
        sa.UniqueConstraint('uuid', name=op.f('uq_gpu_instances_uuid')),
    )
    with op.batch_alter_table('gpu_instances', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_gpu_instances_gpu_id'), ['gpu_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_gpu_instances_job_id'), ['job_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_gpu_instances_node_name'), ['node_name'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('gpu_instances', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_gpu_instances_node_name'))
        batch_op.drop_index(batch_op.f('ix_gpu_instances_job_id'))
        batch_op.drop_index(batch_op.f('ix_gpu_instances_gpu_id'))
    op.drop_table('gpu_instances')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('gpu_instance')
        batch_op.drop_column('mig_profile')
        batch_op.drop_column('gpu_fraction')
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.drop_column('mig_enabled')
        batch_op.drop_column('memory_partition')
        batch_op.drop_column('partitions')
        batch_op.drop_column('partition_mode')
