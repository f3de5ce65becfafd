"""Streaming readers for the job's input: JSONL, CSV and Parquet, local or via fsspec (a table: table_source).

Nothing here loads a whole file: JSONL is read line by line, CSV record by record (split
quote-aware by csv_records), Parquet batch by batch (pyarrow `iter_batches`), and a line or
CSV record over MAX_RECORD_BYTES is skipped in bounded pieces and recorded as oversized.
Bytes that are not UTF-8 are kept (surrogateescape) so that the record is still identified and rejected as `invalid_utf8`, not the whole file.
A record the reader cannot parse (deep nesting, a cut-off compressed stream) is a bad
record with a reason; the records around it are read as usual.
"""

from __future__ import annotations

import csv
import io
import json
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import IO

import fsspec
from fsspec.compression import compr
from fsspec.spec import AbstractBufferedFile
from fsspec.utils import infer_compression

from embedjob.api import Source

from embedjob_worker.core.change_window import ChangeWindow
from embedjob_worker.core.records import MAX_RECORD_BYTES, BadReason, RawRecord
from embedjob_worker.source.csv_records import SkippedCsvRecord, csv_records
from embedjob_worker.source.record_fields import RecordFields, TextOf, columns_for
from embedjob_worker.source.record_metadata import MetadataFields
from embedjob_worker.source.dataset import is_dataset
from embedjob_worker.source.dataset_listing import dataset_files
from embedjob_worker.source.unavailable import in_a_store

_PARQUET_BATCH_ROWS = 4096
# What io.BufferedReader reads of an object-store file at a time (its default, 8 KiB, costs a call into the
# filesystem's cache per 8 KiB).
_READ_BUFFER = 1 << 20
_BOM = "\ufeff"
# What a compressed input that ends early raises (gzip/bz2/lzma through fsspec).
_CUT_OFF_STREAM = (EOFError, zlib.error)
_CUT_OFF_DETAIL = "the input ends in the middle of a compressed stream (a truncated file?)"


class OversizedLine:
    """Stands for a line over MAX_RECORD_BYTES that was skipped without being kept."""

    def __init__(self, size: int):
        self.size = size

    @property
    def detail(self) -> str:
        return f"line of {self.size} bytes or more, over the limit of {MAX_RECORD_BYTES}"


def bounded_lines(f: IO, limit: int = MAX_RECORD_BYTES) -> Iterator:
    """The lines of a file object (bytes or str), an OversizedLine for each one over `limit`.

    A file without newlines is read in pieces of `limit`, so memory stays bounded.
    """
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit:
            yield line
            continue
        size = len(line)
        while not line.endswith(("\n", b"\n")[isinstance(line, bytes)]):
            line = f.readline(limit)
            if not line:
                break
            size += len(line)
        yield OversizedLine(size)


# Opens a file's raw (still compressed) bytes for reading: fsspec's, by default, or a dataset's (dataset_reader).
Opener = Callable[[], AbstractContextManager[IO[bytes]]]


@contextmanager
def open_text_source(uri: str, opener: Opener | None = None) -> Iterator[IO[bytes]]:
    """The input at `uri` as a buffered binary stream, decompressed by its extension. An object store's
    file (fsspec's AbstractBufferedFile) has no readline(size), which bounded_lines needs: it is put
    behind an io.BufferedReader, which reads it by its ranged reads, a MiB at a time."""
    compression = infer_compression(uri)
    with (opener or _fsspec_opener(uri))() as raw:
        if compression is not None:
            with compr[compression](raw, mode="rb") as decompressed:
                yield decompressed
        else:
            yield io.BufferedReader(raw, _READ_BUFFER) if isinstance(raw, AbstractBufferedFile) else raw


def _fsspec_opener(uri: str) -> Opener:
    return partial(fsspec.open, uri, "rb")


def resolve_uri(uri: str, base_dir: Path | None) -> str:
    """A relative local path resolves against base_dir; URLs and absolute paths stay."""
    if "://" in uri or base_dir is None or Path(uri).is_absolute():
        return uri
    # resolve() drops a prefix's trailing slash, which makes it a dataset (dataset.is_dataset)
    return str((base_dir / uri).resolve()) + ("/" if uri.endswith("/") else "")


def source_records(source: Source, uri: str, database_url: str | None,
                   window: ChangeWindow | None = None) -> Iterator[RawRecord]:
    """The records of spec.source: its one file at `uri`, or its table (read from `database_url`, the rows of its
    change `window`); a dataset's are read by dataset_reader."""
    if source.table is not None:
        from embedjob_worker.source.table import read_table_records  # psycopg: only table sources need it

        return read_table_records(database_url, source.table, source.template, source.metadata, window)
    return read_records(uri, source.format, source.id_field, source.text_of, metadata=source.metadata)


def read_records(uri: str, fmt: str, id_field: str, text_of: TextOf, first: int = 0,
                 opener: Opener | None = None, metadata: MetadataFields = ()) -> Iterator[RawRecord]:
    """The records of one file, numbered from position `first`, with the `metadata` fields' values
    (spec.source.metadataFields); its bytes from `opener` (default: fsspec's)."""
    readers = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet}
    return readers[fmt](uri, RecordFields(id_field, text_of, metadata), first, opener or _fsspec_opener(uri))


