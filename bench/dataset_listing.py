"""Seconds and memory to plan a dataset of many small objects in a local S3 server: the listing and snapshot a run starts with.

The largest of `--objects` (default 1,000, 10,000 and 40,000; one short JSONL record each) is
uploaded once to a bucket of moto's S3 server on loopback (started here, as the tests start
it), keyed `many/part-NNNNNN.jsonl`, so that a glob on the key's first digits names each
smaller dataset (`many/part-00*.jsonl` is the first 10,000) and S3 lists only its keys. Each
round takes each dataset's snapshot as a run's start does: `dataset_snapshot` on the glob
into the run's listing in PostgreSQL (sink.listings, a database of its own started here), a
page of 1,000 keys at a time, each file's ETag from the listing, and the fingerprint hashed as
the files come. tracemalloc's peak during a second snapshot (not the timed one: tracing slows
every allocation) is the memory planning takes, what is still allocated once it returns the
memory the run keeps. moto is a Python server on the same cores: a real store lists faster.

    python bench/dataset_listing.py [--objects 1000 10000 40000] [--rounds 3] [--moto-python PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from object_store_read import start_s3
from rounds import report, run_rounds

DIGITS = 6


def glob_of(objects: int) -> str:
    """The glob on the keys' first digits that names the first `objects` keys (a power of ten)."""
    zeros = DIGITS - len(str(objects - 1)) if objects > 1 else DIGITS
    return f"many/part-{'0' * zeros}*.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, nargs="+", default=[1_000, 10_000, 40_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--moto-python", default=os.environ.get("EMBEDJOB_TEST_MOTO_PYTHON", sys.executable))
    args = parser.parse_args()

    import botocore.session
    import fsspec
    import pgserver
    import sqlalchemy as sa

    from embedjob import db, schema
    from embedjob_worker.sink.listings import StoredListing
    from embedjob_worker.sink.postgres import open_engine
    from embedjob_worker.source.dataset import dataset_snapshot

    credentials = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    server, endpoint = start_s3(args.moto_python, {**os.environ, **credentials})
    os.environ.update({**credentials, "AWS_ENDPOINT_URL": endpoint})
    with tempfile.TemporaryDirectory() as tmp:
        postgres = pgserver.get_server(Path(tmp) / "pgdata", cleanup_mode="delete")
        try:
            schema.migrate(postgres.get_uri())
            engine = open_engine(postgres.get_uri())
            client = botocore.session.get_session().create_client("s3", endpoint_url=endpoint)
            client.create_bucket(Bucket="bench")
            started = time.perf_counter()

            def put(n: int) -> None:
                body = json.dumps({"id": f"r{n}", "text": f"record number {n}"}).encode() + b"\n"
                client.put_object(Bucket="bench", Key=f"many/part-{n:0{DIGITS}}.jsonl", Body=body)

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(put, range(max(args.objects))))
            print(f"{max(args.objects)} objects uploaded in {time.perf_counter() - started:.1f} s; S3: moto at "
                  f"{endpoint}")

            def planning(objects: int):
                uri = f"s3://bench/{glob_of(objects)}"

                def snapshot():
                    return dataset_snapshot(uri, "jsonl", StoredListing(engine, "bench/listing", "bench"))

                def figures() -> dict[str, float]:
                    began = time.perf_counter()
                    planned = snapshot()
                    seconds = time.perf_counter() - began
                    assert len(planned.files) == objects, (uri, len(planned.files))
                    del planned
                    fsspec.filesystem("s3").invalidate_cache()
                    gc.collect()
                    # Memory from a second snapshot: tracemalloc slows every allocation, so it stays off the timed one.
                    tracemalloc.start()
                    planned = snapshot()
                    kept, peak = tracemalloc.get_traced_memory()
                    tracemalloc.stop()
                    assert len(planned.files) == objects  # held while measured, as a run holds it
                    with engine.begin() as conn:
                        conn.execute(db.listed_files.delete())
                    return {"seconds": seconds, "peak MiB": peak / 2**20, "kept MiB": kept / 2**20}
                return figures

            results = run_rounds({f"{n} objects": planning(n) for n in args.objects}, rounds=args.rounds)
            with engine.connect() as conn:
                assert conn.execute(sa.select(sa.func.count()).select_from(db.listed_files)).scalar_one() == 0
            engine.dispose()
        finally:
            server.terminate()
            postgres.cleanup()
    print(report(results))


if __name__ == "__main__":
    main()
