"""job reported work: prompts and tokens a job wrote into its metrics file

Revision ID: 5b2e9d7c4a10
Revises: 3f1d6c2a8e47
Create Date: 2026-12-01 11:10:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '5b2e9d7c4a10'
down_revision = '3f1d6c2a8e47'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('reported_prompts', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('reported_input_tokens', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('reported_output_tokens', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('reported_output_tokens')
        batch_op.drop_column('reported_input_tokens')
        batch_op.drop_column('reported_prompts')
