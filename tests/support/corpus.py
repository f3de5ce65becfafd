"""The PEP paragraphs the tests read, from the repository's compressed copy (data/)."""

from __future__ import annotations

import lzma
from itertools import islice

from support.paths import CORPUS


def corpus_lines(start: int, count: int) -> list[bytes]:
    """Lines `start` .. `start + count - 1` of the corpus (each with its newline)."""
    with lzma.open(CORPUS, "rb") as f:
        return list(islice(f, start, start + count))