def count_records(uri: str, fmt: str) -> int | None:
    """A cheap record count for progress bars: Parquet metadata, or newlines of a local file or dataset."""
    if is_dataset(uri):
        if in_a_store(uri):
            return None
        return sum(count_records(name, fmt) or 0 for page in dataset_files(uri, fmt)[1] for name, _ in page)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        with fsspec.open(uri, "rb") as f:
            return pq.ParquetFile(f).metadata.num_rows
    if in_a_store(uri):
        return None
    with open_text_source(uri) as f:
        lines = sum(1 for line in bounded_lines(f) if isinstance(line, OversizedLine) or line.strip())
    # The CSV header is not a record; quoted multi-line CSV cells make this an estimate.
    return lines - 1 if fmt == "csv" else lines


def _read_jsonl(uri: str, made_of: RecordFields, first: int, opener: Opener) -> Iterator[RawRecord]:
    with open_text_source(uri, opener) as f:
        position = first
        lines = bounded_lines(f)
        while True:
            try:
                line = next(lines, None)
            except _CUT_OFF_STREAM:
                yield RawRecord(position, None, None, BadReason.malformed_record, _CUT_OFF_DETAIL)
                return
            if line is None:
                return
            if isinstance(line, OversizedLine):
                yield RawRecord(position, None, None, BadReason.oversized_record, line.detail)
            elif line.strip():
                yield _jsonl_record(position, line.decode("utf-8", errors="surrogateescape").removeprefix(_BOM),
                                    made_of)
            else:
                continue
            position += 1


def _jsonl_record(position: int, line: str, made_of: RecordFields) -> RawRecord:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        return RawRecord(position, None, None, BadReason.malformed_record, f"not JSON: {exc}"[:200])
    except RecursionError:
        return RawRecord(position, None, None, BadReason.malformed_record, "JSON nested too deeply")
    if not isinstance(obj, dict):
        return RawRecord(position, None, None, BadReason.malformed_record, "not a JSON object")
    return made_of.record(position, obj)


def _read_csv(uri: str, made_of: RecordFields, first: int, opener: Opener) -> Iterator[RawRecord]:
    # A cell may be as large as a record may be (the csv module's default stops at 128 KiB).
    csv.field_size_limit(MAX_RECORD_BYTES)
    with open_text_source(uri, opener) as raw:
        # utf-8-sig: a BOM is not part of the first column's name.
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape", newline="")
        # Whole records, split quote-aware: one over the limit is skipped to its real end.
        records = csv_records(text, MAX_RECORD_BYTES)
        try:
            header = next(records, None)
        except _CUT_OFF_STREAM as exc:
            raise ValueError(f"the CSV header cannot be read: {exc}") from None
        if header is None:
            return
        header = _csv_row(header)
        if isinstance(header, SkippedCsvRecord):
            raise ValueError(f"the CSV header cannot be read: {header.detail}")
        position = first
        while True:
            try:
                record = next(records, None)
            except _CUT_OFF_STREAM:
                yield RawRecord(position, None, None, BadReason.malformed_record, _CUT_OFF_DETAIL)
                return
            if record is None:
                return
            row = _csv_row(record)
            if isinstance(row, SkippedCsvRecord):
                yield RawRecord(position, None, None, row.reason, row.detail[:200])
                position += 1
                continue
            if not row:  # a blank line is no record (as csv.DictReader has it)
                continue
            # A cell missing from a short row is None: the CSV form of null.
            yield made_of.record(position, dict(zip(header, row)))
            position += 1


def _csv_row(record: str | SkippedCsvRecord) -> list[str] | SkippedCsvRecord:
    """The cells of one whole CSV record (csv_records has found where it ends), or why it is no row."""
    if isinstance(record, SkippedCsvRecord):
        return record
    try:
        return next(csv.reader((record,)), [])
    except csv.Error as exc:
        return SkippedCsvRecord(BadReason.malformed_record, f"not a CSV row: {exc}")


def _read_parquet(uri: str, made_of: RecordFields, first: int, opener: Opener) -> Iterator[RawRecord]:
    import pyarrow.parquet as pq

    id_field, text_of = made_of.id_field, made_of.text_of
    with opener() as f:
        parquet = pq.ParquetFile(f)
        position = first
        columns = columns_for(parquet.schema_arrow.names, id_field, text_of, made_of.metadata)
        text_columns = made_of.text_columns()
        for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=columns):
            if isinstance(text_of, str) and not made_of.metadata:  # two columns: no row dicts
                for record_id, text in zip(batch.column(id_field).to_pylist(), batch.column(text_of).to_pylist()):
                    yield RawRecord(position, record_id, _decoded(text))
                    position += 1
                continue
            for row in batch.to_pylist():  # the fields as rows (a struct column as a dict)
                yield made_of.record(position, {name: _decoded(value) if name in text_columns else value
                                                for name, value in row.items()})
                position += 1


def _decoded(value):
    """A binary column's value decoded as the text formats are."""
    return value.decode("utf-8", errors="surrogateescape") if isinstance(value, bytes) else value
