"""The table source's session: a bounded, read-only connection whose reads are short transactions, opened again
when lost once it has read.

Each read is a short read-only transaction of its own: no transaction stays open while the driver embeds, so
a server's `idle_in_transaction_session_timeout` never ends a read, and the read never holds back VACUUM for
the hours a large job runs. A connection lost between or during reads (a failover, a restart,
`idle_session_timeout`) is opened again and the read done again, for up to RECONNECT_WAITS_S.

The session bounds each statement (`statement_timeout`) and each lock wait (`lock_timeout`, a table locked by a
migration) as the driver's other sessions do: a wait past them is SourceWaitExceeded saying so, never a read
that waits for ever while the writer's heartbeat keeps the run looking healthy.
"""

from __future__ import annotations

import logging
import time

import psycopg
from psycopg import sql

from embedjob.db import LOCK_TIMEOUT_S, STATEMENT_TIMEOUT_S, engine_url

from embedjob_worker.core.logs import log_event, mask_secrets

# How long to wait before each new connection after one was lost mid-read: a minute in all, a failover's time.
RECONNECT_WAITS_S = (1, 2, 4, 8, 15, 30)
log = logging.getLogger("embedjob_worker.source.table_session")


class SourceWaitExceeded(ValueError):
    """A read of the table that waited past the source session's lock or statement timeout; says which."""


def session_bounds() -> dict[str, str]:
    """The source session's bounds (module docstring); set after connecting, since poolers drop startup options.
    Read when a session starts, from the same names its messages quote."""
    return {"statement_timeout": f"{STATEMENT_TIMEOUT_S}s", "lock_timeout": f"{LOCK_TIMEOUT_S}s"}


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL (postgresql+psycopg://...) as libpq takes it, credentials kept."""
    return engine_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class SourceSession:
    """The source's bounded, read-only connection, opened again when lost once it has read (module docstring)."""

    def __init__(self, url: str, uri: str):
        self._url, self._uri = url, uri
        self._conn: psycopg.Connection | None = None
        self._has_read = False  # before the first read, a refused connection is the job's error, not a failover

    def __enter__(self) -> SourceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.close()

    def rows(self, query: sql.Composed, params: list) -> list[tuple]:
        """The query's rows, read in a short read-only transaction of its own."""
        waits = iter(RECONNECT_WAITS_S)
        while True:
            try:
                rows = self._read(query, params)
                self._has_read = True
                return rows
            except psycopg.errors.LockNotAvailable:
                raise SourceWaitExceeded(f"waited {LOCK_TIMEOUT_S} s (lock_timeout) for a lock on {self._uri} that "
                                         "another session holds (a migration, a VACUUM FULL?); run the job again "
                                         "once it is released") from None
            except psycopg.errors.QueryCanceled as exc:  # statement_timeout
                raise SourceWaitExceeded(f"a read of {self._uri} ran past {STATEMENT_TIMEOUT_S} s "
                                         f"(statement_timeout): {exc}") from None
            except psycopg.OperationalError as exc:
                lost = self._conn is None or self._conn.broken
                wait = next(waits, None) if lost and self._has_read else None
                if wait is None:
                    raise
                log_event(log, "source_reconnecting", logging.WARNING, source=self._uri, wait_s=wait,
                          error=mask_secrets(str(exc).strip()))
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                time.sleep(wait)

    def _read(self, query: sql.Composed, params: list) -> list[tuple]:
        if self._conn is None:
            conn = psycopg.connect(libpq_url(self._url), connect_timeout=10, application_name="embedjob-source")
            conn.read_only = True
            for name, value in session_bounds().items():
                conn.execute("SELECT set_config(%s, %s, false)", (name, value))
            conn.commit()  # a session setting made in a transaction lasts only once that commits
            self._conn = conn
        rows = self._conn.execute(query, params).fetchall()
        self._conn.commit()  # the page's transaction ends here: none stays open while the driver embeds
        return rows
