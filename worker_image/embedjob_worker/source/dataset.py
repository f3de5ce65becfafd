"""A source of many files: a prefix or a glob listed into its files in lexical order, and the dataset's snapshot.

`spec.source.uri` names a dataset when it ends in `/` (every file under the prefix, at any
depth, whose name ends in one of the format's extensions, compressed or not) or holds a glob
character (`*`, `?`, `[`; `**` crosses `/`): every file the pattern matches, unless a file of
exactly that name exists (`data[2024].jsonl` is read as the one file it names; a folder or key
with such a character inside a glob is written as a class: `run[[]1]/part-*.jsonl`). The files are
read one after the other in lexical order of their keys (UTF-8 code point order, S3's listing
order), with record positions running on across files, so the same files give the same
batches and ids wherever they are listed from.

The listing is the run's (dataset_listing lists it, a page at a time): the snapshot keeps each
file's identity (snapshot.file_snapshot: the store's content stamp from the listing itself,
one request per thousand objects on S3, or a local file's sha256) in a ListingKeeper as it
comes (a driver's in PostgreSQL, sink.listings), the fingerprint covers the files' keys under
the dataset's root, sizes and content (hashed as they come), and a file is checked against its
snapshot when its turn to be read comes (`opened_as_listed`), so a file replaced after the
listing is not read as if it were the one fingerprinted. (One replaced while it is being read:
s3fs's ranged reads carry the ETag the file was opened with, If-Match, so S3 refuses them.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractBufferedFile

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.source.dataset_listing import GLOB_CHARACTERS, dataset_files, file_uri
from embedjob_worker.source.listed_files import ListedFiles, ListingKeeper
from embedjob_worker.source.s3_objects import fetched_object
from embedjob_worker.source.snapshot import InputSnapshot, file_snapshot
from embedjob_worker.source.unavailable import in_a_store

# A store's file up to this size is fetched whole while the file before it is parsed (files.read_dataset).
WHOLE_FILE_BYTES = 64 << 20


def is_pattern(uri: str) -> bool:
    """Whether `uri` is written as a prefix or a glob (by its characters alone, asking no store)."""
    if _on_the_web(uri):
        uri = uri.split("?", 1)[0]  # a web address's `?` starts its query (a presigned URL's signature)
    return uri.endswith("/") or any(c in uri for c in GLOB_CHARACTERS)


def is_dataset(uri: str) -> bool:
    """Whether `uri` names many files: a prefix, or a glob that is not also the exact name of a file (asked of
    the store, one request; an answer it cannot give leaves it a glob, whose listing then says why)."""
    if not is_pattern(uri):
        return False
    if uri.endswith("/") or _on_the_web(uri):  # a web server's is refused by its listing (dataset_files)
        return True
    fs, path = fsspec.core.url_to_fs(uri)
    return not fs.isfile(path)


@dataclass(frozen=True)
class DatasetSnapshot:
    """The files of a dataset as the run listed them, in the order they are read."""

    uri: str  # the prefix or glob, as the spec has it (resolved against the manifest's folder)
    files: Sequence[InputSnapshot]  # as the ListingKeeper gives them back
    # The same files (keys under the root, sizes, content) give the same fingerprint wherever they lie.
    fingerprint: str
    size: int  # of every file the store gave a size for
    listing_id: str | None  # where the keeper keeps the listing (sink.listings), None: in this process alone

    def record(self) -> dict[str, Any]:
        """What the run row keeps (embedjob_runs.input): the dataset, and the listing its refusals name files from."""
        return {"uri": self.uri, "size": self.size, "modified": None, "content": f"files:{len(self.files)}",
                "listing": self.listing_id}


class _ListingFingerprint:
    """sha256 of `{"files": [[key, size, content], ...]}` as json.dumps writes it, hashed a file at a time: the
    fingerprint of the runs that kept the whole listing in memory, so that they resume."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256(b'{"files": [')
        self._files = 0

    def add(self, key: str, part: InputSnapshot) -> None:
        self._digest.update((b", " if self._files else b"") + json.dumps([key, part.size, part.content]).encode())
        self._files += 1

    def hexdigest(self) -> str:
        digest = self._digest.copy()
        digest.update(b"]}")
        return digest.hexdigest()


