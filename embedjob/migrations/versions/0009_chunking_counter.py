"""A run's chunks embedded (spec.chunking: one vector per chunk), a column as api.RunCounters has it.

The vectors tables are the user's and not Alembic's: the driver adds their chunk columns
itself (embedjob_worker.sink.vectors_table), since it alone knows which tables a job writes.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("embedjob_runs", sa.Column("chunks_embedded", sa.BigInteger, nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("embedjob_runs", "chunks_embedded")
