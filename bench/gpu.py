"""GPU throughput: half precision, token-budget batches and several actors per GPU (fractional GPUs).

Contenders, interleaved over rounds (bench/rounds.py), each reporting texts/s, tokens/s
(the texts' real tokens, by the model's tokenizer) and the GPU's mean utilisation while it ran:

- `encode`: one process, sentence-transformers `encode` of all texts (fixed batch size).
- `actors`: N EmbeddingWorker actors sharing the GPU (Ray num_gpus=1/N), fed the batches
  embedjob's own planner cuts with the token budget, at most maxInFlight per actor; no database.
- `driver`: `embedjob run`'s driver end to end with PostgreSQL writes (workers.replicas N,
  gpusPerActor 1/N, batching.maxTokens).

Half precision: `--half` sets spec.model.precision to float16 where the API has it; until
then the bench casts its own encode and actor models with `model.half()`, and the driver
contender runs in float32 and says so in its name.

    HF_HUB_OFFLINE=1 python bench/gpu.py [--texts 100000] [--half] [--budgets 16384 65536] [--actors 1 4]
                                         [--corpus PATH]
    python bench/gpu.py --dry-run   # CPU smoke mode: tiny model, a few hundred texts, no GPU needed

Without a CUDA GPU (and without --dry-run) it stops with a message saying so.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from corpus import add_corpus_argument, open_corpus
from rounds import report, run_rounds
from throughput import MODEL_NAME, MODEL_PACKAGE, embedjob_driver, model_dir
from tiny_model import scratch_tiny_model

SAMPLE_INTERVAL_S = 0.2
CPUS_PER_ACTOR = 2
MAX_IN_FLIGHT_PER_ACTOR = 4
SORT_WINDOW = 16_384
MODEL_LIMIT = 256  # all-MiniLM-L6-v2's max_seq_length, which the tiny model keeps
NO_GPU = ("bench/gpu.py: no CUDA GPU is visible (torch.cuda.is_available() is False, CUDA_VISIBLE_DEVICES={}). "
          "Run it on a machine with a GPU, or pass --dry-run for the CPU smoke mode.")


def corpus_records(count: int, path: Path) -> list[dict]:
    """`count` PEP paragraphs, the corpus repeated (ids made unique) when it holds fewer."""
    with open_corpus(path) as f:
        base = [json.loads(line) for line in f]
    return [{"id": f"{base[i % len(base)]['id']}~{i // len(base)}", "text": base[i % len(base)]["text"]}
            for i in range(count)]


class GpuSampler:
    """Samples GPU 0's utilisation (%) in a thread: pynvml when installed, else `nvidia-smi`; nothing when
    not `active` (the CPU smoke mode)."""

    def __init__(self, active: bool):
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._read: Callable[[], float] | None = None
        if not active:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._read = lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except ImportError:
            smi = shutil.which("nvidia-smi")
            self._read = (lambda: float(subprocess.run(
                [smi, "-i", "0", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, check=True).stdout.split()[0])) if smi else None

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.samples.append(self._read())

    def __enter__(self) -> "GpuSampler":
        if self._read is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def mean(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None


def measured(run: Callable[[], float], texts: int, tokens: int, gpu: bool) -> Callable[[], dict[str, float]]:
    """A contender: `run` returns its seconds; the figures are texts/s, tokens/s and GPU utilisation."""
    def contender() -> dict[str, float]:
        with GpuSampler(gpu) as sampler:
            seconds = run()
        figures = {"texts/s": texts / seconds, "tokens/s": tokens / seconds}
        if (utilisation := sampler.mean()) is not None:
            figures["GPU util %"] = utilisation
        return figures
    return contender


def bare_encode(texts: list[str], location: str, device: str, half: bool, batch_size: int) -> Callable[[], float]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(location, device=device)
    if half:
        model.half()
    model.encode(texts[:256], batch_size=batch_size)  # warm-up

    def run() -> float:
        started = time.perf_counter()
        model.encode(texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False)
        return time.perf_counter() - started
    return run


def planned_batches(records: list[dict], budget, batch_size: int) -> list:
    """The batches embedjob's driver would cut (batching.make_batches with the token budget)."""
    from embedjob_worker.plan.batching import make_batches
    from embedjob_worker.core.records import Record

    rows = (Record(i, r["id"], r["text"]) for i, r in enumerate(records))
    return list(make_batches(rows, batch_size, SORT_WINDOW, "bench", budget))


def actor_pool(resolved, actors: int, gpu: bool, half: bool, batches: list) -> Callable[[], float]:
    """EmbeddingWorker actors sharing one GPU (num_gpus 1/actors), at most MAX_IN_FLIGHT_PER_ACTOR each;
    started (models loaded) before the clock and killed after it, so contenders never hold the GPU at once."""
    import ray

    from embedjob_worker.encode.actors import EmbeddingWorker

    class HalfPrecisionWorker(EmbeddingWorker):
        def __init__(self, *args):
            super().__init__(*args)
            if half:
                self.model.half()

    share = 1 / actors if gpu else 0
    remote = ray.remote(HalfPrecisionWorker)

    def run() -> float:
        pool = [remote.options(num_cpus=CPUS_PER_ACTOR, num_gpus=share).remote(resolved, None, CPUS_PER_ACTOR, share)
                for _ in range(actors)]
        try:
            ray.get([a.info.remote() for a in pool])
            started, pending, done = time.perf_counter(), [], 0
            for number, batch in enumerate(batches):
                if len(pending) >= MAX_IN_FLIGHT_PER_ACTOR * actors:
                    ready, pending = ray.wait(pending, num_returns=1)
                    done += sum(len(ray.get(ref).vectors) for ref in ready)
                pending.append(pool[number % actors].embed.remote(batch.batch_id, batch.texts))
            done += sum(len(result.vectors) for result in ray.get(pending))
            seconds = time.perf_counter() - started
        finally:
            for actor in pool:
                ray.kill(actor)
        assert done == sum(len(b.records) for b in batches)
        return seconds
    return run


