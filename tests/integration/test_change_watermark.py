"""A table re-read by its change column (spec.source.table.changeColumn): real PostgreSQL, real Ray, the real model.

The classic trap first: a row written by a transaction that began before a run read the table, with that
transaction's now() as its change stamp, and committed after the read. A watermark at the read's own clock
would miss it for ever; the one the run leaves (the oldest open transaction's start) does not.
"""

import itertools
import os
from datetime import datetime

import psycopg
import pytest
import sqlalchemy as sa

from support.sql import query
from test_table_source import create_docs, execute, table_manifest
from embedjob_worker.core.config import JobConfig
from embedjob_worker.source import table as table_source
from embedjob_worker.run.job import DriverOptions, run_job

pytestmark = pytest.mark.slow
_roles = itertools.count()


def with_change_column(url: str, rows: int) -> None:
    """The docs table of `rows` PEP paragraphs, each row stamped by the database on every write."""
    create_docs(url, 0, rows)
    execute(url, "ALTER TABLE docs ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now()",
            "CREATE INDEX docs_updated_at ON docs (updated_at)")


def changes_manifest(name: str, sync: dict | None = None, **table) -> dict:
    manifest = table_manifest(name, **{"changeColumn": "updated_at", "changeSkewSeconds": 0, **table})
    manifest["spec"]["sync"] = sync or {}
    return manifest


def window_of(url: str, run_id: str) -> dict:
    return query(url, "SELECT change_window FROM embedjob_runs WHERE run_id = :r", r=run_id)[0][0]


def libpq(url: str) -> str:
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def test_a_rerun_reads_only_the_rows_changed_and_a_late_commit_with_an_old_stamp_is_not_missed(ray_address,
                                                                                               database_url):
    with_change_column(database_url, 120)
    job = JobConfig.from_manifest(changes_manifest("changes"))
    late = psycopg.connect(libpq(database_url))  # a transaction open across the first run's read
    late_now = late.execute("SELECT now()").fetchone()[0]

    first = run_job(job, database_url)
    assert first.state == "succeeded", first.error
    assert first.counters.records_new == 120
    recorded = window_of(database_url, first.run_id)
    assert recorded["readFrom"] is None and "no earlier run" in recorded["whyFull"], recorded
    # The watermark is the open transaction's start, not the read's clock: its rows carry that now().
    assert datetime.fromisoformat(recorded["watermark"]) == late_now, recorded

    late.execute("INSERT INTO docs (id, pep, body, updated_at) VALUES (1000, 1, 'a paragraph written late', now())")
    late.commit()  # committed after the first run read the table, stamped before that read began
    late.close()
    execute(database_url, "UPDATE docs SET body = body || ' (edited)', updated_at = now() WHERE id = 5")

    second = run_job(job, database_url)
    assert second.state == "succeeded", second.error
    c = second.counters
    assert (c.records_total, c.records_new, c.records_changed, c.records_unchanged) == (2, 1, 1, 0), c
    assert datetime.fromisoformat(window_of(database_url, second.run_id)["readFrom"]) == late_now
    stored = dict(query(database_url, "SELECT record_id, text FROM embeddings WHERE record_id IN ('5', '1000')"))
    assert stored["1000"] == "a paragraph written late" and stored["5"].endswith(" (edited)"), stored

    # Another EmbeddingJob over the same table into the same vectors (in a cluster every sync is one) reads on
    # from the second run's watermark: nothing changed since.
    next_sync = changes_manifest("changes")
    next_sync["metadata"]["name"] = "changes-next-sync"
    third = run_job(JobConfig.from_manifest(next_sync), database_url)
    assert third.state == "succeeded", third.error
    assert (third.counters.records_total, third.counters.records_embedded) == (0, 0), third.counters
    assert window_of(database_url, third.run_id)["readFrom"] == window_of(database_url, second.run_id)["watermark"]
    assert query(database_url, "SELECT count(*) FROM embeddings")[0][0] == 121


def test_a_role_that_cannot_see_other_sessions_holds_the_watermark_and_the_next_run_reads_every_row(
        ray_address, database_url):
    with_change_column(database_url, 40)
    role = f"reader_{os.getpid()}_{next(_roles)}"
    execute(database_url, f"CREATE ROLE {role} LOGIN PASSWORD 'reader'", f"GRANT SELECT ON docs TO {role}")
    reader_url = sa.make_url(database_url).set(username=role, password="reader").render_as_string(
        hide_password=False)
    held_open = psycopg.connect(libpq(database_url))  # another role's session, which `role` cannot look into
    held_open.execute("SELECT 1")
    job = JobConfig.from_manifest(changes_manifest("held"))
    try:
        first = run_job(job, database_url, DriverOptions(source_database_url=reader_url))
        second = run_job(job, database_url, DriverOptions(source_database_url=reader_url))
    finally:
        held_open.close()
    assert first.state == second.state == "succeeded", (first.error, second.error)
    recorded = window_of(database_url, first.run_id)
    assert recorded["watermark"] is None and "GRANT pg_read_all_stats" in recorded["held"], recorded
    # Nothing proven, nothing skipped: the next run reads every row again (and embeds none: all are up to date).
    assert second.counters.records_total == 40 and second.counters.records_unchanged == 40, second.counters
    assert "left no watermark" in window_of(database_url, second.run_id)["whyFull"]

    execute(database_url, f"GRANT pg_read_all_stats TO {role}")
    third = run_job(job, database_url, DriverOptions(source_database_url=reader_url))
    assert third.state == "succeeded", third.error
    assert window_of(database_url, third.run_id)["watermark"] is not None


