"""Alembic environment: runs on the connection `embedjob.schema.migrate` hands in."""

from alembic import context

from embedjob.db import VERSION_TABLE, metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
