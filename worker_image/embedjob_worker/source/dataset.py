"""A source of many files: a prefix or a glob listed into its files in lexical order, and the dataset's snapshot.

`spec.source.uri` names a dataset when it ends in `/` (every file under the prefix, at any
depth, whose name ends in one of the format's extensions, compressed or not) or holds a glob
character (`*`, `?`, `[`; `**` crosses `/`): every file the pattern matches, unless a file of
exactly that name exists (`data[2024].jsonl` is read as the one file it names; a folder or key
with such a character inside a glob is written as a class: `run[[]1]/part-*.jsonl`). The files are
read one after the other in lexical order of their keys (UTF-8 code point order, S3's listing
order), with record positions running on across files, so the same files give the same
batches and ids wherever they are listed from.

The listing is the run's: the snapshot keeps each file's identity (snapshot.file_snapshot:
the store's content stamp from the listing itself, one request per thousand objects on S3,
or a local file's sha256), the fingerprint covers the files' keys under the dataset's root,
sizes and content, and a file is checked against its snapshot when its turn to be read comes
(`opened_as_listed`), so a file replaced after the listing is not read as if it were the one
fingerprinted. (One replaced while it is being read: s3fs's ranged reads carry the ETag the
file was opened with, If-Match, so S3 refuses them.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractBufferedFile
from fsspec.utils import compressions

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.source.listed_files import ListedFiles
from embedjob_worker.source.s3_objects import fetched_object
from embedjob_worker.source.snapshot import InputSnapshot, file_snapshot
from embedjob_worker.source.unavailable import in_a_store

GLOB_CHARACTERS = "*?["
# What a file of each format is called under a prefix (a glob takes whatever it matches).
FORMAT_EXTENSIONS = {"jsonl": (".jsonl", ".json", ".ndjson"), "csv": (".csv",), "parquet": (".parquet", ".pq")}
# A store's file up to this size is fetched whole while the file before it is parsed (files.read_dataset).
WHOLE_FILE_BYTES = 64 << 20
# How many files a refusal names of each kind (changed, gone, new) before it counts the rest.
NAMED_FILES = 5


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
    files: ListedFiles  # each with its key under the dataset's root (what the fingerprint names)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.files.keys)

    @property
    def fingerprint(self) -> str:
        """The same files (keys under the root, sizes, content) give the same fingerprint wherever they lie."""
        listed = [[key, part.size, part.content] for key, part in self.files.keyed()]
        return hashlib.sha256(json.dumps({"files": listed}).encode()).hexdigest()

    def record(self) -> dict[str, Any]:
        """What the run row keeps (embedjob_runs.input): the dataset and each file, for refusals that name files."""
        return {"uri": self.uri, "size": sum(part.size or 0 for part in self.files), "modified": None,
                "content": f"files:{len(self.files)}",
                "files": [[key, part.size, part.content, part.modified] for key, part in self.files.keyed()]}


def dataset_root(path: str, is_prefix: bool) -> str:
    """The folder a dataset's keys are relative to: the prefix itself, or a glob's folder before its first
    glob character."""
    if is_prefix:
        return path.rstrip("/")
    first = min(path.index(c) for c in GLOB_CHARACTERS if c in path)
    return path[:path.rfind("/", 0, first) + 1].rstrip("/")


def _on_the_web(uri: str) -> bool:
    return uri.lower().startswith(("http://", "https://"))


def _has_format_extension(path: str, fmt: str) -> bool:
    stem = path.lower()
    for extension in compressions:
        stem = stem.removesuffix(f".{extension}")
    return stem.endswith(FORMAT_EXTENSIONS[fmt])


def dataset_files(uri: str, fmt: str) -> tuple[fsspec.AbstractFileSystem, list[str], list[dict[str, Any]]]:
    """The dataset's filesystem, its files' paths in lexical order and their listed `info`; FileNotFoundError
    naming the pattern when nothing matches."""
    fs, path = fsspec.core.url_to_fs(uri)
    if set(_protocols(fs)) & {"http", "https"}:
        # fsspec would scrape an index page's links, with no size or content stamp to know a file by
        raise ValueError("a web server has no listing to read a prefix or glob from: name one file, or keep the "
                         "files in a store (s3://, gs://, az://) or a folder")
    if uri.endswith("/"):
        listed = {name: info for name, info in fs.find(path, detail=True).items() if _has_format_extension(name, fmt)}
    else:
        listed = fs.glob(path, detail=True)
    files = sorted(((name, info) for name, info in listed.items() if info.get("type") == "file"), key=lambda f: f[0])
    if not files:
        raise FileNotFoundError(f"no file under the prefix whose name ends in {', '.join(FORMAT_EXTENSIONS[fmt])}"
                                " (compressed or not)" if uri.endswith("/") else "no file matches the pattern")
    return fs, [name for name, _ in files], [info for _, info in files]


def _file_uri(fs: fsspec.AbstractFileSystem, dataset_uri: str, name: str) -> str:
    """A listed file's URI in the dataset URI's own scheme (adlfs would name an az:// blob abfs://)."""
    if isinstance(fs, LocalFileSystem) or "://" in name:
        return name
    return f"{dataset_uri.split('://', 1)[0]}://{name}"


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def dataset_snapshot(uri: str, fmt: str) -> DatasetSnapshot:
    """List the dataset at `uri` (a prefix or glob) and snapshot its files."""
    fs, names, infos = dataset_files(uri, fmt)
    root = dataset_root(fsspec.core.url_to_fs(uri)[1], uri.endswith("/"))
    snapshot = DatasetSnapshot(uri=uri, files=ListedFiles(
        (name[len(root):].lstrip("/"), file_snapshot(fs, name, info, _file_uri(fs, uri, name)))
        for name, info in zip(names, infos)))
    _forget_listing(fs, root)
    return snapshot


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


def dataset_changes(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The files that changed, went or came between two recorded datasets (DatasetSnapshot.record), named."""
    before = {key: (size, content) for key, size, content, _ in old.get("files", [])}
    after = {key: (size, content) for key, size, content, _ in new.get("files", [])}
    kinds = (("changed", sorted(k for k in before.keys() & after.keys() if before[k] != after[k])),
             ("gone", sorted(before.keys() - after.keys())), ("new", sorted(after.keys() - before.keys())))
    said = []
    for kind, keys in kinds:
        if keys:
            more = f" and {len(keys) - NAMED_FILES} more" if len(keys) > NAMED_FILES else ""
            said.append(f"{kind}: {', '.join(keys[:NAMED_FILES])}{more}")
    return "; ".join(said)
