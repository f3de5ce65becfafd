"""A dataset's files read in listing order, a shard at a time, the next file fetched while one is parsed.

While one file is parsed, the next is fetched in a thread when it is a store's and at most
WHOLE_FILE_BYTES (checked against the listing, then read whole in one request), so that the
store's latency overlaps the parsing; a larger one is streamed as it is parsed. At most two
files' bytes are held. A shard (core.shards) starts at any file and ends at the end of the first
file by which it holds its records; a resumed session starts its first shard where it likes.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from functools import partial

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.records import RawRecord
from embedjob_worker.source.dataset import fetched_whole, opened_as_listed
from embedjob_worker.source.files import Opener, read_records
from embedjob_worker.source.record_fields import TextOf
from embedjob_worker.source.record_metadata import MetadataFields
from embedjob_worker.source.snapshot import InputSnapshot


class DatasetReader:
    """The records of a dataset's `files` (dataset.DatasetSnapshot), a shard at a time; close() ends its fetches."""

    def __init__(self, files: Sequence[InputSnapshot], fmt: str, id_field: str, text_of: TextOf,
                 metadata: MetadataFields = ()):
        self.files, self.fmt, self.id_field, self.text_of, self.metadata = files, fmt, id_field, text_of, metadata
        self.next_file = 0  # where the last shard read ended
        self._fetcher = ThreadPoolExecutor(1, thread_name_prefix="embedjob-fetch")
        self._ahead: tuple[int, Future[bytes | None]] | None = None  # the file being fetched, and its bytes

    def __enter__(self) -> DatasetReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._fetcher.shutdown(wait=True, cancel_futures=True)

    def shard(self, first_file: int, first_position: int, records: int | None) -> Iterator[RawRecord]:
        """The records of the files from `first_file` on, numbered from `first_position`, up to the end of the
        first file by which `records` records have been read (None: every file); `next_file` is then the file
        after that. JobFailed (InputChanged) at a file that is no longer what the run's snapshot saw."""
        read, number = 0, first_file
        while number < len(self.files) and (records is None or read < records):
            part = self.files[number]
            try:
                data = self._fetched(number)
                for record in read_records(part.uri, self.fmt, self.id_field, self.text_of, first_position + read,
                                           _dataset_opener(part, data), self.metadata):
                    read += 1
                    yield record
            except (OSError, ValueError, KeyError) as exc:  # named by its file, not by the dataset's pattern
                raise JobFailed("SourceUnreadable", f"reading {part.uri}: {type(exc).__name__}: {exc}") from None
            number += 1
            self.next_file = number

    def _fetched(self, number: int) -> bytes | None:
        """File `number`'s bytes if it is fetched whole (dataset.fetched_whole), the next file's fetch started."""
        ahead = self._ahead if self._ahead is not None and self._ahead[0] == number else None
        data = ahead[1].result() if ahead else fetched_whole(self.files[number])
        self._ahead = None
        if number + 1 < len(self.files):
            self._ahead = (number + 1, self._fetcher.submit(fetched_whole, self.files[number + 1]))
        return data


def read_dataset(files: Sequence[InputSnapshot], fmt: str, id_field: str, text_of: TextOf) -> Iterator[RawRecord]:
    """The records of a dataset's files in their order, positions running on from file to file (one shard)."""
    with DatasetReader(files, fmt, id_field, text_of) as reader:
        yield from reader.shard(0, 0, None)


def _dataset_opener(part: InputSnapshot, fetched: bytes | None) -> Opener:
    """A dataset file's bytes: fetched already (dataset.fetched_whole), else opened once checked against its listing."""
    return partial(nullcontext, io.BytesIO(fetched)) if fetched is not None else partial(opened_as_listed, part)
