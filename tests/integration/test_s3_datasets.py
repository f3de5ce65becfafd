"""A dataset of many objects in S3 (issue 28, second part): a prefix or a glob over parts on a real S3 API server (moto's,
with IAM authentication on), read in key order, resumed after a kill, and refused by file when parts change."""

from __future__ import annotations

import pytest

from embedjob_worker.core.config import JobConfig
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.run.job import run_job
from embedjob_worker.source import dataset, s3_objects
from embedjob_worker.source.dataset import dataset_snapshot
from embedjob_worker.source.dataset_reader import read_dataset
from support.driver_crash import assert_resumed_exactly, kill_driver_after
from support.driver_jobs import manifest
from support.object_files import corpus_records, encoded
from support.sql import query

pytestmark = pytest.mark.slow

PARTS = 20


def upload_parts(server, bucket: str, records: list[dict], prefix: str = "corpus/") -> list[str]:
    """The records cut into PARTS objects, every third one gzipped, beside a _SUCCESS marker; their keys."""
    client, keys = server.client(), []
    size = len(records) // PARTS
    for n in range(PARTS):
        fmt = "jsonl.gz" if n % 3 == 0 else "jsonl"
        keys.append(f"{prefix}part-{n:05d}.{fmt}")
        client.put_object(Bucket=bucket, Key=keys[-1], Body=encoded(records[n * size:(n + 1) * size], fmt))
    client.put_object(Bucket=bucket, Key=f"{prefix}_SUCCESS", Body=b"")
    return keys


def dataset_job(uri: str, name: str, **options) -> JobConfig:
    spec = manifest(uri, name, **options)
    return JobConfig.from_manifest(spec)


def test_a_prefix_is_embedded_once_per_record_in_key_order_and_changed_parts_are_named(
        s3_env, ray_address, database_url):
    server, bucket = s3_env
    records = corpus_records(200, start=6000)
    keys = upload_parts(server, bucket, records)
    uri = f"s3://{bucket}/corpus/"
    snapshot = dataset_snapshot(uri, "jsonl")
    assert tuple(snapshot.files.keys) == tuple(key.removeprefix("corpus/") for key in keys)
    assert all(part.content.startswith("ETag:") for part in snapshot.files)
    read = list(read_dataset(snapshot.files, "jsonl", "id", "text"))
    assert [(r.position, r.id) for r in read] == [(n, r["id"]) for n, r in enumerate(records)]

    job = dataset_job(uri, "prefix", batch_size=16)
    summary = run_job(job, database_url)
    assert summary.state == "succeeded", summary.error
    assert summary.counters.records_embedded == 200
    assert query(database_url, "SELECT count(*), count(DISTINCT record_id) FROM embeddings")[0] == (200, 200)
    again = run_job(job, database_url)  # the same objects: every batch was already written
    assert again.state == "succeeded" and again.batches_skipped == summary.counters.batches_total
    assert query(database_url, "SELECT count(*) FROM embedjob_batch_attempts")[0][0] == summary.counters.batches_total

    client = server.client()
    client.put_object(Bucket=bucket, Key=keys[4], Body=encoded(corpus_records(10, start=7000), "jsonl"))
    client.delete_object(Bucket=bucket, Key=keys[7])
    client.put_object(Bucket=bucket, Key="corpus/part-00020.jsonl", Body=encoded(corpus_records(3), "jsonl"))
    refused = run_job(job, database_url)
    assert (refused.state, refused.reason) == ("failed", "InputChanged"), refused
    print(refused.error)
    assert f"the input changed from {uri} (20 files, " in refused.error
    assert ("(files changed: part-00004.jsonl; gone: part-00007.jsonl; new: part-00020.jsonl)"
            in refused.error), refused.error


def test_a_part_replaced_after_the_listing_stops_the_read_naming_it(s3_env):
    server, bucket = s3_env
    keys = upload_parts(server, bucket, corpus_records(40))
    snapshot = dataset_snapshot(f"s3://{bucket}/corpus/part-*.jsonl*", "jsonl")
    assert len(snapshot.files) == PARTS
    server.client().put_object(Bucket=bucket, Key=keys[5], Body=encoded(corpus_records(2, start=100), "jsonl"))
    read = read_dataset(snapshot.files, "jsonl", "id", "text")
    with pytest.raises(JobFailed) as failure:
        list(read)
    assert failure.value.reason == "InputChanged"
    print(failure.value)
    assert f"s3://{bucket}/{keys[5]} changed after the run listed the dataset's files (it was ETag:" in str(failure.value)


