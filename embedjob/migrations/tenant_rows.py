"""Row-level security for a table a driver writes, as migration 0005 gives its tables, for the migrations after it.

A role mapped to namespaces (embedjob_tenant_namespaces, `python -m embedjob.tenants`) is confined: it uses
only the rows whose condition names one of its namespaces; an unmapped role uses every row. Every role already
granted what a driver needs on `embedjob_seen_ids` gets the same privileges on the new table, so an upgrade needs
no new `tenants grant`.
"""

from alembic import op

_MEMBER = ("EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = {role}"
           " AND pg_catalog.pg_has_role(r.oid, 'USAGE'))")
_CONFINED = f"EXISTS (SELECT FROM embedjob_tenant_namespaces m WHERE {_MEMBER.format(role='m.role')})"


def own_namespace(column: str) -> str:
    """SQL that holds where `column` is a namespace the session's role is mapped to."""
    return (f"EXISTS (SELECT FROM embedjob_tenant_namespaces m WHERE m.namespace = {column}"
            f" AND {_MEMBER.format(role='m.role')})")


def confine_rows(table: str, own_rows: str) -> None:
    """Row-level security on `table` (a confined role uses the rows where `own_rows` holds) and the driver roles'
    grants copied from embedjob_seen_ids."""
    op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY embedjob_tenant_rows ON {table} USING (NOT {_CONFINED} OR {own_rows})"
               f" WITH CHECK (NOT {_CONFINED} OR ({own_rows}))")
    copy_grants(table, "embedjob_seen_ids", "INSERT", "SELECT, INSERT, UPDATE, DELETE")


def copy_grants(table: str, like: str, held: str, given: str) -> None:
    """Every role (but the migrating one and PUBLIC) that holds `held` on the table `like` is given `given` on `table`."""
    op.execute(f"""
DO $$
DECLARE grantee_role text;
BEGIN
  FOR grantee_role IN
    SELECT DISTINCT grantee FROM information_schema.role_table_grants
    WHERE table_schema = current_schema() AND table_name = '{like}' AND privilege_type = '{held}'
      AND grantee <> current_user AND grantee <> 'PUBLIC'
  LOOP
    EXECUTE format('GRANT {given} ON {table} TO %I', grantee_role);
  END LOOP;
END $$""")
