"""Record checks: what the driver rejects (or truncates) before embedding, and which occurrence of an id wins."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
import unicodedata
from typing import Any, Protocol

from embedjob_worker.core.records import MAX_ID_BYTES, BadReason, BadRecord, RawRecord, Record

# Ids are checked for duplicates in chunks of this many records (or this much text) at a time.
CLAIM_CHUNK_RECORDS = 4096
CLAIM_CHUNK_BYTES = 16 * 1024 * 1024


def _record_id(value: Any) -> str | None:
    # bool is an int subclass but never a meaningful id.
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value
    return None


def _utf8_length(text: str) -> int | None:
    """The UTF-8 size of `text`; None when it has characters UTF-8 (and PostgreSQL) cannot encode.

    Readers decode with surrogateescape, so undecodable bytes (and lone surrogates from
    JSON escapes) show up here as unencodable characters.
    """
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _is_blank(text: str) -> bool:
    """Nothing a model could read: white space and invisible format characters (zero-width
    spaces and joiners, BOMs, soft hyphens) only. Stops at the first visible character."""
    return all(c.isspace() or unicodedata.category(c) == "Cf" for c in text)


def _text_problem(text: str) -> tuple[BadReason, str] | None:
    """Why PostgreSQL could not store this (non-empty) text, or None."""
    if _utf8_length(text) is None:
        return BadReason.invalid_utf8, "text is not valid UTF-8"
    nul = text.find("\x00")
    if nul >= 0:
        return BadReason.contains_nul, f"text has a NUL character at offset {nul}"
    return None


def _id_problem(record_id: str) -> tuple[BadReason, str] | None:
    size = _utf8_length(record_id)
    if size is None:
        return BadReason.invalid_utf8, "id is not valid UTF-8"
    if "\x00" in record_id:
        return BadReason.contains_nul, "id has a NUL character"
    if size > MAX_ID_BYTES:
        return BadReason.id_too_long, f"id is {size} bytes, more than {MAX_ID_BYTES}"
    return None


class IdRegistry(Protocol):
    """Decides which records are the first occurrence of their id, a chunk of claims at a time."""

    def first_occurrences(self, claims: list[tuple[str, int]]) -> set[int]:
        """The positions among `claims` (id, position; in input order) that hold their id's first occurrence."""


class FirstOccurrences:
    """An IdRegistry in memory, for inputs that fit (tests, tools); the driver keeps its ids in PostgreSQL."""

    def __init__(self) -> None:
        self._first: dict[str, int] = {}

    def first_occurrences(self, claims: list[tuple[str, int]]) -> set[int]:
        return {position for record_id, position in claims if self._first.setdefault(record_id, position) == position}


class SortedIds:
    """An IdRegistry for an input read in id order in which equal ids are always next to each other
    (table_source.equal_ids_adjacent): an id is a first occurrence unless it repeats the id just
    before it. Nothing is stored but that id."""

    def __init__(self) -> None:
        self._last: str | None = None

    def first_occurrences(self, claims: list[tuple[str, int]]) -> set[int]:
        firsts = set()
        for record_id, position in claims:
            if record_id != self._last:
                firsts.add(position)
            self._last = record_id
        return firsts


def _check(raw: RawRecord) -> tuple[Record | BadRecord, str | None]:
    """The record's outcome, duplicates aside, and the id it claims (None when it has no usable id)."""
    if raw.problem is not None:
        return BadRecord(raw.position, _record_id(raw.id), raw.problem, raw.detail), None
    record_id = _record_id(raw.id)
    if record_id is None:
        return BadRecord(raw.position, None, BadReason.missing_id, f"id is {raw.id!r}"[:200]), None
    if (id_problem := _id_problem(record_id)) is not None:
        # The id itself cannot be stored: the error row names the record by position only.
        return BadRecord(raw.position, None, *id_problem), None
    text = raw.text
    if text is None:
        return BadRecord(raw.position, record_id, BadReason.null_text), record_id
    if not isinstance(text, str):
        return BadRecord(raw.position, record_id, BadReason.non_string_text, f"text is a {type(text).__name__}"), \
            record_id
    if _is_blank(text):
        return BadRecord(raw.position, record_id, BadReason.empty_text, "only white space or invisible characters"), \
            record_id
    if (problem := _text_problem(text)) is not None:
        return BadRecord(raw.position, record_id, *problem), record_id
    return Record(raw.position, record_id, text, metadata=raw.metadata), record_id


def _chunks(checked: Iterable[tuple[Record | BadRecord, str | None]]) -> Iterator[list]:
    """Checked records in groups of at most CLAIM_CHUNK_RECORDS, or CLAIM_CHUNK_BYTES of text."""
    group, size = [], 0
    for item in checked:
        group.append(item)
        size += len(item[0].text) if isinstance(item[0], Record) else 0
        if len(group) >= CLAIM_CHUNK_RECORDS or size >= CLAIM_CHUNK_BYTES:
            yield group
            group, size = [], 0
    if group:
        yield group


def classify_records(raw_records: Iterable[RawRecord], ids: IdRegistry | None = None) -> Iterator[Record | BadRecord]:
    """Yield each record as a Record or a BadRecord; the first occurrence of an id wins.

    A record with a usable id claims it even when its text is bad. `ids` (default: in
    memory) decides which claims come first, a chunk at a time, in input order on one
    thread of its own: the next chunk's claim (a statement in PostgreSQL for the driver)
    runs while this chunk's records are used, so the driver does not wait for it. Deterministic
    for a given input, so a resumed run rejects the same records and forms the same batches.
    """
    ids = ids if ids is not None else FirstOccurrences()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="claim-ids") as claims:
        previous = None
        for group in _chunks(map(_check, raw_records)):
            claimed = claims.submit(ids.first_occurrences,
                                    [(record_id, item.position) for item, record_id in group if record_id])
            if previous is not None:
                yield from _decided(*previous)
            previous = group, claimed
        if previous is not None:
            yield from _decided(*previous)


def _decided(group: list[tuple[Record | BadRecord, str | None]],
             claimed: Future[set[int]]) -> Iterator[Record | BadRecord]:
    """A chunk's records once its claim is answered: a duplicate of an earlier id is a BadRecord."""
    firsts = claimed.result()
    for item, record_id in group:
        if record_id is None or item.position in firsts:
            yield item
        else:
            yield BadRecord(item.position, record_id, BadReason.duplicate_id, "id seen earlier in the input")
