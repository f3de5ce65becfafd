"""Streaming readers and bad-record classification over real files (JSONL, CSV, Parquet)."""

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq

from embedjob_worker.records import BadReason, BadRecord, Record, classify_records
from embedjob_worker.source import count_records, read_records, resolve_uri

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
