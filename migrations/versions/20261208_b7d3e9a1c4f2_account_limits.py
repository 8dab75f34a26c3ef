"""account limits: budgets of GPU-hours, kWh and kgCO2e per period

One row per account and currency: the amount (GPU-hours, kWh or kg) the account's subtree
may be charged per period (`month`, `quarter`, or a date range `YYYY-MM-DD..YYYY-MM-DD`).

Revision ID: b7d3e9a1c4f2
Revises: e5a1c7d2b9f4
Create Date: 2026-12-08 02:50:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = 'b7d3e9a1c4f2'
down_revision = 'e5a1c7d2b9f4'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'account_limits',
        sa.Column('account', sa.String(length=255), nullable=False),
        sa.Column('currency', sa.String(length=16), nullable=False),
        sa.Column('amount', sa.Float(), nullable=False),
        sa.Column('period', sa.String(length=32), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['account'], ['accounts.name'], name=op.f('fk_account_limits_account_accounts'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('account', 'currency', name=op.f('pk_account_limits')),
    )


def downgrade() -> None:
    op.drop_table('account_limits')
