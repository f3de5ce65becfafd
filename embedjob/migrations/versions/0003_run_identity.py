"""The parts of a run's identity (embedjob_runs.identity), so a refusal can name what changed.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("embedjob_runs", sa.Column("identity", postgresql.JSONB))


def downgrade() -> None:
    op.drop_column("embedjob_runs", "identity")
