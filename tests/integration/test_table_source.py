"""A PostgreSQL table as the source, kept in sync: real PostgreSQL, real Ray, the real model."""

import json

import pytest
import sqlalchemy as sa
import yaml

from support.cli import EMBEDJOB, run_on_ray
from support.driver_crash import kill_driver_after, other_sessions, succeeded_attempts
from support.corpus import corpus_lines
from support.paths import REPO, SAMPLE
from support.polling import wait_until
from support.sql import query
from support.job_models import FAST_START_MODEL
from embedjob_worker.core.config import JobConfig
from embedjob_worker.run.job import DriverOptions, run_job
from embedjob_worker.source.table import equal_ids_adjacent, read_table_records
from embedjob.api import SourceTable

pytestmark = pytest.mark.slow


def create_docs(url: str, start: int, count: int, table: str = "docs") -> list[dict]:
    """A table of PEP paragraphs: integer ids 1..count, the PEP number, the paragraph."""
    rows = [{"id": i + 1, "pep": record["pep"], "body": record["text"]}
            for i, record in enumerate(json.loads(line) for line in corpus_lines(start, count))]
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {table} (id integer PRIMARY KEY, pep integer, body text)"))
        conn.execute(sa.text(f"INSERT INTO {table} VALUES (:id, :pep, :body)"), rows)
    engine.dispose()
    return rows


