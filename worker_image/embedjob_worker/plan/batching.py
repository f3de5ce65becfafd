"""Deterministic batches from length-sorted windows.

Padding dominates CPU cost, so batches are cut from a bounded window of records sorted
by length (longest first, ties by input position). Everything here is a pure function of the input
records and the config: a re-run over the same input forms the same batches with the
same ids, which is what lets a resumed run skip the batches already written.

With a token budget (spec.batching.maxTokens) the windows are sorted by token count (the
model's own tokenizer, capped at its token limit) and cut so that each batch's padded
size, records × its longest record's tokens, stays within the budget.

With spec.chunking each window's records are chunked first (embedjob_worker.plan.chunking) and
the chunks are what is planned: windows sorted by their records' longest chunk, cut so
that a batch holds at most batchSize chunks (and, with a budget, chunks × its longest
chunk's tokens within it). A record's chunks always stay in one batch, so the batch's one
transaction replaces all of a record's vectors at once; a record with more chunks than
that is a batch of its own, which the actor encodes `encode_batch_size` chunks at a time.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice, repeat

from embedjob_worker.core.records import Record, Span


@dataclass(frozen=True, slots=True)
class Batch:
    batch_id: str
    records: tuple[Record, ...]

    @property
    def texts(self) -> list[str]:
        """What the model encodes: each record's chunks' texts, in order (a record's whole text without chunking)."""
        return [text for r in self.records for text in r.chunk_texts()]

    def encode_batch_size(self, batch_size: int, max_tokens: int | None) -> int:
        """How many of its chunks one forward pass takes: batchSize, and within the token budget if there is one."""
        longest = max((s.tokens for r in self.records for s in r.spans), default=0)
        return min(batch_size, max(1, max_tokens // longest)) if max_tokens and longest else batch_size


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


def budget_cuts(token_counts: Sequence[int], max_tokens: int | None, batch_size: int,
                weights: Sequence[int] | None = None) -> list[int]:
    """The sizes (in records) of the consecutive batches a sequence of records is cut into, greedily.

    A record weighs `weights[i]` rows of a forward pass (its chunks; default 1). A batch grows
    while it weighs at most batch_size and its padded size (weight × the most tokens of any
    of its records) stays within max_tokens (None: no budget); a record over either on its
    own becomes a batch of one. sum(result) == len(token_counts).
    """
    sizes: list[int] = []
    size = weight = longest = 0
    for tokens, rows in zip(token_counts, weights if weights is not None else repeat(1)):
        grown = max(longest, tokens)
        if size and (weight + rows > batch_size or (max_tokens is not None and (weight + rows) * grown > max_tokens)):
            sizes.append(size)
            size, weight, grown = 0, 0, tokens
        size, weight, longest = size + 1, weight + rows, grown
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


def _chunked_cuts(window: list[Record], chunker: Callable[[list[str]], list[tuple[Span, ...]]],
                  budget: TokenBudget | None, batch_size: int, sort: bool) -> Iterator[list[Record]]:
    """One window's records with their chunks, sorted by their longest chunk (longest first, ties by
    position) unless `sort` is off, cut into batches of at most batch_size chunks (within the budget)."""
    chunked = [dataclasses.replace(r, spans=spans) for r, spans in zip(window, chunker([r.text for r in window]))]
    if sort:
        chunked.sort(key=lambda r: (-max(s.tokens for s in r.spans), r.position))
    start = 0
    prompt = getattr(chunker, "prompt_tokens", 0)  # a chunk's padded length in the model counts the prompt too
    for size in budget_cuts([max(s.tokens for s in r.spans) + prompt for r in chunked],
                            budget and budget.max_tokens, batch_size, [len(r.spans) for r in chunked]):
        yield chunked[start : start + size]
        start += size


def make_batches(records: Iterable[Record], batch_size: int, sort_window: int, key: str,
                 budget: TokenBudget | None = None,
                 chunker: Callable[[list[str]], list[tuple[Span, ...]]] | None = None) -> Iterator[Batch]:
    """Cut each window into batches of batch_size (a window's last batch may be smaller), or,
    with a token budget, into batches of at most batch_size records within the budget; with
    a chunker (spec.chunking), into batches of whole records' chunks (module docstring).

    sort_window=0 disables length bucketing: windows of one batch, i.e. input order (the
    spec allows no token budget then: it is only meaningful over length-sorted windows).
    """
    if chunker is not None:
        for window in windows(records, sort_window or batch_size):
            for cut in _chunked_cuts(window, chunker, budget, batch_size, sort=sort_window > 0):
                yield Batch(batch_id(key, (r.id for r in cut)), tuple(cut))
        return
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

