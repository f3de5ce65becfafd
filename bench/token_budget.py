"""Texts/s of the embedjob driver with token-budget batches (spec.batching.maxTokens) against fixed batch sizes.

Every contender is the whole driver end to end (local Ray, one actor, PostgreSQL writes to
an embedded pgserver) over the same PEP paragraphs, sortWindow 4096, maxInFlight 4:
fixed batch sizes (32 and 128 unless --fixed says), and token budgets (batchSize 512 as the
upper bound on records). The tiny random-weight model (bench/tiny_model.py) repeats fixed vs budget
where the model costs next to nothing, so the driver's own token counting shows. A last
figure is the driver's token counting alone (the model's tokenizer, CPU µs per text);
--counting-only runs just that, against the transformers tokenizer's call it replaced.

    HF_HUB_OFFLINE=1 python bench/token_budget.py [--texts 2000] [--budgets 4096 16384] [--fixed 32 128] [--cpus 2]
                                                  [--rounds 3] [--corpus PATH] [--counting-only]

The contenders alternate in each round (bench/rounds.py); the table gives medians and ranges.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

from corpus import add_corpus_argument, first_records
from embedjob.api_batching import DEFAULT_BUDGET_RECORDS
from rounds import report, run_rounds
from throughput import MODEL_NAME, MODEL_PACKAGE, TINY_BATCH, embedjob_driver
from tiny_model import scratch_tiny_model

BUDGET_BATCH_SIZE = DEFAULT_BUDGET_RECORDS  # the bound a defaulted budget gets, so its figures are the default's
TINY_BUDGET_BATCH_SIZE = 2048
MODEL_LIMIT = 256  # all-MiniLM-L6-v2's max_seq_length, as the tiny model keeps it


def token_counting(texts: list[str], transformers_call: bool = False) -> dict[str, float]:
    """The driver's TokenCounter over `texts` (a new one: no word counts remembered; `transformers_call`: by the
    transformers tokenizer's call, as before plan.counting): texts/s (wall) and CPU µs per text (all threads)."""
    from transformers import AutoTokenizer

    from embedjob.api import Model
    from embedjob_worker.encode.model import resolve_model
    from embedjob_worker.encode.tokens import TokenCounter, tokenizer_location

    resolved = resolve_model(Model(name=MODEL_NAME, package=MODEL_PACKAGE))
    # transformers' own tokenizer, not the one a driver keeps on disk (encode.tokenizer_cache): the call needs it
    counter = TokenCounter(resolved, MODEL_LIMIT, AutoTokenizer.from_pretrained(tokenizer_location(resolved.location)))
    count = counter.called if transformers_call else counter
    wall, cpu = time.perf_counter(), time.process_time()
    counts = count(texts)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"texts/s": len(texts) / wall, "CPU µs/text": 1e6 * cpu / len(texts),
            "mean tokens/text": sum(counts) / len(counts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--budgets", type=int, nargs="+", default=[4096, 16384], help="maxTokens contenders")
    parser.add_argument("--fixed", type=int, nargs="*", default=[32, 128],
                        help="fixed batchSize contenders (none: only the budgets)")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tiny-texts", type=int, default=20_000, help="texts for the tiny model (0: leave it out)")
    parser.add_argument("--tiny-budget", type=int, default=65_536, help="the tiny model's maxTokens contender")
    parser.add_argument("--counting-only", action="store_true",
                        help="only the driver's token counting, against the transformers tokenizer's call")
    add_corpus_argument(parser)
    args = parser.parse_args()
    records = first_records(max(args.texts, args.tiny_texts), args.corpus)
    tiny_records, records = records[:args.tiny_texts], records[:args.texts]
    counted = [r["text"] for r in records + tiny_records]
    if args.counting_only:
        print(f"{len(counted)} PEP paragraphs counted, {args.rounds} rounds")
        print(report(run_rounds({"token counting, transformers tokenizer's call (before)":
                                 lambda: token_counting(counted, transformers_call=True),
                                 "driver token counting alone": lambda: token_counting(counted)},
                                rounds=args.rounds)))
        return
    print(f"{len(records)} PEP paragraphs, {args.cpus} CPUs, {args.rounds} rounds; "
          f"tiny model: {len(tiny_records)} paragraphs")

    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)

    def driver(inputs: list[dict], batch_size: int, **options) -> dict[str, float]:
        with tempfile.TemporaryDirectory() as tmp:
            steady, wall = embedjob_driver(inputs, batch_size, args.cpus, Path(tmp), **options)
        return {"steady": steady, "wall": wall}

    contenders = {
        **{f"fixed batchSize {size}": (lambda size=size: driver(records, size)) for size in args.fixed},
        **{f"maxTokens {budget} (batchSize ≤ {BUDGET_BATCH_SIZE})":
           (lambda budget=budget: driver(records, BUDGET_BATCH_SIZE, max_tokens=budget)) for budget in args.budgets},
    }
    if tiny_records:
        tiny = {"name": "bench/tiny-random-bert",
                "path": str(scratch_tiny_model())}
        contenders[f"tiny model, fixed batchSize {TINY_BATCH}"] = lambda: driver(
            tiny_records, TINY_BATCH, model=tiny, max_in_flight=8)
        contenders[f"tiny model, maxTokens {args.tiny_budget} (batchSize ≤ {TINY_BUDGET_BATCH_SIZE})"] = lambda: driver(
            tiny_records, TINY_BUDGET_BATCH_SIZE, model=tiny, max_in_flight=8, max_tokens=args.tiny_budget)
    contenders["driver token counting alone"] = lambda: token_counting(counted)
    try:
        results = run_rounds(contenders, rounds=args.rounds)
    finally:
        ray.shutdown()
    print(report(results, unit="texts/s (unless named)"))


if __name__ == "__main__":
    main()
