"""The change window of a table run read by spec.source.table.changeColumn: the column, where the read started
and the watermark it leaves for the next run (embedjob_worker.core.change_window).

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("embedjob_runs", sa.Column("change_window", postgresql.JSONB))


def downgrade() -> None:
    op.drop_column("embedjob_runs", "change_window")
