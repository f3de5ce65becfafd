"""Property through the real sink: generated hostile records, read and checked by the feed
with duplicates decided in PostgreSQL (SeenIds), written by PostgresSink: each valid record
is stored once with its text, each other one has exactly one error row with a reason, and
the first occurrence of an id wins. Vectors are made up (no model, no Ray)."""

import itertools
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedjob_worker.sink.copy_data import content_salt
from embedjob_worker.core.outcome import AttemptRow, BatchOutcome, now
from embedjob_worker.sink.seen_ids import SeenIds
from embedjob_worker.sink.runs import RunRequest
from embedjob_worker.sink.target import SinkTarget
from support.generated_records import INPUTS, check_outcome, csv_records, expected_embedded, feed, write_csv, \
    write_jsonl
from support.sink import open_job
from support.sql import query

DIM = 4
_examples = itertools.count()


def succeeded(batch, rng) -> BatchOutcome:
    return BatchOutcome(batch.batch_id, "succeeded", batch.records, [AttemptRow(1, "w", "succeeded", None, now())],
                        now(), vectors=rng.standard_normal((len(batch.records), DIM)).astype(np.float32), worker="w")


# One database for every example (function_scoped_fixture): each example is a job of its own in it.
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(items=INPUTS, fmt=st.sampled_from(["jsonl", "csv"]), batch_size=st.integers(1, 4),
       sort_window=st.sampled_from([0, 5]))
def test_every_record_is_stored_once_or_has_one_error_row(database_url, items, fmt, batch_size, sort_window):
    job = f"props-{next(_examples)}"
    opened = open_job(database_url, SinkTarget(f"local/tests/{job}", job, "vectors", content_salt(True, None)), job,
                      "tests", dim=DIM)
    try:
        run = opened.runs.start(RunRequest("m", "r1", "in", "cfg"), new_run=False).run
        with tempfile.TemporaryDirectory() as tmp:
            path = (write_jsonl if fmt == "jsonl" else write_csv)(Path(tmp) / f"in.{fmt}", items)
            outcome = feed(path, fmt, batch_size, sort_window, SeenIds(opened.engine, run))
        check_outcome(items if fmt == "jsonl" else csv_records(items), outcome, batch_size)
        rng = np.random.default_rng(0)
        opened.sink.write(run, [succeeded(batch, rng) for batch in outcome.batches], outcome.bad)
    finally:
        opened.close()

    expected = expected_embedded(items if fmt == "jsonl" else csv_records(items))
    stored = query(database_url, "SELECT record_id, text FROM vectors WHERE collection = :c", c=job)
    assert sorted((r.record_id, r.text) for r in stored) == sorted(expected.values())
    errors = query(database_url, "SELECT position, reason FROM embedjob_record_errors WHERE run_id = :r",
                   r=run.run_id)
    assert all(reason for _, reason in errors)
    assert sorted([p for p, _ in errors] + list(expected)) == list(range(len(items)))
