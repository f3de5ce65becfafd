"""A tenant role's vectors table (issue 27 items 4, 5): its own schema's, never `public`'s, and locked apart."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from embedjob.vectors_schema import vectors_table
from embedjob.api import VectorIndex
from embedjob.contract import ExitCode
from embedjob_worker.core.config import JobConfig
from embedjob_worker.core.records import Record
from embedjob_worker.encode.model import resolve_model
from embedjob_worker.plan.checks import classify_records
from embedjob_worker.run.job import run_job
from embedjob_worker.sink.postgres import open_engine
from embedjob_worker.sink.target import VectorsTable
from embedjob_worker.sink.vector_index import INNER_PRODUCT, ensure_index
from embedjob_worker.sink.vectors_table import ensure_vectors_table
from embedjob_worker.source.files import read_records
from support.cli import EMBEDJOB, run
from support.corpus import corpus_lines
from support.driver_jobs import manifest, write_input
from support.polling import wait_until
from support.sql import query
from support.tenant_roles import tenant

DIM = 384  # all-MiniLM-L6-v2's


@pytest.mark.slow
def test_a_tenant_job_uses_its_own_schemas_table_and_never_touches_a_readable_one_in_public(
        ray_address, database_url, tmp_path):
    team = tenant(database_url, "team-a")
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(0, 40))
    spec = manifest(source, "shadowed")
    spec["metadata"]["namespace"] = "team-a"
    spec["spec"]["sync"] = {"deleteMissing": True}
    job = JobConfig.from_manifest(spec)
    resolved = resolve_model(job.spec.model)
    # The single-role install's `public.embeddings` (docs/install.md upgrades from it), readable and writable by the
    # tenant as a group role's grant would make it, holding a vector of the job's own collection, model and revision.
    admin = sa.create_engine(database_url)
    with admin.begin() as conn:
        shared = vectors_table("embeddings", DIM)  # the admin's search path: public
        shared.create(conn)
        conn.execute(shared.insert().values(
            collection="shadowed", record_id="public-only", chunk=0, model=resolved.name, revision=resolved.revision,
            content_hash="0" * 64, embedding=[0.5] * DIM, text="kept", char_start=0, char_end=4,
            job_key="single-role-job", batch_id="b"))
        conn.execute(sa.text(f'GRANT SELECT, INSERT, UPDATE, DELETE ON public.embeddings TO "{team.role}"'))
    admin.dispose()
    # `embedjob search` reads the table the job writes, never public's through the search path: none yet
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(spec))
    before = run([*EMBEDJOB, "search", str(job_file), "anything", "--database-url", team.url])
    assert before.returncode == ExitCode.JOB_FAILED and "no vectors yet" in before.stderr, before.stderr

    summary = run_job(job, team.url)

    assert summary.state == "succeeded", summary.error
    assert query(database_url, "SELECT record_id, text, job_key FROM public.embeddings") == [
        ("public-only", "kept", "single-role-job")]
    ids = sorted(r.id for r in classify_records(read_records(str(source), "jsonl", "id", "text"))
                 if isinstance(r, Record))
    assert len(ids) > 30
    own = query(database_url, f'SELECT record_id FROM "{team.role}".embeddings ORDER BY record_id')
    assert [r.record_id for r in own] == ids
    assert summary.counters.records_deleted == 0


def test_an_index_build_on_one_tenants_table_does_not_hold_up_another_tenants_start(database_url):
    team_a, team_b = tenant(database_url, "team-a"), tenant(database_url, "team-b")
    table_a, table_b = VectorsTable(team_a.role, "embeddings"), VectorsTable(team_b.role, "embeddings")
    engine_a, engine_b = open_engine(team_a.url), open_engine(team_b.url)
    ensure_vectors_table(engine_a, table_a, 8, "vector")
    # A write in progress on A's table: A's index build takes the table's advisory lock, then waits in CREATE INDEX
    # for as long as the write lasts (on a big table the build itself lasts that long).
    writer = sa.create_engine(database_url)
    writing = writer.connect()
    transaction = writing.begin()
    writing.execute(sa.text(f"LOCK TABLE {table_a.sql} IN ROW EXCLUSIVE MODE"))
    try:
        with ThreadPoolExecutor(1) as pool:
            build = pool.submit(ensure_index, engine_a, table_a, "vector", INNER_PRODUCT, VectorIndex(type="hnsw"))
            try:
                wait_until("A's CREATE INDEX waiting on the write", lambda: query(
                    database_url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                  " AND query LIKE 'CREATE INDEX%'")[0][0] == 1)
                started = time.monotonic()
                ensure_vectors_table(engine_b, table_b, 8, "vector")  # B's start, on its own table
                took = time.monotonic() - started
            finally:
                transaction.rollback()
                writing.close()
            assert build.result(timeout=120).built
    finally:
        writer.dispose()
        engine_a.dispose()
        engine_b.dispose()
    assert took < 10, f"B's start waited {took:.1f}s on A's index build"
    assert query(database_url, f"SELECT to_regclass('{table_b.sql}') IS NOT NULL") == [(True,)]
