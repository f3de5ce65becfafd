"""The whole driver and its bookkeeping as the input grows (10⁵ to 10⁷ records), on a model that costs next to nothing.

Each size is a dataset of `--files` JSONL files (a folder: each file a shard of the run's listing), records
generated as bench/memory.py generates them: about 250 characters of text, 1% bad records (null text), 0.1% ids
that repeat an earlier one, across files too. Every run is a new job on one local Ray cluster and one embedded
PostgreSQL (bench/memory.py's FullDriver: the driver's own entrypoint in a fresh process), embedded by the null
model (bench/null_model.py, 16 dimensions), written to a vectors table of its own that is dropped after the run.

Per run, per record (a figure that stays flat as the input grows is one that scales):
  driver RSS     the driver process's peak RSS (MB; not per record)
  driver CPU     the driver process's CPU (every thread, Ray's own included), µs a record
  wall           µs a record, from the driver's start to its exit
  PostgreSQL CPU the server's backends, µs a record (a backend's CPU counts once it exits: the driver's and its
                 actors' connections close with the job)
  bookkeeping    bytes a record at the run's peak (sampled every second) of embedjob_batches,
                 embedjob_batch_attempts, embedjob_seen_ids, embedjob_record_errors, embedjob_runs and
                 embedjob_run_shards (embedjob_seen_ids is compacted before each run: it is emptied at a run's
                 end and its free pages would otherwise hide the next run's growth), and of the vectors table

Sizes alternate in each round (bench/rounds.py).

    HF_HUB_OFFLINE=1 python bench/scale.py [--sizes 100000 1000000 10000000] [--files 64] [--rounds 3]
                                           [--batch-size 512] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import sqlalchemy as sa
from memory import FullDriver, distinct_valid, generate
from null_model import build_null_model
from rounds import Figures, report, run_rounds

BOOKKEEPING = ("embedjob_batches", "embedjob_batch_attempts", "embedjob_seen_ids", "embedjob_record_errors",
               "embedjob_runs", "embedjob_run_shards")
SAMPLE_SECONDS = 1.0
# The job's connections close with its driver and actors; their backends exit (and count) within this.
BACKENDS_EXIT_SECONDS = 1.0
FIGURES = {"driver_rss_mb": "driver peak RSS (MB)", "driver_cpu_us": "driver CPU (µs a record)",
           "wall_us": "wall (µs a record)", "postgres_cpu_us": "PostgreSQL CPU (µs a record)",
           "bookkeeping_bytes": "bookkeeping (bytes a record)", "vectors_bytes": "vectors table (bytes a record)"}


def generate_dataset(folder: Path, records: int, files: int) -> None:
    """`records` records in `files` files, ids running on from one file to the next."""
    folder.mkdir(parents=True)
    bounds = [records * k // files for k in range(files + 1)]
    for k in range(files):
        generate(folder / f"part-{k:05d}.jsonl", bounds[k + 1] - bounds[k], first=bounds[k])


def table_sizes(engine: sa.Engine, tables: tuple[str, ...]) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT relname, pg_total_relation_size(oid) FROM pg_class "
                                    "WHERE relkind = 'r' AND relname = ANY(:names)"), {"names": list(tables)})
        return {name: size for name, size in rows}


def postgres_cpu_seconds(pgdata: Path) -> float:
    """CPU of the postmaster's exited children (its backends), and its own."""
    pid = int((pgdata / "postmaster.pid").read_text().split()[0])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    return (utime + stime + cutime + cstime) / os.sysconf("SC_CLK_TCK")


class PeakSizes:
    """The largest size of each table, sampled every SAMPLE_SECONDS in a thread while a run goes on."""

    def __init__(self, engine: sa.Engine, tables: tuple[str, ...]):
        self.engine, self.tables = engine, tables
        self.peak = table_sizes(engine, tables)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self._note()

    def _note(self) -> None:
        for name, size in table_sizes(self.engine, self.tables).items():
            self.peak[name] = max(size, self.peak.get(name, 0))

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        self._note()
        return self.peak