def execute(url: str, *statements: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for statement in statements:
            conn.execute(sa.text(statement))
    engine.dispose()


def table_manifest(name: str, batch_size: int = 32, max_in_flight: int = 4, **table) -> dict:
    return {
        "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob",
        "metadata": {"name": name, "namespace": "tests"},
        "spec": {
            "source": {"table": {"name": "docs", "idColumn": "id", "textColumn": "body", **table}},
            "model": dict(FAST_START_MODEL),
            "batching": {"batchSize": batch_size, "maxInFlight": max_in_flight, "sortWindow": 512},
            "workers": {"replicas": 1, "cpusPerActor": 2},
            "sink": {"databaseSecretRef": {"name": "db"}, "table": "embeddings", "collection": name},
            "sync": {"deleteMissing": True},
        },
    }


def stamps(url: str) -> dict[str, tuple]:
    return {r.record_id: (r.content_hash, r.updated_at) for r in query(
        url, "SELECT record_id, content_hash, updated_at FROM embeddings")}


def records_given_to_the_model(url: str, run_id: str) -> int:
    """What the run's batches held: every batch dispatched is one model call on exactly these records."""
    return query(url, "SELECT coalesce(sum(records), 0) FROM embedjob_batches WHERE run_id = :r", r=run_id)[0][0]


def test_a_table_is_embedded_and_a_rerun_embeds_only_what_changed(ray_address, database_url):
    rows = create_docs(database_url, 0, 600)
    job = JobConfig.from_manifest(table_manifest("sync"))
    first = run_job(job, database_url)
    assert first.state == "succeeded", first.error
    c = first.counters
    assert (c.records_total, c.records_embedded, c.records_new, c.records_changed, c.records_unchanged,
            c.records_deleted) == (600, 600, 600, 0, 0, 0)
    before = stamps(database_url)
    assert set(before) == {str(r["id"]) for r in rows}

    changed, inserted, deleted = range(101, 111), range(601, 606), (5, 300, 599)
    more = [json.loads(line) for line in corpus_lines(2000, 5)]
    execute(database_url, *(f"UPDATE docs SET body = body || ' (revised)' WHERE id = {i}" for i in changed),
            *(f"INSERT INTO docs VALUES ({i}, {m['pep']}, '{m['text'].replace(chr(39), chr(39) * 2)}')"
              for i, m in zip(inserted, more)),
            f"DELETE FROM docs WHERE id IN {deleted}")
    second = run_job(job, database_url)
    assert second.state == "succeeded", second.error
    assert second.run_id != first.run_id  # each sync after a finished one is a run of its own
    c = second.counters
    assert (c.records_new, c.records_changed, c.records_unchanged, c.records_deleted) == (5, 10, 587, 3)
    assert (c.records_total, c.records_embedded, c.records_failed) == (602, 602, 0)
    assert records_given_to_the_model(database_url, second.run_id) == 15
    after = stamps(database_url)
    touched = {str(i) for i in (*changed, *inserted)}
    assert set(after) == set(before) - {str(i) for i in deleted} | {str(i) for i in inserted}
    assert {k for k in after if after[k] != before.get(k)} == touched  # the rest: same hash, same updated_at
    assert query(database_url, "SELECT text FROM embeddings WHERE record_id = '101'")[0][0].endswith(" (revised)")

    third = run_job(job, database_url)  # nothing changed: nothing reaches the model
    c = third.counters
    assert third.state == "succeeded", third.error
    assert (c.records_new, c.records_changed, c.records_unchanged, c.records_deleted) == (0, 0, 602, 0)
    assert records_given_to_the_model(database_url, third.run_id) == 0
    assert c.batches_succeeded == c.batches_total and stamps(database_url) == after
    assert query(database_url, "SELECT records_new, records_changed, records_deleted FROM embedjob_runs"
                 " WHERE run_id = :r", r=second.run_id) == [(5, 10, 3)]


def test_a_filtered_table_in_another_database_syncs_its_own_rows(ray_address, database_url):
    sink = sa.engine.make_url(database_url)
    source_url = sink.set(database=f"{sink.database}_src").render_as_string(hide_password=False)
    admin = sa.create_engine(sink.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{sink.database}_src"'))
    admin.dispose()
    rows = create_docs(source_url, 0, 300)
    peps = sorted({r["pep"] for r in rows})[:2]
    hostile = "1' OR '1'='1"
    spec = table_manifest("filtered", filter=[{"column": "pep", "op": "in", "values": [str(p) for p in peps]},
                                              {"column": "body", "op": "ne", "value": hostile}])
    summary = run_job(JobConfig.from_manifest(spec), database_url, DriverOptions(source_database_url=source_url))
    assert summary.state == "succeeded", summary.error
    expected = {str(r["id"]) for r in rows if r["pep"] in peps}
    assert {r[0] for r in query(database_url, "SELECT record_id FROM embeddings")} == expected
    assert summary.counters.records_new == len(expected) > 0
    assert query(database_url, "SELECT to_regclass('docs')") == [(None,)]  # the sink's database has no docs

    # The hostile value is a value: it matches no row and changes nothing.
    only_hostile = SourceTable.model_validate({"name": "docs", "idColumn": "id", "textColumn": "body",
                                               "filter": [{"column": "body", "op": "eq", "value": hostile}]})
    assert list(read_table_records(source_url, only_hostile)) == []
    assert query(source_url, "SELECT count(*) FROM docs")[0][0] == 300


@pytest.mark.parametrize("writers", [0, 2])  # the driver's writer thread, writer actors
def test_killing_the_driver_mid_table_resumes_like_a_file_source(ray_address, database_url, tmp_path, writers):
    max_in_flight = 4
    create_docs(database_url, 2800, 320)
    spec = table_manifest("killtable", batch_size=16, max_in_flight=max_in_flight)
    spec["spec"]["sink"]["writers"] = writers
    kill_driver_after(spec, database_url, ray_address, tmp_path / "driver.log", batches=5)
    written = {r[0] for r in query(database_url, "SELECT record_id FROM embeddings")}
    assert 0 < len(written) < 320
    # Between the sessions the table changes: a row before all others (every position moves) and a
    # row already written gets a new text.
    revised = min(written, key=int)
    execute(database_url, "INSERT INTO docs VALUES (0, 1, 'A row inserted before all the others.')",
            f"UPDATE docs SET body = body || ' (revised)' WHERE id = {revised}")

    summary = run_job(JobConfig.from_manifest(spec), database_url)
    assert summary.state == "succeeded", summary.error
    assert query(database_url, "SELECT count(*), count(DISTINCT record_id) FROM embeddings")[0] == (321, 321)
    assert query(database_url, "SELECT text FROM embeddings WHERE record_id = :r", r=revised)[0][0].endswith(
        " (revised)")
    # What the first session wrote went to the model again only where it changed: one succeeded attempt
    # per batch, and the second session's batches held the rest, the inserted row and the revised one.
    assert set(succeeded_attempts(database_url).values()) == {1}
    assert query(database_url, "SELECT sum(records) FROM embedjob_batches WHERE state = 'succeeded'")[0][0] == 322
    run = query(database_url, "SELECT run_id, state, records_embedded, records_new, records_changed,"
                " records_unchanged, records_failed FROM embedjob_runs")
    assert run == [(summary.run_id, "succeeded", 321, 321, 1, 0, 0)]  # one run, resumed; each row counted once

def test_the_table_sync_example_runs_and_resyncs_with_the_real_cli(database_url, local_ray):
    """examples/table-sync.yaml as written: its table filled with the PEP sample, `embedjob run` twice (on the
    tests' Ray head: the example's subject is the table, not Ray's start)."""
    example = REPO / "examples" / "table-sync.yaml"
    source = yaml.safe_load(example.read_text())["spec"]["source"]["table"]
    assert source["filter"] == [{"column": "published", "op": "eq", "value": "true"}]
    texts = [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines()[:120]]
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE TABLE "{source["schema"]}"."{source["name"]}"'
                             f' ("{source["idColumn"]}" int PRIMARY KEY, "{source["textColumn"]}" text, published bool)'))
        conn.execute(sa.text("INSERT INTO documents VALUES (:id, :body, :published)"),
                     [{"id": i, "body": t, "published": i % 4 != 0} for i, t in enumerate(texts)])
    engine.dispose()
    published = sum(1 for i in range(len(texts)) if i % 4 != 0)

    def embedjob_run() -> str:
        done = run_on_ray(local_ray, [*EMBEDJOB, "run", str(example), "--database-url", database_url], timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        return done.stdout

    first = embedjob_run()
    assert f"records by content {published} new, 0 changed, 0 unchanged, 0 deleted" in first, first
    execute(database_url, "UPDATE documents SET published = false WHERE id = 1",
            "UPDATE documents SET body = body || ' Revised.' WHERE id = 2")
    second = embedjob_run()
    assert f"records by content 0 new, 1 changed, {published - 2} unchanged, 1 deleted" in second, second
    assert query(database_url, "SELECT count(*) FROM embeddings WHERE collection = 'documents'")[0][0] == published - 1


def source_table(name: str) -> SourceTable:
    return SourceTable.model_validate({"name": name, "idColumn": "id", "textColumn": "body"})


def test_the_id_column_type_decides_whether_equal_ids_are_read_together(database_url):
    execute(database_url, "CREATE DOMAIN positive AS integer CHECK (VALUE > 0)",
            *(f"CREATE TABLE t_{name} (id {sql_type}, body text)" for name, sql_type in (
                ("int", "integer PRIMARY KEY"), ("big", "bigint"), ("uuid", "uuid"), ("text", "text"),
                ("varchar", 'varchar(40) COLLATE "C"'), ("numeric", "numeric"), ("domain", "positive"),
                ("float", "double precision"))),
            "CREATE VIEW v_int AS SELECT id, body FROM t_int")
    adjacent = {name: equal_ids_adjacent(database_url, source_table(name))
                for name in ("t_int", "t_big", "t_uuid", "t_text", "t_varchar", "t_numeric", "t_domain", "t_float",
                             "v_int", "missing")}
    assert adjacent == {"t_int": True, "t_big": True, "t_uuid": True, "t_text": True, "t_varchar": True,
                        "v_int": True, "t_numeric": False, "t_domain": False, "t_float": False, "missing": False}


def seen_ids_inserted(url: str) -> int:
    return query(url, "SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables"
                      " WHERE relname = 'embedjob_seen_ids'")[0][0]


def test_duplicate_ids_of_a_table_are_found_by_neighbours_as_by_postgresql(ray_address, database_url):
    # A bigint id column without a unique index, with duplicates: read in id order, equal ids come together.
    texts = [json.loads(line)["text"] for line in corpus_lines(0, 60)]
    ids = [*range(1, 51), 3, 3, 17, 50, 50, 50, 1, 22, 22, 40]
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE docs (id bigint, body text)"))
        conn.execute(sa.text("INSERT INTO docs VALUES (:id, :body)"),
                     [{"id": i, "body": t} for i, t in zip(ids, texts)])
    engine.dispose()
    assert equal_ids_adjacent(database_url, source_table("docs"))
    summaries, claimed = {}, {}
    for name, delete_missing in (("neighbours", False), ("claimed", True)):
        manifest = table_manifest(name)
        manifest["spec"]["sync"]["deleteMissing"] = delete_missing
        before = seen_ids_inserted(database_url)
        summaries[name] = run_job(JobConfig.from_manifest(manifest), database_url)
        assert summaries[name].state == "succeeded", summaries[name].error
        # A session's table statistics reach pg_stat when it ends (an idle one may hold them for seconds).
        wait_until("the driver's database sessions to end", lambda: other_sessions(database_url) == 0, timeout=60)
        claimed[name] = seen_ids_inserted(database_url) - before
    assert claimed == {"neighbours": 0, "claimed": 50}  # the neighbours' run claimed nothing in PostgreSQL
    errors = {name: sorted(query(database_url, "SELECT record_id, reason FROM embedjob_record_errors WHERE run_id = :r",
                                 r=summary.run_id)) for name, summary in summaries.items()}
    assert errors["neighbours"] == errors["claimed"] == sorted(
        (str(i), "duplicate_id") for i in (3, 3, 17, 50, 50, 50, 1, 22, 22, 40))
    for name, summary in summaries.items():
        assert (summary.counters.records_total, summary.counters.records_failed) == (60, 10), name
        assert sorted(int(r[0]) for r in query(database_url, "SELECT record_id FROM embeddings WHERE collection = :c",
                                               c=name)) == list(range(1, 51)), name


def test_the_first_of_equal_ids_is_the_same_whatever_the_rows_physical_order(database_url):
    """Issue 27 item 9: ORDER BY id alone leaves equal ids in the plan's order; the text breaks the tie, so
    the row read first (the one that wins) is the smallest text in byte order, NULL last."""
    rows = [(1, "beta"), (2, "solo"), (1, "Alpha"), (1, None), (3, "zeta"), (3, "eta")]
    for name, ordered in (("docs_forward", rows), ("docs_backward", rows[::-1])):
        execute(database_url, f"CREATE TABLE {name} (id integer, body text)",
                *(f"INSERT INTO {name} VALUES ({i}, {'NULL' if t is None else repr(t)})" for i, t in ordered))
    execute(database_url, "CREATE INDEX ON docs_backward (id)", "ANALYZE docs_backward")
    expected = [("1", "Alpha"), ("1", "beta"), ("1", None), ("2", "solo"), ("3", "eta"), ("3", "zeta")]
    for name in ("docs_forward", "docs_backward"):
        got = [(r.id, r.text) for r in read_table_records(database_url, source_table(name))]
        assert got == expected, (name, got)
