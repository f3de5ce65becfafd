"""spec.sink.index and spec.sink.vectorType: hostile values refused naming the field, the index's name, operator
class and dimension limits, and halfvec's binary COPY format (no database)."""

import struct

import numpy as np
import pytest
import yaml

from embedjob import api, crd
from embedjob_worker.sink.copy_data import copy_payload
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.outcome import AttemptRow, BatchOutcome, now
from embedjob_worker.core.records import Record
from embedjob_worker.sink.vector_index import COSINE, INNER_PRODUCT, check_indexable, index_name, metric_for
from support.cli import EMBEDJOB, manifest, run
from support.manifests import MINIMAL_SPEC, merged


@pytest.mark.parametrize("sink, field, message", [
    ({"index": {"type": "hnsw", "m": 1}}, "spec.sink.index.m", "greater than or equal to 2"),
    ({"index": {"type": "hnsw", "m": 101}}, "spec.sink.index.m", "less than or equal to 100"),
    ({"index": {"type": "hnsw", "m": "16); DROP TABLE embeddings; --"}}, "spec.sink.index.m", "valid integer"),
    ({"index": {"type": "hnsw", "m": 16.5}}, "spec.sink.index.m", "valid integer"),
    ({"index": {"type": "hnsw", "efConstruction": 1001}}, "spec.sink.index.efConstruction", "less than or equal"),
    ({"index": {"type": "hnsw", "m": 40, "efConstruction": 64}}, "spec.sink.index",
     "efConstruction must be at least 2 * m (pgvector's rule): efConstruction 64 < 2 * m 40"),
    ({"index": {"type": "hnsw", "m": 16, "efConstruction": 31}}, "spec.sink.index", "efConstruction 31 < 2 * m 16"),
    ({"index": {"m": 16}}, "spec.sink.index", "m, efConstruction and buildMemory apply to type hnsw only"),
    ({"index": {"buildMemory": "1Gi"}}, "spec.sink.index", "apply to type hnsw only"),
    ({"index": {"type": "hnsw", "buildMemory": "1023Ki"}}, "spec.sink.index.buildMemory", "between 1Mi and 2047Gi"),
    ({"index": {"type": "hnsw", "buildMemory": "2Ti"}}, "spec.sink.index.buildMemory", "between 1Mi and 2047Gi"),
    ({"index": {"type": "hnsw", "buildMemory": "500m"}}, "spec.sink.index.buildMemory", "between 1Mi and 2047Gi"),
    ({"index": {"type": "hnsw", "buildMemory": "1GB"}}, "spec.sink.index.buildMemory", "should match pattern"),
    ({"index": {"type": "hnsw", "buildMemory": "-1Gi"}}, "spec.sink.index.buildMemory", "should match pattern"),
    ({"index": {"type": "hnsw", "buildMemory": "1Gi'; SET x = '1"}}, "spec.sink.index.buildMemory",
     "should match pattern"),
    ({"index": {"type": "hnsw", "buildMemory": 1073741824}}, "spec.sink.index.buildMemory", "valid string"),
    ({"index": {"type": "ivfflat"}}, "spec.sink.index.type", "'hnsw' or 'none'"),
    ({"index": {"type": "hnsw", "opclass": "vector_l2_ops"}}, "spec.sink.index.opclass", "Extra inputs"),
    ({"vectorType": "float8"}, "spec.sink.vectorType", "'vector' or 'halfvec'"),
    ({"vectorType": "halfvec(384)"}, "spec.sink.vectorType", "'vector' or 'halfvec'"),
])
def test_hostile_index_and_vector_type_values_are_refused_naming_the_field(sink, field, message):
    with pytest.raises(api.SpecError) as refused:
        api.parse_spec(merged(MINIMAL_SPEC, {"sink": sink}))
    assert f"{field}: " in str(refused.value) and message in str(refused.value)


def test_no_index_unless_asked_and_pgvectors_defaults_when_asked():
    spec = api.parse_spec(MINIMAL_SPEC)
    assert spec.sink.hnsw is None and spec.sink.vector_type == "vector"
    # An optional object gets no CRD default (embedjob.crd): the stored spec has no index, still none.
    stored = crd.spec_as_stored(MINIMAL_SPEC)
    assert "index" not in stored["sink"] and api.parse_spec(stored).sink.hnsw is None
    hnsw = api.parse_spec(merged(MINIMAL_SPEC, {"sink": {"index": {"type": "hnsw"}}})).sink.hnsw
    assert (hnsw.hnsw_m, hnsw.hnsw_ef_construction) == (16, 64)
    edge = api.parse_spec(merged(MINIMAL_SPEC, {"sink": {"index": {"type": "hnsw", "m": 100, "efConstruction": 200},
                                                         "vectorType": "halfvec"}})).sink
    assert (edge.hnsw.hnsw_m, edge.hnsw.hnsw_ef_construction, edge.vector_type) == (100, 200, "halfvec")


