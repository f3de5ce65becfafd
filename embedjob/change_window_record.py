"""What `embedjob_runs.change_window` holds (the driver writes it, the operator shows it), and how it reads.

A table run read by spec.source.table.changeColumn records its window (embedjob_worker.core.change_window): the
column, `readFrom` (the watermark it read from: a moment, or an xid8 column's transaction id; null: every row),
`windowRuns` (runs since the last one that read every id), `whyFull` (why it read every row), `idScan` (why a
window read also read every id, ids only, for sync.deleteMissing), and, once its read started, `watermark`
(what the next run may read from; null: every row) and `held` (why the watermark could not advance).
"""

from __future__ import annotations

from typing import Any


def described(recorded: dict[str, Any] | None) -> str | None:
    """`changed since <readFrom> (or <column> NULL)[, and every id (<why>)]; watermark left <watermark>`, or
    `every row (<why>); ...`; None for a run without a change window."""
    if not recorded:
        return None
    column = recorded.get("column")
    read = (f"changed since {_named(recorded['readFrom'])} (or {column} NULL)" if recorded.get("readFrom")
            else f"every row ({recorded.get('whyFull') or 'a full read'})")
    if recorded.get("readFrom") and recorded.get("idScan"):
        read += f", and every id ({recorded['idScan']})"
    if recorded.get("held"):
        left = f"watermark held ({recorded['held']})"
    elif recorded.get("watermark"):
        left = f"watermark left {_named(recorded['watermark'])}"
    else:
        left = "no watermark yet" if "watermark" not in recorded else "no watermark left"
    return f"{read}; {left}"


def _named(watermark: Any) -> str:
    """A moment as recorded; a transaction id (an xid8 column's watermark) said to be one."""
    return f"transaction {watermark}" if isinstance(watermark, int) else str(watermark)
