"""Streaming readers for the job's input: JSONL, CSV and Parquet, local or via fsspec.

Nothing here loads a whole file: JSONL and CSV are read line by line, Parquet batch by
batch (pyarrow `iter_batches`). Bytes that are not UTF-8 are kept (surrogateescape) so
that the record is still identified and rejected as `invalid_utf8`, not the whole file.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import fsspec

from .records import BadReason, RawRecord

_PARQUET_BATCH_ROWS = 4096
# fsspec `info` keys that change when an object's content does (local mtime, S3/GCS etag...).
_VERSION_KEYS = ("mtime", "LastModified", "last_modified", "ETag", "etag", "md5Hash", "generation", "updated")


def resolve_uri(uri: str, base_dir: Path | None) -> str:
    """A relative local path resolves against base_dir; URLs and absolute paths stay."""
    if "://" in uri or base_dir is None or Path(uri).is_absolute():
        return uri
    return str((base_dir / uri).resolve())


def input_fingerprint(uri: str) -> str:
    """Identifies the input snapshot: URI, size and the store's version stamp (mtime/etag)."""
    fs, path = fsspec.core.url_to_fs(uri)
    info = fs.info(path)
    stamp = {key: str(info[key]) for key in _VERSION_KEYS if info.get(key) is not None}
    identity = {"uri": uri, "size": info.get("size"), "version": stamp}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def read_records(uri: str, fmt: str, id_field: str, text_field: str) -> Iterator[RawRecord]:
    readers = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet}
    return readers[fmt](uri, id_field, text_field)


def count_records(uri: str, fmt: str) -> int | None:
    """A cheap record count for progress bars: Parquet metadata, or newlines of a local file."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        with fsspec.open(uri, "rb") as f:
            return pq.ParquetFile(f).metadata.num_rows
    if "://" in uri and not uri.startswith("file://"):
        return None
    with fsspec.open(uri, "rb", compression="infer") as f:
        lines = sum(1 for line in f if line.strip())
    # The CSV header is not a record; quoted multi-line CSV cells make this an estimate.
    return lines - 1 if fmt == "csv" else lines


def _read_jsonl(uri: str, id_field: str, text_field: str) -> Iterator[RawRecord]:
    with fsspec.open(uri, "rb", compression="infer") as f:
        position = 0
        for line in f:
            if not line.strip():
                continue
            try:
                obj = json.loads(line.decode("utf-8", errors="surrogateescape"))
            except ValueError as exc:
                yield RawRecord(position, None, None, BadReason.malformed_record, f"not JSON: {exc}"[:200])
            else:
                if isinstance(obj, dict):
                    yield RawRecord(position, obj.get(id_field), obj.get(text_field))
                else:
                    yield RawRecord(position, None, None, BadReason.malformed_record, "not a JSON object")
            position += 1


def _read_csv(uri: str, id_field: str, text_field: str) -> Iterator[RawRecord]:
    with fsspec.open(uri, "rb", compression="infer") as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape", newline="")
        for position, row in enumerate(csv.DictReader(text)):
            # DictReader gives None for cells missing from a short row: the CSV form of null.
            yield RawRecord(position, row.get(id_field), row.get(text_field))


def _read_parquet(uri: str, id_field: str, text_field: str) -> Iterator[RawRecord]:
    import pyarrow.parquet as pq

    with fsspec.open(uri, "rb") as f:
        parquet = pq.ParquetFile(f)
        position = 0
        for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=[id_field, text_field]):
            ids = batch.column(id_field).to_pylist()
            texts = batch.column(text_field).to_pylist()
            for record_id, text in zip(ids, texts):
                if isinstance(text, bytes):  # a binary column: decode like the text formats
                    text = text.decode("utf-8", errors="surrogateescape")
                yield RawRecord(position, record_id, text)
                position += 1
