"""spec.source.metadataFields and metadataFieldMap end to end: real Ray, the real model, real PostgreSQL. Each
record's fields are kept beside its vectors (JSONL, CSV, Parquet and table sources; CSV and Parquet with a text
template too), a hostile value fails its record alone, a re-run after a change to metadata alone rewrites it without
a model call, the GIN index serves `--where` filters, and a table from before the metadata columns gets them in
place."""

import csv
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from embedjob.vectors_schema import vectors_table
from embedjob_cli.search import nearest
from embedjob_worker.core.config import JobConfig
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.run.job import DriverOptions, run_job
from embedjob_worker.sink.target import VectorsTable
from embedjob_worker.sink.vector_index import metric_for
from embedjob_worker.sink.vectors_table import add_metadata_columns
from support.corpus import corpus_lines
from support.driver_jobs import manifest, write_input
from support.sql import query
from support.job_models import FAST_START_MODEL, model_as_jobs_run_it

pytestmark = pytest.mark.slow


def lines(paragraphs: list[dict], langs: dict[str, str]) -> list[bytes]:
    return [json.dumps({"id": p["id"], "text": p["text"], "lang": langs.get(p["id"], "en"),
                        "meta": {"pep": p["pep"], "tags": ["pep", str(p["pep"])]}}).encode() for p in paragraphs] + [
        json.dumps({"id": "nul", "text": "a text", "lang": "e\u0000n"}).encode()]


def stored(url: str, collection: str) -> dict[str, tuple]:
    return {r.record_id: (r.metadata, r.updated_at, r.embedding) for r in query(
        url, "SELECT record_id, metadata, updated_at, embedding::text AS embedding FROM embeddings"
             " WHERE collection = :c", c=collection)}


def test_fields_are_kept_beside_the_vectors_and_a_metadata_change_alone_embeds_nothing(ray_address, database_url,
                                                                                       tmp_path):
    paragraphs = [json.loads(line) for line in corpus_lines(400, 24)]
    source = write_input(tmp_path / "in.jsonl", lines(paragraphs, {}))
    job = manifest(source, "kept")
    job["spec"]["source"]["metadataFields"] = ["lang", "meta.pep", "meta", "missing"]
    job["spec"]["sink"]["index"] = {"metadata": True}
    config = JobConfig.from_manifest(job)
    first = run_job(config, database_url)
    assert first.state == "succeeded", first.error
    assert (first.counters.records_embedded, first.counters.records_failed) == (24, 1)
    assert first.metadata_index is not None and first.metadata_index.built
    rows = stored(database_url, "kept")
    assert {k: m for k, (m, _, _) in rows.items()} == {
        p["id"]: {"lang": "en", "meta.pep": p["pep"], "meta": {"pep": p["pep"], "tags": ["pep", str(p["pep"])]},
                  "missing": None} for p in paragraphs}
    failed = query(database_url, "SELECT record_id, reason, detail FROM embedjob_record_errors WHERE job_key LIKE '%kept'")
    assert [tuple(f) for f in failed] == [("nul", "metadata_field", "metadata field 'lang': text with a NUL character "
                                                                    "at offset 1, which jsonb cannot store")]

    # Only the metadata of four records changes: written in place, no actor started, no text embedded again.
    changed = {p["id"]: "de" for p in paragraphs[:4]}
    write_input(source, lines(paragraphs, changed))
    again = run_job(config, database_url, DriverOptions(new_run=True))
    assert again.state == "succeeded", again.error
    assert (again.metadata_updated, again.counters.chunks_embedded, again.counters.records_unchanged) == (4, 0, 24)
    assert again.workers == [] and again.batch_latencies == []  # no model was loaded: no model call
    after = stored(database_url, "kept")
    for record_id, (metadata, updated_at, embedding) in after.items():
        assert metadata["lang"] == changed.get(record_id, "en")
        assert embedding == rows[record_id][2]  # the same vectors
        assert (updated_at > rows[record_id][1]) == (record_id in changed)
    unchanged_again = run_job(config, database_url, DriverOptions(new_run=True))
    assert (unchanged_again.metadata_updated, unchanged_again.counters.records_unchanged) == (0, 24)

    # --where: by containment, served by the GIN index when the planner wants it; all conditions must hold.
    model = model_as_jobs_run_it(config.spec.model)
    query_vector = model.encode(["packaging and distribution"], normalize_embeddings=True)[0]
    engine = sa.create_engine(database_url)
    with engine.connect() as conn:
        table = VectorsTable("public", "embeddings")
        revision = query(database_url, "SELECT DISTINCT revision FROM embeddings")[0][0]

        def ids(*where):
            return {h.record_id for h in nearest(conn, table, "kept", config.spec.model.name, revision, query_vector,
                                                  50, metric_for(True), where=list(where))}

        assert ids(("lang", "de")) == set(changed)
        some = paragraphs[5]
        assert ids(("lang", "en"), ("meta.pep", str(some["pep"]))) == {
            p["id"] for p in paragraphs[4:] if p["pep"] == some["pep"]}
        assert ids(("lang", "fr")) == set()
        plan = "\n".join(conn.execute(sa.text(
            "EXPLAIN SELECT record_id FROM embeddings WHERE metadata @> '{\"lang\": \"de\"}'")).scalars())
        indexes = [r[0] for r in conn.execute(sa.text("SELECT indexdef FROM pg_indexes WHERE tablename = 'embeddings'"))]
        assert any("USING gin (metadata jsonb_path_ops)" in i for i in indexes), (indexes, plan)
    engine.dispose()


