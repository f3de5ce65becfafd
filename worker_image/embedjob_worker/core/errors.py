"""Failures: why a job stops, which database errors are transient, and how they are retried."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
import sqlalchemy as sa

from embedjob.api import Retry
from embedjob.contract import ExitCode

from embedjob_worker.core.logs import log_event

log = logging.getLogger("embedjob_worker.core.errors")
T = TypeVar("T")

# A lost or refused connection, not a bad statement: worth retrying, or the database is unreachable.
DB_ERRORS = (sa.exc.OperationalError, sa.exc.InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)

_BACKOFF_BASE_S, _BACKOFF_MAX_S = 1.0, 30.0
# A lost database (a restart, a failover) is ridden out this long before the job fails
# with DatabaseUnavailable; every retried statement is idempotent.
DATABASE_OUTAGE_S = 60.0


def backoff_seconds(attempt: int) -> float:
    """Wait before retrying after failed attempt number `attempt`: 1 s, 2 s, 4 s, ... at most 30 s."""
    return min(_BACKOFF_MAX_S, _BACKOFF_BASE_S * 2 ** (attempt - 1))


def retry_database(call: Callable[[], T], what: str, on_retry: Callable[[Exception], None] | None = None,
                   outage_s: float = DATABASE_OUTAGE_S) -> T:
    """`call()`, retried with backoff while it fails on a lost connection, until it has failed for
    `outage_s`; then its error is raised. `on_retry` hears of each failure that is retried."""
    failing_since = None
    for attempt in itertools.count(1):
        try:
            return call()
        except DB_ERRORS as exc:
            failing_since = failing_since if failing_since is not None else time.monotonic()
            left = outage_s - (time.monotonic() - failing_since)
            if left <= 0:
                raise
            log_event(log, "database_retry", logging.WARNING, what=what, attempt=attempt, error=str(exc)[:300])
            if on_retry is not None:
                on_retry(exc)
            time.sleep(min(backoff_seconds(attempt), left))


class JobFailed(Exception):
    """The job ends failed (exit 1); `reason` is CamelCase and goes into the run row."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)

    def __reduce__(self):  # raised in a writer actor, it reaches the driver through pickle with its reason
        return type(self), (self.reason, str(self))


class Unreachable(Exception):
    """PostgreSQL (or, as RayUnreachable, Ray) cannot be reached; the run row may not be writable."""


class RayUnreachable(Unreachable):
    """The Ray cluster the driver was given cannot be reached (exit 3, never a local Ray instead)."""


def too_many_failed_batches(retry: Retry, failed: int, batches_total: int | None, detail: str) -> JobFailed | None:
    """TooManyFailedBatches when `failed` batches are more than spec.retry allows for the run's batches."""
    allowed = retry.failed_batches_allowed(batches_total or 0)
    if failed <= allowed:
        return None
    percent = retry.failed_batches_tolerated_percent
    tolerance = f"spec.retry.failedBatchesTolerated={retry.failed_batches_tolerated}" + (
        f" and failedBatchesToleratedPercent={percent} of {batches_total} batches" if percent is not None else "")
    return JobFailed("TooManyFailedBatches", f"{failed} batch(es) failed for good, more than the {allowed} that "
                                             f"{tolerance} allow; {detail}")


def unreachable_exit_code(exc: Unreachable) -> int:
    """3 for Ray, 4 for the database: the operator turns them into RayUnavailable / DatabaseUnavailable."""
    return ExitCode.RAY_UNREACHABLE if isinstance(exc, RayUnreachable) else ExitCode.DATABASE_UNREACHABLE
