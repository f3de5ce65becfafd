"""A dataset's shards: consecutive files read as a unit, and what a session that read one through records of it.

A dataset (spec.source.uri a prefix or glob) is read a shard at a time: its files in listing order,
a shard ending at the end of the first file by which it holds SHARD_WINDOWS sort windows of records
(windows, and so batches, never cross a shard's end: the same files give the same shards and the
same batches, read in one session or over several). Once a shard has been read through, its
ShardRead is written (embedjob_run_shards, in the writer's order: after the shard's bad records);
a resumed session skips a shard whose batches have all been written, adding its counts instead of
reading its files again.
"""

from __future__ import annotations

from dataclasses import dataclass

from embedjob_worker.core.tally import DriverCounts

# A shard holds at least this many sort windows of records (unless the dataset ends first): its last window
# may be short, so a shard of more windows costs fewer partial batches; one of fewer, less to read again.
SHARD_WINDOWS = 4


@dataclass(frozen=True)
class ShardRead:
    """A shard one session read through: where it starts and ends in the listing, and what reading it added."""

    first_file: int  # its first file's place in the run's listing
    files: int
    records: int  # positions, bad records included
    batches: int  # every batch its records were cut into (the run's batches_total counts them)
    counts: DriverCounts  # what its reading added to the driver's counts
    batch_ids: tuple[str, ...]  # the batches it sent to the model: all written, and the shard is done


def shard_records(window: int) -> int:
    """How many records a shard holds at least (its last file may take it past that)."""
    return SHARD_WINDOWS * window
