"""Per-namespace database roles: row-level security confines a mapped role to its namespaces' rows.

Revision ID: 0005
Revises: 0004

`embedjob_tenant_namespaces(role, namespace)` (kept by `python -m embedjob.tenants`, see
docs/install.md, "One database role per namespace") maps a role to the namespaces it may
use. A role that is a member of a mapped role is *confined*: on every bookkeeping table
it sees, inserts, updates and deletes only rows of its namespaces. `runs` and
`pool_leases` carry the namespace; the other tables reach it through their run, so a
child row must name a run the role may use, with the same job_key. No namespace column
is added to them: the run is the one place a job's namespace is written, so the two
cannot disagree. A confined role cannot use a job_key in a run or lease when a run of
another namespace has it (checked by a SECURITY DEFINER function, the one place that
looks across namespaces), so it cannot write batch rows under another job's key.

A role with no mapping (the shared writer role of earlier installs, the operator's
reader) is not confined: the table GRANTs alone decide, as before. Owners and
superusers bypass row-level security (it is enabled, not forced), so the migrations,
the operator's owner URL and single-role installs behave exactly as before.
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

MAPPING = "embedjob_tenant_namespaces"
POLICY = "embedjob_tenant_rows"
JOB_KEY_ELSEWHERE = "embedjob_job_key_elsewhere"

# Policy expressions are parsed when the policy is created, so the names below resolve in
# the migration's schema and a role cannot redirect them with its own search_path.
_MEMBER = ("EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = {role}"
           " AND pg_catalog.pg_has_role(r.oid, 'USAGE'))")
_CONFINED = f"EXISTS (SELECT FROM {MAPPING} m WHERE {_MEMBER.format(role='m.role')})"


def _mapped(namespace: str) -> str:
    return f"EXISTS (SELECT FROM {MAPPING} m WHERE m.namespace = {namespace} AND {_MEMBER.format(role='m.role')})"


def _own_run(table: str, same_job_key: bool) -> str:
    """The row's run is one the role may use (and, with same_job_key, has the row's job_key)."""
    job_key = f" AND r.job_key = {table}.job_key" if same_job_key else ""
    return f"EXISTS (SELECT FROM embedjob_runs r WHERE r.run_id = {table}.run_id{job_key} AND {_mapped('r.namespace')})"


_NAMESPACED = {"embedjob_runs", "embedjob_pool_leases"}
# Table -> the rows a confined role may use.
_ROWS = {
    "embedjob_runs": _mapped("embedjob_runs.namespace"),
    "embedjob_pool_leases": _mapped("embedjob_pool_leases.namespace"),
    "embedjob_batches": _own_run("embedjob_batches", same_job_key=True),
    "embedjob_batch_attempts": _own_run("embedjob_batch_attempts", same_job_key=True),
    "embedjob_record_errors": _own_run("embedjob_record_errors", same_job_key=True),
    "embedjob_seen_ids": _own_run("embedjob_seen_ids", same_job_key=False),
}


def upgrade() -> None:
    schema = op.get_bind().exec_driver_sql("SELECT current_schema()").scalar_one()
    op.create_table(MAPPING, sa.Column("role", sa.String(63), primary_key=True),
                    sa.Column("namespace", sa.String(63), primary_key=True))
    # Everyone may read the mapping, but only the rows of the roles they are members of.
    op.execute(f"ALTER TABLE {MAPPING} ENABLE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY {POLICY} ON {MAPPING} FOR SELECT USING ({_MEMBER.format(role='role')})")
    op.execute(f"GRANT SELECT ON {MAPPING} TO PUBLIC")
    op.execute(f"""
CREATE FUNCTION {JOB_KEY_ELSEWHERE}(key text, ns text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = "{schema}", pg_temp
AS $$ SELECT EXISTS (SELECT FROM embedjob_runs WHERE job_key = key AND namespace <> ns) $$""")
    for table, rows in _ROWS.items():
        check = rows
        if table in _NAMESPACED:
            check = f"{rows} AND NOT {JOB_KEY_ELSEWHERE}(job_key, namespace)"
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY {POLICY} ON {table} USING (NOT {_CONFINED} OR {rows})"
                   f" WITH CHECK (NOT {_CONFINED} OR ({check}))")


def downgrade() -> None:
    for table in _ROWS:
        op.execute(f"DROP POLICY {POLICY} ON {table}")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    op.execute(f"DROP FUNCTION {JOB_KEY_ELSEWHERE}(text, text)")
    op.execute(f"DROP TABLE {MAPPING}")
