"""The data plane: CPU per record of each driver stage, and texts/s end to end against spec.sink.writers.

(a) Each stage on the same N PEP paragraphs, as the driver runs it, timed with
    time.process_time (CPU of this whole process, every thread, Ray's own included; not
    the CPU of PostgreSQL's or the actors' processes):
    read      source.read_records (JSONL lines to raw records)
    check     records.classify_records with the driver's SeenIds (duplicate ids in PostgreSQL)
    plan      batching.make_batches (sort window, batch ids) and the incremental lookup of
              stored content hashes (one query per feed.LOOKUP_RECORDS records, incremental.StoredHashes)
    dispatch  each batch to an actor that returns ready vectors apart (EmbeddingWorker's
              embed_apart, num_returns=2) and ray.get of the small result: what the driver
              does with writer actors
    transfer  ray.get of those vectors into this process: what the driver's writer thread
              needs on top (with writer actors a writer does it)
    write     PostgresSink.write of groups of 64 batches (COPY payload, merge, marks)
(b) `embedjob run`'s driver end to end with the tiny random-weight model (bench/tiny_model.py),
    one 2-CPU EmbeddingWorker, batch 256, maxInFlight 8: texts/s with spec.sink.writers 0 (the
    driver's writer thread), 1, 2 and 4, interleaved rounds (bench/rounds.py).
(c) The projected ceiling per core from (a): 1 / (CPU seconds a record costs the driver).

    HF_HUB_OFFLINE=1 python bench/dataplane.py [--parts a b] [--records 20000] [--dim 384] [--texts 20000] [--rounds 3]
                                               [--corpus PATH]
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from corpus import add_corpus_argument, first_records, open_corpus
from rounds import report, run_rounds
from throughput import TINY_BATCH, embedjob_driver
from tiny_model import scratch_tiny_model

from embedjob import schema
from embedjob_worker.plan.batching import batch_key, make_batches
from embedjob_worker.sink.copy_data import content_salt
from embedjob_worker.plan.feed import lookup_groups
from embedjob_worker.sink.incremental import StoredHashes
from embedjob_worker.core.outcome import AttemptRow, BatchOutcome, now
from embedjob_worker.core.records import Record
from embedjob_worker.core.worker_reports import EmbedResult
from embedjob_worker.plan.checks import classify_records
from embedjob_worker.sink.seen_ids import SeenIds
from embedjob_worker.sink.postgres import PostgresSink, open_engine
from embedjob_worker.sink.runs import JobRuns, RunRequest
from embedjob_worker.sink.target import SinkTarget
from embedjob_worker.sink.vectors_table import ensure_vectors_table
from embedjob_worker.source.files import read_records

STAGES = ("read", "check", "plan", "dispatch", "transfer", "write")
DRIVER_WITH_WRITERS = ("read", "check", "plan", "dispatch")
GROUP_BATCHES = 64


class ReadyVectors:
    """An actor that answers like EmbeddingWorker.embed_apart, with vectors made once (no model)."""

    def __init__(self, dim: int, batch_size: int):
        self.vectors = np.random.default_rng(0).standard_normal((batch_size, dim)).astype(np.float32)

    def embed_apart(self, batch_id: str, texts: list[str]) -> tuple[EmbedResult, np.ndarray]:
        return EmbedResult(batch_id, (), "bench", "r", "bench", 0.0, 0), self.vectors[:len(texts)]


def cpu_per_record(records: int, call) -> tuple[float, object]:
    """Microseconds of this process's CPU per record for `call()`, and what it returned."""
    started = time.process_time()
    result = call()
    return (time.process_time() - started) / records * 1e6, result


