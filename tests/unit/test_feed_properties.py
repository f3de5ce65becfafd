"""Property: whatever records a JSONL or CSV file holds, the feed (reader, checks, batcher)
puts each one in exactly one batch once or records it exactly once as bad with a reason,
and the first occurrence of an id wins (duplicates decided in memory, as the driver's
PostgreSQL registry decides them: tests/integration/test_sink_properties.py)."""

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.generated_records import INPUTS, check_outcome, csv_records, feed, write_csv, write_jsonl

BATCHING = dict(batch_size=st.integers(1, 5), sort_window=st.sampled_from([0, 1, 3, 16]))
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(items=INPUTS, **BATCHING)
def test_every_jsonl_record_is_batched_once_or_recorded_bad_once(items, batch_size, sort_window):
    with tempfile.TemporaryDirectory() as tmp:
        path = write_jsonl(Path(tmp) / "in.jsonl", items)
        check_outcome(items, feed(path, "jsonl", batch_size, sort_window), batch_size)


@SETTINGS
@given(items=INPUTS, **BATCHING)
def test_every_csv_record_is_batched_once_or_recorded_bad_once(items, batch_size, sort_window):
    with tempfile.TemporaryDirectory() as tmp:
        path = write_csv(Path(tmp) / "in.csv", items)
        check_outcome(csv_records(items), feed(path, "csv", batch_size, sort_window), batch_size)
