"""A dataset's listed files kept as columns: each file's URI, key, size and stamps, its snapshot made when asked for.

A run holds its dataset's listing for its whole life: each file is checked against it when
its turn to be read comes, and a resumed run's refusal names the files that changed. Kept as
one InputSnapshot per file (a Python object with four strings of its own) beside the key, a
listing cost about 1.6 KiB a file with the store's cached listing; kept here as UTF-8 bytes
joined per column with an array of offsets, a file costs its strings' bytes and a few
integers (bench/dataset_listing.py measures both).
"""

from __future__ import annotations

from abc import abstractmethod
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar, overload

from embedjob_worker.source.snapshot import InputSnapshot

_NO_SIZE = -1  # a store that gave no size (sizes are never negative)
Item = TypeVar("Item")


class _ByPosition(Sequence[Item]):
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


class _Strings(_ByPosition[str]):
    """Strings kept as one bytes object of their UTF-8 and the offset where each ends."""

    def __init__(self, encoded: list[bytes]):
        self._ends = array("Q")
        end = 0
        for value in encoded:
            end += len(value)
            self._ends.append(end)
        self._data = b"".join(encoded)

    def __len__(self) -> int:
        return len(self._ends)

    def _item(self, index: int) -> str:
        start = self._ends[index - 1] if index else 0
        return self._data[start:self._ends[index]].decode()


class ListedFiles(_ByPosition[InputSnapshot]):
    """A dataset's files in reading order, each with its key under the dataset's root."""

    def __init__(self, keyed: Iterable[tuple[str, InputSnapshot]]):
        keys: list[bytes] = []
        uris: list[bytes] = []
        contents: list[bytes] = []
        modified: list[bytes] = []
        self._sizes = array("q")
        for key, part in keyed:  # one pass: a listing's snapshots are made one at a time, never held together
            keys.append(key.encode())
            uris.append(part.uri.encode())
            contents.append(part.content.encode())
            modified.append((part.modified or "").encode())  # "" for a store that did not say
            self._sizes.append(_NO_SIZE if part.size is None else part.size)
        self.keys, self._uris = _Strings(keys), _Strings(uris)
        self._contents, self._modified = _Strings(contents), _Strings(modified)

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
