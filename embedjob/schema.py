"""The bookkeeping tables brought to the newest schema: Alembic's migrations, run once, under a lock, by a role that may."""

from __future__ import annotations

import sqlalchemy as sa

from embedjob.db import MIGRATIONS_DIR, VERSION_TABLE, create_engine

# Whether this session may migrate: it owns the tables (superusers and members of the owner role do).
_OWNS_TABLES = sa.text("SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = to_regclass(:table)")
# Serialises concurrent migrations (several drivers starting at once).
_MIGRATION_LOCK_ID = 0x656D6264  # "embd"


class SchemaBehind(Exception):
    """The schema needs a migration that this database role is not allowed to run."""


def migrate(url: str | sa.URL) -> None:
    """Bring the bookkeeping tables to the newest schema (idempotent, concurrency-safe).

    At the newest schema it changes nothing and needs no privilege beyond reading the
    version table, so a per-namespace role (docs/install.md) can run it."""
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            current = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
            if current == head:
                return
            if current is not None and not conn.execute(_OWNS_TABLES, {"table": VERSION_TABLE}).scalar_one():
                role = conn.execute(sa.text("SELECT current_user")).scalar_one()
                raise SchemaBehind(f"the database schema is at revision {current}, this driver needs {head}, and role "
                                   f"{role} may not migrate it: run `python -m embedjob.tenants migrate` (or a driver) "
                                   f"with the tables' owner first")
            # Locked first: CREATE EXTENSION IF NOT EXISTS races too (two drivers of a new database).
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": _MIGRATION_LOCK_ID})
            conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS vector"))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    finally:
        engine.dispose()
