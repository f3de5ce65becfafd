"""The CSV input split into whole records, quote-aware, so that a record over the limit is skipped to its real end.

The csv module, after "field larger than field limit", starts again on the next physical
line, which may still be inside a quoted cell: the cell's own lines would become records.
Here a record ends only at a line break outside quotes, found by the rules of the csv
module's default dialect (a quote opens a quoted cell only at the start of a cell, `""`
inside one is a quote, and after the closing quote the cell goes on unquoted), so the
inside of a cell is never read as records. A record over the limit is skipped in bounded
pieces to that end; a quoted cell that never closes refuses the rest of the file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import IO

from embedjob_worker.core.records import BadReason

# Read a line at most this long at a time: a skipped record costs this much memory, not its size.
_PIECE_CHARS = 1024 * 1024
_UNQUOTED_CELL_END = re.compile(r"[,\r\n]")
# A quoted cell's text up to its closing quote: anything but a quote, or `""` (one quote).
_QUOTED_TEXT = re.compile(r'[^"]*(?:""[^"]*)*')


class _State(Enum):
    CELL_START = "cell start"
    UNQUOTED = "unquoted cell"
    QUOTED = "quoted cell"
    QUOTE_IN_QUOTED = "quote in a quoted cell"  # a closing quote, or the first of `""`


@dataclass(frozen=True, slots=True)
class SkippedCsvRecord:
    """A CSV record that is not read: the reason to record it with, and what and where it was."""

    reason: BadReason
    detail: str


def scan_piece(piece: str, state: _State) -> tuple[_State, bool]:
    """The parser's state after `piece` read from `state`, and whether a record ended in it.

    A record ends at a line break outside quotes; `piece` holds at most one line break, at
    its end (it is one readline), so an ended record ends with `piece`.
    """
    pos, size = 0, len(piece)
    while pos < size:
        if state is _State.QUOTED:
            pos = _QUOTED_TEXT.match(piece, pos).end()
            if pos == size:
                return state, False
            state, pos = _State.QUOTE_IN_QUOTED, pos + 1
            continue
        char = piece[pos]
        if state is _State.QUOTE_IN_QUOTED and char == '"':
            state, pos = _State.QUOTED, pos + 1
        elif char in "\r\n":
            return _State.CELL_START, True
        elif char == ",":
            state, pos = _State.CELL_START, pos + 1
        elif state is _State.CELL_START and char == '"':
            state, pos = _State.QUOTED, pos + 1
        else:  # an ordinary character: the cell goes on unquoted, where quotes are text
            found = _UNQUOTED_CELL_END.search(piece, pos)
            if found is None:
                return _State.UNQUOTED, False
            state, pos = _State.UNQUOTED, found.start()
    return state, False


def csv_records(text: IO[str], limit: int) -> Iterator[str | SkippedCsvRecord]:
    """The records of a CSV text stream, each the text of one record (its quoted line breaks
    inside), or a SkippedCsvRecord for one over `limit` characters or one left open at the end."""
    lines_read = 0
    while True:
        first_line = lines_read + 1
        pieces: list[str] = []
        size, state, ended = 0, _State.CELL_START, False
        while not ended:
            piece = text.readline(_PIECE_CHARS)
            if not piece:
                break
            lines_read += piece[-1] in "\r\n"
            size += len(piece)
            state, ended = scan_piece(piece, state)
            if size <= limit:
                pieces.append(piece)
            else:
                pieces.clear()  # over the limit: only its end is looked for now
        if size == 0:
            return
        if not ended and state is _State.QUOTED:
            yield SkippedCsvRecord(BadReason.malformed_record, (
                f"record from line {first_line}: a quoted cell that never closes; the rest of the file "
                f"({size} characters, {lines_read - first_line + 1} lines) is not read"))
            return
        if size > limit:
            last_line = lines_read if ended else lines_read + 1  # the file's last line has no line break
            yield SkippedCsvRecord(BadReason.oversized_record, (
                f"record from line {first_line} to {last_line}: {size} characters, over the limit of {limit}"))
        else:
            yield "".join(pieces)
