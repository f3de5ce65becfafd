"""Streaming readers and bad-record classification over real files (JSONL, CSV, Parquet)."""

import csv
import json
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedjob_worker.plan.checks import CLAIM_CHUNK_RECORDS, FirstOccurrences, SortedIds, classify_records
from embedjob_worker.core.records import BadReason, BadRecord, RawRecord, Record
from embedjob_worker.source.files import count_records, read_records, resolve_uri

ROWS = [{"id": "a", "text": "alpha"}, {"id": "b", "text": "beta"}, {"id": 3, "text": "gamma"}]


def test_jsonl_csv_and_parquet_read_the_same_records(tmp_path):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "\n")
    with open(tmp_path / "in.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["id", "text"])
        writer.writeheader()
        writer.writerows(ROWS)
    pq.write_table(pa.table({"id": ["a", "b", "3"], "text": ["alpha", "beta", "gamma"]}), tmp_path / "in.parquet")
    expected = [Record(0, "a", "alpha"), Record(1, "b", "beta"), Record(2, "3", "gamma")]
    for fmt in ("jsonl", "csv", "parquet"):
        uri = str(tmp_path / f"in.{fmt}")
        assert list(classify_records(read_records(uri, fmt, "id", "text"))) == expected, fmt
        assert count_records(uri, fmt) == 3, fmt


def test_each_bad_record_kind_is_classified(tmp_path):
    lines = [
        b'{"id": "ok", "text": "fine"}',
        b'{"text": "no id"}',
        b'{"id": "ok", "text": "same id again"}',
        b'{"id": "n", "text": null}',
        b'{"id": "i", "text": 42}',
        b'{"id": "e", "text": "  \\n "}',
        b'{"id": "u", "text": "caf\xe9"}',
        b"this is not json",
        b'{"id": "s", "text": "lone \\ud800 surrogate"}',
    ]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    classified = list(classify_records(read_records(str(path), "jsonl", "id", "text")))
    assert classified[0] == Record(0, "ok", "fine")
    reasons = [(c.position, c.record_id, c.reason) for c in classified[1:] if isinstance(c, BadRecord)]
    assert reasons == [
        (1, None, BadReason.missing_id), (2, "ok", BadReason.duplicate_id), (3, "n", BadReason.null_text),
        (4, "i", BadReason.non_string_text), (5, "e", BadReason.empty_text), (6, "u", BadReason.invalid_utf8),
        (7, None, BadReason.malformed_record), (8, "s", BadReason.invalid_utf8),
    ]


def test_relative_paths_resolve_against_the_manifest_dir_and_urls_stay(tmp_path):
    assert resolve_uri("data/in.jsonl", tmp_path) == str(tmp_path / "data" / "in.jsonl")
    assert resolve_uri("s3://bucket/in.jsonl", tmp_path) == "s3://bucket/in.jsonl"
    assert resolve_uri("/abs/in.jsonl", tmp_path) == "/abs/in.jsonl"


class RecordingRegistry(FirstOccurrences):
    """The in-memory registry, noting on which thread each chunk of claims came and how the caller had got on."""

    def __init__(self, fail_at_chunk: int | None = None):
        super().__init__()
        self.threads, self.first_positions, self.fail_at_chunk = [], [], fail_at_chunk

    def first_occurrences(self, claims):
        if len(self.threads) == self.fail_at_chunk:
            raise ConnectionError("lost the database")
        self.threads.append(threading.get_ident())
        self.first_positions.append(claims[0][1])
        return super().first_occurrences(claims)


def test_claims_run_in_input_order_on_a_thread_of_their_own_and_decide_as_in_memory():
    # Ids repeat across claim chunks, so a claim answered out of order would change which record wins.
    raw = [RawRecord(i, f"id{i % (CLAIM_CHUNK_RECORDS + 7)}", f"text {i}") for i in range(3 * CLAIM_CHUNK_RECORDS)]
    registry = RecordingRegistry()
    classified = list(classify_records(raw, registry))
    assert registry.first_positions == [0, CLAIM_CHUNK_RECORDS, 2 * CLAIM_CHUNK_RECORDS]
    assert threading.get_ident() not in registry.threads and len(set(registry.threads)) == 1
    assert [c.position for c in classified] == list(range(len(raw)))
    duplicates = [c.position for c in classified if isinstance(c, BadRecord)]
    assert duplicates == list(range(CLAIM_CHUNK_RECORDS + 7, len(raw)))


def test_a_failed_claim_reaches_the_reader():
    raw = [RawRecord(i, f"id{i}", "text") for i in range(3 * CLAIM_CHUNK_RECORDS)]
    read = []
    with pytest.raises(ConnectionError, match="lost the database"):
        for record in classify_records(raw, RecordingRegistry(fail_at_chunk=1)):
            read.append(record)
    assert len(read) == CLAIM_CHUNK_RECORDS  # the first chunk, whose claim was answered, and nothing after it


def test_sorted_ids_find_a_repeat_next_to_its_first_occurrence_across_chunks():
    ids = ["1", "2", "2", "2", "3", "10", "10"]  # as a table reads them in id order
    raw = [RawRecord(i, record_id, "text") for i, record_id in enumerate(ids)]
    raw.insert(3, RawRecord(99, None, "no id"))  # records without an id claim nothing and break no run
    registry = SortedIds()
    in_memory = list(classify_records(raw, FirstOccurrences()))
    assert list(classify_records(raw, registry)) == in_memory
    assert [(b.position, b.record_id) for b in in_memory if isinstance(b, BadRecord)
            and b.reason is BadReason.duplicate_id] == [(2, "2"), (3, "2"), (6, "10")]
    # The last id is remembered between chunks of claims.
    assert registry.first_occurrences([("10", 7), ("11", 8)]) == {8}
