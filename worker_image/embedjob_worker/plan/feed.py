"""The input feed: the source's records, classified, cut into the batches this run still has to embed."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import psycopg

from embedjob.api import EmbeddingJobSpec

from embedjob_worker.plan.batching import Batch, TokenBudget, make_batches
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.metrics import DriverMetrics
from embedjob_worker.core.records import BadRecord, RawRecord, Record, Span
from embedjob_worker.plan.checks import IdRegistry, classify_records
from embedjob_worker.core.outcome import DoneBatch
from embedjob_worker.source.files import source_records
from embedjob_worker.source.snapshot import InputSnapshot
from embedjob_worker.core.tally import RunTally

# Bad records are handed to the writer at least every this many, valid batches or not: a
# wrong textField (every record bad) must not hold the whole input in memory.
BAD_RECORDS_GROUP = 1000
# Consecutive batches are checked against the stored hashes together, up to this many records
# (one query a group; a sort window's worth, which make_batches holds in memory anyway).
LOOKUP_RECORDS = 4096


@dataclass(frozen=True)
class FeedPlan:
    """What the feed reads and how it cuts it into batches."""

    spec: EmbeddingJobSpec  # its source is read, cut into batches by its batching
    uri: str  # the input (files.resolve_uri; a table source's table.table_uri)
    key: str  # batch ids derive from it (batching.batch_key)
    source_database_url: str | None = None  # where a table source is read
    # spec.chosen_batching.max_tokens: batches cut by padded tokens instead of by count
    budget: TokenBudget | None = None
    # spec.chunking: each record cut into chunks, and batches hold whole records' chunks
    chunker: Callable[[list[str]], list[tuple[Span, ...]]] | None = None
    files: tuple[InputSnapshot, ...] = ()  # a dataset's files as the run listed them (dataset.DatasetSnapshot)


@dataclass(frozen=True)
class FeedSkips:
    """What the feed leaves out: duplicate ids, batches an earlier session wrote, records up to date."""

    # Decides duplicate ids (checks.classify_records; the driver's keeps them in PostgreSQL); None: in memory.
    ids: IdRegistry | None = None
    done_before: Mapping[str, DoneBatch] = field(default_factory=dict)  # the batches an earlier session wrote, by id
    # The part of each of a group of batches (up to LOOKUP_RECORDS records) the model still has to embed, None for a
    # batch with nothing left (incremental.IncrementalFeed).
    to_embed: Callable[[list[Batch]], Sequence[Batch | None]] | None = None


def batches_to_embed(plan: FeedPlan, skips: FeedSkips, tally: RunTally, metrics: DriverMetrics,
                     on_bad_records: Callable[[list[BadRecord]], None]) -> Iterator[Batch]:
    """Stream the batches of valid records `plan` makes, less what `skips` leaves out.

    Bad records go to `on_bad_records` before the next group of batches, or once BAD_RECORDS_GROUP of
    them have piled up; once the input has been read through, the tally learns its totals.
    """
    bad: list[BadRecord] = []
    positions = itertools.count()

    def valid(raw_records: Iterable[RawRecord]) -> Iterator[Record]:
        for item in classify_records(raw_records, skips.ids):
            next(positions)
            match item:
                case Record():
                    yield item
                case BadRecord():
                    bad.append(item)
                    if len(bad) >= BAD_RECORDS_GROUP:
                        hand_over_bad()

    def hand_over_bad() -> None:
        if bad:
            tally.rejected(len(bad))
            metrics.records.labels("failed").inc(len(bad))
            on_bad_records(list(bad))
            bad.clear()

    chosen, done_before, to_embed = plan.spec.chosen_batching, skips.done_before, skips.to_embed
    raw = source_records(plan.spec.source, plan.uri, plan.source_database_url, plan.files)
    total = 0
    try:
        for group in lookup_groups(make_batches(valid(raw), chosen.batch_size, plan.spec.batching.sort_window, plan.key,
                                                plan.budget, plan.chunker)):
            hand_over_bad()
            total += len(group)
            pending = []
            for batch in group:
                if batch.batch_id in done_before:
                    tally.skipped(done_before[batch.batch_id])
                    metrics.batches.labels("skipped").inc()
                else:
                    pending.append(batch)
            for batch in (pending if to_embed is None else to_embed(pending)):
                if batch is None:
                    metrics.batches.labels("skipped").inc()
                else:
                    yield batch
    except (OSError, ValueError, KeyError, psycopg.Error) as exc:
        raise JobFailed("SourceUnreadable", f"reading {plan.uri}: {type(exc).__name__}: {exc}") from None
    hand_over_bad()
    tally.input_read(batches=total, records=next(positions))


def lookup_groups(batches: Iterable[Batch]) -> Iterator[list[Batch]]:
    """Consecutive batches in lists of at least one batch and at most LOOKUP_RECORDS records (unless one holds more)."""
    group: list[Batch] = []
    records = 0
    for batch in batches:
        if group and records + len(batch.records) > LOOKUP_RECORDS:
            yield group
            group, records = [], 0
        group.append(batch)
        records += len(batch.records)
        if records >= LOOKUP_RECORDS:  # full: not held until the next batch (the next window) is read
            yield group
            group, records = [], 0
    if group:
        yield group
