"""Seconds and memory to plan a dataset of many small objects in a local S3 server: the listing and snapshot a run starts with.

N objects (default 10,000, one short JSONL record each) are uploaded once to a bucket of
moto's S3 server on loopback (started here, as the tests start it). Each round takes the
dataset's snapshot as a run's start does (`dataset_snapshot` on the prefix: the listing,
1,000 keys a request, and each file's ETag from it) and, for comparison, on a glob over the
same keys; tracemalloc's peak during a second snapshot (not the timed one: tracing slows
every allocation) is the memory planning takes, what is still allocated once it returns (the
snapshot, and any listing the store's filesystem caches) the memory a run keeps, and the
size of the run row's JSON (`DatasetSnapshot.record`) what the database keeps. moto is a
Python server on the same two cores: a real store lists faster.

    python bench/dataset_listing.py [--objects 10000] [--rounds 3] [--moto-python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

from object_store_read import start_s3
from rounds import report, run_rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--moto-python", default=os.environ.get("EMBEDJOB_TEST_MOTO_PYTHON", sys.executable))
    args = parser.parse_args()

    import botocore.session
    import fsspec

    from embedjob_worker.source.dataset import dataset_snapshot

    credentials = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    server, endpoint = start_s3(args.moto_python, {**os.environ, **credentials})
    os.environ.update({**credentials, "AWS_ENDPOINT_URL": endpoint})
    try:
        client = botocore.session.get_session().create_client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="bench")
        started = time.perf_counter()

        def put(n: int) -> None:
            body = json.dumps({"id": f"r{n}", "text": f"record number {n}"}).encode() + b"\n"
            client.put_object(Bucket="bench", Key=f"many/day={n % 10}/part-{n:06}.jsonl", Body=body)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, range(args.objects)))
        print(f"{args.objects} objects uploaded in {time.perf_counter() - started:.1f} s; S3: moto at {endpoint}")

        def planning(uri: str):
            def figures() -> dict[str, float]:
                began = time.perf_counter()
                snapshot = dataset_snapshot(uri, "jsonl")
                seconds = time.perf_counter() - began
                assert len(snapshot.files) == args.objects, len(snapshot.files)
                # Memory from a second snapshot: tracemalloc slows every allocation, so it stays off the timed one.
                # "kept" is what stays allocated while the run holds the snapshot (the store's listing cache too).
                del snapshot
                fsspec.filesystem("s3").invalidate_cache()  # the listing the first snapshot cached counts too
                tracemalloc.start()
                snapshot = dataset_snapshot(uri, "jsonl")
                kept, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                return {"seconds": seconds, "peak MiB": peak / 2**20, "kept MiB": kept / 2**20,
                        "run row KiB": len(json.dumps(snapshot.record())) / 1024}
            return figures

        results = run_rounds({"prefix": planning("s3://bench/many/"),
                              "glob": planning("s3://bench/many/**/part-*.jsonl")}, rounds=args.rounds)
    finally:
        server.terminate()
    print(report(results))


if __name__ == "__main__":
    main()
