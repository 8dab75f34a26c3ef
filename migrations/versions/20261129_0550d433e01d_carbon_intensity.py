"""carbon intensity

Revision ID: 0550d433e01d
Revises: bb490cc5a202
Create Date: 2026-11-29 16:05:08.327551
"""
from alembic import op
import sqlalchemy as sa


revision = '0550d433e01d'
down_revision = 'bb490cc5a202'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('carbon_fetches',
    sa.Column('provider', sa.String(length=32), nullable=False),
    sa.Column('zone', sa.String(length=64), nullable=False),
    sa.Column('endpoint', sa.String(length=32), nullable=False),
    sa.Column('last_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_success_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('next_allowed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('failures', sa.Integer(), nullable=False),
    sa.Column('calls', sa.Integer(), nullable=False),
    sa.Column('rows', sa.Integer(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('provider', 'zone', 'endpoint', name=op.f('pk_carbon_fetches'))
    )
    op.create_table('carbon_intensity',
    sa.Column('zone', sa.String(length=64), nullable=False),
    sa.Column('signal', sa.String(length=16), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('issued_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.Column('duration_s', sa.Integer(), nullable=False),
    sa.Column('gco2_per_kwh', sa.Float(), nullable=False),
    sa.Column('estimated', sa.Boolean(), nullable=True),
    sa.PrimaryKeyConstraint('zone', 'signal', 'kind', 'at', 'issued_at', 'source', name=op.f('pk_carbon_intensity'))
    )
    with op.batch_alter_table('carbon_intensity', schema=None) as batch_op:
        batch_op.create_index('ix_carbon_intensity_issue', ['zone', 'signal', 'kind', 'issued_at'], unique=False)

    op.create_table('carbon_zone_status',
    sa.Column('zone', sa.String(length=64), nullable=False),
    sa.Column('level', sa.String(length=16), nullable=False),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('since', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('zone', name=op.f('pk_carbon_zone_status'))
    )


def downgrade() -> None:
    op.drop_table('carbon_zone_status')
    with op.batch_alter_table('carbon_intensity', schema=None) as batch_op:
        batch_op.drop_index('ix_carbon_intensity_issue')

    op.drop_table('carbon_intensity')
    op.drop_table('carbon_fetches')
