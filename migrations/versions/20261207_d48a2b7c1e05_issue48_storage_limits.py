"""issue 48: storage limits: what each job stored, when it was purged, truncated output

Jobs: stored_bytes (the request's command, environment and paths, counted against the
owner's stored-bytes limit), purged_at (command and environment dropped after the retention;
the row stays as the accounting record), output_truncated (streams cut at the output limit).

Revision ID: d48a2b7c1e05
Revises: d48e3b1a7c05
Create Date: 2026-12-07 18:30:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = 'd48a2b7c1e05'
down_revision = 'd48e3b1a7c05'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('stored_bytes', sa.BigInteger(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('purged_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('output_truncated', sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('output_truncated')
        batch_op.drop_column('purged_at')
        batch_op.drop_column('stored_bytes')
