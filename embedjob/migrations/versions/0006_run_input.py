"""The input a run was of (embedjob_runs.input), so a refused re-run can name the recorded input and the new one.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("embedjob_runs", sa.Column("input", postgresql.JSONB))


def downgrade() -> None:
    op.drop_column("embedjob_runs", "input")
