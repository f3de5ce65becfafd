"""The operator's database connections: every call it makes is bounded in time.

A database that is slow, unreachable, or that accepts a connection and never answers
delays what the operator reads by seconds at most (the caller sees an error and tries
again at its next round); it never stops a loop for good. A lock wait (the pool's
advisory lock) is part of its statement and ends with it.
"""

from __future__ import annotations

import sqlalchemy as sa

from embedjob.db import engine_url

CONNECT_TIMEOUT_SECONDS = 5
STATEMENT_TIMEOUT_MS = 5000


def bounded_engine(url: str, pool_size: int, read_only: bool) -> sa.Engine:
    """An engine whose connects and statements (lock waits included) give up after seconds."""
    options = f"-c statement_timeout={STATEMENT_TIMEOUT_MS}"
    return sa.create_engine(
        engine_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=CONNECT_TIMEOUT_SECONDS,
        pool_pre_ping=True,
        pool_recycle=300,
        connect_args={
            "connect_timeout": CONNECT_TIMEOUT_SECONDS,
            "options": options + (" -c default_transaction_read_only=on" if read_only else ""),
            "application_name": "embedjob-operator",
        },
    )
