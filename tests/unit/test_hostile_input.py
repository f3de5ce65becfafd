"""A catalogue of hostile records through the real readers and checks (JSONL, CSV, Parquet).

Each record is either read as a valid record (and later embedded) or rejected with a
named reason; the records around it are read exactly; nothing raises. The same catalogue
runs end to end through the driver in the integration tier.
"""

from __future__ import annotations

import gzip
import json
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedjob_worker.core.records import BadReason, BadRecord, MAX_RECORD_BYTES, Record
from embedjob_worker.plan.checks import classify_records
from embedjob_worker.source.files import OversizedLine, bounded_lines, count_records, read_records
from support.hostile import HUGE, LONG_TEXT, OK, hostile_jsonl_bytes, hostile_jsonl_entries

def outcomes(uri: str, fmt: str) -> list[Record | BadRecord]:
    return list(classify_records(read_records(uri, fmt, "id", "text")))


def outcome_of(item: Record | BadRecord):
    return OK if isinstance(item, Record) else item.reason


def test_jsonl_catalogue_each_record_read_or_rejected_with_its_reason(tmp_path):
    entries = hostile_jsonl_entries()
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(hostile_jsonl_bytes(entries))
    got = outcomes(str(path), "jsonl")
    assert [outcome_of(item) for item in got] == [expected for _, _, expected in entries], \
        [(name, outcome_of(item)) for (name, _, _), item in zip(entries, got)]
    assert [item.position for item in got] == list(range(len(entries)))
    valid = {item.id: item.text for item in got if isinstance(item, Record)}
    assert valid["42"] == "the answer" and valid["dup"] == "the first one wins"
    assert valid["long"] == LONG_TEXT and all(valid[f"fill-{i}"] == f"ordinary text {i}" for i in range(50))
    rejected = {item.position: item for item in got if isinstance(item, BadRecord)}
    nul_id = rejected[1]
    assert nul_id.record_id is None and "NUL" in nul_id.detail  # the id itself cannot be stored
    assert all(item.detail is None or len(item.detail) <= 200 for item in rejected.values())
    assert count_records(str(path), "jsonl") == len(entries)


def test_a_jsonl_file_without_newlines_is_read_in_bounded_pieces(tmp_path):
    path = tmp_path / "one-line.jsonl"
    path.write_bytes(b'{"id": "a", "text": "' + b"z" * (2 * MAX_RECORD_BYTES) + b'"}\n{"id": "b", "text": "b"}')
    assert [outcome_of(item) for item in outcomes(str(path), "jsonl")] == [BadReason.oversized_record, OK]


def test_memory_for_an_oversized_line_stays_within_the_limit(tmp_path):
    limit = 1024 * 1024
    path = tmp_path / "long.txt"
    path.write_bytes(b"q" * (20 * limit) + b"\nshort\n")
    tracemalloc.start()
    try:
        with open(path, "rb") as f:
            lines = list(bounded_lines(f, limit))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(lines[0], OversizedLine) and lines[0].size == 20 * limit + 1 and lines[1] == b"short\n"
    assert peak < 4 * limit  # a few pieces of `limit`, never the 20 of the whole line


def test_empty_inputs_have_no_records(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "blank.jsonl").write_bytes(b"\n \n\r\n")
    (tmp_path / "empty.csv").write_bytes(b"")
    (tmp_path / "header.csv").write_bytes(b"id,text\r\n")
    for name in ("empty.jsonl", "blank.jsonl", "empty.csv", "header.csv"):
        assert outcomes(str(tmp_path / name), name.rsplit(".", 1)[1]) == [], name


def test_a_truncated_gzip_keeps_what_came_before_and_records_the_cut(tmp_path):
    lines = b"".join(json.dumps({"id": f"g{i}", "text": f"gzip text number {i} " * 20}).encode() + b"\n"
                     for i in range(2000))
    whole = gzip.compress(lines)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    got = outcomes(str(path), "jsonl")
    assert got[-1].reason is BadReason.malformed_record and "compressed stream" in got[-1].detail
    assert 0 < len(got) - 1 < 2000
    assert all(isinstance(item, Record) and item.id == f"g{i}" for i, item in enumerate(got[:-2]))


