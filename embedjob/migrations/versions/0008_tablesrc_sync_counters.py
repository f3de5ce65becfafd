"""A run's incremental counters (records new, changed, unchanged, deleted), one column each as api.RunCounters has them.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

COLUMNS = ("records_new", "records_changed", "records_unchanged", "records_deleted")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("embedjob_runs", sa.Column(name, sa.BigInteger, nullable=False, server_default="0"))


def downgrade() -> None:
    for name in COLUMNS:
        op.drop_column("embedjob_runs", name)
