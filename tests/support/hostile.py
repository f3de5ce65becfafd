"""The hostile JSONL catalogue: records each reader must either read or reject with a named reason.

Shared by the unit tier (readers and checks) and the integration tier (the driver end to end).
"""

import json

from embedjob_worker.core.records import MAX_ID_BYTES, MAX_RECORD_BYTES, BadReason

OK = "ok"  # read as a valid record
HUGE = MAX_RECORD_BYTES + 10
LONG_TEXT = " ".join(["embedding"] * 20_000)

# (name, JSONL line as bytes, expected outcome: OK, or the BadReason)
JSONL_CATALOGUE = [
    ("nul in text", b'{"id": "nul-text", "text": "a\\u0000b"}', BadReason.contains_nul),
    ("nul in id", b'{"id": "nul\\u0000id", "text": "fine"}', BadReason.contains_nul),
    ("lone surrogate in text", b'{"id": "sur-text", "text": "x \\ud800 y"}', BadReason.invalid_utf8),
    ("lone surrogate in id", b'{"id": "sur\\udfffid", "text": "fine"}', BadReason.invalid_utf8),
    ("invalid utf-8 in text", b'{"id": "bytes", "text": "caf\xe9 \xff"}', BadReason.invalid_utf8),
    ("invalid utf-8 in id", b'{"id": "\xc3\x28", "text": "fine"}', BadReason.invalid_utf8),
    ("deep nesting", b"[" * 100_000, BadReason.malformed_record),
    ("deep nesting in a value", b'{"id": "deep", "text": ' + b"[" * 100_000 + b"}", BadReason.malformed_record),
    ("huge line", b'{"id": "huge", "text": "' + b"y" * HUGE + b'"}', BadReason.oversized_record),
    ("array", b'["arr", "text"]', BadReason.malformed_record),
    ("string", b'"just a string"', BadReason.malformed_record),
    ("trailing garbage", b'{"id": "tg", "text": "t"} garbage', BadReason.malformed_record),
    ("number id", b'{"id": 42, "text": "the answer"}', OK),
    ("float id", b'{"id": 1.5, "text": "a float id"}', BadReason.missing_id),
    ("boolean id", b'{"id": true, "text": "a boolean id"}', BadReason.missing_id),
    ("object id", b'{"id": {"k": 1}, "text": "an object id"}', BadReason.missing_id),
    ("blank id", b'{"id": "   ", "text": "a blank id"}', BadReason.missing_id),
    ("id too long", json.dumps({"id": "i" * (MAX_ID_BYTES + 1), "text": "t"}).encode(), BadReason.id_too_long),
    ("id at the limit", json.dumps({"id": "j" * MAX_ID_BYTES, "text": "t"}).encode(), OK),
    ("null text", b'{"id": "null", "text": null}', BadReason.null_text),
    ("missing text", b'{"id": "notext"}', BadReason.null_text),
    ("object text", b'{"id": "objtext", "text": {"a": 1}}', BadReason.non_string_text),
    ("number text", b'{"id": "numtext", "text": 3.25}', BadReason.non_string_text),
    ("zero-width only", '{"id": "zw", "text": "\u200b\u200d\u2060\ufeff"}'.encode(), BadReason.empty_text),
    ("white space only", b'{"id": "ws", "text": " \\t\\n "}', BadReason.empty_text),
    ("right-to-left", '{"id": "rtl", "text": "مرحبا بالعالم שלום עולם"}'.encode(), OK),
    ("emoji", '{"id": "emoji", "text": "🚀 launch 👩‍🚀 zero-width joiner"}'.encode(), OK),
    ("control characters", b'{"id": "ctl", "text": "bell\\u0007 and escape\\u001b"}', OK),
    ("over-long text", json.dumps({"id": "long", "text": LONG_TEXT}).encode(), OK),
    ("first of an id", b'{"id": "dup", "text": "the first one wins"}', OK),
    ("crlf line", b'{"id": "crlf", "text": "windows line"}\r', OK),
]
FILLER = [json.dumps({"id": f"fill-{i}", "text": f"ordinary text {i}"}).encode() for i in range(50)]
DUPLICATE = ("duplicate far apart", b'{"id": "dup", "text": "a later copy"}', BadReason.duplicate_id)


def hostile_jsonl_entries() -> list[tuple[str, bytes, object]]:
    """The whole catalogue in file order: the hostile records, the filler, a late duplicate."""
    return [*JSONL_CATALOGUE, *[("filler", line, OK) for line in FILLER], DUPLICATE]


def hostile_jsonl_bytes(entries: list[tuple[str, bytes, object]]) -> bytes:
    """The file: a BOM at the start, a blank line after the tenth record, no newline at the end."""
    return (b"\xef\xbb\xbf" + b"\n".join(line for _, line, _ in entries[:10]) + b"\n\n  \n"
            + b"\n".join(line for _, line, _ in entries[10:]))
