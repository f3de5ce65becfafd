"""The input snapshot: what identifies the content of a job's input (its fingerprint) and how to name it.

A local file is identified by a sha256 of its bytes, read once before the run starts.
Not its modification time: `touch`, a copy or a checkout of the same bytes is the same
input, and a resumed run must find the batches it already wrote. Not a hash computed
while streaming either: batch ids derive from the input fingerprint (batching.batch_key),
so it must be known before the first batch, and a change found at the end of the input
would come after batches were written under ids that claim the old content. The extra
sequential read costs about a second per GB, little next to embedding the same bytes.

An object behind an fsspec URL is not downloaded twice: its store's content stamp is
used (GCS `md5Hash`/`crc32c`, S3 and HTTP `ETag`, Azure's Content-MD5), which a re-upload of the same bytes
keeps; a store with none falls back to the modification stamp (`LastModified`, `mtime`,
...), and one with neither to the URI and size.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

_READ_BYTES = 1 << 20
# fsspec `info` keys that name an object's content, best first.
_CONTENT_KEYS = ("md5Hash", "crc32c", "ETag", "etag")
# When the object was last written (S3, Azure, local, GCS), for messages ...
_MODIFIED_KEYS = ("LastModified", "last_modified", "mtime", "updated")
# ... and, for stores without a content key, what changes with every write.
_VERSION_KEYS = (*_MODIFIED_KEYS, "generation")
SHORT_HASH = 12


@dataclass(frozen=True)
class InputSnapshot:
    """One input as the run saw it. `content` is `sha256:<hex>` for a local file, else the store's
    `<key>:<stamp>`, or `uri:<uri>` when the store gives neither."""

    uri: str
    size: int | None
    modified: str | None  # ISO 8601 UTC when the store says; for messages, not for the fingerprint
    content: str

    @property
    def fingerprint(self) -> str:
        """Part of every batch id of the run: the same bytes give the same fingerprint wherever they lie."""
        return hashlib.sha256(json.dumps({"size": self.size, "content": self.content}).encode()).hexdigest()

    def record(self) -> dict[str, Any]:
        """What the run row keeps (embedjob_runs.input), so a refusal can name the recorded input."""
        return asdict(self)


def describe_input(recorded: dict[str, Any] | None) -> str:
    """`/data/in.jsonl (sha256 1a2b3c4d5e6f, 1234 bytes, modified 2026-11-29T23:00:00Z)`."""
    if not recorded:
        return "an input whose description was not recorded (a run written before migration 0006)"
    kind, _, stamp = str(recorded.get("content", "")).partition(":")
    content = {"sha256": f"sha256 {stamp[:SHORT_HASH]}", "files": f"{stamp} files"}.get(kind, f"{kind} {stamp}")
    parts = [content, f"{recorded.get('size')} bytes"]
    if recorded.get("modified"):
        parts.append(f"modified {recorded['modified']}")
    return f"{recorded.get('uri')} ({', '.join(parts)})"


def store_content_stamp(uri: str, info: dict[str, Any]) -> str:
    """The content stamp of a remote object from its fsspec `info`: a content hash if the store
    keeps one, else its modification stamp, else its URI."""
    md5 = (info.get("content_settings") or {}).get("content_md5")  # Azure (adlfs): its ETag changes on every upload
    if md5:
        return f"content_md5:{base64.b64encode(bytes(md5)).decode()}"
    for key in (*_CONTENT_KEYS, *_VERSION_KEYS):
        if info.get(key) is not None:
            return f"{key}:{info[key]}"
    return f"uri:{uri}"


def modified_at(info: dict[str, Any]) -> str | None:
    """When the store says the object was last written, ISO 8601 UTC to the second."""
    for key in _MODIFIED_KEYS:
        value = info.get(key)
        if isinstance(value, (int, float)):  # seconds since the epoch (local files)
            value = datetime.fromtimestamp(value, timezone.utc)
        if isinstance(value, datetime):
            return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        if value is not None:
            return str(value)
    return None


def _sha256_of(fs: fsspec.AbstractFileSystem, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(_READ_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def input_snapshot(uri: str) -> InputSnapshot:
    """The snapshot of the input at `uri` (a local path, file:// or an fsspec URL); OSError if it is missing."""
    fs, path = fsspec.core.url_to_fs(uri)
    return file_snapshot(fs, path, fs.info(path), uri)


def file_snapshot(fs: fsspec.AbstractFileSystem, path: str, info: dict[str, Any], uri: str) -> InputSnapshot:
    """The snapshot of the file at `path` of `fs` (its `info`, as `fs.info` or a listing gives it), named `uri`."""
    content = f"sha256:{_sha256_of(fs, path)}" if isinstance(fs, LocalFileSystem) else store_content_stamp(uri, info)
    return InputSnapshot(uri=uri, size=info.get("size"), modified=modified_at(info), content=content)
