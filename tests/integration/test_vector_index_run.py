"""The vector index and halfvec through whole runs: real Ray, the packaged model, PEP paragraphs, real PostgreSQL."""

import numpy as np
import pytest
import sqlalchemy as sa
import yaml

from support.cli import EMBEDJOB, manifest as cli_manifest, run, run_on_ray
from support.corpus import corpus_lines
from support.driver_jobs import manifest, write_input
from support.manifests import merged
from support.sql import query, stored_vectors
from embedjob import db
from embedjob_worker.core.config import JobConfig
from embedjob_worker.run.job import run_job
from embedjob_cli.search import nearest
from embedjob_worker.sink.target import VectorsTable
from embedjob_worker.sink.vector_index import INNER_PRODUCT

pytestmark = pytest.mark.slow
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def test_a_run_builds_the_index_once_and_search_through_it_finds_the_exact_neighbours(ray_address, database_url,
                                                                                       tmp_path):
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(0, 400))
    job = JobConfig.from_manifest(merged(manifest(source, "indexed"), {"spec": {"sink": {"index": {"type": "hnsw"}}}}))
    summary = run_job(job, database_url)
    assert summary.state == "succeeded", summary.error
    assert summary.index.built and summary.index.name == "embeddings_hnsw_ip" and summary.index.seconds > 0
    assert summary.counters.index_build_seconds == round(summary.index.seconds, 3)
    assert query(database_url, "SELECT state, index_build_seconds FROM embedjob_runs") == [
        ("succeeded", summary.counters.index_build_seconds)]
    assert query(database_url, "SELECT indexdef LIKE '%USING hnsw (embedding vector_ip_ops)%' FROM pg_indexes"
                 " WHERE indexname = 'embeddings_hnsw_ip'") == [(True,)]
    oid = query(database_url, "SELECT 'embeddings_hnsw_ip'::regclass::oid")

    # recall@10 of the index (pgvector's default ef_search) against exact float32 neighbours, on real embeddings.
    ids, vectors, revision = stored_vectors(database_url, "indexed")
    picks = np.random.default_rng(0).choice(len(ids), 100, replace=False)
    engine = db.create_engine(database_url)
    found = 0
    with engine.connect() as conn:
        # On 400 rows the planner would rather read and sort them all, which finds the exact neighbours whatever
        # the index holds: sorting off for this session, so both the recall and the plan are the index's.
        conn.execute(sa.text("SET enable_sort = off"))
        for i in picks:
            exact = {ids[j] for j in np.argsort(-(vectors @ vectors[i]), kind="stable")[:11]} - {ids[i]}
            hits = nearest(conn, VectorsTable("public", "embeddings"), "indexed", MODEL, revision, vectors[i], 11, INNER_PRODUCT)
            found += len(exact & ({h.record_id for h in hits} - {ids[i]}))
        plan = conn.execute(sa.text("EXPLAIN SELECT 1 FROM embeddings WHERE collection = 'indexed' AND model = :m"
                                    " AND revision = :r ORDER BY embedding <#> CAST(:q AS vector) LIMIT 10"),
                            {"m": MODEL, "r": revision, "q": "[" + ",".join(map(str, vectors[0])) + "]"}).scalars().all()
    engine.dispose()
    recall = found / (10 * len(picks))
    print(f"recall@10 over {len(ids)} PEP paragraphs, ef_search 40: {recall:.3f}")
    assert recall >= 0.95
    assert any("Index Scan using embeddings_hnsw_ip" in line for line in plan), plan

    again = run_job(job, database_url)  # nothing left to embed; the index is there
    assert again.state == "succeeded" and not again.index.built and again.index.name == "embeddings_hnsw_ip"
    assert again.counters.index_build_seconds is None
    assert query(database_url, "SELECT 'embeddings_hnsw_ip'::regclass::oid") == oid
    assert query(database_url, "SELECT index_build_seconds FROM embedjob_runs") == [(None,)]


def test_embedjob_run_index_hnsw_on_halfvec_then_search(tmp_path, database_url, local_ray):
    write_input(tmp_path / "peps.jsonl", corpus_lines(0, 200))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(merged(cli_manifest("peps.jsonl"), {"spec": {"sink": {"vectorType": "halfvec"}}})))
    result = run_on_ray(local_ray, [*EMBEDJOB, "run", str(path), "--index", "hnsw", "--database-url", database_url])
    assert result.returncode == 0, result.stderr
    assert "vector index       embeddings_hnsw_ip built in " in result.stdout
    assert query(database_url, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                 " WHERE attrelid = 'embeddings'::regclass AND attname = 'embedding'") == [("halfvec(384)",)]
    assert query(database_url, "SELECT indexdef LIKE '%halfvec_ip_ops%' FROM pg_indexes"
                 " WHERE indexname = 'embeddings_hnsw_ip'") == [(True,)]

    found = run([*EMBEDJOB, "search", str(path), "the purpose of a PEP", "-k", "3", "--ef-search", "100",
                 "--database-url", database_url])
    assert found.returncode == 0, found.stderr
    header, *hits = found.stdout.strip().splitlines()
    distance, record_id, _ = hits[0].split(maxsplit=2)
    assert len(hits) == 3 and record_id.startswith("pep-0001-") and 0 <= float(distance) < 0.6

    refused = run([*EMBEDJOB, "search", str(path), "x", "--ef-search", "0", "--database-url", database_url])
    assert refused.returncode == 2 and "--ef-search: must be a whole number from 1 to 1000" in refused.stderr

    vector = tmp_path / "vector.yaml"  # the same table, written as vector: refused, nothing mixed
    vector.write_text(yaml.safe_dump(merged(cli_manifest("peps.jsonl"), {"spec": {"sink": {"collection": "other"}}})))
    mixed = run_on_ray(local_ray, [*EMBEDJOB, "run", str(vector), "--database-url", database_url])
    assert mixed.returncode == 1
    assert ("VectorTypeMismatch: table public.embeddings holds halfvec(384) vectors but spec.sink.vectorType is vector"
            in mixed.stdout)
    assert query(database_url, "SELECT count(*) FROM embeddings WHERE collection = 'other'") == [(0,)]