def test_with_delete_missing_every_full_scan_every_th_run_scans_the_ids_alone_and_deletes(ray_address, database_url,
                                                                                          monkeypatch):
    monkeypatch.setattr(table_source, "ID_PAGE_ROWS", 7)  # the id scan's pages end mid-table
    with_change_column(database_url, 40)
    job = JobConfig.from_manifest(changes_manifest("gone", sync={"deleteMissing": True, "fullScanEvery": 2}))
    assert run_job(job, database_url).state == "succeeded"
    execute(database_url, "DELETE FROM docs WHERE id = 3",
            "UPDATE docs SET body = body || ' (edited)', updated_at = now() WHERE id = 5")

    window_run = run_job(job, database_url)  # reads the changes only: it cannot know which ids went
    assert window_run.state == "succeeded", window_run.error
    c = window_run.counters
    assert (c.records_total, c.records_embedded, c.records_deleted) == (1, 1, 0), c  # the edited row alone
    assert "idScan" not in window_of(database_url, window_run.run_id)
    assert query(database_url, "SELECT count(*) FROM embeddings WHERE record_id = '3'")[0][0] == 1

    execute(database_url, "DELETE FROM docs WHERE id = 4")
    scan_run = run_job(job, database_url)  # the changes (none), then every id: the texts are not read again
    assert scan_run.state == "succeeded", scan_run.error
    assert (scan_run.counters.records_total, scan_run.counters.records_deleted) == (0, 2), scan_run.counters
    recorded = window_of(database_url, scan_run.run_id)
    assert recorded["readFrom"] is not None and "whyFull" not in recorded, recorded
    assert "fullScanEvery" in recorded["idScan"] and recorded["windowRuns"] == 0, recorded
    assert sorted(int(r) for r, in query(database_url, "SELECT record_id FROM embeddings")) == [
        i for i in range(1, 41) if i not in (3, 4)]


def test_an_xid8_column_stamped_by_the_writing_transaction_keeps_the_watermark_and_misses_no_late_commit(
        ray_address, database_url):
    create_docs(database_url, 0, 40)
    execute(database_url, "ALTER TABLE docs ADD COLUMN changed_xid xid8 DEFAULT pg_current_xact_id()",
            "CREATE INDEX docs_changed_xid ON docs (changed_xid)",
            "CREATE FUNCTION docs_stamp() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN NEW.changed_xid := pg_current_xact_id(); RETURN NEW; END$$",
            "CREATE TRIGGER docs_stamp BEFORE UPDATE ON docs FOR EACH ROW EXECUTE FUNCTION docs_stamp()")
    job = JobConfig.from_manifest(changes_manifest("by-xid", changeColumn="changed_xid"))
    late = psycopg.connect(libpq(database_url))  # writes before the first run's read, commits after it
    late.execute("INSERT INTO docs (id, pep, body) VALUES (1000, 1, 'a paragraph written late')")
    late_xid = int(late.execute("SELECT pg_current_xact_id()::text").fetchone()[0])

    first = run_job(job, database_url)
    assert first.state == "succeeded", first.error
    assert first.counters.records_new == 40
    recorded = window_of(database_url, first.run_id)
    assert recorded["readFrom"] is None and isinstance(recorded["watermark"], int), recorded
    assert recorded["watermark"] <= late_xid, recorded  # the late writer was running: the xmin is at most its id

    late.commit()
    late.close()
    execute(database_url, "UPDATE docs SET body = body || ' (edited)' WHERE id = 5")
    second = run_job(job, database_url)
    assert second.state == "succeeded", second.error
    c = second.counters
    assert (c.records_total, c.records_new, c.records_changed) == (2, 1, 1), c
    assert window_of(database_url, second.run_id)["readFrom"] == recorded["watermark"]
    assert "changed since transaction" in second.change_window.described(), second.change_window.described()
    assert query(database_url, "SELECT text FROM embeddings WHERE record_id = '1000'")[0][0] == (
        "a paragraph written late")


@pytest.mark.parametrize(("column_sql", "said"), [
    ("ALTER TABLE docs ADD COLUMN written timestamp DEFAULT now()",
     "spec.source.table.changeColumn: written is timestamp without time zone, not timestamp with time zone"),
    ("ALTER TABLE docs ADD COLUMN written bigint GENERATED ALWAYS AS IDENTITY",
     "written is bigint, not timestamp with time zone or xid8: a change column must hold the moment"),
    ("SELECT 1", "spec.source.table.changeColumn: public.docs has no column 'written'"),
    ("DROP TABLE docs", "spec.source.table: there is no table or view public.docs"),
])
def test_a_change_column_that_cannot_carry_a_watermark_is_refused_by_name(ray_address, database_url, column_sql,
                                                                          said):
    create_docs(database_url, 0, 10)
    execute(database_url, column_sql)
    manifest = changes_manifest("refused")
    manifest["spec"]["source"]["table"]["changeColumn"] = "written"
    summary = run_job(JobConfig.from_manifest(manifest), database_url)
    assert (summary.state, summary.reason) == ("failed", "SourceUnreadable"), summary
    assert said in summary.error, summary.error
    assert query(database_url, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'embeddings'"
                 )[0][0] == 0
