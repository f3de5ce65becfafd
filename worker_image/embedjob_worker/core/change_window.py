"""A table run's change window (spec.source.table.changeColumn): which rows it reads and the watermark it leaves.

A run of a table with a change column reads only the rows whose column is at or past the watermark the
previous run left, and the rows where it is NULL: a window read. `window_for` decides, from what the run row
records, when that is safe; otherwise the run reads every row (a full read) and says why:

- the latest run that got to start writing the same vectors (this namespace, vectors table, collection, model and
  revision; of any job: in a cluster each sync is an EmbeddingJob of its own) must have succeeded with no failed
  batch, over the same table and filter (input fingerprint) and settings (config fingerprint), and have left a
  watermark of the same column: after a failed batch, a crash, another filter (whose deleteMissing may have
  deleted vectors of these rows) or a held watermark (below), the rows since the last good watermark are not all
  known to have vectors;
- the revision must have been `ready` or `embedding` when the run started: a retired revision's vectors may have
  been dropped in part (sink.revisions), and the rows of a dropped one are gone;
- with sync.deleteMissing, every fullScanEvery-th run also reads every id, ids only (an id scan): only a run
  that read every id can tell which are gone, and the ids are all it needs of the rows outside its window;
- a resumed run reads from where its first session was to read (the window it recorded at its start).

The watermark a read leaves is taken before its first page (source.change_watermark). For a timestamp column:
the database's clock, then the start of the oldest transaction then open in the database, the earlier of the
two, less changeSkewSeconds. For an xid8 column (each row stamped with its writing transaction's
pg_current_xact_id()): the oldest transaction id still running in the read's snapshot (pg_snapshot_xmin), the
same argument with transaction ids for clocks. Why no committed change is missed (docs/table-source.md has the whole argument): a row
version the read did not see was committed by a transaction still open when the pages were read, so either
open when the clock was read (it started before it, and the oldest open transaction's start bounds its
clock) or begun after (its clock is later): either way its now() or clock_timestamp() is at or past the
watermark. A role that cannot see every session's transaction (no pg_read_all_stats) or a standby (whose
primary's transactions it cannot see) holds the watermark where the read started.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from embedjob.api import SourceTable, Sync
from embedjob.change_window_record import described

# The revision states whose vectors are whole: a window read adds only the changes to them.
WHOLE_REVISION_STATES = ("ready", "embedding")
# A watermark: a moment (a timestamp with time zone column) or a transaction id (an xid8 column).
Watermark = datetime | int


@dataclass(frozen=True)
class PreviousRun:
    """A run that got to start, as its row records it (the next run's window reads it)."""

    state: str
    batches_failed: int
    input_fingerprint: str
    config_fingerprint: str
    change_window: dict[str, Any] | None


@dataclass
class ChangeWindow:
    """The rows a table run reads (`read_from`: at or past it, or NULL; None: every row) and, once its read has
    started, the watermark it leaves for the next run (None: the next run reads every row)."""

    column: str
    read_from: Watermark | None
    window_runs: int  # runs since the last one that read every id, this one included (0: this one does)
    skew_s: int
    why_full: str | None = None  # why this run reads every row
    id_scan: str | None = None  # why this window read also reads every id of the table (sync.deleteMissing)
    watermark: Watermark | None = None
    held: str | None = None  # why the watermark stays where the read started

    def record(self) -> dict[str, Any]:
        """What the run row keeps (embedjob_runs.change_window; its keys: embedjob.change_window_record)."""
        said = {"column": self.column, "readFrom": _recorded(self.read_from), "windowRuns": self.window_runs}
        if self.why_full:
            said["whyFull"] = self.why_full
        if self.id_scan:
            said["idScan"] = self.id_scan
        if self.watermark is not None or self.held:
            said["watermark"] = _recorded(self.watermark)
        if self.held:
            said["held"] = self.held
        return said

    def described(self) -> str:
        """What the run reads and leaves, for the summary (change_window_record.described)."""
        return described(self.record()) or ""

    def hold(self, why: str) -> None:
        """The read cannot prove a later watermark: the next run reads from where this one did."""
        self.watermark, self.held = self.read_from, why


def _recorded(watermark: Watermark | None) -> str | int | None:
    """A watermark as the run row keeps it: a moment in ISO 8601, a transaction id as a number."""
    return watermark.isoformat() if isinstance(watermark, datetime) else watermark


def _watermark(recorded: Any) -> Watermark | None:
    if isinstance(recorded, str):
        return datetime.fromisoformat(recorded)
    return recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else None


def window_for(table: SourceTable | None, sync: Sync, fingerprints: tuple[str, str], revision_state: str | None,
               previous: PreviousRun | None, resumed: bool) -> ChangeWindow | None:
    """The change window of a run of `table` (None: the table has no change column, or the source is no table).
    `fingerprints` are the run's input and config fingerprints, `revision_state` the state its revision had when
    it started (None: no row), `previous` the latest run that got to start writing the same vectors before it
    (for a resumed run: the run itself, whose recorded window it keeps)."""
    if table is None or table.change_column is None:
        return None
    column = table.change_column

    def full(why: str) -> ChangeWindow:
        return ChangeWindow(column, None, 0, table.skew_seconds, why_full=why)

    recorded = previous.change_window if previous is not None else None
    if not recorded or recorded.get("column") != column:
        return full("no earlier run read this table by this change column")
    if revision_state not in WHOLE_REVISION_STATES:
        return full(f"the revision was {revision_state or 'not recorded'} when the run started: its vectors may "
                    "not all be there")
    if resumed:
        start = _watermark(recorded.get("readFrom"))
        return ChangeWindow(column, start, int(recorded.get("windowRuns") or 0) if start else 0,
                            table.skew_seconds, why_full=None if start else recorded.get("whyFull"),
                            id_scan=recorded.get("idScan") if start else None)
    assert previous is not None
    if (previous.input_fingerprint, previous.config_fingerprint) != fingerprints:
        return full("the latest run that wrote these vectors read another table, filter or settings")
    if previous.state != "succeeded" or previous.batches_failed:
        return full(f"the latest run that wrote these vectors {previous.state}"
                    f"{f' with {previous.batches_failed} failed batches' if previous.batches_failed else ''}")
    watermark = _watermark(recorded.get("watermark"))
    if watermark is None:
        return full("the latest run that wrote these vectors left no watermark"
                    f"{': ' + recorded['held'] if recorded.get('held') else ''}")
    window_runs = int(recorded.get("windowRuns") or 0) + 1
    if sync.delete_missing and window_runs >= (sync.full_scan_every or 1):
        return ChangeWindow(column, watermark, 0, table.skew_seconds, id_scan=(
            f"sync.deleteMissing reads every id every {sync.full_scan_every} runs (sync.fullScanEvery)"
            if sync.full_scan_every else "sync.deleteMissing without sync.fullScanEvery reads every id in every run"))
    return ChangeWindow(column, watermark, window_runs, table.skew_seconds)
