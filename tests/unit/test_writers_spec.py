"""spec.sink.writers: hostile values refused naming the field (pydantic and the CRD alike), and the counts a
group adds to the run row whichever writer commits it (no database)."""

import pytest

from embedjob import api
from embedjob_worker.core.outcome import AttemptRow, BatchOutcome, group_counts, now
from embedjob_worker.core.records import Record, Span
from embedjob_worker.core.tally import RunTally
from support.crd_schema import fields, root_schema
from support.manifests import MINIMAL_SPEC, merged


@pytest.mark.parametrize("value, message", [
    (-1, "greater than or equal to 0"), (65, "less than or equal to 64"), (2**70, "less than or equal to 64"),
    (1.5, "valid integer"), ("2", "valid integer"), (True, "valid integer"), ("4; DROP TABLE embeddings", "integer"),
    ([2], "valid integer"), ({"count": 2}, "valid integer"),
])
def test_hostile_writer_counts_are_refused_naming_the_field(value, message):
    with pytest.raises(api.SpecError) as err:
        api.parse_spec(merged(MINIMAL_SPEC, {"sink": {"writers": value}}))
    assert "spec.sink.writers" in str(err.value) and message in str(err.value)


def test_writers_default_to_the_drivers_thread_and_the_crd_checks_the_same_bounds():
    assert api.parse_spec(MINIMAL_SPEC).sink.writers == 0
    assert api.parse_spec(merged(MINIMAL_SPEC, {"sink": {"writers": 64}})).sink.writers == 64
    schema = dict(fields(root_schema()))["embeddingjobs.spec.sink.writers"]
    assert (schema["type"], schema["minimum"], schema["maximum"], schema["default"]) == ("integer", 0, 64, 0)


def outcome(batch_id: str, state: str, records: int, new: int = 0, changed: int = 0, chunks: int = 0) -> BatchOutcome:
    """`chunks` > 0: each record is that many chunks (spec.chunking); 0: one chunk, its whole text."""
    spans = tuple(Span(i, i + 2, 3) for i in range(chunks))
    return BatchOutcome(batch_id, state, tuple(Record(i, f"{batch_id}-{i}", "text" * 4, spans) for i in range(records)),
                        [AttemptRow(1, "w", state, None, now())], now(), records_new=new, records_changed=changed)


def test_each_group_adds_its_own_counts_and_the_driver_adds_only_what_changed_since_its_last_write():
    groups = [[outcome("a", "succeeded", 3, new=2, changed=1, chunks=3)], [outcome("b", "failed", 2, chunks=2)],
              [outcome("c", "succeeded", 4, new=4), outcome("d", "succeeded", 1)]]
    assert group_counts(groups[0]) == {"batches_succeeded": 1, "batches_failed": 0, "records_embedded": 3,
                                       "records_failed": 0, "records_new": 2, "records_changed": 1,
                                       "chunks_embedded": 9}
    row = dict.fromkeys(group_counts([]), 0)
    tally = RunTally()
    tally.rejected(5)
    first = tally.driver_update()
    assert first.driver == {"batches_succeeded": 0, "records_embedded": 0, "records_failed": 5}
    # totals, not deltas: the row adds what they are beyond the ones it holds (runs.counter_values)
    assert tally.driver_update().driver == first.driver
    for name, count in first.driver.items():
        row[name] += count
    for group in reversed(groups):  # writers commit in any order: sums do not care
        for name, count in group_counts(group).items():
            row[name] += count
        tally.commit(group)
    counters = tally.counters()
    assert {name: getattr(counters, name) for name in row} == row == {
        "batches_succeeded": 3, "batches_failed": 1, "records_embedded": 8, "records_failed": 7, "records_new": 6,
        "records_changed": 1, "chunks_embedded": 9 + 4 + 1}


def test_a_resumed_run_keeps_its_earlier_sessions_new_changed_and_chunk_counts_and_adds_this_sessions():
    tally = RunTally()
    tally.resumed(new=5, changed=2, chunks=17)
    tally.commit([outcome("e", "succeeded", 2, new=1, chunks=4)])
    counters = tally.counters([outcome("f", "succeeded", 1, changed=1)])
    assert (counters.records_new, counters.records_changed, counters.chunks_embedded) == (6, 3, 17 + 8 + 1)
