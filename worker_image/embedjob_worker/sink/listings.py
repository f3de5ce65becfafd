"""A dataset's listing kept in PostgreSQL (embedjob_listed_files): written a page at a time, read back a window at a time.

A run's driver lists its dataset into the table as the store answers (source.dataset_listing),
so its memory holds one page of the listing, never all of it, whatever the number of files; the
reader asks for the files a window at a time as their turns come, and a refused re-run names the
files that changed, went or came by comparing two listings in the database. Each start of the
job keeps only the listing its latest started run names, and a resumed session's own
(`forget_listings`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa

from embedjob import db

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.source.listed_files import ByPosition
from embedjob_worker.source.snapshot import InputSnapshot

WINDOW = 256  # files read back at a time
# How many files a refusal names of each kind (changed, gone, new) before it counts the rest.
NAMED_FILES = 5


class StoredListing:
    """A ListingKeeper (source.listed_files) writing each page to embedjob_listed_files under a new listing id."""

    def __init__(self, engine: sa.Engine, job_key: str, namespace: str):
        self.engine, self.job_key, self.namespace = engine, job_key, namespace
        self.listing_id = str(uuid.uuid4())
        self._files = 0

    def keep(self, page: Sequence[tuple[str, InputSnapshot]]) -> None:
        rows = [{"listing_id": self.listing_id, "position": self._files + n, "job_key": self.job_key,
                 "namespace": self.namespace, "key": key, "uri": part.uri, "size": part.size,
                 "content": part.content, "modified": part.modified} for n, (key, part) in enumerate(page)]
        if rows:
            with self.engine.begin() as conn:
                conn.execute(db.listed_files.insert(), rows)
        self._files += len(rows)

    def kept(self) -> StoredFiles:
        return StoredFiles(self.engine, self.listing_id, self._files)


class StoredFiles(ByPosition[InputSnapshot]):
    """The files of a stored listing in reading order, fetched WINDOW at a time from the one asked for."""

    def __init__(self, engine: sa.Engine, listing_id: str, files: int):
        self.engine, self.listing_id, self._files = engine, listing_id, files
        self._first, self._window = 0, []

    def __len__(self) -> int:
        return self._files

    def _item(self, index: int) -> InputSnapshot:
        if not self._first <= index < self._first + len(self._window):
            listed = db.listed_files.c
            with self.engine.connect() as conn:
                rows = conn.execute(sa.select(listed.uri, listed.size, listed.modified, listed.content)
                                    .where(listed.listing_id == self.listing_id, listed.position >= index)
                                    .order_by(listed.position).limit(WINDOW)).all()
            self._first, self._window = index, [InputSnapshot(*row) for row in rows]
            if not self._window:  # only a later start of the job deletes a listing: this session is not the run's
                raise JobFailed("DriverSuperseded", "the dataset listing this driver session read from is gone: "
                                "another driver session of the job started since")
        return self._window[index - self._first]


_CHANGES = sa.text("""
WITH old AS (SELECT key, size, content FROM embedjob_listed_files WHERE listing_id = :old),
     new AS (SELECT key, size, content FROM embedjob_listed_files WHERE listing_id = :new),
     changes AS (
       SELECT CASE WHEN old.key IS NULL THEN 'new' WHEN new.key IS NULL THEN 'gone' ELSE 'changed' END AS kind,
              coalesce(new.key, old.key) AS key
       FROM old FULL JOIN new ON old.key = new.key
       WHERE (old.key IS NULL OR new.key IS NULL OR old.size IS DISTINCT FROM new.size OR old.content <> new.content)
         AND EXISTS (SELECT FROM old)),
     ranked AS (
       SELECT kind, key, count(*) OVER (PARTITION BY kind) AS files,
              row_number() OVER (PARTITION BY kind ORDER BY key COLLATE "C") AS place FROM changes)
SELECT kind, key, files FROM ranked WHERE place <= :named ORDER BY kind, key COLLATE "C"
""")


def listing_changes(conn: sa.Connection, old_listing: str, new_listing: str) -> str:
    """The files that changed, went or came between two stored listings, named (`changed: a; gone: b; new: c,
    d, ... and 2 more`); "" when the old one is no longer kept."""
    named: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for kind, key, files in conn.execute(_CHANGES, {"old": old_listing, "new": new_listing, "named": NAMED_FILES}):
        named.setdefault(kind, []).append(key)
        counts[kind] = files
    said = []
    for kind in ("changed", "gone", "new"):
        if kind in named:
            more = f" and {counts[kind] - NAMED_FILES} more" if counts[kind] > NAMED_FILES else ""
            said.append(f"{kind}: {', '.join(named[kind])}{more}")
    return "; ".join(said)


def forget_listings(conn: sa.Connection, job_key: str, keep: set[str | None]) -> None:
    """Delete the job's stored listings but those in `keep` (the one its latest started run names, and the one its
    session reads; None stands for none)."""
    listed = db.listed_files.c
    kept = sorted(listing for listing in keep if listing)
    conn.execute(db.listed_files.delete().where(listed.job_key == job_key, listed.listing_id.not_in(kept)))