@pytest.mark.parametrize("build_memory, kb", [(None, None), ("1Mi", 1024), ("1Gi", 1024 ** 2), ("1G", 976563),
                                              ("1.5Mi", 1536), ("2047Gi", 2047 * 1024 ** 2), ("1048577", 1025)])
def test_build_memory_becomes_whole_kilobytes_rounded_up(build_memory, kb):
    index = api.parse_spec(merged(MINIMAL_SPEC, {"sink": {"index": {"type": "hnsw", "buildMemory": build_memory}}}))
    assert index.sink.hnsw.build_memory_kb == kb


def test_the_index_name_is_deterministic_and_fits_an_identifier():
    assert index_name("embeddings", INNER_PRODUCT) == "embeddings_hnsw_ip"
    assert index_name("embeddings", COSINE) == "embeddings_hnsw_cosine"
    long_a, long_b = "a" * 60 + "x", "a" * 60 + "y"
    names = {index_name(t, COSINE) for t in (long_a, long_b)}
    assert len(names) == 2 and all(len(n) <= 63 and n.endswith("_hnsw_cosine") for n in names)
    assert index_name(long_a, COSINE) == index_name(long_a, COSINE)


def test_normalised_vectors_use_inner_product_others_cosine():
    assert metric_for(True) is INNER_PRODUCT and INNER_PRODUCT.opclass("halfvec") == "halfvec_ip_ops"
    assert metric_for(False) is COSINE and COSINE.opclass("vector") == "vector_cosine_ops"


def test_an_index_pgvector_cannot_build_is_refused_before_embedding():
    hnsw = api.parse_spec(merged(MINIMAL_SPEC, {"sink": {"index": {"type": "hnsw"}}})).sink.hnsw
    check_indexable(hnsw, "vector", 2000)
    check_indexable(None, "vector", 3072)
    with pytest.raises(JobFailed, match="at most 2000 dimensions and the model gives 3072; set spec.sink.vectorType "
                                        "halfvec or set index type none") as refused:
        check_indexable(hnsw, "vector", 3072)
    assert refused.value.reason == "IndexUnsupported"
    with pytest.raises(JobFailed, match="halfvec of at most 4000 dimensions and the model gives 4096; set index"):
        check_indexable(hnsw, "halfvec", 4096)


def test_halfvec_copy_data_is_pgvectors_binary_halfvec():
    vectors = np.array([[0.5, -1.25, 3.0e-5]], dtype=np.float32)
    outcome = BatchOutcome("b", "succeeded", (Record(0, "r", "t"),), [AttemptRow(1, "w", "succeeded", None, now())],
                           now(), vectors=vectors)
    half, full = (b"".join(copy_payload([outcome], b"", vector_type)) for vector_type in ("halfvec", "vector"))
    expected = struct.pack(">ihh", 4 + 2 * 3, 3, 0) + vectors.astype(">f2").tobytes()
    assert expected in half and len(full) - len(half) == 2 * 3
    with pytest.raises(JobFailed, match=r"record 'r' \(batch b\): a component \(100000\) is beyond halfvec's range"):
        outcome.vectors = np.array([[1e5, 0, 0]], dtype=np.float32)
        b"".join(copy_payload([outcome], b"", "halfvec"))


def test_embedjob_run_and_search_refuse_bad_index_options(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest("in.jsonl")))
    index = run([*EMBEDJOB, "run", str(path), "--index", "ivfflat"])
    assert index.returncode == 2 and "--index: invalid choice: 'ivfflat'" in index.stderr
    for bad in ("0", "1001", "40; SET", "-1"):
        search = run([*EMBEDJOB, "search", str(path), "q", "--ef-search", bad])
        assert search.returncode == 2 and "--ef-search: must be a whole number from 1 to 1000" in search.stderr


def test_the_index_build_time_reaches_status_progress():
    from controller.run_reader import RunRow
    from controller.status import progress_of

    built = progress_of(RunRow(state="succeeded", batches_total=2, batches_succeeded=2, index_build_seconds=12.25))
    assert built["indexBuildSeconds"] == 12.25
    assert "indexBuildSeconds" not in progress_of(RunRow(state="succeeded", batches_total=2, batches_succeeded=2))
