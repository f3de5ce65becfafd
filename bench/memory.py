"""Peak RSS of the driver as the input grows: its data path alone, or the whole driver.

Default: streams generated JSONL inputs of each size through `embedjob_worker.plan.feed.batches_to_embed`
(the same reader, record checks, duplicate-id claims in PostgreSQL and length-sorted
batcher the driver runs; no model, no Ray: the batches are dropped) in a fresh process per measurement, and reports
that process's peak RSS.

`--full-driver`: runs the real driver (`embedjob_worker.driver`, in a fresh process per
measurement) on a local Ray cluster and an embedded PostgreSQL, every batch embedded by
a tiny random-weight BERT (bench/tiny_model.py: MiniLM's tokenizer, one layer, built at
bench time) and written as the driver writes; the figure is the driver process's peak RSS
(the actors and PostgreSQL run in processes of their own).

Sizes alternate in each round (bench/rounds.py). Memory is flat when the largest
input's peak is within 10% of the smallest's.

    python bench/memory.py [--sizes 1000000 5000000] [--rounds 3] [--workdir DIR] [--full-driver]

Generated records: ~250 characters of text (the PEP corpus' mean), 1% bad records
(null text), ids unique except 0.1% repeats far apart.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from embedjob.contract import DATABASE_URL_ENV
from rounds import report, run_rounds
from tiny_model import build_tiny_model

WORDS = ("embedding vector batch actor driver record token model index cluster python "
         "proposal syntax module function").split()


def generate(path: Path, count: int, first: int = 0) -> None:
    """Write records `first` to `first + count - 1` as JSONL, without holding them in memory."""
    with path.open("w") as f:
        for i in range(first, first + count):
            words = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(20 + i % 17))
            record_id = f"rec-{i // 2}" if i % 1000 == 999 else f"rec-{i}"  # a repeat of an earlier id
            text = None if i % 100 == 42 else f"{i} {words}"
            f.write(json.dumps({"id": record_id, "text": text}) + "\n")


def distinct_valid(count: int) -> int:
    """How many of generate's records 0 to `count - 1` have a text and an id not seen before: each should get
    one vector. A repeat (every 1000th record, of record i // 2's id) is new when record i // 2 was a repeat
    itself, and never meets a null text (i // 2 ends in 99 there, a null text's index in 42)."""
    nulls = count // 100 + (count % 100 > 42)
    repeats = sum(1 for i in range(999, count, 1000) if (i // 2) % 1000 != 999)
    return count - nulls - repeats


def process_memory_mb() -> dict[str, float]:
    """This process's peak RSS (VmHWM, since its exec) and what its RSS is made of now (its own memory, mapped files,
    shared memory), in MB. Not getrusage's ru_maxrss: Linux carries the RSS the process had before its exec (the
    parent's at the fork) into it, which after a parent that loaded torch is most of the figure."""
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status if ":" in line)
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmHWM", "RssAnon", "RssFile", "RssShmem")}


def stream(path: str) -> None:
    """Run in a child process: feed every record through the data path, print peak RSS in MB.

    Duplicate ids are decided in PostgreSQL as the driver does (embedjob_seen_ids), by an
    embedded server in its own processes, so its memory is not counted here."""
    import pgserver

    from embedjob import schema
    from embedjob.api import parse_spec
    from embedjob_worker.sink.copy_data import content_salt
    from embedjob_worker.plan.feed import FeedPlan, FeedSkips, batches_to_embed
    from embedjob_worker.core.metrics import DriverMetrics
    from embedjob_worker.sink.seen_ids import SeenIds
    from embedjob_worker.sink.postgres import open_engine
    from embedjob_worker.sink.runs import JobRuns, RunRequest
    from embedjob_worker.sink.target import SinkTarget
    from embedjob_worker.core.tally import RunTally

    spec = parse_spec({"source": {"uri": path}, "model": {"name": "m", "revision": "r"},
                       "sink": {"databaseSecretRef": {"name": "db"}}})
    with tempfile.TemporaryDirectory() as tmp:
        server = pgserver.get_server(Path(tmp) / "pgdata", cleanup_mode="delete")
        try:
            schema.migrate(server.get_uri())
            engine = open_engine(server.get_uri())
            target = SinkTarget("bench/memory", "bench", "embeddings", content_salt(True, None), schema="public")
            run = JobRuns(engine, target, "memory", "bench").start(RunRequest("m", "r", "input", "config"),
                                                                   new_run=False).run
            batches = sum(1 for _ in batches_to_embed(FeedPlan(spec, path, "bench"),
                                                       FeedSkips(SeenIds(engine, run)), RunTally(),
                                                       DriverMetrics(), lambda bad: None))
            engine.dispose()
        finally:
            server.cleanup()
    print(json.dumps({"batches": batches, "peak_rss_mb": process_memory_mb()["VmHWM"]}))


def measure(path: Path) -> float:
    out = subprocess.run([sys.executable, __file__, "--stream", str(path)], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mb"]


def drive(config: str, ray_address: str) -> None:
    """Run in a child process: the driver's own entrypoint on `config`; print its exit code and peak RSS in MB."""
    from embedjob_worker.driver import main

    code = main(["--config", config, "--ray-address", ray_address])
    usage, memory = resource.getrusage(resource.RUSAGE_SELF), process_memory_mb()
    print(json.dumps({"exit_code": code, "peak_rss_mb": memory.pop("VmHWM"), "rss_at_exit_mb": memory,
                      "cpu_s": usage.ru_utime + usage.ru_stime}))


class FullDriver:
    """A local Ray cluster and an embedded PostgreSQL for driver runs of `model` (a directory); each run a new job."""

    def __init__(self, tmp: Path, model: Path, batching: dict | None = None):
        import pgserver
        import ray

        self.tmp, self.model, self.runs = tmp, model, 0
        self.batching = batching or {"batchSize": 256, "maxInFlight": 4}
        self.postgres = pgserver.get_server(tmp / "pgdata", cleanup_mode="delete")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        self.ray_address = ray.get_runtime_context().gcs_address

    def close(self) -> None:
        import ray

        ray.shutdown()
        self.postgres.cleanup()

    def run(self, uri: str, sink: dict | None = None) -> dict:
        """The driver, in a fresh process, on a new job that reads `uri` (with `sink` added to spec.sink): its exit
        code, peak RSS (MB), CPU seconds and wall seconds."""
        self.runs += 1
        name = f"run-{self.runs}"  # a job of its own: a new run, never a resumed one
        manifest = {"apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob",
                    "metadata": {"name": name, "namespace": "bench"},
                    "spec": {"source": {"uri": uri}, "model": {"name": self.model.name, "path": str(self.model)},
                             "batching": self.batching, "workers": {"replicas": 1, "cpusPerActor": 1},
                             "sink": {"databaseSecretRef": {"name": "db"}, "collection": name, **(sink or {})}}}
        config = self.tmp / f"{name}.json"
        config.write_text(json.dumps(manifest))
        env = {**os.environ, DATABASE_URL_ENV: self.postgres.get_uri(), "HF_HUB_OFFLINE": "1"}
        started = time.monotonic()
        with (self.tmp / f"{name}.log").open("w") as log:
            out = subprocess.run([sys.executable, __file__, "--drive", str(config), self.ray_address], check=True,
                                 env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        result = {**json.loads(out.stdout.strip().splitlines()[-1]), "wall_s": time.monotonic() - started}
        if result["exit_code"] != 0:
            raise RuntimeError(f"the driver exited {result['exit_code']}; see {self.tmp / f'{name}.log'}")
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 5_000_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, help="where the generated inputs go (default: a temp dir)")
    parser.add_argument("--full-driver", action="store_true",
                        help="measure the whole driver (Ray, the tiny model, PostgreSQL), not its data path alone")
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    parser.add_argument("--drive", nargs=2, metavar=("CONFIG", "RAY_ADDRESS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stream:
        stream(args.stream)
        return
    if args.drive:
        drive(*args.drive)
        return
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        inputs = {}
        for size in args.sizes:
            inputs[size] = Path(tmp) / f"input-{size}.jsonl"
            print(f"generating {size:,} records ...", file=sys.stderr, flush=True)
            generate(inputs[size], size)
        full = FullDriver(Path(tmp), build_tiny_model(Path(tmp) / "tiny-bert")) if args.full_driver else None
        try:
            measured = (lambda path: full.run(str(path))["peak_rss_mb"]) if full else measure
            results = run_rounds({f"{size:,} records": (lambda p=path: measured(p)) for size, path in inputs.items()},
                                 rounds=args.rounds)
        finally:
            if full:
                full.close()
    print(report(results, unit="driver peak RSS (MB)" if args.full_driver else "peak RSS (MB)"))
    smallest, largest = (f"{size:,} records" for size in (min(args.sizes), max(args.sizes)))
    growth = results[largest].median / results[smallest].median - 1
    print(f"\npeak RSS at {largest} vs {smallest}: {growth:+.1%} (target: within 10%)")


if __name__ == "__main__":
    main()