def test_csv_catalogue(tmp_path):
    big_cell = "c" * (200 * 1024)  # over the csv module's default field limit of 128 KiB
    rows = [
        b"ok-1,plain text",
        b'"quoted,comma","a cell with, a comma"',
        b'multi,"a cell over\r\ntwo lines"',
        b"short-row",
        b"nul,a\x00b",
        b"bad-utf8,caf\xe9",
        b"big," + big_cell.encode(),
        b"huge," + b"h" * HUGE,
        b"",
        b"after-huge,still read",
        b"ok-1,a duplicate id",
        "rtl,שלום".encode(),
    ]
    path = tmp_path / "hostile.csv"
    path.write_bytes(b"\xef\xbb\xbfid,text\r\n" + b"\r\n".join(rows))  # BOM, CRLF, no final newline
    got = outcomes(str(path), "csv")
    assert [outcome_of(item) for item in got] == [
        OK, OK, OK, BadReason.null_text, BadReason.contains_nul, BadReason.invalid_utf8, OK,
        BadReason.oversized_record, OK, BadReason.duplicate_id, OK,
    ]
    valid = {item.id: item.text for item in got if isinstance(item, Record)}
    assert valid["quoted,comma"] == "a cell with, a comma"
    assert valid["multi"] == "a cell over\r\ntwo lines"
    assert valid["big"] == big_cell and valid["after-huge"] == "still read" and valid["rtl"] == "שלום"


def test_parquet_catalogue(tmp_path):
    table = pa.table({
        "id": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
        "text": pa.array([b"fine", None, b"caf\xe9", b"a\x00b", b"", "🚀 emoji".encode()], pa.binary()),
    })
    path = tmp_path / "hostile.parquet"
    pq.write_table(table, path)
    assert [outcome_of(item) for item in outcomes(str(path), "parquet")] == [
        OK, BadReason.null_text, BadReason.invalid_utf8, BadReason.contains_nul, BadReason.empty_text, OK,
    ]


def test_a_truncated_parquet_file_is_unreadable_as_a_whole(tmp_path):
    path = tmp_path / "cut.parquet"
    pq.write_table(pa.table({"id": ["a"] * 1000, "text": ["t"] * 1000}), path)
    path.write_bytes(path.read_bytes()[:-100])
    # The driver turns ValueError/OSError from the reader into SourceUnreadable.
    with pytest.raises((ValueError, OSError)):
        outcomes(str(path), "parquet")


def csv_cell(text: str) -> str:
    """`text` as one quoted CSV cell, as a CSV writer quotes it."""
    return '"' + text.replace('"', '""') + '"'


def test_an_oversized_csv_cell_over_many_lines_is_skipped_to_its_real_end(tmp_path):
    # A quoted cell of 17 lines of 1 MiB (over the 16 MiB limit), with lines in it that look
    # like records: one repeats the id of a later real row, one is a quoted row, one ends in
    # a quote followed by a comma and a line break as a closing quote would.
    filler = "f" * (1024 * 1024)
    planted = ["real-3,planted text that repeats a later id", '"planted-quoted","looks like a row"',
               'planted-4,"opens a cell', 'planted-5",closes it,']
    cell_lines = [planted[i % len(planted)] + filler for i in range(17)] + planted
    rows = ["id,text", "real-1,before the cell", "big," + csv_cell("\n".join(cell_lines)),
            "real-2,after the cell", 'real-3,"the real third, over\ntwo lines"', "real-4,the last row"]
    path = tmp_path / "spanning.csv"
    path.write_text("\r\n".join(rows) + "\r\n", encoding="utf-8")
    got = outcomes(str(path), "csv")
    assert [outcome_of(item) for item in got] == [OK, BadReason.oversized_record, OK, OK, OK], \
        [(item.position, outcome_of(item), getattr(item, "detail", None)) for item in got]
    assert [item.position for item in got] == [0, 1, 2, 3, 4]
    oversized = got[1]
    assert "record from line 3 to 23" in oversized.detail and "over the limit" in oversized.detail
    assert {item.id: item.text for item in got if isinstance(item, Record)} == {
        "real-1": "before the cell", "real-2": "after the cell",
        "real-3": "the real third, over\ntwo lines", "real-4": "the last row"}


def test_a_csv_cell_that_never_closes_refuses_the_rest_of_the_file_naming_its_line(tmp_path):
    path = tmp_path / "open.csv"
    path.write_text('id,text\nok-1,first\nopen,"a cell left open\nok-2,looks like a row\nok-3,and another\n')
    got = outcomes(str(path), "csv")
    assert [outcome_of(item) for item in got] == [OK, BadReason.malformed_record]
    assert got[0].id == "ok-1" and got[1].position == 1
    assert "record from line 3" in got[1].detail and "never closes" in got[1].detail


def test_a_record_is_scanned_alike_whatever_piece_boundaries_cut_it():
    """A long line is read in pieces: a `""` or a closing quote cut between two pieces reads the same."""
    from embedjob_worker.source.csv_records import _State, scan_piece

    for record in ('id,"a ""quoted"", cell",after"quote,"x"y\n', '"open ""cell"" across\n', '"",""""\r\n'):
        whole = scan_piece(record, _State.CELL_START)
        for cut in range(1, len(record.rstrip("\r\n")) + 1):  # a cut inside the line break ends the record
            state, ended = scan_piece(record[:cut], _State.CELL_START)
            assert not ended and scan_piece(record[cut:], state) == whole, (record, cut)
