"""accounts, their users, and each job's account and QOS

Accounts: an operator-managed tree (name, parent, fair-share shares, description); the
built-in `default` account is made here, so a one-user install needs no set-up.
Account users: which user may charge which account, and each user's default account.
Jobs: account (every job before this revision: `default`) and qos (`normal`).

Revision ID: 7c2e4a9f1b36
Revises: d48a2b7c1e05
Create Date: 2026-12-07 23:40:00.000000
"""
from datetime import datetime, timezone

from alembic import op
import sqlalchemy as sa


revision = '7c2e4a9f1b36'
down_revision = 'd48a2b7c1e05'
branch_labels = None
depends_on = None


def upgrade() -> None:
    accounts = op.create_table(
        'accounts',
        sa.Column('name', sa.String(length=255), nullable=False),
        sa.Column('parent', sa.String(length=255), nullable=True),
        sa.Column('shares', sa.Integer(), server_default='1', nullable=False),
        sa.Column('description', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['parent'], ['accounts.name'], name=op.f('fk_accounts_parent_accounts'),
                                ondelete='RESTRICT'),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_accounts')),
    )
    with op.batch_alter_table('accounts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_accounts_parent'), ['parent'], unique=False)
    op.create_table(
        'account_users',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('user_name', sa.String(length=255), nullable=False),
        sa.Column('account', sa.String(length=255), nullable=False),
        sa.Column('is_default', sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['account'], ['accounts.name'], name=op.f('fk_account_users_account_accounts'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_account_users')),
        sa.UniqueConstraint('user_name', 'account', name='uq_account_users_user_name_account'),
    )
    with op.batch_alter_table('account_users', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_account_users_account'), ['account'], unique=False)
        batch_op.create_index(batch_op.f('ix_account_users_user_name'), ['user_name'], unique=False)
    # SQLite keeps naive UTC, PostgreSQL an aware time: the same instant either way.
    now = datetime.now(timezone.utc)
    created = now.replace(tzinfo=None) if op.get_bind().dialect.name == 'sqlite' else now
    op.bulk_insert(accounts, [{'name': 'default', 'parent': None, 'shares': 1,
                               'description': 'built in: jobs of users without an account', 'created_at': created}])
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('account', sa.String(length=255), server_default='default', nullable=False))
        batch_op.add_column(sa.Column('qos', sa.String(length=64), server_default='normal', nullable=False))
        batch_op.create_index('ix_jobs_account_state', ['account', 'state'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_jobs_account_state')
        batch_op.drop_column('qos')
        batch_op.drop_column('account')
    with op.batch_alter_table('account_users', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_account_users_user_name'))
        batch_op.drop_index(batch_op.f('ix_account_users_account'))
    op.drop_table('account_users')
    with op.batch_alter_table('accounts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_accounts_parent'))
    op.drop_table('accounts')