def stage_round(path: Path, records: int, dim: int, batch_size: int) -> dict[str, float]:
    """One pass of every stage over the file, on a fresh database; µs of driver CPU per record."""
    import pgserver
    import ray

    with tempfile.TemporaryDirectory() as tmp:
        server = pgserver.get_server(Path(tmp) / "pgdata", cleanup_mode="delete")
        target = SinkTarget("bench/dataplane", "bench", "embeddings", content_salt(True, None), schema="public")
        sink = PostgresSink(open_engine(server.get_uri()), target)
        try:
            schema.migrate(server.get_uri())
            run = JobRuns(sink.engine, target, "dataplane", "bench").start(RunRequest("m", "r", "input", "config"),
                                                                           new_run=False).run
            ensure_vectors_table(sink.engine, target.vectors, dim, target.vector_type)
            figures = {}
            figures["read"], raw = cpu_per_record(records, lambda: list(read_records(str(path), "jsonl", "id", "text")))
            figures["check"], checked = cpu_per_record(
                records, lambda: list(classify_records(raw, SeenIds(sink.engine, run))))
            valid = [r for r in checked if isinstance(r, Record)]
            stored = StoredHashes(sink.engine, target.vectors, "bench", "m", "r", target.salt)

            def plan():
                batches = list(make_batches(valid, batch_size, 4096, batch_key("input", "config")))
                for group in lookup_groups(batches):
                    stored.changes(group, set())
                return batches

            figures["plan"], batches = cpu_per_record(records, plan)
            actor = ray.remote(ReadyVectors).options(num_cpus=1).remote(dim, batch_size)
            ray.get(actor.embed_apart.options(num_returns=2).remote("warm-up", ["x"])[0])

            def dispatch():
                refs = [actor.embed_apart.options(num_returns=2).remote(b.batch_id, b.texts) for b in batches]
                ray.get([meta for meta, _ in refs])
                return [vectors for _, vectors in refs]

            figures["dispatch"], vector_refs = cpu_per_record(records, dispatch)
            figures["transfer"], vectors = cpu_per_record(records, lambda: ray.get(vector_refs))
            outcomes = [BatchOutcome(b.batch_id, "succeeded", b.records, [AttemptRow(1, "bench", "succeeded", None,
                                                                                     now())], now(), vectors=v)
                        for b, v in zip(batches, vectors)]
            figures["write"], _ = cpu_per_record(records, lambda: [
                sink.write(run, outcomes[i:i + GROUP_BATCHES], [])
                for i in range(0, len(outcomes), GROUP_BATCHES)])
            ray.kill(actor)
            return figures
        finally:
            sink.engine.dispose()
            server.cleanup()


def ceilings(stage_medians: dict[str, float]) -> str:
    """Records/s one core can carry, for the driver alone and for each writer."""
    thread = sum(stage_medians[s] for s in STAGES)
    driver = sum(stage_medians[s] for s in DRIVER_WITH_WRITERS)
    writer = stage_medians["transfer"] + stage_medians["write"]
    return "\n".join([
        "| where the CPU goes | µs/record | projected ceiling, records/s per core |", "| --- | --- | --- |",
        f"| driver with its writer thread (all six stages) | {thread:.1f} | {1e6 / thread:,.0f} |",
        f"| driver with writer actors (read, check, plan, dispatch) | {driver:.1f} | {1e6 / driver:,.0f} |",
        f"| one writer actor (transfer, write) | {writer:.1f} | {1e6 / writer:,.0f} |",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=20_000, help="records for the stage costs (a)")
    parser.add_argument("--dim", type=int, default=384, help="vector dimensions in (a): all-MiniLM-L6-v2's")
    parser.add_argument("--texts", type=int, default=20_000, help="texts for the end-to-end runs (b)")
    parser.add_argument("--writers", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--parts", nargs="+", choices=["a", "b"], default=["a", "b"], help="(a) and (c), (b)")
    add_corpus_argument(parser)
    args = parser.parse_args()

    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    try:
        if "a" in args.parts:
            stage_costs(args)
        if "b" in args.parts:
            end_to_end(args)
    finally:
        ray.shutdown()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; CPU: {_lscpu_model()}")


def stage_costs(args: argparse.Namespace) -> None:
    """(a), and (c) from it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "records.jsonl"
        with open_corpus(args.corpus) as src, path.open("w") as out:  # plain JSONL: the driver's reader is timed
            for _, line in zip(range(args.records), src):
                out.write(line)
        print(f"(a) CPU of this process per record, {args.records} PEP paragraphs, {args.dim}-dim vectors, "
              f"batch {TINY_BATCH}")
        stages = run_rounds({"stage": lambda: stage_round(path, args.records, args.dim, TINY_BATCH)},
                            rounds=args.rounds)
    print(report(stages, unit="µs/record"))
    print("\n(c)\n" + ceilings({s: stages[f"stage {s}"].median for s in STAGES}))


def end_to_end(args: argparse.Namespace) -> None:
    """(b)."""
    tiny_dir = scratch_tiny_model()
    tiny = {"name": "bench/tiny-random-bert", "path": str(tiny_dir)}
    records = first_records(args.texts, args.corpus)

    def driver(writers: int) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            steady, _ = embedjob_driver(records, TINY_BATCH, args.cpus, Path(tmp), model=tiny, max_in_flight=8,
                                        writers=writers)
        return steady

    print(f"\n(b) texts/s end to end (steady), {args.texts} PEP paragraphs, tiny model, batch {TINY_BATCH}, "
          f"maxInFlight 8, one {args.cpus}-CPU actor")
    throughput = run_rounds({f"writers {w}": (lambda w=w: driver(w)) for w in args.writers}, rounds=args.rounds)
    print(report(throughput, unit="texts/s"))


def _lscpu_model() -> str:
    import subprocess

    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


if __name__ == "__main__":
    main()
