"""The table source's session (issue 27 item 6): a locked source table ends the run within the lock timeout.

Real PostgreSQL, real Ray, the real model.
"""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from embedjob.db import LOCK_TIMEOUT_S
from embedjob_worker.source import table_session
from embedjob_worker.core.config import JobConfig
from embedjob_worker.run.job import run_job
from support.corpus import corpus_lines
from support.sql import query
from support.job_models import FAST_START_MODEL

pytestmark = pytest.mark.slow


def create_docs(url: str, count: int) -> None:
    """Table `docs`: integer ids 1..count, a PEP paragraph each."""
    rows = [{"id": i + 1, "body": json.loads(line)["text"]} for i, line in enumerate(corpus_lines(0, count))]
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE docs (id integer PRIMARY KEY, body text)"))
        conn.execute(sa.text("INSERT INTO docs VALUES (:id, :body)"), rows)
    engine.dispose()


def table_job(name: str) -> JobConfig:
    return JobConfig.from_manifest({
        "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob",
        "metadata": {"name": name, "namespace": "tests"},
        "spec": {
            "source": {"table": {"name": "docs", "idColumn": "id", "textColumn": "body"}},
            "model": dict(FAST_START_MODEL),
            "batching": {"batchSize": 32, "maxInFlight": 2, "sortWindow": 512},
            "workers": {"replicas": 1, "cpusPerActor": 2},
            "sink": {"databaseSecretRef": {"name": "db"}, "table": "embeddings", "collection": name},
        },
    })


def test_a_source_table_locked_by_another_session_ends_the_run_within_the_lock_timeout(ray_address, database_url,
                                                                                    monkeypatch):
    # The session's real bound is LOCK_TIMEOUT_S (tests/unit/test_table_source_spec.py checks it);
    # the same wait, a twelfth as long, so that the tier does not sit out a minute.
    lock_timeout_s = LOCK_TIMEOUT_S // 12
    monkeypatch.setattr(table_session, "LOCK_TIMEOUT_S", lock_timeout_s)
    create_docs(database_url, 40)
    migration = sa.create_engine(database_url)
    locking = migration.connect()
    transaction = locking.begin()
    locking.execute(sa.text("LOCK TABLE docs IN ACCESS EXCLUSIVE MODE"))  # as an ALTER TABLE holds it
    try:
        with ThreadPoolExecutor(1) as pool:
            started = time.monotonic()
            running = pool.submit(run_job, table_job("locked"), database_url)
            try:
                summary = running.result(timeout=lock_timeout_s + 60)
                took = time.monotonic() - started
            finally:  # also when the run still waits: released, it goes on and ends
                transaction.rollback()
                locking.close()
    finally:
        migration.dispose()
    assert (summary.state, summary.reason) == ("failed", "SourceUnreadable"), summary.error
    assert summary.error.startswith(f"reading table:public.docs: SourceWaitExceeded: waited {lock_timeout_s} s "
                                    "(lock_timeout) for a lock on table:public.docs that another session holds")
    assert lock_timeout_s <= took < lock_timeout_s + 45
    assert query(database_url, "SELECT state, reason FROM embedjob_runs") == [("failed", "SourceUnreadable")]

