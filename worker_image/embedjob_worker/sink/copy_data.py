"""PostgreSQL binary COPY data of finished batches (one row per chunk: record id, chunk number and offsets,
content hash, pgvector vector, text, metadata), for the staging table or the vectors table; the hashes and salt."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from embedjob.api import Chunking

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.records import chunk_owners
from embedjob_worker.core.vector_range import largest_components, out_of_range, why_out_of_range

if TYPE_CHECKING:
    from embedjob_worker.core.outcome import BatchOutcome

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
_NULL = struct.pack(">i", -1)  # a binary COPY field's length for NULL
_HEX_SHA256 = 64
# pgvector's binary input of each type: int16 dimensions, int16 unused, then big-endian floats of this dtype.
_BINARY_DTYPES = {"vector": np.dtype(">f4"), "halfvec": np.dtype(">f2")}
# The vectors' columns in the order of the COPY data: the fixed-size fields first, so that numpy writes
# them for a whole batch (_fixed_fields), then the three of variable size.
COPY_COLUMNS = ("chunk", "char_start", "char_end", "content_hash", "embedding", "record_id", "text", "batch_id")
# After COPY_COLUMNS when the job keeps metadata (SinkTarget.metadata): jsonb (binary: version 1, then the text).
METADATA_COLUMNS = ("metadata", "metadata_hash")
_JSONB_VERSION = b"\x01"


@lru_cache(maxsize=8)
def _fixed_fields(component: np.dtype, dim: int) -> np.dtype:
    """A COPY row's start, as one packed record: its field count, then each fixed-size field's length and value."""
    return np.dtype([("fields", ">i2"), ("chunk_size", ">i4"), ("chunk", ">i4"), ("start_size", ">i4"),
                     ("start", ">i4"), ("end_size", ">i4"), ("end", ">i4"), ("hash_size", ">i4"),
                     ("hash", f"S{_HEX_SHA256}"), ("vector_size", ">i4"), ("dim", ">i2"), ("unused", ">i2"),
                     ("vector", component, (dim,))])


def content_salt(normalize: bool, max_seq_length: int | None, chunking: Chunking | None = None) -> bytes:
    """Part of every content hash: settings that change a vector without changing its key (the chunking
    only when set, so the hashes of vectors written without it stay as they were)."""
    chunks = "" if chunking is None else f";chunking={chunking.max_tokens}/{chunking.overlap_tokens}"
    return f"normalize={normalize};max_seq_length={max_seq_length}{chunks}\x00".encode()


def content_hash(salt: bytes, text: bytes) -> str:
    """A vector row's content_hash: sha256 of the salt and the UTF-8 text, hex."""
    return hashlib.sha256(salt + text).hexdigest()


def metadata_hash(metadata: str) -> str:
    """A vector row's metadata_hash: sha256 of its metadata's JSON text (record_metadata's, canonical), hex."""
    return hashlib.sha256(metadata.encode()).hexdigest()


def copy_columns(metadata: bool) -> tuple[str, ...]:
    """The columns of copy_payload's rows before the constant ones: COPY_COLUMNS, then METADATA_COLUMNS if kept."""
    return COPY_COLUMNS + (METADATA_COLUMNS if metadata else ())


def copy_payload(outcomes: list[BatchOutcome], salt: bytes, vector_type: str = "vector",
                 same_on_every_row: tuple[str, ...] = (), metadata: bool = False) -> Iterator[bytes]:
    """PostgreSQL binary COPY data for copy_columns(metadata) (pgvector's binary `vector` or `halfvec`), then text
    columns whose values are `same_on_every_row`; a piece per outcome: PostgreSQL reads one while the next is built."""
    component = _BINARY_DTYPES[vector_type]
    constant_fields = b"".join(_sized(value.encode()) for value in same_on_every_row)
    yield _COPY_SIGNATURE
    for outcome in outcomes:
        # The driver failed the batches of such vectors already (dispatch); this guards every other way in.
        largest = largest_components(outcome.vectors)
        unstorable = out_of_range(largest, vector_type)
        if unstorable:
            record = chunk_owners(outcome.records)[unstorable[0]]
            raise JobFailed("VectorOutOfRange", f"record {record.id!r} (batch {outcome.batch_id}): "
                                                f"{why_out_of_range(largest[unstorable[0]], vector_type)}")
        vectors = np.asarray(outcome.vectors, dtype=component)
        batch_id = outcome.batch_id.encode()
        numbers, starts, ends, hashes, variable = [], [], [], [], []
        for record in outcome.records:
            id_field = _sized(record.id.encode())
            text = record.text
            digest = content_hash(salt, text.encode())  # the record's, on each of its chunks
            # the batch id, the record's metadata and its hash, and the constant columns
            row_end = _sized(batch_id) + (_metadata_fields(record.metadata) if metadata else b"") + constant_fields
            for number, (start, end) in enumerate(record.chunk_bounds()):
                numbers.append(number)
                starts.append(start)
                ends.append(end)
                hashes.append(digest)
                variable.append(id_field + _sized(text[start:end].encode()) + row_end)
        count, dim = vectors.shape
        fixed = np.empty(count, _fixed_fields(component, dim))
        fixed["fields"] = len(copy_columns(metadata)) + len(same_on_every_row)
        fixed["chunk_size"] = fixed["start_size"] = fixed["end_size"] = 4
        fixed["chunk"], fixed["start"], fixed["end"], fixed["hash"] = numbers, starts, ends, hashes
        fixed["hash_size"] = _HEX_SHA256
        fixed["vector_size"], fixed["dim"], fixed["unused"] = 4 + component.itemsize * dim, dim, 0
        fixed["vector"] = vectors
        rows, width = memoryview(fixed.tobytes()), fixed.itemsize
        yield b"".join(piece for row, fields in enumerate(variable)
                       for piece in (rows[row * width:(row + 1) * width], fields))
    yield _COPY_TRAILER


def _metadata_fields(metadata: str | None) -> bytes:
    """A record's metadata (jsonb) and metadata_hash as binary COPY fields; NULL and NULL without metadata."""
    if metadata is None:
        return _NULL * 2
    return _sized(_JSONB_VERSION + metadata.encode()) + _sized(metadata_hash(metadata).encode())


def _sized(value: bytes) -> bytes:
    """A binary COPY field: its length, then its bytes."""
    return len(value).to_bytes(4, "big") + value
