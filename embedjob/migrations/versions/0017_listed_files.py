"""A dataset's listing in a table of its own (embedjob_listed_files), written page by page: the driver keeps none of it.

Revision ID: 0017
Revises: 0016

Before this, a run kept its dataset's listing in its memory and in its row (embedjob_runs.input's "files"), linear
in the files. Row-level security as migration 0014 gives embedjob_run_shards, by the job's namespace held in each
row (a listing is written before its run row exists).
"""

import sqlalchemy as sa
from alembic import op

from embedjob.migrations.tenant_rows import confine_rows, own_namespace

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

TABLE = "embedjob_listed_files"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("listing_id", sa.String(36), primary_key=True),
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("job_key", sa.String(300), nullable=False, index=True),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("uri", sa.Text, nullable=False),
        sa.Column("size", sa.BigInteger),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("modified", sa.Text),
    )
    confine_rows(TABLE, own_namespace(f"{TABLE}.namespace"))


def downgrade() -> None:
    op.drop_table(TABLE)
