"""issue 48: operator holds, released only by an operator (Slurm's admin hold)

Jobs: hold_kind, "user" (the owner's own hold: `submit --hold`, `hold JOB`; the owner
releases it) or "operator" (root or an admin group held another user's job: only an
operator releases it); NULL while the job is not held. Jobs held before this revision get
"user" when their owner held them and "operator" when someone else did (only an operator
could).

Revision ID: d48e3b1a7c05
Revises: c30e1b7d9a42
Create Date: 2026-12-07 18:30:00.000000
"""
from alembic import op
import sqlalchemy as sa



revision = 'd48e3b1a7c05'
down_revision = 'c30e1b7d9a42'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('hold_kind', sa.String(length=16), nullable=True))
    op.execute("UPDATE jobs SET hold_kind = CASE WHEN held_by IS NULL OR held_by = owner_uid THEN 'user' "
               "ELSE 'operator' END WHERE held_at IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('hold_kind')
