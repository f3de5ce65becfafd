"""Bad-record classification: what the driver rejects (or truncates) before embedding."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any


class BadReason(str, Enum):
    missing_id = "missing_id"
    duplicate_id = "duplicate_id"
    null_text = "null_text"
    non_string_text = "non_string_text"
    empty_text = "empty_text"
    invalid_utf8 = "invalid_utf8"
    malformed_record = "malformed_record"  # a line/row that is not a record at all
    # Not a rejection: the text was cut to the model's token limit, embedded and counted.
    truncated = "truncated"


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record as read from the source, before any checks."""

    position: int  # 0-based record number in the input
    id: Any
    text: Any
    problem: BadReason | None = None  # set by the reader when it could not even parse the record
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Record:
    position: int
    id: str
    text: str


@dataclass(frozen=True, slots=True)
class BadRecord:
    position: int
    record_id: str | None
    reason: BadReason
    detail: str | None = None
    batch_id: str | None = None


def _record_id(value: Any) -> str | None:
    # bool is an int subclass but never a meaningful id.
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value
    return None


def _is_valid_utf8(text: str) -> bool:
    # Readers decode with surrogateescape, so undecodable bytes (and lone surrogates from
    # JSON escapes, which PostgreSQL rejects too) show up here as unencodable characters.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def classify_records(raw_records: Iterable[RawRecord]) -> Iterator[Record | BadRecord]:
    """Yield each record as a Record or a BadRecord; the first occurrence of an id wins.

    Deterministic for a given input, so a resumed run rejects the same records and forms
    the same batches.
    """
    seen_ids: set[str] = set()
    for raw in raw_records:
        if raw.problem is not None:
            yield BadRecord(raw.position, _record_id(raw.id), raw.problem, raw.detail)
            continue
        record_id = _record_id(raw.id)
        if record_id is None:
            yield BadRecord(raw.position, None, BadReason.missing_id, f"id is {raw.id!r}"[:200])
        elif not _is_valid_utf8(record_id):
            yield BadRecord(raw.position, None, BadReason.invalid_utf8, "id is not valid UTF-8")
        elif record_id in seen_ids:
            yield BadRecord(raw.position, record_id, BadReason.duplicate_id, "id seen earlier in the input")
        else:
            seen_ids.add(record_id)
            text = raw.text
            if text is None:
                yield BadRecord(raw.position, record_id, BadReason.null_text)
            elif not isinstance(text, str):
                yield BadRecord(raw.position, record_id, BadReason.non_string_text, f"text is a {type(text).__name__}")
            elif not _is_valid_utf8(text):
                yield BadRecord(raw.position, record_id, BadReason.invalid_utf8, "text is not valid UTF-8")
            elif not text.strip():
                yield BadRecord(raw.position, record_id, BadReason.empty_text)
            else:
                yield Record(raw.position, record_id, text)