class ScaleRuns:
    """One driver run of a dataset, measured."""

    def __init__(self, tmp: Path, batch_size: int):
        self.driver = FullDriver(tmp, build_null_model(tmp / "null-model"),
                                 batching={"batchSize": batch_size, "maxInFlight": 8})
        self.pgdata = tmp / "pgdata"
        self.engine = sa.create_engine(self.driver.postgres.get_uri(), poolclass=sa.pool.NullPool)

    def close(self) -> None:
        self.engine.dispose()
        self.driver.close()

    def measure(self, folder: Path, records: int) -> dict[str, float]:
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if table_sizes(self.engine, ("embedjob_seen_ids",)):
                conn.execute(sa.text("VACUUM FULL embedjob_seen_ids"))
        table = f"vectors_{self.driver.runs + 1}"
        before = table_sizes(self.engine, BOOKKEEPING)
        cpu_before = postgres_cpu_seconds(self.pgdata)
        peaks = PeakSizes(self.engine, (*BOOKKEEPING, table))
        try:
            result = self.driver.run(f"{folder}/", sink={"table": table})
        finally:
            peak = peaks.stop()
        time.sleep(BACKENDS_EXIT_SECONDS)
        postgres_cpu = postgres_cpu_seconds(self.pgdata) - cpu_before
        with self.engine.connect() as conn:
            embedded = conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
            conn.execute(sa.text(f"DROP TABLE {table} CASCADE"))
            conn.commit()
        expected = distinct_valid(records)
        if embedded != expected:  # each distinct id with a text once, across the files
            raise RuntimeError(f"{records:,} records: {embedded:,} vectors, {expected:,} expected")
        grown = {name: peak[name] - before.get(name, 0) for name in BOOKKEEPING}
        figures = {
            "driver_rss_mb": result["peak_rss_mb"],
            "driver_cpu_us": result["cpu_s"] / records * 1e6,
            "wall_us": result["wall_s"] / records * 1e6,
            "postgres_cpu_us": postgres_cpu / records * 1e6,
            "bookkeeping_bytes": sum(grown.values()) / records,
            "vectors_bytes": peak[table] / records,
        }
        print(json.dumps({"records": records, "embedded": embedded,
                          "driver_rss_at_exit_mb": result["rss_at_exit_mb"],
                          "bookkeeping_bytes_by_table": {name: size / records for name, size in grown.items()},
                          **figures}),
              file=sys.stderr, flush=True)
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--workdir", type=Path, help="where the generated inputs go (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        inputs = {}
        for size in args.sizes:
            inputs[f"{size:,} records"] = (Path(tmp) / f"input-{size}", size)
            print(f"generating {size:,} records in {args.files} files ...", file=sys.stderr, flush=True)
            generate_dataset(*inputs[f"{size:,} records"], files=args.files)
        runs = ScaleRuns(Path(tmp), args.batch_size)
        try:
            results = run_rounds({label: (lambda f=folder, n=size: runs.measure(f, n))
                                  for label, (folder, size) in inputs.items()}, rounds=args.rounds)
        finally:
            runs.close()
    for figure, title in FIGURES.items():
        print(f"\n{title}\n")
        print(report({label: results[f"{label} {figure}"] for label in inputs}))
    print("\neach further record, from one size to the next (the start's fixed cost left out)\n")
    print(report(further_record(results, {label: size for label, (_, size) in inputs.items()})))


def further_record(results: dict[str, Figures], sizes: dict[str, int]) -> dict[str, Figures]:
    """Per round, (total at the larger size - total at the smaller) / the records between them, for each figure
    that is per record: the cost of one more record, which a start-up (Ray, the model's load) does not blur."""
    ordered = sorted(sizes, key=sizes.get)
    further = {}
    for smaller, larger in zip(ordered, ordered[1:]):
        n, m = sizes[smaller], sizes[larger]
        for figure, title in FIGURES.items():
            if figure == "driver_rss_mb":
                continue
            pairs = zip(results[f"{smaller} {figure}"].values, results[f"{larger} {figure}"].values)
            further[f"{title}, {smaller} to {larger}"] = Figures([(b * m - a * n) / (m - n) for a, b in pairs])
    return further


if __name__ == "__main__":
    main()
