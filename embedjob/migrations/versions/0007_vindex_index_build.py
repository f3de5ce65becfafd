"""How long a run spent building the vector index after its load (embedjob_runs.index_build_seconds).

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("embedjob_runs", sa.Column("index_build_seconds", sa.Float))


def downgrade() -> None:
    op.drop_column("embedjob_runs", "index_build_seconds")
