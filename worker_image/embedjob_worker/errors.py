"""Failures: why a job stops, which database errors are transient, and the backoff before a retry."""

from __future__ import annotations

import psycopg
import sqlalchemy as sa

from embedjob.api import Retry

# A lost or refused connection, not a bad statement: worth retrying, or the database is unreachable.
DB_ERRORS = (sa.exc.OperationalError, sa.exc.InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)

_BACKOFF_BASE_S, _BACKOFF_MAX_S = 1.0, 30.0


def backoff_seconds(attempt: int) -> float:
    """Wait before retrying after failed attempt number `attempt`: 1 s, 2 s, 4 s, ... at most 30 s."""
    return min(_BACKOFF_MAX_S, _BACKOFF_BASE_S * 2 ** (attempt - 1))


class JobFailed(Exception):
    """The job ends failed (exit 1); `reason` is CamelCase and goes into the run row."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


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
