"""Progress reads from a real PostgreSQL (the driver's embedjob_runs table)."""

from __future__ import annotations

import datetime as dt
import uuid

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from controller.run_reader import RunReader
from embedjob.db import MIGRATIONS_DIR, revisions, runs
from embedjob.schema import migrate


def _run_row(job_key: str, started_at: dt.datetime, **counters) -> dict:
    return {
        "run_id": str(uuid.uuid4()), "job_key": job_key, "job_name": "pep", "namespace": "team-a",
        "collection": "default", "vectors_table": "embeddings", "model": "m", "revision": "r",
        "input_fingerprint": "i" * 64, "config_fingerprint": "c" * 64, "state": "running",
        "started_at": started_at, **counters,
    }


def test_reads_the_newest_run_of_the_job(database_url):
    migrate(database_url)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        for row in (
            _run_row("uid-1", t0, state="failed", reason="TooManyFailedBatches", batches_succeeded=3),
            _run_row("uid-1", t0 + dt.timedelta(minutes=5), batches_total=400, batches_succeeded=120,
                     batches_failed=2, records_embedded=7680, records_failed=3, texts_per_second=55.5),
            _run_row("uid-2", t0 + dt.timedelta(minutes=9), batches_succeeded=999),
        ):
            conn.execute(runs.insert().values(**row))
    engine.dispose()
    reader = RunReader(database_url)
    try:
        run = reader.latest("uid-1", "team-a", "pep")
        assert (run.state, run.batches_total, run.batches_succeeded, run.batches_failed) == ("running", 400, 120, 2)
        assert (run.records_embedded, run.records_failed, run.texts_per_second) == (7680, 3, 55.5)
        assert reader.latest("uid-unknown", "team-a", "pep") is None
    finally:
        reader.close()


def test_before_the_first_migration_there_is_no_progress(database_url):
    reader = RunReader(database_url)
    try:
        assert reader.latest("uid-1", "team-a", "pep") is None
    finally:
        reader.close()


def test_only_a_row_of_the_jobs_namespace_and_name_drives_its_status(database_url):
    """Newer rows under the job's uid but another namespace or job name (what a role of another
    namespace can write, docs/install.md) are not the job's run."""
    migrate(database_url)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        for row in (
            _run_row("uid-1", t0, batches_succeeded=7),
            _run_row("uid-1", t0 + dt.timedelta(minutes=1), namespace="team-b", state="failed",
                     reason="TooManyFailedBatches"),
            _run_row("uid-1", t0 + dt.timedelta(minutes=2), job_name="other", state="failed", reason="InputChanged"),
        ):
            conn.execute(runs.insert().values(**row))
    engine.dispose()
    reader = RunReader(database_url)
    try:
        run = reader.latest("uid-1", "team-a", "pep")
        assert (run.state, run.reason, run.batches_succeeded) == ("running", None, 7)
        assert reader.latest("uid-1", "team-c", "pep") is None
    finally:
        reader.close()


def test_the_runs_revision_state_and_the_collections_ready_revision_come_from_embedjob_revisions(database_url):
    migrate(database_url)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(runs.insert().values(**_run_row("uid-1", t0, revision="new")))
        conn.execute(revisions.insert(), [
            {"vectors_table": "team_a.embeddings", "collection": "default", "model": "m", "revision": "old",
             "state": "ready", "namespace": "team-a", "run_id": "r0"},
            {"vectors_table": "team_a.embeddings", "collection": "default", "model": "m", "revision": "new",
             "state": "embedding", "namespace": "team-a", "run_id": "r1"},
            # another collection's, and a same-named table's in another schema: neither is this job's
            {"vectors_table": "team_a.embeddings", "collection": "other", "model": "m", "revision": "x",
             "state": "ready", "namespace": "team-a", "run_id": "r2"},
            {"vectors_table": "team_a.more_embeddings", "collection": "default", "model": "m", "revision": "y",
             "state": "ready", "namespace": "team-a", "run_id": "r3"},
        ])
    reader = RunReader(database_url)
    try:
        run = reader.latest("uid-1", "team-a", "pep")
        assert (run.model, run.revision, run.revision_state, run.ready_revision) == ("m", "new", "embedding", "m@old")
        with engine.begin() as conn:  # the switch: the new revision ready, the old one retired
            conn.execute(sa.text("UPDATE embedjob_revisions SET state = 'retired' WHERE revision = 'old'"))
            conn.execute(sa.text("UPDATE embedjob_revisions SET state = 'ready' WHERE revision = 'new'"))
        run = reader.latest("uid-1", "team-a", "pep")
        assert (run.revision_state, run.ready_revision) == ("ready", "m@new")
    finally:
        reader.close()
        engine.dispose()


def test_a_database_before_the_revisions_table_still_shows_the_counters(database_url):
    migrate(database_url)
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0014")
        conn.execute(runs.insert().values(**_run_row("uid-1", dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
                                                     batches_succeeded=7)))
    engine.dispose()
    reader = RunReader(database_url)
    try:
        run = reader.latest("uid-1", "team-a", "pep")
        assert (run.batches_succeeded, run.revision_state, run.ready_revision, run.rows_read) == (7, None, None, None)
    finally:
        reader.close()


def test_a_table_runs_change_window_shows_which_rows_it_read_and_the_watermark_it_left(database_url):
    migrate(database_url)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    window = {"column": "updated_at", "readFrom": "2026-01-01T09:00:00+00:00", "windowRuns": 1,
              "watermark": "2026-01-01T10:00:00+00:00"}
    full = {"column": "updated_at", "readFrom": None, "windowRuns": 0, "whyFull": "no earlier run read this table",
            "watermark": None, "held": "the source is a standby"}
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(runs.insert().values(**_run_row("uid-1", t0, change_window=window)))
        conn.execute(runs.insert().values(**_run_row("uid-2", t0, change_window=full)))
        conn.execute(runs.insert().values(**_run_row("uid-3", t0)))
    engine.dispose()
    reader = RunReader(database_url)
    try:
        assert reader.latest("uid-1", "team-a", "pep").rows_read == (
            "changed since 2026-01-01T09:00:00+00:00 (or updated_at NULL); watermark left 2026-01-01T10:00:00+00:00")
        assert reader.latest("uid-2", "team-a", "pep").rows_read == (
            "every row (no earlier run read this table); watermark held (the source is a standby)")
        assert reader.latest("uid-3", "team-a", "pep").rows_read is None  # a file's run, or no change column
    finally:
        reader.close()
