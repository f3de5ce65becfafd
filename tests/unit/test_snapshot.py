"""The input snapshot: local files by their bytes, remote objects by their store's content stamp."""

import os
import shutil

import fsspec

from embedjob_worker.source.snapshot import describe_input, input_snapshot, store_content_stamp


def test_a_local_input_is_identified_by_its_bytes_not_its_path_or_mtime(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "a", "text": "alpha"}\n')
    before = input_snapshot(str(path))
    os.utime(path, (1_700_000_000, 1_700_000_000))  # touch
    touched = input_snapshot(str(path))
    assert touched.fingerprint == before.fingerprint and touched.modified == "2023-11-14T22:13:20Z"
    copy = tmp_path / "elsewhere" / "copy.jsonl"
    copy.parent.mkdir()
    shutil.copy(path, copy)
    assert input_snapshot(str(copy)).fingerprint == before.fingerprint
    assert input_snapshot("file://" + str(path)).fingerprint == before.fingerprint

    path.write_text('{"id": "a", "text": "alphA"}\n')  # same size, other bytes
    changed = input_snapshot(str(path))
    assert changed.fingerprint != before.fingerprint and changed.size == before.size


def test_a_description_names_the_uri_a_short_hash_the_size_and_the_time(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"{}\n")
    os.utime(path, (1_700_000_000, 1_700_000_000))
    snapshot = input_snapshot(str(path))
    assert describe_input(snapshot.record()) == \
        f"{path} (sha256 {snapshot.content[7:19]}, 3 bytes, modified 2023-11-14T22:13:20Z)"
    assert "not recorded" in describe_input(None)


def test_a_remote_object_is_identified_by_its_content_stamp_then_its_version():
    s3 = {"size": 10, "ETag": '"9e107d9d372bb6826bd81d3542a419d6"', "LastModified": "2026-11-29T00:00:00Z"}
    assert store_content_stamp("s3://b/k", s3) == 'ETag:"9e107d9d372bb6826bd81d3542a419d6"'
    gcs = {"size": 10, "md5Hash": "nhB9nTcrtoJr2B01QqQZ1g==", "etag": "CKih16GjycICEAE=", "generation": "17"}
    assert store_content_stamp("gs://b/k", gcs) == "md5Hash:nhB9nTcrtoJr2B01QqQZ1g=="
    assert store_content_stamp("https://h/k", {"size": 10, "last_modified": "yesterday"}) == "last_modified:yesterday"
    assert store_content_stamp("https://h/k", {"size": 10}) == "uri:https://h/k"


def test_an_object_in_a_store_without_stamps_is_identified_by_its_uri_and_size():
    with fsspec.open("memory://snapshot/in.jsonl", "wb") as f:
        f.write(b"{}\n")
    snapshot = input_snapshot("memory://snapshot/in.jsonl")
    assert (snapshot.size, snapshot.content) == (3, "uri:memory://snapshot/in.jsonl")
