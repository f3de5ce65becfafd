"""The driver session's own counts as the run row's counters hold them: a retried write adds them only once.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("embedjob_runs", sa.Column("driver_counts", postgresql.JSONB))


def downgrade() -> None:
    op.drop_column("embedjob_runs", "driver_counts")
