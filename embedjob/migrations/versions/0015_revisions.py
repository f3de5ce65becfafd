"""The state of each revision of a collection's vectors (embedjob_revisions): searches read the ready one.

Revision ID: 0015
Revises: 0014

Row-level security as migration 0005 gives the tables a driver writes (a confined role uses only the rows of its
namespaces), and every role that may already write `embedjob_seen_ids` (a role `python -m embedjob.tenants grant`
set up before this migration) gets the same privileges here, so an upgrade needs no new grant; a role that reads
`embedjob_runs` (the operator's) may read this table too. No row is made for
vectors written before: a collection without rows is read as before (`embedjob search` by the manifest's revision)
until its next successful run makes its revision ready.
"""

import sqlalchemy as sa
from alembic import op

from embedjob.migrations.tenant_rows import confine_rows, copy_grants, own_namespace

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

TABLE = "embedjob_revisions"
STATES = ("embedding", "ready", "retired")

def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("vectors_table", sa.String(128), primary_key=True),
        sa.Column("collection", sa.String(128), primary_key=True),
        sa.Column("model", sa.String(256), primary_key=True),
        sa.Column("revision", sa.String(128), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint(f"state IN {STATES}", name="embedjob_revisions_state"),
    )
    op.create_index("embedjob_revisions_one_ready", TABLE, ["vectors_table", "collection"], unique=True,
                    postgresql_where=sa.text("state = 'ready'"))
    confine_rows(TABLE, own_namespace(f"{TABLE}.namespace"))
    copy_grants(TABLE, "embedjob_runs", "SELECT", "SELECT")  # the operator's role reads the revisions, as the runs


def downgrade() -> None:
    op.drop_table(TABLE)
