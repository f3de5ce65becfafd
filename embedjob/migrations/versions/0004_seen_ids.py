"""The record ids a run has read (embedjob_seen_ids): duplicate ids decided in PostgreSQL, not in driver memory.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "embedjob_seen_ids",
        sa.Column("run_id", sa.String(36), sa.ForeignKey("embedjob_runs.run_id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("record_id", sa.Text, primary_key=True),
        sa.Column("position", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("embedjob_seen_ids")
