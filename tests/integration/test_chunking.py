"""spec.chunking end to end: long PEP documents become chunk vectors equal to a direct encode of each chunk, with
their offsets; a document that shrinks keeps exactly its new chunks; a crash resumes without duplicates or orphans;
search points into the document; writer actors (spec.sink.writers) write and drop the same chunk rows; a vectors
table from before chunking is upgraded by its owner, refused otherwise (real Ray, the real model, real PostgreSQL)."""

import json

import numpy as np
import pytest
import sqlalchemy as sa

from support.driver_crash import kill_driver_after
from support.corpus import corpus_lines
from support.job_models import FAST_START_MODEL, model_as_jobs_run_it
from support.driver_jobs import manifest, write_input
from support.sql import query
from embedjob_worker.plan.chunking import Chunker
from embedjob_worker.core.config import JobConfig
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.encode.model import resolve_model
from embedjob_worker.run.job import DriverOptions, run_job
from embedjob_cli.search import nearest
from embedjob_worker.encode.tokens import load_tokenizer
from embedjob_worker.sink.vector_index import metric_for
from embedjob_worker.sink.target import VectorsTable
from embedjob_worker.sink.vectors_table import upgrade_vectors_table

pytestmark = pytest.mark.slow

MAX_TOKENS, OVERLAP = 128, 32


def documents(count: int, start: int = 1000, paragraphs: int = 6) -> list[dict]:
    """`count` documents of `paragraphs` consecutive PEP paragraphs each (some 1, to stay one chunk)."""
    lines = [json.loads(line)["text"] for line in corpus_lines(start, count * paragraphs)]
    return [{"id": f"doc-{i}", "text": "\n\n".join(lines[i * paragraphs:(i + 1) * paragraphs] if i % 4 else
                                                   lines[i * paragraphs:i * paragraphs + 1])} for i in range(count)]


def chunked_manifest(source, name: str, batch_size: int = 16, max_in_flight: int = 4) -> dict:
    spec = manifest(source, name, batch_size=batch_size, max_in_flight=max_in_flight, model=FAST_START_MODEL)
    spec["spec"]["chunking"] = {"maxTokens": MAX_TOKENS, "overlapTokens": OVERLAP}
    return spec


def write_docs(path, docs: list[dict]):
    return write_input(path, [json.dumps(d).encode() for d in docs])


def stored(url: str) -> dict[str, list]:
    rows = query(url, "SELECT record_id, chunk, char_start, char_end, text, embedding::text, content_hash, updated_at"
                      " FROM embeddings ORDER BY record_id, chunk")
    by_record: dict[str, list] = {}
    for row in rows:
        by_record.setdefault(row[0], []).append(row)
    return by_record


@pytest.fixture(scope="module")
def model_and_chunker():
    """The jobs' model as their actors run it (the onnx export), and the chunker its tokenizer makes."""
    from embedjob.api import Model

    model = Model(**FAST_START_MODEL)
    resolved = resolve_model(model)
    return resolved, model_as_jobs_run_it(model), Chunker(load_tokenizer(resolved).backend_tokenizer, MAX_TOKENS,
                                                          OVERLAP)


def check_chunk_rows(by_record: dict, docs: list[dict], chunker: Chunker) -> int:
    """Every document's rows are exactly its chunks 0..n-1, with their offsets and texts; the number of rows."""
    assert set(by_record) == {d["id"] for d in docs}
    for doc in docs:
        spans = chunker([doc["text"]])[0]
        rows = by_record[doc["id"]]
        assert [(r[1], r[2], r[3]) for r in rows] == [(k, s.start, s.end) for k, s in enumerate(spans)], doc["id"]
        assert [r[4] for r in rows] == [doc["text"][s.start:s.end] for s in spans]
        assert len({r[6] for r in rows}) == 1  # the record's content hash, on each of its chunks
    return sum(len(rows) for rows in by_record.values())


def five_chunk_document(docs: list[dict], chunker: Chunker) -> dict:
    """A document of `docs` cut (in place) to exactly 5 chunks."""
    long = next(d for d in docs if len(chunker([d["text"]])[0]) >= 5)
    while len(chunker([long["text"]])[0]) > 5:
        long["text"] = long["text"].rsplit("\n\n", 1)[0] if "\n\n" in long["text"] else long["text"][:-200]
    assert len(chunker([long["text"]])[0]) == 5 or pytest.skip("no 5-chunk document in this stretch")
    return long