def test_parts_are_fetched_by_obstore_with_botocores_credentials_and_a_refused_store_falls_back_to_s3fs(
        s3_env, monkeypatch):
    server, bucket = s3_env
    records = corpus_records(40, start=300)
    upload_parts(server, bucket, records)
    snapshot = dataset_snapshot(f"s3://{bucket}/corpus/", "jsonl")
    expected = [(n, r["id"]) for n, r in enumerate(records)]
    with monkeypatch.context() as without_fsspec:  # every part by obstore's one GET: fsspec's opening never asked
        without_fsspec.setattr(dataset, "opened_as_listed", lambda part: pytest.fail(f"{part.uri} read by fsspec"))
        assert [(r.position, r.id) for r in read_dataset(snapshot.files, "jsonl", "id", "text")] == expected

    from obstore.store import S3Store

    refused = S3Store(bucket, endpoint=server.endpoint, region="us-east-1", access_key_id="AKIDREFUSED",
                      secret_access_key="refused-secret-Zq81", client_options={"allow_http": True})
    monkeypatch.setattr(s3_objects, "_stores", {})
    monkeypatch.setattr(s3_objects, "_new_store", lambda name: refused)
    opened, logged, real_opened = [], [], dataset.opened_as_listed
    monkeypatch.setattr(dataset, "opened_as_listed", lambda part: opened.append(part.uri) or real_opened(part))
    monkeypatch.setattr(s3_objects, "log_event", lambda logger, event, level, **fields: logged.append((event, fields)))
    assert [(r.position, r.id) for r in read_dataset(snapshot.files, "jsonl", "id", "text")] == expected
    assert opened == [part.uri for part in snapshot.files]  # the store refused obstore's first request: s3fs read all
    assert [(event, fields["bucket"]) for event, fields in logged] == [("s3_objects_through_fsspec", bucket)]  # once
    assert "refused-secret" not in str(logged)



def test_a_parquet_glob_reads_only_its_columns_and_nothing_matched_is_source_unavailable(
        s3_env, ray_address, database_url):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    server, bucket = s3_env
    records = corpus_records(30, start=6500)
    for n in range(3):
        part = records[n * 10:(n + 1) * 10]
        sink = io.BytesIO()
        # a wide column the job never reads; projection leaves it in the store
        pq.write_table(pa.table({"id": [r["id"] for r in part], "text": [r["text"] for r in part],
                                 "blob": [b"\0" * 100_000] * len(part)}), sink)
        server.client().put_object(Bucket=bucket, Key=f"pq/day={n}/part-0.parquet", Body=sink.getvalue())
    snapshot = dataset_snapshot(f"s3://{bucket}/pq/**/*.parquet", "parquet")
    assert tuple(snapshot.files.keys) == ("day=0/part-0.parquet", "day=1/part-0.parquet", "day=2/part-0.parquet")
    read = list(read_dataset(snapshot.files, "parquet", "id", "text"))
    assert [(r.position, r.id, r.text) for r in read] == [(n, r["id"], r["text"]) for n, r in enumerate(records)]

    spec = manifest(f"s3://{bucket}/pq/**/*.jsonl", "nomatch")
    summary = run_job(JobConfig.from_manifest(spec), database_url)
    assert (summary.state, summary.reason) == ("failed", "SourceUnavailable")
    assert summary.error == (f"spec.source s3://{bucket}/pq/**/*.jsonl: FileNotFoundError: "
                             "no file matches the pattern")


def test_killing_the_driver_mid_dataset_resumes_skipping_the_files_it_finished(s3_env, ray_address, database_url,
                                                                              tmp_path, caplog):
    server, bucket = s3_env
    records = corpus_records(320, start=6200)
    upload_parts(server, bucket, records)
    spec = manifest(f"s3://{bucket}/corpus/", "killed", batch_size=16, max_in_flight=2)
    spec["spec"]["batching"]["sortWindow"] = 16  # shards of 4 windows: 4 parts of 16 records, 4 batches
    committed, dispatched = kill_driver_after(spec, database_url, ray_address, tmp_path / "driver.log", batches=8)
    assert committed <= dispatched and len(dispatched - committed) <= 2
    # The shards the killed session read through and whose batches were all written; the first one at least (its
    # row is queued before the next shard's first batch is dispatched, so it commits before that batch does).
    shards = query(database_url, "SELECT first_file, batch_ids FROM embedjob_run_shards ORDER BY first_file")
    finished = [first for first, batch_ids in shards if set(batch_ids) <= committed]
    assert finished[:1] == [0], finished

    with caplog.at_level("INFO", logger="embedjob_worker.plan.feed"):
        summary = run_job(JobConfig.from_manifest(spec), database_url)
    assert_resumed_exactly(summary, committed, database_url, records=320, batches=20)
    skipped = [int(r.fields["first_file"]) for r in caplog.records if r.getMessage() == "shard_skipped"]
    assert skipped == finished
    assert summary.counters.records_total == 320 and summary.counters.batches_total == 20
    assert query(database_url, "SELECT count(*) FROM embedjob_run_shards")[0][0] == 0  # gone with the run's end
