"""Admin command for per-namespace database roles: maps a role to namespaces and grants what a driver needs.

    python -m embedjob.tenants migrate
    python -m embedjob.tenants grant  --namespace team-a --role team_a_writer
    python -m embedjob.tenants revoke --namespace team-a --role team_a_writer

Run it with the bookkeeping tables' owner in EMBEDJOB_DATABASE_URL (or --database-url).
`grant` confines the role to the namespace's rows (row-level security, migration 0005),
grants it DML on the bookkeeping tables, and gives it a schema of its own, named like
the role, for its vectors tables (first on PostgreSQL's default search_path
`"$user", public`). docs/install.md, "One database role per namespace", says more.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from embedjob import db, schema
from embedjob.contract import DATABASE_URL_ENV

# What a driver reads and writes (sink, seen ids, shards read, revisions, pool leases, dataset listings); it only
# reads the version table.
DRIVER_TABLES = (db.runs, db.batches, db.batch_attempts, db.record_errors, db.seen_ids, db.run_shards, db.revisions,
                 db.pool_leases, db.listed_files)
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class TenantError(Exception):
    """A refused request; the message names the argument."""


def _check(namespace: str, role: str) -> None:
    if not _NAMESPACE.fullmatch(namespace):
        raise TenantError(f"--namespace {namespace!r} is not a Kubernetes namespace name (RFC 1123 label)")
    if not role or len(role.encode()) > 63:
        raise TenantError(f"--role {role!r} is not a PostgreSQL role name (1 to 63 bytes)")


def _role_exists(conn: sa.Connection, role: str) -> bool:
    return conn.execute(sa.text("SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = :r)"), {"r": role}).scalar_one()


# Roles that row-level security never confines: superusers, BYPASSRLS, the tables' owner and its members.
_UNCONFINABLE = sa.text("""
SELECT r.rolsuper OR r.rolbypassrls OR pg_has_role(r.oid, c.relowner, 'USAGE')
FROM pg_roles r, pg_class c WHERE r.rolname = :r AND c.oid = to_regclass(:table)
""")


def _table_privileges(conn: sa.Connection, verb: str, role: str) -> None:
    """GRANT ... TO role, or REVOKE ... FROM role: the driver's privileges on the bookkeeping tables."""
    quote = conn.dialect.identifier_preparer.quote_identifier
    to = "TO" if verb == "GRANT" else "FROM"
    tables = ", ".join(quote(t.name) for t in DRIVER_TABLES)
    sequence = conn.execute(sa.text("SELECT pg_get_serial_sequence(:t, 'id')"),
                            {"t": quote(db.batch_attempts.name)}).scalar_one()
    conn.execute(sa.text(f"{verb} SELECT, INSERT, UPDATE, DELETE ON {tables} {to} {quote(role)}"))
    conn.execute(sa.text(f"{verb} SELECT ON {quote(db.VERSION_TABLE)} {to} {quote(role)}"))
    conn.execute(sa.text(f"{verb} USAGE ON SEQUENCE {sequence} {to} {quote(role)}"))


def grant(url: str, namespace: str, role: str) -> list[str]:
    """Confine `role` to `namespace` (added to those it has) with what a driver needs; what was done."""
    _check(namespace, role)
    schema.migrate(url)
    engine = db.create_engine(url)
    try:
        with engine.begin() as conn:
            if not _role_exists(conn, role):
                raise TenantError(f"--role {role}: no such role; create it first, e.g. "
                                  f"CREATE ROLE {role} LOGIN PASSWORD '...'")
            if conn.execute(_UNCONFINABLE, {"r": role, "table": db.runs.name}).scalar_one():
                raise TenantError(f"--role {role} is a superuser, has BYPASSRLS or owns the bookkeeping tables: "
                                  f"row-level security cannot confine it; use a role of its own per namespace")
            quote = conn.dialect.identifier_preparer.quote_identifier
            conn.execute(pg_insert(db.tenant_namespaces).values(role=role, namespace=namespace)
                         .on_conflict_do_nothing())
            _table_privileges(conn, "GRANT", role)
            tables_schema = conn.execute(sa.text("SELECT current_schema()")).scalar_one()
            conn.execute(sa.text(f"GRANT USAGE ON SCHEMA {quote(tables_schema)} TO {quote(role)}"))
            conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {quote(role)}"))
            conn.execute(sa.text(f"GRANT USAGE, CREATE ON SCHEMA {quote(role)} TO {quote(role)}"))
            namespaces = _namespaces(conn, role)
    finally:
        engine.dispose()
    return [f"role {role} may use the rows of namespace(s) {', '.join(namespaces)} and no others",
            f"role {role} creates its vectors tables in schema {role}"]


def revoke(url: str, namespace: str, role: str) -> list[str]:
    """Take `namespace` from `role`; with none left, its privileges on the bookkeeping tables go too
    (an unmapped role would no longer be confined). Its vectors schema and tables stay."""
    _check(namespace, role)
    engine = db.create_engine(url)
    try:
        with engine.begin() as conn:
            mapping = db.tenant_namespaces
            conn.execute(mapping.delete().where(mapping.c.role == role, mapping.c.namespace == namespace))
            namespaces = _namespaces(conn, role)
            if not namespaces and _role_exists(conn, role):
                _table_privileges(conn, "REVOKE", role)
    finally:
        engine.dispose()
    if namespaces:
        return [f"role {role} may use the rows of namespace(s) {', '.join(namespaces)} and no others"]
    return [f"role {role} has no namespace left and no privileges on the bookkeeping tables"]


def _namespaces(conn: sa.Connection, role: str) -> list[str]:
    mapping = db.tenant_namespaces
    return list(conn.execute(sa.select(mapping.c.namespace).where(mapping.c.role == role)
                             .order_by(mapping.c.namespace)).scalars())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedjob.tenants", description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get(DATABASE_URL_ENV),
                        help=f"the tables' owner (default: ${DATABASE_URL_ENV})")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("migrate", help="bring the bookkeeping tables to the newest schema")
    for name, text in (("grant", "confine a role to a namespace's rows (adding it to those it has)"),
                       ("revoke", "take a namespace from a role")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--namespace", required=True)
        sub.add_argument("--role", required=True)
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error(f"no database: set {DATABASE_URL_ENV} or pass --database-url")
    try:
        if args.command == "migrate":
            schema.migrate(args.database_url)
            lines = ["the bookkeeping tables are at the newest schema"]
        else:
            lines = (grant if args.command == "grant" else revoke)(args.database_url, args.namespace, args.role)
    except (TenantError, schema.SchemaBehind) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except sa.exc.SQLAlchemyError as exc:
        print(f"error: {type(getattr(exc, 'orig', None) or exc).__name__}: {str(getattr(exc, 'orig', exc)).strip()}",
              file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