def test_a_table_sources_columns_are_kept_under_their_names_or_others_and_a_table_from_before_gets_them(
        ray_address, database_url):
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE docs (id integer PRIMARY KEY, body text, lang text, published timestamptz,"
                             " extra jsonb, price numeric)"))
        conn.execute(sa.text("INSERT INTO docs SELECT n, 'paragraph number ' || n, CASE WHEN n % 2 = 0 THEN 'en' END,"
                             " timestamptz '2026-01-02 03:04:05+00' + n * interval '1 day', jsonb_build_object('n', n),"
                             " n / 4.0 FROM generate_series(1, 12) n"))
        conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS vector"))
        # A vectors table from before the metadata columns, as the owner made it.
        vectors_table("embeddings", 384).create(conn)
        conn.execute(sa.text("ALTER TABLE embeddings DROP COLUMN metadata, DROP COLUMN metadata_hash"))
    engine.dispose()
    job = {
        "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob", "metadata": {"name": "tabled", "namespace": "t"},
        "spec": {"source": {"table": {"name": "docs", "idColumn": "id", "textColumn": "body"},
                            "metadataFields": ["published", "extra"],
                            # columns under other names, one of them (published) twice
                            "metadataFieldMap": {"language": "lang", "cost": "price", "day": "published"}},
                 "model": dict(FAST_START_MODEL),
                 "workers": {"replicas": 1, "cpusPerActor": 2},
                 "sink": {"databaseSecretRef": {"name": "db"}, "table": "embeddings", "collection": "tabled"}},
    }
    summary = run_job(JobConfig.from_manifest(job), database_url)
    assert summary.state == "succeeded", summary.error
    metadata = {r.record_id: r.metadata for r in query(
        database_url, "SELECT record_id, metadata FROM embeddings WHERE collection = 'tabled'")}
    assert metadata["1"] == {"language": None, "published": "2026-01-03T03:04:05+00:00", "extra": {"n": 1},
                             "cost": "0.25000000000000000000", "day": "2026-01-03T03:04:05+00:00"}
    assert metadata["2"]["language"] == "en" and len(metadata) == 12
    vectors = np.array([json.loads(r[0]) for r in query(database_url, "SELECT embedding::text FROM embeddings")])
    assert vectors.shape == (12, 384)


