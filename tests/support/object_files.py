"""Files of PEP paragraphs as a store would hold them: JSONL (plain or gzip), CSV or Parquet bytes."""

from __future__ import annotations

import csv
import gzip
import io
import json

from support.corpus import corpus_lines


def corpus_records(count: int, start: int = 0) -> list[dict]:
    return [json.loads(line) for line in corpus_lines(start, count)]


def encoded(records: list[dict], fmt: str) -> bytes:
    """The records as a file of `fmt`: jsonl, jsonl.gz, csv or parquet."""
    if fmt.startswith("jsonl"):
        data = b"".join(json.dumps(r).encode() + b"\n" for r in records)
        return gzip.compress(data) if fmt.endswith(".gz") else data
    if fmt == "csv":
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=["id", "text"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)
        return text.getvalue().encode()
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"id": [r["id"] for r in records], "text": [r["text"] for r in records]}), sink)
    return sink.getvalue()
