"""The embedded PostgreSQL (with pgvector) that `embedjob run` uses without --database-url."""

from __future__ import annotations

from pathlib import Path

import platformdirs


def data_dir() -> Path:
    """Where local runs keep their database, so that `embedjob search` and re-runs find it."""
    return Path(platformdirs.user_data_dir("embedjob")) / "pgdata"


def start_local_database():
    """Start (or reuse) the embedded server; returns the handle (keep it alive) and its URL."""
    import pgserver

    pgdata = data_dir()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    return server, server.get_uri()
