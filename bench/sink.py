"""Rows/s of the PostgreSQL sink alone: 384-dim vectors upserted the way the driver writes them.

Groups of 64 batches of 64 rows per transaction (the driver's largest group), binary
COPY into the staging table, one merge. Three passes over the same keys: fresh inserts,
an identical re-write (a re-run: the merge skips unchanged rows) and a re-write with
changed texts (every row updated).

    python bench/sink.py [--rows 100000] [--rounds 3]

Each round starts a fresh database; the table gives each pass's median and range.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from rounds import report, run_rounds

from embedjob_worker.records import Record
from embedjob_worker.sink import AttemptRow, BatchOutcome, PostgresSink, content_salt, now

DIM = 384
BATCH_ROWS = 64
GROUP_BATCHES = 64


def outcomes(rows: int, suffix: str) -> list[BatchOutcome]:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((rows, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    # ~220 characters: the mean length of a PEP paragraph.
    records = [Record(i, f"rec-{i}", f"paragraph {i} {suffix} " + "lorem ipsum dolor " * 11) for i in range(rows)]
    return [BatchOutcome(f"batch-{start}", "succeeded", tuple(records[start:start + BATCH_ROWS]),
                         [AttemptRow(1, "bench", "succeeded", None, now())], now(),
                         vectors=vectors[start:start + BATCH_ROWS], worker="bench")
            for start in range(0, rows, BATCH_ROWS)]


def timed_pass(sink: PostgresSink, run_id: str, batches: list[BatchOutcome]) -> float:
    started = time.perf_counter()
    for start in range(0, len(batches), GROUP_BATCHES):
        sink.write(run_id, batches[start:start + GROUP_BATCHES], [], {})
    return sum(len(b.records) for b in batches) / (time.perf_counter() - started)


def one_round(rows: int) -> dict[str, float]:
    """A fresh database; the three passes in rows/s."""
    import pgserver

    with tempfile.TemporaryDirectory() as tmp:
        server = pgserver.get_server(Path(tmp) / "pgdata", cleanup_mode="delete")
        try:
            sink = PostgresSink(server.get_uri(), "bench/sink", "bench", "embeddings", content_salt(True, None))
            sink.migrate()
            sink.ensure_vectors_table(DIM)
            run = sink.start_run("sink", "bench", "m", "r", "input", "config", new_run=False)
            fresh = outcomes(rows, "v1")
            figures = {
                "insert (new rows)": timed_pass(sink, run.run_id, fresh),
                "re-write, unchanged rows": timed_pass(sink, run.run_id, fresh),
                "re-write, changed texts": timed_pass(sink, run.run_id, outcomes(rows, "v2")),
            }
            sink.close()
            return figures
        finally:
            server.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.rows} rows of vector({DIM}), {BATCH_ROWS} rows/batch, {GROUP_BATCHES} batches/transaction")
    print(report(run_rounds({"sink": lambda: one_round(args.rows)}, rounds=args.rounds), unit="rows/s"))


if __name__ == "__main__":
    main()
