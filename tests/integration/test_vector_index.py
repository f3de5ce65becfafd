"""The HNSW index and halfvec storage against a real PostgreSQL with pgvector: search through the index, recall, types."""

import numpy as np
import pytest
import sqlalchemy as sa

from support.sql import query
from embedjob.api import VectorIndex
from embedjob_worker.sink.copy_data import content_salt
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.outcome import AttemptRow, BatchOutcome, now
from embedjob_worker.core.records import Record
from embedjob_cli.search import nearest, vector_literal
from embedjob_worker.sink.postgres import open_engine
from embedjob_worker.sink.runs import RunRequest
from embedjob_worker.sink.target import SinkTarget, VectorsTable
from embedjob_worker.core.tally import RunTally
from embedjob_worker.sink.vector_index import COSINE, INNER_PRODUCT, ensure_index, index_name
from embedjob_worker.sink.vectors_table import ensure_vectors_table
from embedjob_worker.sink.writer import SinkWriter
from support.sink import OpenJob, open_job

HNSW = VectorIndex(type="hnsw")
RUN = RunRequest("m", "r1", "in", "cfg")


def unit_vectors(count: int, dim: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def loaded_sink(url: str, vectors: np.ndarray, vector_type: str, table: str = "vectors") -> OpenJob:
    job = open_job(url, SinkTarget("local/tests/index", "c1", table, content_salt(True, None), vector_type), "index",
                   "tests", dim=vectors.shape[1])
    run = job.runs.start(RUN, new_run=False).run
    records = tuple(Record(i, f"r{i:05d}", f"text {i}") for i in range(len(vectors)))
    step = 500
    job.sink.write(run, [
        BatchOutcome(f"b{start}", "succeeded", records[start:start + step], [AttemptRow(1, "w", "succeeded", None, now())],
                     now(), vectors=vectors[start:start + step], worker="w") for start in range(0, len(vectors), step)],
        [])
    return job


# What a search may use: the HNSW index only (no sequential scan: a small table is cheaper to scan), no index
# (the exact answer), or whatever the planner picks.
PLANS = {"index": ["SET LOCAL enable_seqscan = off", "SET LOCAL enable_sort = off"],
         "exact": ["SET LOCAL enable_indexscan = off"], "planner": []}


def search(job: OpenJob, query_vector: np.ndarray, k: int, metric, plan: str, ef_search: int | None = None):
    with job.engine.connect() as conn:
        for setting in PLANS[plan]:
            conn.execute(sa.text(setting))
        return nearest(conn, job.target.vectors, "c1", "m", "r1", query_vector, k, metric, ef_search)


def uses_index(job: OpenJob, name: str, query_vector: np.ndarray, metric, vector_type: str, plan: str) -> bool:
    """Whether the plan of nearest()'s query, as `plan` allows, scans index `name`."""
    with job.engine.connect() as conn:
        for setting in PLANS[plan]:
            conn.execute(sa.text(setting))
        lines = conn.execute(sa.text(
            f"EXPLAIN SELECT record_id FROM {job.target.table} WHERE collection = 'c1' AND model = 'm'"
            " AND revision = 'r1'"
            f" ORDER BY embedding {metric.operator} CAST(:q AS {vector_type}) LIMIT 10"),
            {"q": vector_literal(query_vector)}).scalars().all()
    return any(f"Index Scan using {name}" in line for line in lines)


@pytest.mark.parametrize("vector_type", ["vector", "halfvec"])
@pytest.mark.parametrize("metric", [INNER_PRODUCT, COSINE], ids=["ip", "cosine"])
def test_search_through_the_index_equals_the_sequential_scan_on_a_small_set(database_url, vector_type, metric):
    vectors = unit_vectors(300, 32, seed=1)
    job = loaded_sink(database_url, vectors, vector_type)
    build = ensure_index(job.engine, job.target.vectors, vector_type, metric, HNSW)
    assert build.built and build.name == index_name("vectors", metric) and build.seconds > 0
    queries = unit_vectors(20, 32, seed=2)
    assert uses_index(job, build.name, queries[0], metric, vector_type, "index")
    assert not uses_index(job, build.name, queries[0], metric, vector_type, "exact")
    for q in queries:
        indexed = search(job, q, 10, metric, "index", ef_search=300)
        exact = search(job, q, 10, metric, "exact")
        assert [h.record_id for h in indexed] == [h.record_id for h in exact]
        assert np.allclose([h.distance for h in indexed], [h.distance for h in exact], atol=1e-6)
    # The distance shown is the cosine distance whichever operator ordered the rows.
    expected = 1 - vectors @ queries[0]
    assert np.allclose(sorted(expected)[:10], [h.distance for h in search(job, queries[0], 10, metric, "exact")],
                       atol=2e-3 if vector_type == "halfvec" else 1e-5)
    job.close()


def test_build_memory_is_the_builds_maintenance_work_mem_and_a_graph_that_outgrows_it_is_reported(database_url):
    vectors = unit_vectors(3000, 384, seed=8)  # about 5 MB of graph: more than 1Mi holds, far less than 64Mi
    small = loaded_sink(database_url, vectors, "vector", table="small_memory")
    cramped = ensure_index(small.engine, small.target.vectors, "vector", INNER_PRODUCT,
                           VectorIndex(type="hnsw", build_memory="1Mi"))
    assert cramped.built and cramped.note is not None
    assert "no longer fits into maintenance_work_mem" in cramped.note and "buildMemory 1Mi" in cramped.note
    roomy_sink = loaded_sink(database_url, vectors, "vector", table="roomy_memory")
    roomy = ensure_index(roomy_sink.engine, roomy_sink.target.vectors, "vector", INNER_PRODUCT,
                         VectorIndex(type="hnsw", build_memory="64Mi"))
    assert roomy.built and roomy.note is None
    # Both indexes answer alike; the setting lasted only for the build's transaction.
    for q in unit_vectors(5, 384, seed=9):
        assert [h.record_id for h in search(small, q, 10, INNER_PRODUCT, "index", ef_search=200)] == \
            [h.record_id for h in search(roomy_sink, q, 10, INNER_PRODUCT, "index", ef_search=200)]
    with small.engine.connect() as conn:
        server_default = conn.execute(sa.text("SELECT reset_val FROM pg_settings WHERE name = 'maintenance_work_mem'"))
        assert conn.execute(sa.text("SELECT setting FROM pg_settings WHERE name = 'maintenance_work_mem'")).scalar() \
            == server_default.scalar()
    small.close()
    roomy_sink.close()


@pytest.mark.parametrize("vector_type", ["vector", "halfvec"])
def test_recall_at_10_of_the_index_against_exact_float32_neighbours(database_url, vector_type):
    # Clustered like sentence embeddings (topics), not uniform noise, in the model's 384 dimensions.
    rng = np.random.default_rng(3)
    centres = unit_vectors(60, 384, seed=4)
    vectors = centres[rng.integers(0, 60, 4000)] + 0.6 * unit_vectors(4000, 384, seed=5)
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    job = loaded_sink(database_url, vectors, vector_type)
    build = ensure_index(job.engine, job.target.vectors, vector_type, INNER_PRODUCT, HNSW)
    queries = vectors[rng.choice(4000, 50, replace=False)] + 0.05 * unit_vectors(50, 384, seed=6)
    assert uses_index(job, build.name, queries[0], INNER_PRODUCT, vector_type, "planner")
    hits = 0
    for q in queries:
        truth = {f"r{i:05d}" for i in np.argsort(-(vectors @ q), kind="stable")[:10]}
        hits += len(truth & {h.record_id for h in search(job, q, 10, INNER_PRODUCT, "planner")})
    recall = hits / (10 * len(queries))
    print(f"recall@10 {vector_type} (ef_search 40): {recall:.3f}")
    assert recall >= 0.95
    job.close()


def test_halfvec_round_trip_is_float16(database_url):
    vectors = unit_vectors(50, 64, seed=7) * np.float32(3.0)
    job = loaded_sink(database_url, vectors, "halfvec")
    stored = query(database_url, "SELECT record_id, embedding::text AS e FROM vectors ORDER BY record_id")
    back = np.array([[float(x) for x in row.e.strip("[]").split(",")] for row in stored], dtype=np.float32)
    assert np.array_equal(back, vectors.astype(np.float16).astype(np.float32))  # IEEE half, round to nearest
    assert np.all(np.abs(back - vectors) <= np.abs(vectors) * 2.0 ** -11 + 2.0 ** -25)
    assert query(database_url, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                 " WHERE attrelid = 'vectors'::regclass AND attname = 'embedding'") == [("halfvec(64)",)]
    job.close()


def test_halfvec_refuses_a_component_beyond_its_range(database_url):
    job = loaded_sink(database_url, unit_vectors(2, 8, seed=8), "halfvec")
    run = job.runs.start(RUN, new_run=False).run
    huge = BatchOutcome("big", "succeeded", (Record(0, "big-one", "x"),), [AttemptRow(1, "w", "succeeded", None, now())],
                        now(), vectors=np.full((1, 8), 1e6, dtype=np.float32), worker="w")
    with pytest.raises(JobFailed, match=r"record 'big-one' \(batch big\).*halfvec's range"):
        job.sink.write(run, [huge], [])
    huge.records_new = 1  # copied straight into the vectors table: refused as well, nothing written
    with pytest.raises(JobFailed, match=r"record 'big-one' \(batch big\).*halfvec's range"):
        job.sink.write(run, [huge], [])
    # Through the writer thread, as the driver writes: the run fails with this reason, not InternalError.
    writer = SinkWriter(job.sink, run, RunTally())
    writer.put_outcome(huge)
    writer.close()
    assert writer.failure().reason == "VectorOutOfRange"
    assert query(database_url, "SELECT count(*) FROM vectors WHERE record_id = 'big-one'")[0][0] == 0
    job.close()


@pytest.mark.parametrize("existing, wanted", [("vector", "halfvec"), ("halfvec", "vector")])
def test_a_table_of_the_other_vector_type_is_refused_naming_both(database_url, existing, wanted):
    loaded_sink(database_url, unit_vectors(3, 8, seed=9), existing, table="shared").close()
    other = open_engine(database_url)  # another job's driver
    with pytest.raises(JobFailed, match=rf"table public.shared holds {existing}\(8\) vectors but spec.sink.vectorType is "
                                        rf"{wanted}") as refused:
        ensure_vectors_table(other, VectorsTable("public", "shared"), 8, wanted)
    assert refused.value.reason == "VectorTypeMismatch"
    assert query(database_url, "SELECT count(*) FROM shared") == [(3,)]
    other.dispose()


def test_an_existing_index_is_found_not_rebuilt_and_other_parameters_are_reported(database_url):
    job = loaded_sink(database_url, unit_vectors(100, 16, seed=10), "vector")
    first = ensure_index(job.engine, job.target.vectors, "vector", INNER_PRODUCT, VectorIndex(type="hnsw", m=8))
    oid = query(database_url, f"SELECT '{first.name}'::regclass::oid")
    again = ensure_index(job.engine, job.target.vectors, "vector", INNER_PRODUCT, VectorIndex(type="hnsw", m=8))
    assert (again.built, again.name, again.note) == (False, first.name, None)
    other = ensure_index(job.engine, job.target.vectors, "vector", INNER_PRODUCT, VectorIndex(type="hnsw", m=24))
    assert not other.built and "exists with m=8, ef_construction=64, not the spec's m=24" in other.note
    assert query(database_url, f"SELECT '{first.name}'::regclass::oid") == oid
    assert query(database_url, "SELECT count(*) FROM pg_indexes WHERE tablename = 'vectors' AND indexdef LIKE "
                 "'%hnsw%'") == [(1,)]
    job.close()


def test_embedjob_run_index_option_overrides_the_manifest_keeping_its_parameters():
    from embedjob_cli.main import _with_index  # imports Ray: not in the unit tier
    from embedjob_worker.core.config import JobConfig
    from support.cli import manifest
    from support.manifests import merged

    plain = JobConfig.from_manifest(manifest("in.jsonl"))
    tuned = JobConfig.from_manifest(merged(manifest("in.jsonl"), {"spec": {"sink": {"index": {"type": "hnsw", "m": 32}}}}))
    assert _with_index(plain, None).spec.sink.hnsw is None
    assert _with_index(plain, "hnsw").spec.sink.hnsw.hnsw_m == 16
    assert _with_index(tuned, "hnsw").spec.sink.hnsw.hnsw_m == 32
    assert _with_index(tuned, "none").spec.sink.hnsw is None
