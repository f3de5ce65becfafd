"""Where a dataset's listing goes as it is listed (ListingKeeper), and the keeper that holds it in memory, as columns.

A run's driver keeps its listing in PostgreSQL (sink.listings), a page at a time, so that a
listing of millions of files is never in its memory; each file is read back when its turn
comes. ListedFiles keeps one in memory, for a dataset read without a database (the benches,
the unit tests): each column's strings as one UTF-8 bytes object and an array of offsets, a
file costing its strings' bytes and a few integers (an InputSnapshot object per file cost
about 1.6 KiB).
"""

from __future__ import annotations

from abc import abstractmethod
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol, TypeVar, overload

from embedjob_worker.source.snapshot import InputSnapshot

_NO_SIZE = -1  # a store that gave no size (sizes are never negative)
Item = TypeVar("Item")


class ListingKeeper(Protocol):
    """Where a dataset's listing goes as it is listed: pages of (key under the dataset's root, snapshot) in reading
    order, then the files read back in that order."""

    listing_id: str | None  # what the run row's input record names it by (None: kept in this process alone)

    def keep(self, page: Sequence[tuple[str, InputSnapshot]]) -> None:
        """The next files of the listing."""

    def kept(self) -> Sequence[InputSnapshot]:
        """Every file kept, in the order kept."""


class ByPosition(Sequence[Item]):
    """A sequence whose items are made when asked for (`_item`); a slice gives a list of them."""

    @abstractmethod
    def _item(self, index: int) -> Item:
        """Item `index`, 0 <= index < len(self)."""

    @overload
    def __getitem__(self, index: int) -> Item: ...
    @overload
    def __getitem__(self, index: slice) -> list[Item]: ...
    def __getitem__(self, index: int | slice) -> Item | list[Item]:
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"{type(self).__name__} index out of range")
        return self._item(index)


class _Strings(ByPosition[str]):
    """Strings kept as one bytes object of their UTF-8 and the offset where each ends."""

    def __init__(self) -> None:
        self._ends = array("Q")
        self._data = bytearray()

    def append(self, value: str) -> None:
        self._data += value.encode()
        self._ends.append(len(self._data))

    def __len__(self) -> int:
        return len(self._ends)

    def _item(self, index: int) -> str:
        start = self._ends[index - 1] if index else 0
        return self._data[start:self._ends[index]].decode()


class ListedFiles(ByPosition[InputSnapshot]):
    """A dataset's files in reading order, each with its key under the dataset's root, kept in this process."""

    listing_id = None

    def __init__(self, keyed: Iterable[tuple[str, InputSnapshot]] = ()):
        self.keys, self._uris, self._contents, self._modified = _Strings(), _Strings(), _Strings(), _Strings()
        self._sizes = array("q")
        self.keep(keyed)  # one pass: a listing's snapshots are made one at a time, never held together

    def keep(self, page: Iterable[tuple[str, InputSnapshot]]) -> None:
        for key, part in page:
            self.keys.append(key)
            self._uris.append(part.uri)
            self._contents.append(part.content)
            self._modified.append(part.modified or "")  # "" for a store that did not say
            self._sizes.append(_NO_SIZE if part.size is None else part.size)

    def kept(self) -> ListedFiles:
        return self

    def __len__(self) -> int:
        return len(self._sizes)

    def _item(self, index: int) -> InputSnapshot:
        size = self._sizes[index]
        return InputSnapshot(uri=self._uris[index], size=None if size == _NO_SIZE else size,
                             modified=self._modified[index] or None, content=self._contents[index])

    def keyed(self) -> Iterator[tuple[str, InputSnapshot]]:
        """Each file's key and snapshot, in reading order."""
        for number in range(len(self)):
            yield self.keys[number], self[number]