def driver_run(records: list[dict], model: dict, actors: int, gpu: bool, budget: int,
               batch_size: int) -> Callable[[], float]:
    def run() -> float:
        with tempfile.TemporaryDirectory() as tmp:
            steady, _ = embedjob_driver(records, batch_size, CPUS_PER_ACTOR, Path(tmp), model=model,
                                        max_in_flight=MAX_IN_FLIGHT_PER_ACTOR * actors, max_tokens=budget,
                                        workers={"replicas": actors, "cpusPerActor": CPUS_PER_ACTOR,
                                                 **({"gpusPerActor": 1 / actors} if gpu else {})})
        return len(records) / steady
    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, help="texts to embed (default 100,000; 300 with --dry-run)")
    parser.add_argument("--half", action="store_true", help="float16 (spec.model.precision, else model.half())")
    parser.add_argument("--budgets", type=int, nargs="+", default=[16_384, 65_536], help="maxTokens contenders")
    parser.add_argument("--batch-size", type=int, default=1024, help="encode's batch size; the budgets' upper bound")
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 4], help="actors sharing the GPU")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3; 1 with --dry-run)")
    parser.add_argument("--no-driver", action="store_true", help="leave out the driver + PostgreSQL contender")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU smoke mode: the tiny model on CPU, --texts 300 unless given, 1 round")
    add_corpus_argument(parser)
    args = parser.parse_args(argv)
    import torch

    gpu = torch.cuda.is_available() and not args.dry_run
    if not gpu and not args.dry_run:
        raise SystemExit(NO_GPU.format(os.environ.get("CUDA_VISIBLE_DEVICES", "unset")))
    args.texts = args.texts or (300 if args.dry_run else 100_000)
    args.rounds = args.rounds or (1 if args.dry_run else 3)

    from embedjob.api import Model
    from embedjob_worker.encode.model import resolve_model
    from embedjob_worker.encode.tokens import TokenCounter, token_budget

    if gpu:
        model = {"name": MODEL_NAME, "package": MODEL_PACKAGE}
        location = model_dir()
    else:  # the smoke mode: a model that costs next to nothing on CPU
        location = str(scratch_tiny_model())
        model = {"name": "bench/tiny-random-bert", "path": location}
    half = args.half and gpu  # float16 matmuls on CPU are slow or missing: the smoke mode stays float32
    driver_precision = "float32"
    if half and "precision" in Model.model_fields:
        model, driver_precision = {**model, "precision": "float16"}, "float16"
    resolved = resolve_model(Model(**{k: v for k, v in model.items() if k != "precision"}))
    records = corpus_records(args.texts, args.corpus)
    texts = [r["text"] for r in records]
    tokens = sum(TokenCounter(resolved, MODEL_LIMIT)(texts))
    precision = "float16" if half else "float32"
    device = "cuda" if gpu else "cpu"
    print(f"{len(texts)} PEP paragraphs ({tokens} tokens), {device}, {precision}, budgets {args.budgets}, "
          f"actors per GPU {args.actors}, {args.rounds} round(s)" + (" — DRY RUN (CPU smoke mode)" if not gpu else ""))

    import ray

    ray.init(num_cpus=max(os.cpu_count() or 1, CPUS_PER_ACTOR * max(args.actors)), include_dashboard=False,
             log_to_driver=False, logging_level=logging.WARNING)
    contenders = {f"encode, batch {args.batch_size}, {precision}":
                  measured(bare_encode(texts, location, device, half, args.batch_size), len(texts), tokens, gpu)}
    for budget in args.budgets:
        batches = planned_batches(records, token_budget(budget, resolved, MODEL_LIMIT), args.batch_size)
        for actors in args.actors:
            contenders[f"{actors} actor(s)/GPU, maxTokens {budget}, {precision}, no DB"] = measured(
                actor_pool(resolved, actors, gpu, half, batches), len(texts), tokens, gpu)
            if not args.no_driver:
                contenders[f"driver + PostgreSQL, {actors} actor(s)/GPU, maxTokens {budget}, {driver_precision}"] = \
                    measured(driver_run(records, model, actors, gpu, budget, args.batch_size), len(texts), tokens, gpu)
    try:
        results = run_rounds(contenders, rounds=args.rounds)
    finally:
        ray.shutdown()
    gpu_name = torch.cuda.get_device_name(0) if gpu else "no GPU (dry run)"
    print(report(results, unit="(per figure)") + f"; GPU: {gpu_name}")


if __name__ == "__main__":
    main()
