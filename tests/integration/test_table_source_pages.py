"""The table source reads in keyset pages (issue 27 item 6): no transaction stays open while the driver embeds,
a lost connection is opened again, and pages never split, repeat or lose a row. Real PostgreSQL 18."""

import json
import logging
import time

import pytest
import sqlalchemy as sa

from embedjob.api import SourceTable
from embedjob_worker.source import table as table_source
from embedjob_worker.source.table import read_table_records
from support.corpus import corpus_lines
from support.sql import query

pytestmark = pytest.mark.slow


def execute(url: str, *statements: str, rows: list[dict] | None = None) -> None:
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for statement in statements:
            conn.execute(sa.text(statement), rows or {})
    engine.dispose()


def docs(url: str, count: int) -> list[tuple[str, str]]:
    """Table `docs` of `count` PEP paragraphs with integer ids; the rows as the source reads them."""
    texts = [json.loads(line)["text"] for line in corpus_lines(0, count)]
    execute(url, "CREATE TABLE docs (id integer PRIMARY KEY, body text)")
    execute(url, "INSERT INTO docs VALUES (:id, :body)", rows=[{"id": i + 1, "body": t} for i, t in enumerate(texts)])
    return [(str(i + 1), t) for i, t in enumerate(texts)]


def source(name: str = "docs") -> SourceTable:
    return SourceTable.model_validate({"name": name, "idColumn": "id", "textColumn": "body"})


def database_name(url: str) -> str:
    return sa.engine.make_url(url).database


def test_a_read_outlives_the_servers_idle_in_transaction_timeout(database_url):
    """Before: the named cursor's transaction sat idle while the consumer worked, and the server's
    idle_in_transaction_session_timeout ended the read mid-table (psycopg.OperationalError)."""
    expected = docs(database_url, 5000)
    execute(database_url, f'ALTER DATABASE "{database_name(database_url)}" SET idle_in_transaction_session_timeout = 1000')
    got = []
    for record in read_table_records(database_url, source()):
        if record.position in (0, 2500):  # the driver busy embedding, past the server's 1 s
            time.sleep(1.6)
        got.append((record.id, record.text))
    assert got == expected


def test_a_connection_lost_between_pages_is_opened_again_and_the_read_goes_on(database_url, caplog):
    """A failover or restart drops every connection: the read resumes after the last id it read whole."""
    expected = docs(database_url, 4500)
    got = []
    with caplog.at_level(logging.WARNING, logger="embedjob_worker.source.table_session"):
        for record in read_table_records(database_url, source()):
            got.append((record.id, record.text))
            if record.position in (1000, 3000):
                killed = query(database_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                             "WHERE application_name = 'embedjob-source'")
                assert killed == [(True,)]
    assert got == expected  # each row once, in order
    reconnects = [r.fields for r in caplog.records if r.getMessage() == "source_reconnecting"]
    assert [(r["source"], r["wait_s"]) for r in reconnects] == [("table:public.docs", 1)] * 2, reconnects


def test_a_refused_first_connection_is_not_retried(database_url):
    wrong = sa.engine.make_url(database_url).set(database="no_such_database").render_as_string(hide_password=False)
    started = time.monotonic()
    with pytest.raises(Exception, match="no_such_database"):
        list(read_table_records(wrong, source()))
    assert time.monotonic() - started < 5


def test_pages_keep_equal_ids_together_and_read_every_row_once(database_url, monkeypatch):
    """Pages of 4 rows over groups of equal ids that straddle a page, one bigger than two pages, ids whose
    texts differ but sort equal (numeric 1.0 and 1.00), NULL texts and NULL ids: the same rows in the same
    order as one ORDER BY over the whole table, the rows without an id last."""
    monkeypatch.setattr(table_source, "PAGE_ROWS", 4)
    ids = ["1", "2", "2", "2", "3", "1.0", "1.00", "1.0", *["7"] * 11, "8", "9", "9", "10", None, None, "11"]
    texts = [f"text {n:02}" if n % 5 else None for n in range(len(ids))]
    execute(database_url, "CREATE TABLE mixed (id numeric, body text)")
    execute(database_url, "INSERT INTO mixed VALUES (CAST(:id AS numeric), :body)",
            rows=[{"id": i, "body": t} for i, t in zip(ids, texts)])
    whole = query(database_url, 'SELECT id::text, body FROM mixed WHERE id IS NOT NULL '  # mixed.id: not the output id
                                'ORDER BY mixed.id, id::text COLLATE "C", body COLLATE "C"')
    expected = [tuple(row) for row in whole] + [(None, None)] * 2
    got = [(r.id, r.text) for r in read_table_records(database_url, source("mixed"))]
    assert got == expected
    assert [r.position for r in read_table_records(database_url, source("mixed"))] == list(range(len(ids)))


@pytest.mark.parametrize("column", ["uuid", 'text COLLATE "C"', "bigint", "double precision", "date"])
def test_pages_resume_after_ids_of_every_orderable_type(database_url, monkeypatch, column):
    """The last id goes back to the server as text and is read as the column's type."""
    monkeypatch.setattr(table_source, "PAGE_ROWS", 3)
    values = {"uuid": "gen_random_uuid()", 'text COLLATE "C"': "'id-' || (n * 7919 % 101)::text || ' é'",
              "bigint": "n::bigint * 1000000007", "double precision": "n / 7.0", "date": "DATE '2026-01-01' + n % 9"}[column]
    execute(database_url, f"CREATE TABLE typed (id {column}, body text)",
            f"INSERT INTO typed SELECT {values}, 'row ' || n FROM generate_series(1, 40) n")
    whole = query(database_url, 'SELECT id::text, body FROM typed ORDER BY typed.id, id::text COLLATE "C", body COLLATE "C"')
    assert [(r.id, r.text) for r in read_table_records(database_url, source("typed"))] == [tuple(r) for r in whole]