def test_a_table_from_before_is_refused_to_a_role_that_does_not_own_it_naming_the_statement_its_owner_runs(
        database_url):
    owner = sa.create_engine(database_url)
    with owner.begin() as conn:
        conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS vector"))
        vectors_table("embeddings", 384).create(conn)
        conn.execute(sa.text("ALTER TABLE embeddings DROP COLUMN metadata, DROP COLUMN metadata_hash"))
        conn.execute(sa.text("CREATE ROLE metadata_writer LOGIN PASSWORD 'pw'"))
        conn.execute(sa.text("GRANT SELECT, INSERT, UPDATE, DELETE ON embeddings TO metadata_writer"))
    table = VectorsTable("public", "embeddings")
    writer = sa.create_engine(sa.engine.make_url(database_url).set(username="metadata_writer", password="pw"))
    try:
        with pytest.raises(JobFailed) as refused:
            add_metadata_columns(writer, table)
    finally:
        writer.dispose()
        with owner.begin() as conn:
            conn.execute(sa.text("DROP OWNED BY metadata_writer"))
            conn.execute(sa.text("DROP ROLE metadata_writer"))
    assert refused.value.reason == "VectorsTableOutdated"
    message = str(refused.value)
    assert "table public.embeddings has no metadata columns and role metadata_writer does not own it" in message
    columns = "SELECT attname FROM pg_attribute WHERE attrelid = 'embeddings'::regclass AND NOT attisdropped"
    assert not {"metadata", "metadata_hash"} & {r[0] for r in query(database_url, columns)}
    # the statement it names is the owner's fix, as written
    statement = message.split("runs `", 1)[1].split("`", 1)[0]
    with owner.begin() as conn:
        conn.execute(sa.text(statement))
    assert {"metadata", "metadata_hash"} <= {r[0] for r in query(database_url, columns)}
    assert add_metadata_columns(owner, table) is False  # nothing left to add
    owner.dispose()


def test_a_csv_and_a_parquet_source_keep_their_templates_text_and_their_metadata_under_both_names(
        ray_address, database_url, tmp_path):
    paragraphs = [json.loads(line) for line in corpus_lines(500, 10)]
    rows = [{"id": p["id"], "title": f"Title {n}", "body": p["text"], "lang": "de" if n % 2 else "en", "year": 2000 + n}
            for n, p in enumerate(paragraphs)]
    with open(tmp_path / "in.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "title", "body", "lang", "year"])
        writer.writerows([[r["id"], r["title"], r["body"], r["lang"], r["year"]] for r in rows])
        writer.writerow(["short-row", "a title alone"])  # no body: its record fails alone, naming the field
    pq.write_table(pa.table({"id": [r["id"] for r in rows] + ["null-body"],
                             "title": [r["title"] for r in rows] + ["a title"], "body": [r["body"] for r in rows] + [None],
                             "meta": [{"lang": r["lang"], "year": r["year"]} for r in rows] + [None]}),
                   tmp_path / "in.parquet")
    text = {r["id"]: f"{r['title']}: {r['body']}" for r in rows}
    for fmt, fields, renamed, values in [
            ("csv", ["year"], {"language": "lang"}, lambda r: {"year": str(r["year"]), "language": r["lang"]}),
            ("parquet", ["meta.year"], {"language": "meta.lang"},
             lambda r: {"meta.year": r["year"], "language": r["lang"]})]:
        job = manifest(tmp_path / f"in.{fmt}", f"fields-{fmt}")
        job["spec"]["source"].update(format=fmt, textTemplate="{title}: {body}", metadataFields=fields,
                                     metadataFieldMap=renamed)
        summary = run_job(JobConfig.from_manifest(job), database_url)
        assert summary.state == "succeeded", summary.error
        assert (summary.counters.records_embedded, summary.counters.records_failed) == (10, 1), fmt
        stored = {r.record_id: (r.text, r.metadata) for r in query(
            database_url, f"SELECT record_id, text, metadata FROM embeddings WHERE collection = 'fields-{fmt}'")}
        assert stored == {r["id"]: (text[r["id"]], values(r)) for r in rows}, fmt
        failed = query(database_url, "SELECT reason, detail FROM embedjob_record_errors"
                                     f" WHERE job_key LIKE '%fields-{fmt}'")
        assert [(f.reason, f.detail) for f in failed] == [
            ("template_field", "textTemplate field 'body' is " + ("missing" if fmt == "csv" else "null"))], fmt
