"""A vector the sink's type cannot store (issue 27 item 7): its batch fails naming the record, the run goes on.

Real Ray, the real model and real PostgreSQL; the non-finite component comes from the actor's fault hook
(`component_when`), as a model in half precision or int8 may give one.
"""

import json

import pytest

from embedjob_worker.core.config import JobConfig
from embedjob_worker.core.records import Record
from embedjob_worker.plan.checks import classify_records
from embedjob_worker.run.job import DriverOptions, run_job
from embedjob_worker.source.files import read_records
from support.corpus import corpus_lines
from support.driver_jobs import manifest, write_input
from support.sql import query

pytestmark = pytest.mark.slow
MARKER = "[poisoned by the test]"


@pytest.mark.parametrize(("vector_type", "component", "said"), [
    ("vector", "nan", "a component is NaN"),
    ("vector", "-inf", "a component is infinite"),
    ("halfvec", "1e6", "a component (1e+06) is beyond halfvec's range (±65504); use vectorType vector"),
])
def test_an_unstorable_vector_fails_its_batch_naming_the_record_and_the_rest_is_written(
        ray_address, database_url, tmp_path, vector_type, component, said):
    rows = [json.loads(line) for line in corpus_lines(0, 40)]
    poisoned = rows[7]["id"]
    rows[7]["text"] += " " + MARKER
    source = write_input(tmp_path / "in.jsonl", [json.dumps(row).encode() for row in rows])
    spec = manifest(source, f"range-{vector_type}", batch_size=8, failedBatchesTolerated=1)
    spec["spec"]["sink"]["vectorType"] = vector_type
    options = DriverOptions(fault_injection={"component_when": {MARKER: component}})

    summary = run_job(JobConfig.from_manifest(spec), database_url, options)

    assert summary.state == "succeeded", summary.error
    assert summary.counters.batches_failed == 1
    failed = query(database_url, "SELECT batch_id, records, error FROM embedjob_batches WHERE state = 'failed'")
    assert len(failed) == 1
    assert failed[0].error == f"VectorOutOfRange: record {poisoned!r} (chunk 0): {said}"
    # Not retried: the model gives the same vector again.
    assert query(database_url, "SELECT outcome FROM embedjob_batch_attempts WHERE batch_id = :b",
                 b=failed[0].batch_id) == [("failed",)]
    valid = {r.id for r in classify_records(read_records(str(source), "jsonl", "id", "text")) if isinstance(r, Record)}
    stored = {r.record_id for r in query(database_url, "SELECT record_id FROM embeddings")}
    assert poisoned not in stored and stored < valid
    assert len(stored) == len(valid) - failed[0].records == summary.counters.records_embedded
    assert query(database_url, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                 " WHERE attrelid = 'embeddings'::regclass AND attname = 'embedding'") == [(f"{vector_type}(384)",)]
