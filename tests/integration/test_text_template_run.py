"""spec.source.textTemplate end to end: real Ray, the real model, real PostgreSQL. Each record's text built from two
fields is what is embedded and stored, a record without a field fails alone naming it, and a re-run after a change to
a field the template does not name embeds nothing."""

import json

import numpy as np
import sqlalchemy as sa
import pytest

from embedjob_worker.core.config import JobConfig
from embedjob_worker.run.job import DriverOptions, run_job
from support.corpus import corpus_lines
from support.driver_jobs import manifest, write_input
from support.sql import query
from support.job_models import FAST_START_MODEL, model_as_jobs_run_it

pytestmark = pytest.mark.slow
TEMPLATE = "{title}\n\n{body}"


def records(paragraphs: list[dict], edition: str) -> list[bytes]:
    lines = [json.dumps({"id": p["id"], "title": f"Paragraph {n}", "body": p["text"], "edition": edition}).encode()
             for n, p in enumerate(paragraphs)]
    return lines + [json.dumps({"id": "no-body", "title": "only a title", "edition": edition}).encode()]


def test_the_template_is_embedded_a_missing_field_fails_its_record_and_an_unused_field_changes_nothing(
        ray_address, database_url, tmp_path):
    paragraphs = [json.loads(line) for line in corpus_lines(300, 30)]
    source = write_input(tmp_path / "in.jsonl", records(paragraphs, "first"))
    job = manifest(source, "templated")
    job["spec"]["source"]["textTemplate"] = TEMPLATE
    config = JobConfig.from_manifest(job)
    summary = run_job(config, database_url)
    assert summary.state == "succeeded", summary.error
    assert (summary.counters.records_embedded, summary.counters.records_failed) == (30, 1)

    rows = query(database_url, "SELECT record_id, text, embedding::text AS embedding FROM embeddings"
                               " WHERE collection = 'templated' ORDER BY record_id")
    by_id = {p["id"]: f"Paragraph {n}\n\n{p['text']}" for n, p in enumerate(paragraphs)}
    assert {r.record_id: r.text for r in rows} == by_id
    model = model_as_jobs_run_it(config.spec.model)
    reference = model.encode([r.text for r in rows], normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(np.array([json.loads(r.embedding) for r in rows]), reference, atol=1e-5)
    failed = query(database_url, "SELECT record_id, reason, detail FROM embedjob_record_errors"
                                 " WHERE job_key LIKE '%templated'")
    assert [(f.record_id, f.reason, f.detail) for f in failed] == [
        ("no-body", "template_field", "textTemplate field 'body' is missing")]

    write_input(source, records(paragraphs, "second"))  # only a field the template does not name changed
    again = run_job(config, database_url, DriverOptions(new_run=True))
    assert again.state == "succeeded", again.error
    assert (again.counters.records_unchanged, again.counters.chunks_embedded) == (30, 0)


def test_a_table_sources_template_is_rendered_from_its_columns(ray_address, database_url):
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE articles (id integer PRIMARY KEY, title text, body text, pages integer)"))
        conn.execute(sa.text("INSERT INTO articles SELECT n, 'Title ' || n, CASE WHEN n <> 3 THEN 'body ' || n END, n"
                             " FROM generate_series(1, 8) n"))
    engine.dispose()
    job = {"apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob", "metadata": {"name": "articles"},
           "spec": {"source": {"table": {"name": "articles", "idColumn": "id"}, "textTemplate": TEMPLATE},
                    "model": dict(FAST_START_MODEL),
                    "workers": {"replicas": 1, "cpusPerActor": 2},
                    "sink": {"databaseSecretRef": {"name": "db"}, "table": "embeddings", "collection": "articles"}}}
    summary = run_job(JobConfig.from_manifest(job), database_url)
    assert summary.state == "succeeded", summary.error
    assert (summary.counters.records_embedded, summary.counters.records_failed) == (7, 1)
    texts = dict(query(database_url, "SELECT record_id, text FROM embeddings WHERE collection = 'articles'"))
    assert texts == {str(n): f"Title {n}\n\nbody {n}" for n in range(1, 9) if n != 3}
    failed = query(database_url, "SELECT record_id, detail FROM embedjob_record_errors WHERE job_key LIKE '%articles'")
    assert [tuple(f) for f in failed] == [("3", "textTemplate field 'body' is null")]
