"""Peak RSS of the driver's data path (reader, checks, batcher) as the input grows.

Streams generated JSONL inputs of each size through `embedjob_worker.feed.batches_to_embed`
(the same reader, record checks, duplicate-id claims in PostgreSQL and length-sorted
batcher the driver runs; no model, no Ray: the batches are dropped) in a fresh process per measurement, and reports
that process's peak RSS. Sizes alternate in each round (bench/rounds.py). Memory is flat
when the largest input's peak is within 10% of the smallest's.

    python bench/memory.py [--sizes 1000000 5000000] [--rounds 3] [--workdir DIR]

Generated records: ~250 characters of text (the PEP corpus' mean), 1% bad records
(null text), ids unique except 0.1% repeats far apart.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from rounds import report, run_rounds

WORDS = ("embedding vector batch actor driver record token model index cluster python "
         "proposal syntax module function").split()


def generate(path: Path, count: int) -> None:
    """Write `count` JSONL records without holding them in memory."""
    with path.open("w") as f:
        for i in range(count):
            words = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(20 + i % 17))
            record_id = f"rec-{i // 2}" if i % 1000 == 999 else f"rec-{i}"  # a repeat of an earlier id
            text = None if i % 100 == 42 else f"{i} {words}"
            f.write(json.dumps({"id": record_id, "text": text}) + "\n")


def stream(path: str) -> None:
    """Run in a child process: feed every record through the data path, print peak RSS in MB.

    Duplicate ids are decided in PostgreSQL as the driver does (embedjob_seen_ids), by an
    embedded server in its own processes, so its memory is not counted here."""
    import pgserver

    from embedjob.api import parse_spec
    from embedjob_worker.feed import batches_to_embed
    from embedjob_worker.metrics import DriverMetrics
    from embedjob_worker.seen_ids import SeenIds
    from embedjob_worker.sink import PostgresSink, content_salt
    from embedjob_worker.tally import RunTally

    spec = parse_spec({"source": {"uri": path}, "model": {"name": "m", "revision": "r"},
                       "sink": {"databaseSecretRef": {"name": "db"}}})
    with tempfile.TemporaryDirectory() as tmp:
        server = pgserver.get_server(Path(tmp) / "pgdata", cleanup_mode="delete")
        try:
            sink = PostgresSink(server.get_uri(), "bench/memory", "bench", "embeddings", content_salt(True, None))
            sink.migrate()
            run = sink.start_run("memory", "bench", "m", "r", "input", "config", new_run=False)
            batches = sum(1 for _ in batches_to_embed(spec, path, "bench", {}, RunTally(), DriverMetrics(),
                                                       lambda bad: None, SeenIds(sink.engine, run.run_id)))
            sink.close()
        finally:
            server.cleanup()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"batches": batches, "peak_rss_mb": peak_mb}))


def measure(path: Path) -> float:
    out = subprocess.run([sys.executable, __file__, "--stream", str(path)], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mb"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 5_000_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, help="where the generated inputs go (default: a temp dir)")
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stream:
        stream(args.stream)
        return
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        inputs = {}
        for size in args.sizes:
            inputs[size] = Path(tmp) / f"input-{size}.jsonl"
            print(f"generating {size:,} records ...", file=sys.stderr, flush=True)
            generate(inputs[size], size)
        results = run_rounds({f"{size:,} records": (lambda p=path: measure(p)) for size, path in inputs.items()},
                             rounds=args.rounds)
    print(report(results, unit="peak RSS (MB)"))
    smallest, largest = (f"{size:,} records" for size in (min(args.sizes), max(args.sizes)))
    growth = results[largest].median / results[smallest].median - 1
    print(f"\npeak RSS at {largest} vs {smallest}: {growth:+.1%} (target: within 10%)")


if __name__ == "__main__":
    main()
