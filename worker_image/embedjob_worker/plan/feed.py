"""The input feed: the source's records, classified, cut into the batches this run still has to embed."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import psycopg

from embedjob.api import EmbeddingJobSpec

from embedjob_worker.plan.batching import Batch, TokenBudget, make_batches
from embedjob_worker.core.change_window import ChangeWindow
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.metrics import DriverMetrics
from embedjob_worker.core.logs import log_event
from embedjob_worker.core.records import BadRecord, RawRecord, Record, Span
from embedjob_worker.core.shards import ShardRead, shard_records
from embedjob_worker.plan.checks import IdRegistry, classify_records
from embedjob_worker.core.outcome import DoneBatch
from embedjob_worker.source.dataset_reader import DatasetReader
from embedjob_worker.source.files import source_records
from embedjob_worker.source.snapshot import InputSnapshot
from embedjob_worker.core.tally import RunTally

# Bad records are handed to the writer at least every this many, valid batches or not: a
# wrong textField (every record bad) must not hold the whole input in memory.
BAD_RECORDS_GROUP = 1000
# Consecutive batches are checked against the stored hashes together, up to this many records
# (one query a group; a sort window's worth, which make_batches holds in memory anyway).
LOOKUP_RECORDS = 4096

log = logging.getLogger("embedjob_worker.plan.feed")


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
    files: Sequence[InputSnapshot] = ()  # a dataset's files as the run listed them (dataset.DatasetSnapshot)
    window: ChangeWindow | None = None  # a table read by its change column: the rows it reads, its watermark


@dataclass(frozen=True)
class FeedSkips:
    """What the feed leaves out: duplicate ids, batches an earlier session wrote, records up to date."""

    # Decides duplicate ids (checks.classify_records; the driver's keeps them in PostgreSQL); None: in memory.
    ids: IdRegistry | None = None
    done_before: Mapping[str, DoneBatch] = field(default_factory=dict)  # the batches an earlier session wrote, by id
    # The part of each of a group of batches (up to LOOKUP_RECORDS records) the model still has to embed, None for a
    # batch with nothing left (incremental.IncrementalFeed).
    to_embed: Callable[[list[Batch]], Sequence[Batch | None]] | None = None
    # A dataset's shards an earlier session of the run read through, by their first file (sink.runs.shards_read).
    shards_read: Mapping[int, ShardRead] = field(default_factory=dict)


def batches_to_embed(plan: FeedPlan, skips: FeedSkips, tally: RunTally, metrics: DriverMetrics,
                     on_bad_records: Callable[[list[BadRecord]], None],
                     on_shard_read: Callable[[ShardRead], None] = lambda shard: None) -> Iterator[Batch]:
    """Stream the batches of valid records `plan` makes, less what `skips` leaves out.

    Bad records go to `on_bad_records` before the next group of batches, or once BAD_RECORDS_GROUP of
    them have piled up; a dataset's shard read through goes to `on_shard_read` after its bad records.
    Once the input has been read through, the tally learns its totals.
    """
    feed = _Feed(plan, skips, tally, metrics, on_bad_records)
    try:
        if plan.files:
            yield from feed.dataset_batches(on_shard_read)
        else:
            yield from feed.batches(source_records(plan.spec.source, plan.uri, plan.source_database_url, plan.window))
    except (OSError, ValueError, KeyError, psycopg.Error) as exc:
        raise JobFailed("SourceUnreadable", f"reading {plan.uri}: {type(exc).__name__}: {exc}") from None
    feed.hand_over_bad()
    tally.input_read(batches=feed.total, records=feed.position)


class _Feed:
    """The feed's state as it reads: the bad records not yet handed over, the records (positions) and batches
    read so far, and the batches sent on to the model since `sent` was last emptied."""

    def __init__(self, plan: FeedPlan, skips: FeedSkips, tally: RunTally, metrics: DriverMetrics,
                 on_bad_records: Callable[[list[BadRecord]], None]):
        self.plan, self.skips, self.tally, self.metrics, self.on_bad_records = plan, skips, tally, metrics, on_bad_records
        self.bad: list[BadRecord] = []
        self.position = self.total = 0
        self.sent: list[str] = []

    def batches(self, raw: Iterable[RawRecord]) -> Iterator[Batch]:
        """The batches to embed of `raw`'s records, cut afresh (windows never reach across two calls)."""
        chosen, plan = self.plan.spec.chosen_batching, self.plan
        done_before, to_embed = self.skips.done_before, self.skips.to_embed
        for group in lookup_groups(make_batches(self._valid(raw), chosen.batch_size, plan.spec.batching.sort_window,
                                                plan.key, plan.budget, plan.chunker)):
            self.hand_over_bad()
            self.total += len(group)
            pending = []
            for batch in group:
                if batch.batch_id in done_before:
                    self.tally.skipped(done_before[batch.batch_id])
                    self.metrics.batches.labels("skipped").inc()
                else:
                    pending.append(batch)
            for batch in (pending if to_embed is None else to_embed(pending)):
                if batch is None:
                    self.metrics.batches.labels("skipped").inc()
                else:
                    self.sent.append(batch.batch_id)
                    yield batch

    def dataset_batches(self, on_shard_read: Callable[[ShardRead], None]) -> Iterator[Batch]:
        """A dataset's batches, a shard at a time (core.shards); a shard an earlier session read through, and whose
        batches were all written, is counted as it was read then, not read again."""
        spec, files = self.plan.spec, self.plan.files
        window = spec.batching.sort_window or spec.chosen_batching.batch_size
        source = spec.source
        with DatasetReader(files, source.format, source.id_field, source.text_of, source.metadata) as reader:
            first_file = 0
            while first_file < len(files):
                done = self.skips.shards_read.get(first_file)
                if done is not None and all(batch_id in self.skips.done_before for batch_id in done.batch_ids):
                    self._count_again(done)
                    first_file += done.files
                    continue
                before, first_position, first_batch = self.tally.driver_counts(), self.position, self.total
                self.sent = []
                yield from self.batches(reader.shard(first_file, self.position, shard_records(window)))
                self.hand_over_bad()
                on_shard_read(ShardRead(first_file, reader.next_file - first_file, self.position - first_position,
                                        self.total - first_batch, self.tally.driver_counts() - before,
                                        tuple(self.sent)))
                first_file = reader.next_file

    def _count_again(self, shard: ShardRead) -> None:
        """A shard read through by an earlier session, counted as reading it again would: what its reading
        counted then, and each batch it sent to the model as written before."""
        self.tally.add_driver_counts(shard.counts)
        for batch_id in shard.batch_ids:
            self.tally.skipped(self.skips.done_before[batch_id])
        self.metrics.batches.labels("skipped").inc(shard.counts.batches_skipped + len(shard.batch_ids))
        self.metrics.records.labels("failed").inc(shard.counts.records_rejected)
        self.position += shard.records
        self.total += shard.batches
        log_event(log, "shard_skipped", first_file=shard.first_file, files=shard.files, records=shard.records,
                  batches=shard.batches)

    def _valid(self, raw_records: Iterable[RawRecord]) -> Iterator[Record]:
        for item in classify_records(raw_records, self.skips.ids):
            self.position += 1
            match item:
                case Record():
                    yield item
                case BadRecord():
                    self.bad.append(item)
                    if len(self.bad) >= BAD_RECORDS_GROUP:
                        self.hand_over_bad()

    def hand_over_bad(self) -> None:
        if self.bad:
            self.tally.rejected(len(self.bad))
            self.metrics.records.labels("failed").inc(len(self.bad))
            self.on_bad_records(list(self.bad))
            self.bad.clear()


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
