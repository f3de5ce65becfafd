"""A job's input in Google Cloud Storage, Azure Blob Storage or on a web server (issue 28): an object read where it
lives, from real servers on loopback (fake-gcs-server, Azurite, Python's http.server), through the variables a user
sets. S3's own tests are test_s3_source.py (and the listing's, here, with the others)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import pytest
import yaml

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.source import dataset_listing
from embedjob_worker.source.dataset import dataset_snapshot, is_dataset
from embedjob_worker.source.dataset_reader import read_dataset
from embedjob_worker.source.files import read_records
from embedjob_worker.source.snapshot import input_snapshot
from embedjob_worker.source.unavailable import store_unavailable
from support.cli import EMBEDJOB, manifest, run_on_ray
from support.object_files import corpus_records, encoded
from support.sql import query

pytestmark = pytest.mark.slow

WRONG_SECRET = "wrong-secret-Kp2x9Qz"


@dataclass(frozen=True)
class Store:
    """One store's bucket (container) of the test's own, as the tests use it."""

    scheme: str
    bucket: str
    put: Callable[[str, bytes], None]  # key, bytes
    wrong_credentials: Callable[[object], dict[str, str]]  # tmp_path -> the variables of a refused credential

    def uri(self, key: str, bucket: str | None = None) -> str:
        return f"{self.scheme}://{bucket or self.bucket}/{key}"


def _google_user_credential(tmp_path) -> dict[str, str]:
    # A user credential Google's token endpoint does not know (here: cannot reach) -> google-auth cannot refresh it
    path = tmp_path / "adc.json"
    path.write_text(json.dumps({"type": "authorized_user", "client_id": "embedjob-tests.apps.googleusercontent.com",
                                "client_secret": WRONG_SECRET, "refresh_token": f"1//{WRONG_SECRET}"}))
    return {"GOOGLE_APPLICATION_CREDENTIALS": str(path)}


@pytest.fixture(params=["gs", "az"])
def store(request) -> Store:
    if request.param == "gs":
        server, bucket = request.getfixturevalue("gcs_env")
        return Store("gs", bucket, lambda key, data: server.put(bucket, key, data), _google_user_credential)
    server, container = request.getfixturevalue("azure_env")
    wrong_key = "V3JvbmdLZXk" + WRONG_SECRET + "A" * 59 + "=="  # well-formed base64, not the account's key
    return Store("az", container, lambda key, data: server.put(container, key, data),
                 lambda tmp_path: server.env(key=wrong_key))


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "csv", "parquet"])
def test_an_object_in_a_store_reads_as_the_same_file_on_local_disk(store, tmp_path, fmt):
    data = encoded(corpus_records(50), fmt)
    local = tmp_path / f"in.{fmt}"
    local.write_bytes(data)
    store.put(f"corpus/in.{fmt}", data)
    reader_format = fmt.removesuffix(".gz")
    from_store = list(read_records(store.uri(f"corpus/in.{fmt}"), reader_format, "id", "text"))
    assert from_store == list(read_records(str(local), reader_format, "id", "text")) and len(from_store) == 50


def test_abfs_names_the_same_blob_as_az(azure_env):
    server, container = azure_env
    server.put(container, "in.jsonl", encoded(corpus_records(5), "jsonl"))
    assert (list(read_records(f"abfs://{container}/in.jsonl", "jsonl", "id", "text"))
            == list(read_records(f"az://{container}/in.jsonl", "jsonl", "id", "text")))


def test_an_object_keeps_its_content_stamp_when_the_same_bytes_are_uploaded_again(store):
    uri = store.uri("in.jsonl")
    store.put("in.jsonl", encoded(corpus_records(10), "jsonl"))
    first = input_snapshot(uri)
    store.put("in.jsonl", encoded(corpus_records(10), "jsonl"))
    again = input_snapshot(uri)
    store.put("in.jsonl", encoded(corpus_records(11), "jsonl"))
    changed = input_snapshot(uri)
    assert first.content.split(":")[0] in {"md5Hash", "content_md5"}, first.content
    assert first.fingerprint == again.fingerprint != changed.fingerprint


def failure_line(uri: str, exc: Exception) -> str:
    """The line the driver prints for a job whose input at `uri` failed to open with `exc` (run/start.py)."""
    failure = store_unavailable("SourceUnavailable", f"spec.source {uri}", uri, exc)
    return f"{failure.reason}: {failure}"


def write_job(tmp_path, uri: str):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest(uri)))
    return path


def test_embedjob_run_embeds_an_object_in_a_store(store, tmp_path, database_url, local_ray):
    records = corpus_records(40)
    store.put("peps/part-0.jsonl.gz", encoded(records, "jsonl.gz"))
    result = run_on_ray(local_ray, [*EMBEDJOB, "run", str(write_job(tmp_path, store.uri("peps/part-0.jsonl.gz"))),
                  "--database-url", database_url])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "records embedded   40" in result.stdout
    stored = query(database_url, "SELECT record_id FROM embeddings WHERE collection = 'cli'")
    assert sorted(r.record_id for r in stored) == sorted(r["id"] for r in records)


def test_embedjob_run_with_a_refused_credential_ends_source_unavailable_with_no_secret(store, tmp_path, database_url,
                                                                                      local_ray):
    store.put("in.jsonl", encoded(corpus_records(5), "jsonl"))
    uri = store.uri("in.jsonl")
    result = run_on_ray(local_ray, [*EMBEDJOB, "run", str(write_job(tmp_path, uri)), "--database-url", database_url],
                 env=store.wrong_credentials(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in result.stderr, result.stderr
    assert f"SourceUnavailable: spec.source {uri}: " in result.stdout, output
    assert "the store refused this job's credentials" in result.stdout, output
    assert WRONG_SECRET not in output


@pytest.mark.parametrize("case", ["missing object", "missing bucket"])
def test_a_missing_object_or_bucket_is_source_unavailable_naming_the_url(store, case):
    store.put("in.jsonl", encoded(corpus_records(5), "jsonl"))
    uri = store.uri("nothing-here.jsonl") if case == "missing object" else store.uri("in.jsonl", "embedjob-no-such")
    with pytest.raises(OSError) as raised:
        input_snapshot(uri)
    message = failure_line(uri, raised.value)
    assert message.startswith(f"SourceUnavailable: spec.source {uri}: FileNotFoundError: "), message


def test_a_jsonl_file_on_a_web_server_reads_and_a_missing_one_is_source_unavailable(http_files):
    url, folder = http_files
    records = corpus_records(30)
    (folder / "in.jsonl").write_bytes(encoded(records, "jsonl"))
    for address in (f"{url}/in.jsonl", f"{url}/in.jsonl?X-Amz-Signature=0f1e&X-Amz-Expires=60"):  # a presigned URL
        assert not is_dataset(address)
        read = list(read_records(address, "jsonl", "id", "text"))
        assert [r.id for r in read] == [r["id"] for r in records] and input_snapshot(address).size > 0
    with pytest.raises(OSError) as raised:
        input_snapshot(f"{url}/nothing-here.jsonl")
    message = failure_line(f"{url}/nothing-here.jsonl", raised.value)
    assert message.startswith(f"SourceUnavailable: spec.source {url}/nothing-here.jsonl: FileNotFoundError"), message


def test_an_object_whose_key_holds_glob_characters_is_that_one_object(store):
    records = corpus_records(4, start=7000)
    store.put("notes [draft]*.jsonl", encoded(records, "jsonl"))
    uri = store.uri("notes [draft]*.jsonl")
    assert not is_dataset(uri) and input_snapshot(uri).size == len(encoded(records, "jsonl"))
    assert [r.id for r in read_records(uri, "jsonl", "id", "text")] == [r["id"] for r in records]


def test_a_prefix_and_a_glob_in_a_store_read_their_parts_in_key_order_and_a_replaced_part_is_named(store):
    records = corpus_records(60, start=8000)
    keys = [f"ds/day={n // 3}/part-{n:05d}.{'jsonl.gz' if n % 2 else 'jsonl'}" for n in range(6)]
    for n, key in enumerate(keys):
        store.put(key, encoded(records[n * 10:(n + 1) * 10], key.split(".", 1)[1]))
    store.put("ds/_SUCCESS", b"")
    snapshot = dataset_snapshot(store.uri("ds/"), "jsonl")
    assert tuple(snapshot.files.keys) == tuple(key.removeprefix("ds/") for key in keys)
    read = list(read_dataset(snapshot.files, "jsonl", "id", "text"))
    assert [(r.position, r.id) for r in read] == [(n, r["id"]) for n, r in enumerate(records)]
    assert tuple(dataset_snapshot(store.uri("ds/**/*.jsonl.gz"), "jsonl").files.keys) == tuple(
        key.removeprefix("ds/") for key in keys[1::2])

    store.put(keys[2], encoded(corpus_records(3), "jsonl"))
    with pytest.raises(JobFailed, match=rf"spec.source: {store.uri(keys[2])} changed after the run listed"):
        list(read_dataset(snapshot.files, "jsonl", "id", "text"))


@pytest.fixture(params=["s3", "gs", "az"])
def any_store(request) -> tuple[str, str, Callable[[str, bytes], None]]:
    """Each store's scheme, bucket (container) and a way to put an object in it."""
    if request.param == "s3":
        server, bucket = request.getfixturevalue("s3_env")
        client = server.client()
        return "s3", bucket, lambda key, data: client.put_object(Bucket=bucket, Key=key, Body=data)
    server, bucket = request.getfixturevalue("gcs_env" if request.param == "gs" else "azure_env")
    return request.param, bucket, lambda key, data: server.put(bucket, key, data)