def dataset_root(path: str, is_prefix: bool) -> str:
    """The folder a dataset's keys are relative to: the prefix itself, or a glob's folder before its first
    glob character."""
    if is_prefix:
        return path.rstrip("/")
    first = min(path.index(c) for c in GLOB_CHARACTERS if c in path)
    return path[:path.rfind("/", 0, first) + 1].rstrip("/")


def _on_the_web(uri: str) -> bool:
    return uri.lower().startswith(("http://", "https://"))


def dataset_snapshot(uri: str, fmt: str, keeper: ListingKeeper | None = None) -> DatasetSnapshot:
    """List the dataset at `uri` (a prefix or glob) and snapshot its files into `keeper` (default: in memory), a
    page at a time."""
    keeper = ListedFiles() if keeper is None else keeper
    fs, pages = dataset_files(uri, fmt)
    root = dataset_root(fsspec.core.url_to_fs(uri)[1], uri.endswith("/"))
    fingerprint, size = _ListingFingerprint(), 0
    for page in pages:
        keyed = [(name[len(root):].lstrip("/"), file_snapshot(fs, name, info, file_uri(fs, uri, name)))
                 for name, info in page]
        for key, part in keyed:
            fingerprint.add(key, part)
            size += part.size or 0
        keeper.keep(keyed)
    _forget_listing(fs, root)
    return DatasetSnapshot(uri, keeper.kept(), fingerprint.hexdigest(), size, keeper.listing_id)


def _forget_listing(fs: fsspec.AbstractFileSystem, root: str) -> None:
    """Drop what `fs` cached of the listing at or under `root`: the snapshot keeps what the run needs, and the
    filesystem (one per process, fsspec caches it) would keep every object's details, about 1 KiB each, for
    the process's life; each file is asked of the store again when it is read (opened_as_listed)."""
    for path in [path for path in fs.dircache if path == root or path.startswith(f"{root}/")]:
        fs.dircache.pop(path, None)


@contextmanager
def opened_as_listed(part: InputSnapshot) -> Iterator[IO[bytes]]:
    """The file of `part` opened for reading (its raw bytes) once it is known to be the file the run's snapshot
    saw, else JobFailed (InputChanged) naming it. A store's file is checked by the details its opening fetched (one
    request for both; s3fs then sends that ETag with each ranged read, If-Match); a local file by its sha256,
    its bytes read once more (about a second per GB)."""
    fs, path = fsspec.core.url_to_fs(part.uri)
    fs.invalidate_cache(path)  # the filesystems answer from the listing they cached: ask the store
    local = isinstance(fs, LocalFileSystem)
    try:
        if local:
            _refuse_if_changed(part, file_snapshot(fs, path, fs.info(path), part.uri))
        opened = fs.open(path, "rb")
    except FileNotFoundError:
        _refuse(part, "it is gone")
    with opened as f:
        if not local:
            details = f.info() if isinstance(f, AbstractBufferedFile) else fs.info(path)
            _refuse_if_changed(part, file_snapshot(fs, path, details, part.uri))
        yield f


def fetched_whole(part: InputSnapshot) -> bytes | None:
    """A store's file of at most WHOLE_FILE_BYTES, checked against its listing and read whole (S3's by obstore,
    s3_objects; else, or when that could not, through fsspec); None for a local or a larger file (read as it
    is parsed)."""
    if not in_a_store(part.uri) or (part.size or 0) > WHOLE_FILE_BYTES:
        return None
    fetched = fetched_object(part) if part.uri.startswith("s3://") else None  # one GET, off the GIL
    if fetched is not None:
        return fetched
    with opened_as_listed(part) as f:
        return f.read()


def _refuse_if_changed(part: InputSnapshot, now: InputSnapshot) -> None:
    if (now.size, now.content) != (part.size, part.content):
        _refuse(part, f"it was {part.content}, {part.size} bytes; now {now.content}, {now.size} bytes")


def _refuse(part: InputSnapshot, change: str) -> None:
    raise JobFailed("InputChanged", f"spec.source: {part.uri} changed after the run listed the dataset's files "
                                    f"({change}); a run reads the files its start listed, as they were then")
