"""Rows/s of the table source's read alone (keyset pages), with an index on the id column and without one.

One embedded PostgreSQL (pgserver) holds two databases with the same table `docs` of N PEP
paragraphs (bench/incremental.py's fill_table): one keeps its primary key, the other has
it dropped. Each round reads both whole through `read_table_records`, as the driver does,
and counts the rows: no model, no Ray, no sink. With the index each page starts with an
index lookup; without it each page sorts the table again (docs/table-source.md).

    python bench/table_read.py [--rows 100000] [--rounds 3] [--corpus PATH]
"""

from __future__ import annotations

import argparse
import time

from corpus import add_corpus_argument
from incremental import fill_table
from rounds import ratio, report, run_rounds
from scratch import scratch_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    add_corpus_argument(parser)
    args = parser.parse_args()

    import pgserver
    import psycopg
    from sqlalchemy.engine import make_url

    from embedjob.api import SourceTable
    from embedjob_worker.source.table import read_table_records

    server = pgserver.get_server(scratch_dir("embedjob-table-read-") / "pgdata",
                                 cleanup_mode="delete")
    urls = {}
    for name in ("indexed", "unindexed"):
        with psycopg.connect(server.get_uri(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        urls[name] = make_url(server.get_uri()).set(database=name).render_as_string(hide_password=False)
        fill_table(urls[name], args.rows, args.corpus, stamped=False)
        with psycopg.connect(urls[name], autocommit=True) as conn:
            if name == "unindexed":
                conn.execute("ALTER TABLE docs DROP CONSTRAINT docs_pkey")
            conn.execute("VACUUM ANALYZE docs")
    table = SourceTable.model_validate({"name": "docs", "idColumn": "id", "textColumn": "body"})
    print(f"{args.rows} rows, {args.rounds} rounds")

    def read(url: str):
        def rows_per_second() -> float:
            started = time.perf_counter()
            count = sum(1 for _ in read_table_records(url, table))
            assert count == args.rows, count
            return count / (time.perf_counter() - started)
        return rows_per_second

    try:
        results = run_rounds({name: read(url) for name, url in urls.items()}, rounds=args.rounds)
    finally:
        server.cleanup()
    print(report(results, unit="rows/s", ratios={"indexed / unindexed": ratio(results, "indexed", "unindexed")}))


if __name__ == "__main__":
    main()
