"""A dataset's files as its store lists them: in lexical order of key, a page at a time as the store answers.

A prefix lists every file under it whose name ends in one of the format's extensions
(compressed or not); a glob every file its pattern matches, as fsspec's `glob` matches it
(`glob_translate`). S3, Google Cloud Storage and Azure Blob answer up to 1,000 (Azure 5,000)
keys a request, in UTF-8 order of key, which is Python's order of the names: their pages are
handed on as they come (each store's paginated listing, beneath what its filesystem's `find`
gathers before it returns), so a listing of millions of objects is never in memory at once;
a glob lists everything under the stem before its first glob character and keeps what
matches. A folder (or another filesystem) is listed at once, sorted, then handed on a page
at a time.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import fsspec
from fsspec.asyn import sync
from fsspec.implementations.local import LocalFileSystem
from fsspec.utils import compressions, glob_translate

GLOB_CHARACTERS = "*?["
# What a file of each format is called under a prefix (a glob takes whatever it matches).
FORMAT_EXTENSIONS = {"jsonl": (".jsonl", ".json", ".ndjson"), "csv": (".csv",), "parquet": (".parquet", ".pq")}
LISTING_PAGE = 1000  # files handed on at a time (S3's page)

Listed = tuple[str, dict[str, Any]]  # a file's path in its filesystem, and its details as the listing gave them


def dataset_files(uri: str, fmt: str) -> tuple[fsspec.AbstractFileSystem, Iterator[list[Listed]]]:
    """The dataset's filesystem and its files in lexical order of path, a page at a time. ValueError for a web
    server's address (refused before any request); the pages end in FileNotFoundError naming the pattern when
    nothing matches."""
    fs, path = fsspec.core.url_to_fs(uri)
    if set(_protocols(fs)) & {"http", "https"}:
        # fsspec would scrape an index page's links, with no size or content stamp to know a file by
        raise ValueError("a web server has no listing to read a prefix or glob from: name one file, or keep the "
                         "files in a store (s3://, gs://, az://) or a folder")
    is_prefix = uri.endswith("/")
    if is_prefix:
        def wanted(name: str) -> bool:
            return _has_format_extension(name, fmt)
    else:
        wanted = re.compile(glob_translate(path)).match
    return fs, _matching_pages(_listing(fs, path, is_prefix), wanted, is_prefix, fmt)


def _matching_pages(listing: Iterator[list[Listed]], wanted: Callable[[str], object], is_prefix: bool,
                    fmt: str) -> Iterator[list[Listed]]:
    found, previous = False, None
    for page in listing:
        files = [(name, info) for name, info in page if info.get("type") == "file" and wanted(name)]
        for name, _ in files:
            if previous is not None and name <= previous:  # batch ids follow the order: a store must keep it
                raise ValueError(f"the store listed {name} after {previous}: not in lexical order of key")
            previous = name
        if files:
            found = True
            yield files
    if not found:
        raise FileNotFoundError(f"no file under the prefix whose name ends in {', '.join(FORMAT_EXTENSIONS[fmt])}"
                                " (compressed or not)" if is_prefix else "no file matches the pattern")


def _listing(fs: fsspec.AbstractFileSystem, path: str, is_prefix: bool) -> Iterator[list[Listed]]:
    """Everything under the prefix (or the glob's stem), a page at a time: a store's pages as it answers, else the
    filesystem's whole listing, sorted, cut into pages (also a glob whose bucket name holds a glob character)."""
    stem = path if is_prefix else path[:min(path.index(c) for c in GLOB_CHARACTERS if c in path)]
    bucket, slash, key = stem.partition("/")
    if is_prefix:  # every key under the folder (gcsfs and adlfs keep a prefix's slash, s3fs drops it)
        key = f"{key.rstrip('/')}/" if key.rstrip("/") else ""
    objects = _store_objects(fs, bucket, key) if slash or is_prefix else None  # a glob in the bucket's name: glob
    if objects is not None:
        try:
            while page := sync(fs.loop, _next_page, objects):
                yield [(info["name"], info) for info in page]
        finally:
            sync(fs.loop, objects.aclose)
        return
    listed = fs.find(path, detail=True) if is_prefix else fs.glob(path, detail=True)
    names = sorted(listed)
    for start in range(0, len(names), LISTING_PAGE):
        yield [(name, listed[name]) for name in names[start:start + LISTING_PAGE]]


def _store_objects(fs: fsspec.AbstractFileSystem, bucket: str, prefix: str) -> AsyncIterator[dict[str, Any]] | None:
    """Every object of `bucket` whose key starts with `prefix` ("": all), as the store lists them, each with the
    details its filesystem's `find` gives; None for a filesystem listed at once (a folder, a versioned bucket)."""
    protocols = set(_protocols(fs))
    if getattr(fs, "version_aware", False):
        return None
    if "s3" in protocols:
        return fs._iterdir(bucket, delimiter="", prefix=prefix)
    if "gs" in protocols:
        return _gcs_objects(fs, bucket, prefix)
    if "az" in protocols:
        return _azure_objects(fs, bucket, prefix)
    return None


async def _gcs_objects(fs: fsspec.AbstractFileSystem, bucket: str, prefix: str) -> AsyncIterator[dict[str, Any]]:
    token = None
    while True:
        page = await fs._call_list_objects(bucket, prefix=prefix, maxResults=LISTING_PAGE, pageToken=token)
        for item in page.get("items", []):
            yield fs._process_object(bucket, item)
        token = page.get("nextPageToken")
        if token is None:
            return


async def _azure_objects(fs: fsspec.AbstractFileSystem, container: str, prefix: str) -> AsyncIterator[dict[str, Any]]:
    async with fs.service_client.get_container_client(container=container) as client:
        blobs = []
        async for blob in client.list_blobs(include=["metadata"], name_starts_with=prefix):
            blobs.append(blob)
            if len(blobs) == LISTING_PAGE:
                for info in await fs._details(blobs):
                    yield info
                blobs = []
        for info in await fs._details(blobs):
            yield info


async def _next_page(objects: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    page: list[dict[str, Any]] = []
    async for info in objects:  # leaving the loop leaves the generator where it was, for the next page
        page.append(info)
        if len(page) == LISTING_PAGE:
            break
    return page


def _has_format_extension(path: str, fmt: str) -> bool:
    stem = path.lower()
    for extension in compressions:
        stem = stem.removesuffix(f".{extension}")
    return stem.endswith(FORMAT_EXTENSIONS[fmt])


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def file_uri(fs: fsspec.AbstractFileSystem, dataset_uri: str, name: str) -> str:
    """A listed file's URI in the dataset URI's own scheme (adlfs would name an az:// blob abfs://)."""
    if isinstance(fs, LocalFileSystem) or "://" in name:
        return name
    return f"{dataset_uri.split('://', 1)[0]}://{name}"
