"""A job's input in S3 (issue 28, first part): an object read where it lives, from a real S3 API server on loopback
(moto's, with IAM authentication on), through the standard AWS variables and AWS_ENDPOINT_URL."""

from __future__ import annotations

import pytest
import yaml

from embedjob_worker.source.dataset import is_dataset
from embedjob_worker.source.files import read_records
from embedjob_worker.source.snapshot import input_snapshot
from support.cli import EMBEDJOB, manifest, run_on_ray
from support.object_files import corpus_records, encoded
from support.sql import query

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "csv", "parquet"])
def test_an_object_in_s3_reads_as_the_same_file_on_local_disk(s3_env, tmp_path, fmt):
    server, bucket = s3_env
    data = encoded(corpus_records(50), fmt)
    local = tmp_path / f"in.{fmt}"
    local.write_bytes(data)
    server.client().put_object(Bucket=bucket, Key=f"corpus/in.{fmt}", Body=data)
    reader_format = fmt.removesuffix(".gz")
    from_s3 = list(read_records(f"s3://{bucket}/corpus/in.{fmt}", reader_format, "id", "text"))
    assert from_s3 == list(read_records(str(local), reader_format, "id", "text")) and len(from_s3) == 50


def test_an_s3_object_is_known_by_its_etag_the_same_bytes_uploaded_again_are_the_same_input(s3_env):
    server, bucket = s3_env
    uri = f"s3://{bucket}/in.jsonl"
    server.client().put_object(Bucket=bucket, Key="in.jsonl", Body=encoded(corpus_records(10), "jsonl"))
    first = input_snapshot(uri)
    server.client().put_object(Bucket=bucket, Key="in.jsonl", Body=encoded(corpus_records(10), "jsonl"))
    again = input_snapshot(uri)
    server.client().put_object(Bucket=bucket, Key="in.jsonl", Body=encoded(corpus_records(11), "jsonl"))
    changed = input_snapshot(uri)
    assert first.content.startswith("ETag:") and first.fingerprint == again.fingerprint != changed.fingerprint


def test_an_s3_key_that_holds_glob_characters_is_that_one_object(s3_env):
    server, bucket = s3_env
    data = encoded(corpus_records(6), "jsonl")
    server.client().put_object(Bucket=bucket, Key="notes [draft]?.jsonl", Body=data)
    uri = f"s3://{bucket}/notes [draft]?.jsonl"
    assert not is_dataset(uri) and input_snapshot(uri).size == len(data)
    assert [r.id for r in read_records(uri, "jsonl", "id", "text")] == [r["id"] for r in corpus_records(6)]


def write_job(tmp_path, uri: str):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest(uri)))
    return path


def test_embedjob_run_embeds_an_object_in_s3(s3_env, tmp_path, database_url, local_ray):
    server, bucket = s3_env
    records = corpus_records(60)
    server.client().put_object(Bucket=bucket, Key="peps/part-0.jsonl.gz", Body=encoded(records, "jsonl.gz"))
    result = run_on_ray(local_ray, [*EMBEDJOB, "run", str(write_job(tmp_path, f"s3://{bucket}/peps/part-0.jsonl.gz")),
                  "--database-url", database_url])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "records embedded   60" in result.stdout
    stored = query(database_url, "SELECT record_id FROM embeddings WHERE collection = 'cli'")
    assert sorted(r.record_id for r in stored) == sorted(r["id"] for r in records)
    assert server.secret_key not in result.stdout + result.stderr


@pytest.mark.parametrize("case", ["missing object", "missing bucket", "wrong secret key", "unknown access key"])
def test_an_s3_source_that_cannot_be_read_is_source_unavailable_naming_the_url_and_no_secret(
        s3_env, tmp_path, database_url, local_ray, case):
    server, bucket = s3_env
    server.client().put_object(Bucket=bucket, Key="in.jsonl", Body=encoded(corpus_records(5), "jsonl"))
    uri = {"missing object": f"s3://{bucket}/nothing-here.jsonl",
           "missing bucket": "s3://embedjob-no-such-bucket/in.jsonl"}.get(case, f"s3://{bucket}/in.jsonl")
    wrong_secret = "wrong-secret-Kp2x9Qz"
    env = {"wrong secret key": server.env(secret_key=wrong_secret),
           "unknown access key": server.env(access_key="AKIANOSUCHKEY0000000", secret_key=wrong_secret)}.get(case, {})
    result = run_on_ray(local_ray, [*EMBEDJOB, "run", str(write_job(tmp_path, uri)), "--database-url", database_url],
                 env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in result.stderr, result.stderr
    assert "SourceUnavailable" in result.stdout and uri in result.stdout, output
    assert wrong_secret not in output and server.secret_key not in output
    if "key" in case:
        assert "PermissionError: Forbidden; the store refused this job's credentials" in result.stdout, output
