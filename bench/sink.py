"""Rows/s of the PostgreSQL sink alone: 384-dim vectors upserted the way the driver writes them.

Groups of 64 batches of 64 rows per transaction (the driver's largest group), binary
COPY into the staging table, one merge. Three passes over the same keys: fresh inserts,
an identical re-write (a re-run: the merge skips unchanged rows) and a re-write with
changed texts (every row updated).

    python bench/sink.py [--rows 100000] [--rounds 3] [--vector-types vector halfvec]

Each round starts a fresh database per vector type (spec.sink.vectorType; the types alternate
within a round); the table gives each pass's median and range, and the vectors table's size
after the passes (pg_total_relation_size: heap, TOAST and the primary key, no vector index).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import sqlalchemy as sa
from rounds import report, run_rounds

from embedjob import schema
from embedjob_worker.sink.copy_data import content_salt
from embedjob_worker.core.outcome import AttemptRow, BatchOutcome, now
from embedjob_worker.core.records import Record
from embedjob_worker.sink.postgres import PostgresSink, open_engine
from embedjob_worker.sink.runs import JobRuns, RunRequest, RunSession
from embedjob_worker.sink.target import SinkTarget
from embedjob_worker.sink.vectors_table import ensure_vectors_table

DIM = 384
BATCH_ROWS = 64
GROUP_BATCHES = 64


def outcomes(rows: int, suffix: str, new: bool) -> list[BatchOutcome]:
    """The batches, labelled as the driver labels them: all records new to the table, or all changed."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((rows, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    # ~220 characters: the mean length of a PEP paragraph.
    records = [Record(i, f"rec-{i}", f"paragraph {i} {suffix} " + "lorem ipsum dolor " * 11) for i in range(rows)]
    batches = [tuple(records[start:start + BATCH_ROWS]) for start in range(0, rows, BATCH_ROWS)]
    return [BatchOutcome(f"batch-{k}", "succeeded", batch, [AttemptRow(1, "bench", "succeeded", None, now())], now(),
                         vectors=vectors[k * BATCH_ROWS:(k + 1) * BATCH_ROWS], worker="bench",
                         **{"records_new" if new else "records_changed": len(batch)})
            for k, batch in enumerate(batches)]


def timed_pass(sink: PostgresSink, run: RunSession, batches: list[BatchOutcome]) -> float:
    started = time.perf_counter()
    for start in range(0, len(batches), GROUP_BATCHES):
        sink.write(run, batches[start:start + GROUP_BATCHES], [])
    return sum(len(b.records) for b in batches) / (time.perf_counter() - started)


@contextmanager
def fresh_sink(dim: int, vector_type: str = "vector", job: str = "sink"):
    """A sink on a new database (its own PostgreSQL in a temp dir), with its vectors table of `dim` and its run
    started."""
    import pgserver

    with tempfile.TemporaryDirectory() as tmp:
        server = pgserver.get_server(Path(tmp) / "pgdata", cleanup_mode="delete")
        try:
            schema.migrate(server.get_uri())
            engine = open_engine(server.get_uri())
            target = SinkTarget(f"bench/{job}", "bench", "embeddings", content_salt(True, None), vector_type,
                                schema="public")
            ensure_vectors_table(engine, target.vectors, dim, vector_type)
            start = JobRuns(engine, target, job, "bench").start(RunRequest("m", "r", "input", "config"), new_run=False)
            yield PostgresSink(engine, target), start.run
            engine.dispose()
        finally:
            server.cleanup()


def one_round(rows: int, vector_type: str = "vector") -> dict[str, float]:
    """A fresh database; the three passes in rows/s, and the table's size in MB."""
    with fresh_sink(DIM, vector_type) as (sink, run):
        figures = {
            "insert (new rows)": timed_pass(sink, run, outcomes(rows, "v1", new=True)),
            # new outcomes of the same texts: a re-run
            "re-write, unchanged rows": timed_pass(sink, run, outcomes(rows, "v1", new=False)),
            "re-write, changed texts": timed_pass(sink, run, outcomes(rows, "v2", new=False)),
        }
        with sink.engine.connect() as conn:
            size = conn.execute(sa.text("SELECT pg_total_relation_size('embeddings')")).scalar_one()
        figures["table size (MB, not rows/s)"] = size / 2**20
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vector-types", nargs="+", choices=["vector", "halfvec"], default=["vector"])
    args = parser.parse_args()
    print(f"{args.rows} rows of {'/'.join(args.vector_types)}({DIM}), {BATCH_ROWS} rows/batch, "
          f"{GROUP_BATCHES} batches/transaction")
    contenders = {f"sink {t}": lambda t=t: one_round(args.rows, t) for t in args.vector_types}
    print(report(run_rounds(contenders, rounds=args.rounds), unit="rows/s"))


if __name__ == "__main__":
    main()
