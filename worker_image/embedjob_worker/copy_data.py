"""PostgreSQL binary COPY data for the staging table: one row per chunk (record id, chunk number and offsets,
content hash, pgvector vector, text)."""

from __future__ import annotations

import hashlib
import struct
from typing import TYPE_CHECKING

import numpy as np

from embedjob.api import Chunking

from .errors import JobFailed
from .records import chunk_owners

if TYPE_CHECKING:
    from .outcome import BatchOutcome

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
_HASH_FIELD = struct.pack(">i", 64)  # hex sha256
# pgvector's binary input of each type: int16 dimensions, int16 unused, then big-endian floats of this dtype.
_BINARY_DTYPES = {"vector": np.dtype(">f4"), "halfvec": np.dtype(">f2")}


def content_salt(normalize: bool, max_seq_length: int | None, chunking: Chunking | None = None) -> bytes:
    """Part of every content hash: settings that change a vector without changing its key (the chunking
    only when set, so the hashes of vectors written without it stay as they were)."""
    chunks = "" if chunking is None else f";chunking={chunking.max_tokens}/{chunking.overlap_tokens}"
    return f"normalize={normalize};max_seq_length={max_seq_length}{chunks}\x00".encode()


def content_hash(salt: bytes, text: bytes) -> str:
    """A vector row's content_hash: sha256 of the salt and the UTF-8 text, hex."""
    return hashlib.sha256(salt + text).hexdigest()


def copy_payload(outcomes: list[BatchOutcome], salt: bytes, vector_type: str = "vector") -> bytes:
    """PostgreSQL binary COPY data for the staging table (pgvector's binary `vector` or `halfvec` format)."""
    dtype = _BINARY_DTYPES[vector_type]
    parts = [_COPY_SIGNATURE]
    for outcome in outcomes:
        with np.errstate(over="ignore"):  # beyond float16's range: inf, refused below
            vectors = np.ascontiguousarray(outcome.vectors, dtype=dtype)
        if vector_type == "halfvec" and not np.isfinite(vectors).all():
            record = chunk_owners(outcome.records)[int(np.flatnonzero(~np.isfinite(vectors).all(axis=1))[0])]
            raise JobFailed("VectorOutOfRange", f"record {record.id!r} (batch {outcome.batch_id}): a component is "
                                                f"beyond halfvec's range (±65504); use vectorType vector")
        count, dim = vectors.shape
        vector_prefix = struct.pack(">ihh", 4 + dtype.itemsize * dim, dim, 0)
        batch_id = outcome.batch_id.encode()
        batch_field = struct.pack(">i", len(batch_id)) + batch_id
        rows = iter(vectors)
        for record in outcome.records:
            record_id = record.id.encode()
            id_field = struct.pack(">hi", 8, len(record_id)) + record_id
            hash_field = _HASH_FIELD + content_hash(salt, record.text.encode()).encode()  # the record's, on each chunk
            for number, (span, text) in enumerate(zip(record.chunks, record.chunk_texts())):
                text = text.encode()
                parts += (id_field, struct.pack(">iiiiii", 4, number, 4, span.start, 4, span.end), hash_field,
                          vector_prefix, next(rows).tobytes(), struct.pack(">i", len(text)), text, batch_field)
    parts.append(_COPY_TRAILER)
    return b"".join(parts)
