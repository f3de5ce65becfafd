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

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

TABLE = "embedjob_run_shards"
# As migration 0005 words it for embedjob_seen_ids (a row's run is one the role may use).
_MEMBER = ("EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = {role}"
           " AND pg_catalog.pg_has_role(r.oid, 'USAGE'))")
_CONFINED = f"EXISTS (SELECT FROM embedjob_tenant_namespaces m WHERE {_MEMBER.format(role='m.role')})"
_OWN_RUN = (f"EXISTS (SELECT FROM embedjob_runs r WHERE r.run_id = {TABLE}.run_id AND EXISTS (SELECT FROM "
            f"embedjob_tenant_namespaces m WHERE m.namespace = r.namespace AND {_MEMBER.format(role='m.role')}))")
# The roles granted what a driver needs on embedjob_seen_ids, each given the same on the new table.
_SAME_GRANTS = f"""
DO $$
DECLARE grantee_role text;
BEGIN
  FOR grantee_role IN
    SELECT DISTINCT grantee FROM information_schema.role_table_grants
    WHERE table_schema = current_schema() AND table_name = 'embedjob_seen_ids' AND privilege_type = 'INSERT'
      AND grantee <> current_user AND grantee <> 'PUBLIC'
  LOOP
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON {TABLE} TO %I', grantee_role);
  END LOOP;
END $$"""


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
    op.execute(f"ALTER TABLE {TABLE} ENABLE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY embedjob_tenant_rows ON {TABLE} USING (NOT {_CONFINED} OR {_OWN_RUN})"
               f" WITH CHECK (NOT {_CONFINED} OR ({_OWN_RUN}))")
    op.execute(_SAME_GRANTS)


def downgrade() -> None:
    op.drop_table(TABLE)
