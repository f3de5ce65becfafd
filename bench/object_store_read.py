"""Records/s of the source readers over objects in a local S3 server against the same files on local disk.

N records of the corpus (repeated under new ids when N exceeds it) are cut into P parts,
written once as JSONL and once as Parquet, to a temporary directory and to a bucket of
moto's S3 server (`moto[server]`, started here on loopback, as the tests start it). Each
round reads each format's parts from both places as one dataset, the way a run with a prefix
for its source does: the snapshot (the listing with each object's ETag; a local file's
sha256) and then every part through `read_dataset`, one after the other, each checked
against its snapshot first. S3's parts are read twice: as a run reads them (fetched whole by
obstore, source/s3_objects.py) and through s3fs alone (what a run did before, and does when
obstore cannot reach the store). No model, no Ray, no sink. moto's server is a Python
(Werkzeug) process on the same two cores, so the S3 figures are a pessimistic stand-in for a
real store's; "bytes only" fetches the same objects whole with botocore and parses nothing,
the most the server allows.

    python bench/object_store_read.py [--records 100000] [--parts 20] [--rounds 3] [--corpus PATH]
        [--moto-python PATH] [--server-cpu N]

moto's server runs under --moto-python (default: $EMBEDJOB_TEST_MOTO_PYTHON, the virtualenv
tests/run makes for it, else this interpreter): its boto3 and s3fs want different botocore versions.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

from corpus import add_corpus_argument, open_corpus
from rounds import ratio, report, run_rounds
from scratch import scratch_dir

FORMATS = ("jsonl", "parquet")


def part_bytes(records: list[dict], fmt: str) -> bytes:
    if fmt == "jsonl":
        return b"".join(json.dumps(r).encode() + b"\n" for r in records)
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"id": [r["id"] for r in records], "text": [r["text"] for r in records]}), sink)
    return sink.getvalue()


def start_s3(python: str, env: dict[str, str], cpu: int | None = None) -> tuple[subprocess.Popen, str]:
    """moto's S3 server on loopback (on CPU `cpu` alone when given); the process and its endpoint."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                              preexec_fn=None if cpu is None else lambda: os.sched_setaffinity(0, {cpu}))
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("moto's S3 server did not start")
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--parts", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--moto-python", default=os.environ.get("EMBEDJOB_TEST_MOTO_PYTHON", sys.executable))
    parser.add_argument("--server-cpu", type=int, metavar="N",
                        help="run moto on CPU N alone and this process on the others, as a store runs on machines of "
                             "its own (default: both share every CPU)")
    add_corpus_argument(parser)
    args = parser.parse_args()

    import botocore.session

    from embedjob_worker.source import dataset
    from embedjob_worker.source.dataset import dataset_snapshot
    from embedjob_worker.source.files import read_dataset

    with open_corpus(args.corpus) as f:
        corpus = [json.loads(line)["text"] for line in f]
    records = [{"id": f"r{i}", "text": corpus[i % len(corpus)]} for i in range(args.records)]
    size = -(-args.records // args.parts)
    parts = [records[i:i + size] for i in range(0, args.records, size)]

    credentials = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    server, endpoint = start_s3(args.moto_python, {**os.environ, **credentials}, args.server_cpu)
    if args.server_cpu is not None:
        os.sched_setaffinity(0, os.sched_getaffinity(0) - {args.server_cpu})
    os.environ.update({**credentials, "AWS_ENDPOINT_URL": endpoint})
    local = scratch_dir("embedjob-object-read-")
    client = botocore.session.get_session().create_client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket="bench")
    uris: dict[str, str] = {}  # each a prefix: the format picks its parts
    for fmt in FORMATS:
        for number, part in enumerate(parts):
            data = part_bytes(part, fmt)
            (local / f"part-{number:05}.{fmt}").write_bytes(data)
            client.put_object(Bucket="bench", Key=f"corpus/part-{number:05}.{fmt}", Body=data)
        uris[f"{fmt} local"] = f"{local}/"
        uris[f"{fmt} s3"] = uris[f"{fmt} s3 through s3fs"] = "s3://bench/corpus/"
    print(f"{args.records} records in {len(parts)} parts, {args.rounds} rounds, S3: moto at {endpoint}")

    fast_fetch = dataset.fetched_object

    def reading(name: str, uri: str):
        fmt = name.split()[0]

        def records_per_second() -> float:
            dataset.fetched_object = (lambda part: None) if name.endswith("s3fs") else fast_fetch
            started = time.perf_counter()
            files = dataset_snapshot(uri, fmt).files
            assert len(files) == len(parts), files
            count = sum(1 for _ in read_dataset(files, fmt, "id", "text"))
            assert count == args.records, count
            return count / (time.perf_counter() - started)
        return records_per_second

    def fetching(fmt: str):
        """The same objects' bytes fetched whole with botocore (no parsing): what the server alone allows."""
        def records_per_second() -> float:
            started = time.perf_counter()
            for number in range(len(parts)):
                client.get_object(Bucket="bench", Key=f"corpus/part-{number:05}.{fmt}")["Body"].read()
            return args.records / (time.perf_counter() - started)
        return records_per_second

    try:
        results = run_rounds({**{name: reading(name, uri) for name, uri in uris.items()},
                              **{f"{fmt} s3 bytes only": fetching(fmt) for fmt in FORMATS}}, rounds=args.rounds)
    finally:
        server.terminate()
    print(report(results, unit="records/s", ratios={
        **{f"{fmt} s3 / local": ratio(results, f"{fmt} s3", f"{fmt} local") for fmt in FORMATS},
        **{f"{fmt} s3 through s3fs / local": ratio(results, f"{fmt} s3 through s3fs", f"{fmt} local")
           for fmt in FORMATS},
        **{f"{fmt} s3 / s3 bytes only": ratio(results, f"{fmt} s3", f"{fmt} s3 bytes only") for fmt in FORMATS}}))


if __name__ == "__main__":
    main()
