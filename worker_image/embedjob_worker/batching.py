"""Deterministic batches from length-sorted windows.

Padding dominates CPU cost, so batches are cut from a bounded window of records sorted
by length (longest first, ties by input position). Everything here is a pure function of the input
records and the config: a re-run over the same input forms the same batches with the
same ids, which is what lets a resumed run skip the batches already written.

With a token budget (spec.batching.maxTokens) the windows are sorted by token count (the
model's own tokenizer, capped at its token limit) and cut so that each batch's padded
size, records × its longest record's tokens, stays within the budget.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

from .records import Record


@dataclass(frozen=True, slots=True)
class Batch:
    batch_id: str
    records: tuple[Record, ...]

    @property
    def texts(self) -> list[str]:
        return [r.text for r in self.records]


def batch_id(batch_key: str, record_ids: Iterable[str]) -> str:
    """Stable id of a batch: the job's input+config fingerprint and its record ids, in order."""
    digest = hashlib.sha256(batch_key.encode())
    for record_id in record_ids:
        digest.update(b"\x00")
        digest.update(record_id.encode("utf-8"))
    return digest.hexdigest()[:32]


def batch_key(input_fingerprint: str, config_fingerprint: str) -> str:
    return hashlib.sha256(f"{input_fingerprint}:{config_fingerprint}".encode()).hexdigest()


def estimated_batches(records: int, batch_size: int, sort_window: int) -> int:
    """How many batches make_batches cuts from `records` valid records (exact when none is bad)."""
    window = sort_window or batch_size
    full, rest = divmod(records, window)
    return full * -(-window // batch_size) + -(-rest // batch_size)


def windows(records: Iterable[Record], window_size: int) -> Iterator[list[Record]]:
    """Consecutive lists of at most window_size records, in input order."""
    iterator = iter(records)
    while window := list(islice(iterator, window_size)):
        yield window


def length_sorted_windows(records: Iterable[Record], window_size: int) -> Iterator[list[Record]]:
    """Consecutive windows of at most window_size records, each sorted longest first (ties by position).

    Longest first, because an actor that meets its largest batch shape first allocates
    once and reuses the memory; in ascending order every batch is a little larger than
    the last, and on CPU the re-allocations halved throughput (bench/throughput.py).
    """
    for window in windows(records, window_size):
        window.sort(key=lambda r: (-len(r.text), r.position))
        yield window


@dataclass(frozen=True)
class TokenBudget:
    """spec.batching.maxTokens and how to count a text's tokens (capped at the model's limit)."""

    max_tokens: int
    count: Callable[[list[str]], list[int]]


def budget_cuts(token_counts: Sequence[int], max_tokens: int, batch_size: int) -> list[int]:
    """The sizes of the consecutive batches a sequence of records is cut into, greedily.

    A batch grows while it holds at most batch_size records and its padded size (records ×
    the most tokens of any of them) stays within max_tokens; a record over the budget on
    its own becomes a batch of one. sum(result) == len(token_counts).
    """
    sizes: list[int] = []
    size = longest = 0
    for tokens in token_counts:
        grown = max(longest, tokens)
        if size and (size == batch_size or (size + 1) * grown > max_tokens):
            sizes.append(size)
            size, grown = 0, tokens
        size, longest = size + 1, grown
    if size:
        sizes.append(size)
    return sizes


def _token_sorted_cuts(window: list[Record], budget: TokenBudget, batch_size: int) -> Iterator[list[Record]]:
    """One window sorted by tokens, longest first (ties by position), cut within the budget."""
    counted = sorted(zip(budget.count([r.text for r in window]), window), key=lambda pair: (-pair[0], pair[1].position))
    start = 0
    for size in budget_cuts([tokens for tokens, _ in counted], budget.max_tokens, batch_size):
        yield [record for _, record in counted[start : start + size]]
        start += size


def make_batches(records: Iterable[Record], batch_size: int, sort_window: int, key: str,
                 budget: TokenBudget | None = None) -> Iterator[Batch]:
    """Cut each window into batches of batch_size (a window's last batch may be smaller), or,
    with a token budget, into batches of at most batch_size records within the budget.

    sort_window=0 disables length bucketing: windows of one batch, i.e. input order (the
    spec allows no token budget then: it is only meaningful over length-sorted windows).
    """
    if budget is not None:
        for window in windows(records, sort_window or batch_size):
            for chunk in _token_sorted_cuts(window, budget, batch_size):
                yield Batch(batch_id(key, (r.id for r in chunk)), tuple(chunk))
        return
    chunks = length_sorted_windows(records, sort_window) if sort_window else windows(records, batch_size)
    for window in chunks:
        for start in range(0, len(window), batch_size):
            chunk = tuple(window[start : start + batch_size])
            yield Batch(batch_id(key, (r.id for r in chunk)), chunk)

