"""A dataset's listed files kept in memory as columns (source.listed_files), and its fingerprint hashed as it is listed."""

import hashlib
import json
import pickle

import pytest

from embedjob_worker.source.dataset import dataset_snapshot
from embedjob_worker.source.dataset_listing import LISTING_PAGE
from embedjob_worker.source.listed_files import ListedFiles
from embedjob_worker.source.snapshot import InputSnapshot

KEYED = [
    ("day=1/part-0.jsonl", InputSnapshot("s3://b/ds/day=1/part-0.jsonl", 120, "2026-12-01T00:00:00Z", 'ETag:"a1"')),
    ("", InputSnapshot("s3://b/ds/", 0, None, "uri:s3://b/ds/")),  # an empty key, no modified stamp
    ("naïve/日本語/😀.jsonl", InputSnapshot("gs://b/naïve/日本語/😀.jsonl", None, "", "md5Hash:Zm9v")),
    ("a\x00b\n.jsonl", InputSnapshot("/data/a\x00b\n.jsonl", 2**62, None, "sha256:" + "f" * 64)),
]


def test_each_file_comes_back_as_listed():
    files = ListedFiles(KEYED)
    assert len(files) == len(KEYED)
    # a modified stamp the store gave as "" reads back as None: neither says when the object was written
    expected = [part if part.modified else InputSnapshot(part.uri, part.size, None, part.content) for _, part in KEYED]
    assert list(files) == expected
    assert list(files.keyed()) == [(key, part) for (key, _), part in zip(KEYED, expected)]
    assert tuple(files.keys) == tuple(key for key, _ in KEYED)
    assert files[-1] == expected[-1] and files.keys[-2] == KEYED[-2][0]
    assert files[1:3] == expected[1:3] and files[::-2] == expected[::-2] and files.keys[5:] == []
    with pytest.raises(IndexError):
        files[len(KEYED)]
    with pytest.raises(IndexError):
        files.keys[-len(KEYED) - 1]


def test_an_empty_listing_and_a_pickled_one():
    assert len(ListedFiles([])) == 0 and list(ListedFiles([])) == []
    files = ListedFiles(KEYED)
    assert list(pickle.loads(pickle.dumps(files)).keyed()) == list(files.keyed())


def test_a_listing_kept_a_page_at_a_time_is_the_same_listing():
    files = ListedFiles()
    for start in range(0, len(KEYED), 3):
        files.keep(KEYED[start:start + 3])
    assert list(files.keyed()) == list(ListedFiles(KEYED).keyed()) and files.kept() is files


def test_the_fingerprint_is_the_one_runs_recorded_when_they_kept_the_whole_listing(tmp_path):
    """A run started before the listing was hashed a file at a time resumes: its batch ids derive from this."""
    names = [f"part-{n:05d}-ü.jsonl" for n in range(LISTING_PAGE + 3)]  # more than one page
    for n, name in enumerate(names):
        (tmp_path / name).write_bytes(b"x" * n)
    snapshot = dataset_snapshot(f"{tmp_path}/", "jsonl")
    listed = [[key, part.size, part.content] for key, part in snapshot.files.keyed()]
    assert [key for key, _, _ in listed] == names
    assert snapshot.fingerprint == hashlib.sha256(json.dumps({"files": listed}).encode()).hexdigest()
    assert snapshot.record()["size"] == sum(range(len(names)))
