"""The driver session that owns a run: group writes commit only while their session still owns it.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("embedjob_runs", sa.Column("driver_session", sa.String(36)))


def downgrade() -> None:
    op.drop_column("embedjob_runs", "driver_session")