def shrink_to_two_chunks(doc: dict, chunker: Chunker) -> None:
    spans = chunker([doc["text"]])[0]
    doc["text"] = doc["text"][:spans[1].end - 1]  # ends inside chunk 1: two chunks
    assert len(chunker([doc["text"]])[0]) == 2


def test_long_documents_become_chunk_vectors_equal_to_a_direct_encode(ray_address, database_url, tmp_path,
                                                                      model_and_chunker):
    resolved, model, chunker = model_and_chunker
    docs = documents(24)
    spec = chunked_manifest(write_docs(tmp_path / "docs.jsonl", docs), "chunks")
    summary = run_job(JobConfig.from_manifest(spec), database_url)
    assert summary.state == "succeeded", summary.error
    by_record = stored(database_url)
    rows = check_chunk_rows(by_record, docs, chunker)
    assert rows > 2 * len(docs) and any(len(r) == 1 for r in by_record.values())
    c = summary.counters
    assert (c.records_embedded, c.chunks_embedded, c.records_new, summary.records_truncated) == (24, rows, 24, 0)
    assert query(database_url, "SELECT chunks_embedded FROM embedjob_runs")[0][0] == rows

    texts = [r[4] for record in by_record.values() for r in record]
    written = np.array([json.loads(r[5]) for record in by_record.values() for r in record], dtype=np.float32)
    direct = model.encode(texts, batch_size=16, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(written, direct, atol=1e-5)

    # Search points into the document: the nearest chunk to a chunk's own vector is that chunk, with its offsets.
    doc_id, chunk, start, end = next((r[0], r[1], r[2], r[3]) for rec in by_record.values() for r in rec if r[1] == 2)
    engine = sa.create_engine(database_url)
    with engine.connect() as conn:
        hits = nearest(conn, VectorsTable("public", "embeddings"), "chunks", resolved.name, resolved.revision,
                       direct[texts.index(next(r[4] for r in by_record[doc_id] if r[1] == 2))], 3,
                       metric_for(True))
    engine.dispose()
    assert (hits[0].record_id, hits[0].chunk, hits[0].char_start, hits[0].char_end) == (doc_id, chunk, start, end)
    assert hits[0].distance < 1e-4

    again = run_job(JobConfig.from_manifest(spec), database_url)  # the same input: nothing embedded again
    assert again.state == "succeeded" and again.counters.chunks_embedded == rows
    assert stored(database_url) == by_record


def test_a_record_of_more_chunks_than_a_batch_is_encoded_in_passes_and_split_on_out_of_memory(
        ray_address, database_url, tmp_path, model_and_chunker):
    _, model, chunker = model_and_chunker
    docs = documents(6, start=5000, paragraphs=8)
    spec = chunked_manifest(write_docs(tmp_path / "docs.jsonl", docs), "passes", batch_size=4)
    summary = run_job(JobConfig.from_manifest(spec), database_url, DriverOptions(fault_injection={"oom_above": 2}))
    assert summary.state == "succeeded", summary.error
    by_record = stored(database_url)
    check_chunk_rows(by_record, docs, chunker)
    assert max(len(rows) for rows in by_record.values()) > 4 and summary.oom_splits > 0
    assert query(database_url, "SELECT count(*) FROM embedjob_batch_attempts WHERE outcome = 'split'")[0][0] > 0
    rows = [r for record in by_record.values() for r in record]
    direct = model.encode([r[4] for r in rows], batch_size=4, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(np.array([json.loads(r[5]) for r in rows], dtype=np.float32), direct, atol=1e-5)


def test_a_document_that_shrinks_from_5_chunks_to_2_leaves_exactly_2(ray_address, database_url, tmp_path,
                                                                     model_and_chunker):
    _, _, chunker = model_and_chunker
    docs = documents(12, start=2000, paragraphs=5)
    long = five_chunk_document(docs, chunker)
    long_id = long["id"]
    source = write_docs(tmp_path / "docs.jsonl", docs)
    spec = chunked_manifest(source, "shrink")
    spec["spec"]["sync"] = {"deleteMissing": True}
    assert run_job(JobConfig.from_manifest(spec), database_url).state == "succeeded"
    before = stored(database_url)
    assert len(before[long_id]) == 5

    shrink_to_two_chunks(long, chunker)
    gone = docs.pop(-1)
    write_docs(source, docs)
    second = run_job(JobConfig.from_manifest(spec), database_url, DriverOptions(new_run=True))
    assert second.state == "succeeded", second.error
    after = stored(database_url)
    assert [r[1] for r in after[long_id]] == [0, 1]  # exactly 2: no orphan chunks 2, 3, 4
    check_chunk_rows(after, docs, chunker)
    assert gone["id"] not in after and second.counters.records_deleted == 1  # every chunk of it
    c = second.counters
    assert (c.records_changed, c.records_unchanged, c.chunks_embedded) == (1, len(docs) - 1, 2)
    assert {k: v for k, v in after.items() if k != long_id} == {k: v for k, v in before.items()
                                                                if k not in (long_id, gone["id"])}


def test_a_chunked_job_with_writer_actors_writes_each_chunk_once_and_drops_stale_chunks(
        ray_address, database_url, tmp_path, model_and_chunker):
    """spec.sink.writers: 2 with spec.chunking: the writer actors write the chunk rows and drop a shrunk
    document's stale chunks in their own group transactions."""
    _, model, chunker = model_and_chunker
    docs = documents(20, start=5000, paragraphs=5)
    long = five_chunk_document(docs, chunker)
    source = write_docs(tmp_path / "docs.jsonl", docs)
    spec = chunked_manifest(source, "chunk-writers", batch_size=4)
    spec["spec"]["sink"]["writers"] = 2
    first = run_job(JobConfig.from_manifest(spec), database_url)
    assert first.state == "succeeded", first.error
    assert len(first.writers) == 2 and sum(first.writers.values()) == first.counters.batches_succeeded > 1
    by_record = stored(database_url)
    rows = check_chunk_rows(by_record, docs, chunker)
    assert len(by_record[long["id"]]) == 5
    assert query(database_url, "SELECT count(*), count(DISTINCT (record_id, chunk)) FROM embeddings")[0] == (rows, rows)
    assert (first.counters.records_embedded, first.counters.chunks_embedded) == (len(docs), rows)
    assert query(database_url, "SELECT records_embedded, chunks_embedded FROM embedjob_runs") == [(len(docs), rows)]
    texts = [r[4] for record in by_record.values() for r in record]
    written = np.array([json.loads(r[5]) for record in by_record.values() for r in record], dtype=np.float32)
    np.testing.assert_allclose(written, model.encode(texts, batch_size=16, normalize_embeddings=True,
                                                     convert_to_numpy=True), atol=1e-5)

    shrink_to_two_chunks(long, chunker)
    write_docs(source, docs)
    second = run_job(JobConfig.from_manifest(spec), database_url, DriverOptions(new_run=True))
    assert second.state == "succeeded", second.error
    after = stored(database_url)
    assert [r[1] for r in after[long["id"]]] == [0, 1]  # the writer's transaction dropped chunks 2, 3 and 4
    check_chunk_rows(after, docs, chunker)
    c = second.counters
    assert (c.records_changed, c.records_unchanged, c.chunks_embedded) == (1, len(docs) - 1, 2)
    assert {k: v for k, v in after.items() if k != long["id"]} == {k: v for k, v in by_record.items()
                                                                   if k != long["id"]}


def test_a_crashed_chunking_run_resumes_without_duplicates_or_orphans(ray_address, database_url, tmp_path,
                                                                     model_and_chunker):
    _, _, chunker = model_and_chunker
    docs = documents(60, start=3000, paragraphs=4)
    spec = chunked_manifest(write_docs(tmp_path / "docs.jsonl", docs), "chunk-crash", batch_size=8, max_in_flight=2)
    committed, dispatched = kill_driver_after(spec, database_url, ray_address, tmp_path / "driver.log", batches=3)
    assert len(dispatched - committed) <= 2 and committed
    partial = stored(database_url)
    assert partial and len(partial) < len(docs)
    for record_id, rows in partial.items():  # whole records only: a batch's records, all their chunks
        doc = next(d for d in docs if d["id"] == record_id)
        assert [r[1] for r in rows] == list(range(len(chunker([doc["text"]])[0])))
    summary = run_job(JobConfig.from_manifest(spec), database_url)
    assert summary.state == "succeeded", summary.error
    rows = check_chunk_rows(stored(database_url), docs, chunker)
    assert query(database_url, "SELECT count(*), count(DISTINCT (record_id, chunk)) FROM embeddings")[0] == (rows, rows)
    assert summary.counters.records_embedded == len(docs) and summary.counters.chunks_embedded == rows


OLD_TABLE = """
CREATE EXTENSION IF NOT EXISTS vector;
CREATE TABLE embeddings (collection varchar(128), record_id text, model varchar(256), revision varchar(128),
  content_hash varchar(64) NOT NULL, embedding vector(384) NOT NULL, text text NOT NULL, job_key varchar(300) NOT NULL,
  batch_id varchar(64) NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (collection, record_id, model, revision))
"""


def execute(url: str, *statements: str, **params) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for statement in statements:
            conn.execute(sa.text(statement), params)
    engine.dispose()


def test_a_vectors_table_from_before_chunking_is_upgraded_by_its_owner(ray_address, database_url, tmp_path):
    vector = "[" + ",".join(["0.05"] * 384) + "]"
    execute(database_url, OLD_TABLE, "INSERT INTO embeddings (collection, record_id, model, revision, content_hash,"
            " embedding, text, job_key, batch_id) VALUES ('other', 'old-1', 'm', 'r', 'h', CAST(:v AS vector), 'ünï',"
            " 'j', 'b')", v=vector)
    source = write_input(tmp_path / "in.jsonl", corpus_lines(4000, 40))
    summary = run_job(JobConfig.from_manifest(manifest(source, "upgraded")), database_url)
    assert summary.state == "succeeded", summary.error
    assert query(database_url, "SELECT chunk, char_start, char_end FROM embeddings WHERE record_id = 'old-1'") == \
        [(0, 0, 3)]  # the old row: chunk 0 over its whole text (characters, not bytes)
    assert query(database_url, "SELECT count(*) FROM embeddings WHERE collection = 'upgraded' AND chunk = 0"
                               " AND char_end = char_length(text)")[0][0] == 40
    key = query(database_url, "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'embeddings'::regclass"
                              " AND contype = 'p'")[0][0]
    assert key == "PRIMARY KEY (collection, record_id, chunk, model, revision)"


def test_a_primary_key_whose_name_holds_quotes_is_dropped_by_the_upgrade(database_url):
    """Issue 27 item 9: the constraint's name goes into DROP CONSTRAINT quoted as an identifier."""
    odd = 'key "of" embeddings'
    execute(database_url, OLD_TABLE.replace("PRIMARY KEY (", 'CONSTRAINT "key ""of"" embeddings" PRIMARY KEY ('))
    assert query(database_url, "SELECT conname FROM pg_constraint WHERE contype = 'p'"
                               " AND conrelid = 'embeddings'::regclass") == [(odd,)]
    engine = sa.create_engine(database_url)
    try:
        assert upgrade_vectors_table(engine, VectorsTable("public", "embeddings")) is True
    finally:
        engine.dispose()
    key = query(database_url, "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                              " WHERE conrelid = 'embeddings'::regclass AND contype = 'p'")
    assert [definition for _, definition in key] == ["PRIMARY KEY (collection, record_id, chunk, model, revision)"]
    assert key[0][0] != odd


def test_a_vectors_table_from_before_chunking_is_refused_to_a_role_that_does_not_own_it(database_url):
    execute(database_url, OLD_TABLE, "CREATE ROLE chunk_reader LOGIN PASSWORD 'pw'",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON embeddings TO chunk_reader")
    url = sa.engine.make_url(database_url).set(username="chunk_reader", password="pw")
    engine = sa.create_engine(url)
    try:
        with pytest.raises(JobFailed) as refused:
            upgrade_vectors_table(engine, VectorsTable("public", "embeddings"))
    finally:
        engine.dispose()
        execute(database_url, "DROP OWNED BY chunk_reader", "DROP ROLE chunk_reader")
    assert refused.value.reason == "VectorsTableOutdated"
    assert "table public.embeddings was created before chunking" in str(refused.value)
    assert "role chunk_reader does not own it" in str(refused.value) and "docs/chunking.md" in str(refused.value)
    assert "chunk" not in {r[0] for r in query(database_url, "SELECT attname FROM pg_attribute WHERE attrelid ="
                                                              " 'embeddings'::regclass")}