@pytest.mark.parametrize("pattern", ["deep/", "deep/*.jsonl", "deep/**/part-?.jsonl", "deep/[ab]*/*", "deep/a*",
                                     "deep/**"])
def test_a_listing_is_handed_on_a_page_of_the_store_at_a_time_as_fsspec_would_glob_it(any_store, monkeypatch,
                                                                                     pattern):
    scheme, bucket, put = any_store
    keys = ["deep/a/part-1.jsonl", "deep/a-b.jsonl", "deep/b/c/part-2.jsonl", "deep/é.jsonl", "deep/a/part-10.jsonl",
            "deep/Z.jsonl", "deep/a/notes.txt", "other/a/part-1.jsonl"]
    for key in keys:
        put(key, b"{}\n")
    monkeypatch.setattr(dataset_listing, "LISTING_PAGE", 2)
    fs, pages = dataset_listing.dataset_files(f"{scheme}://{bucket}/{pattern}", "jsonl")
    pages = list(pages)
    listed = [name for page in pages for name, _ in page]
    assert fs.dircache == {} and all(len(page) <= 2 for page in pages)  # the store's pages, nothing cached
    if pattern.endswith("/"):
        expected = sorted(f"{bucket}/{key}" for key in keys if key.startswith(pattern) and key.endswith(".jsonl"))
    else:
        expected = sorted(name for name, info in fs.glob(f"{bucket}/{pattern}", detail=True).items()
                          if info["type"] == "file")
        fs.invalidate_cache()
    assert listed == expected and expected  # in code point order of key, as the stores list
