"""The record model: a record as read (RawRecord), as checked (Record, its chunks' Spans), or rejected (BadRecord)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

# A JSONL line or CSV row longer than this is recorded as oversized and skipped without
# being held in memory; far above any text a model embeds whole (see spec.model.maxSeqLength).
MAX_RECORD_BYTES = 16 * 1024 * 1024
# Record ids are part of the vectors table's primary key: PostgreSQL's btree entries stop
# at about 2.7 kB, so longer ids could never be written.
MAX_ID_BYTES = 1024

class BadReason(str, Enum):
    missing_id = "missing_id"
    duplicate_id = "duplicate_id"
    null_text = "null_text"
    non_string_text = "non_string_text"
    empty_text = "empty_text"
    invalid_utf8 = "invalid_utf8"
    malformed_record = "malformed_record"  # a line/row that is not a record at all
    oversized_record = "oversized_record"  # a line/row over MAX_RECORD_BYTES, skipped unread
    contains_nul = "contains_nul"  # PostgreSQL text cannot store U+0000
    id_too_long = "id_too_long"  # over MAX_ID_BYTES: no index (vectors' primary key) can hold it
    template_field = "template_field"  # a field spec.source.textTemplate names is missing, null or not text
    metadata_field = "metadata_field"  # a value of spec.source.metadataFields that JSON (jsonb) cannot hold
    metadata_too_large = "metadata_too_large"  # a record's metadata over MAX_METADATA_BYTES
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
    metadata: str | None = None  # spec.source.metadataFields' values as one JSON object's text (record_metadata)


@dataclass(frozen=True, slots=True)
class Span:
    """One chunk of a record's text (spec.chunking): character offsets (str indices) and its tokens."""

    start: int
    end: int
    tokens: int  # what the model sees: the chunk's tokens with the special ones


@dataclass(frozen=True, slots=True)
class Record:
    position: int
    id: str
    text: str
    # The record's chunks (embedjob_worker.plan.chunking); empty without spec.chunking: one chunk, its whole text.
    spans: tuple[Span, ...] = ()
    metadata: str | None = None  # its metadata's JSON text (spec.source.metadataFields), kept on each of its chunks

    @property
    def chunks(self) -> tuple[Span, ...]:
        """Its chunks; without spec.chunking one, 0, over the whole text (its tokens not counted: 0)."""
        return self.spans or (Span(0, len(self.text), 0),)

    def chunk_bounds(self) -> list[tuple[int, int]]:
        """Each chunk's start and end offsets: `chunks` without building a Span for a record of one chunk."""
        return [(s.start, s.end) for s in self.spans] if self.spans else [(0, len(self.text))]

    def chunk_texts(self) -> list[str]:
        return [self.text[start:end] for start, end in self.chunk_bounds()]  # the whole text: itself, not a copy


def chunk_owners(records: Iterable[Record]) -> list[Record]:
    """The record of each chunk of `records`, in the order their chunks are embedded and written."""
    return [r for r in records for _ in r.chunks]


@dataclass(frozen=True, slots=True)
class BadRecord:
    position: int
    record_id: str | None
    reason: BadReason
    detail: str | None = None
    batch_id: str | None = None
