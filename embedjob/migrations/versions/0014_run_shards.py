"""The shards of a dataset a run has read through (embedjob_run_shards): a resumed session skips the files it finished.

Revision ID: 0014
Revises: 0013

Row-level security as migration 0005 gives the other tables a driver writes (a confined role uses only the rows of
its namespaces' runs), and every role that may already write `embedjob_seen_ids` (a role `python -m
embedjob.tenants grant` set up before this migration) gets the same privileges here, so an upgrade needs no new grant.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from embedjob.migrations.tenant_rows import confine_rows, own_namespace

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

TABLE = "embedjob_run_shards"
# A row is one the role may use when its run is (migration 0005 words it so for embedjob_seen_ids).
_OWN_RUN = (f"EXISTS (SELECT FROM embedjob_runs r WHERE r.run_id = {TABLE}.run_id AND {own_namespace('r.namespace')})")


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("run_id", sa.String(36), sa.ForeignKey("embedjob_runs.run_id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("first_file", sa.Integer, primary_key=True),
        sa.Column("files", sa.Integer, nullable=False),
        sa.Column("records", sa.BigInteger, nullable=False),
        sa.Column("batches", sa.Integer, nullable=False),
        sa.Column("counts", postgresql.JSONB, nullable=False),
        sa.Column("batch_ids", postgresql.ARRAY(sa.Text), nullable=False),
    )
    confine_rows(TABLE, _OWN_RUN)


def downgrade() -> None:
    op.drop_table(TABLE)
