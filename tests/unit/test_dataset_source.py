"""A source of many files (a prefix or a glob): its listing, order, snapshot, refusals, and its records read across files."""

import gzip
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedjob_worker.core.errors import JobFailed
from embedjob_worker.core.records import RawRecord
from embedjob_worker.source.dataset import dataset_root, dataset_snapshot, is_dataset, is_pattern
from embedjob_worker.source.dataset_listing import dataset_files
from embedjob_worker.source.dataset_reader import read_dataset
from embedjob_worker.source.files import count_records, read_records, resolve_uri
from embedjob_worker.source.snapshot import describe_input, input_snapshot


def jsonl(*ids: str) -> bytes:
    return b"".join(json.dumps({"id": i, "text": f"text of {i}"}).encode() + b"\n" for i in ids)


@pytest.fixture
def corpus(tmp_path):
    """A dataset folder as a Spark or Ray job leaves it: parts at two depths, one compressed, one empty,
    with files of other kinds beside them."""
    root = tmp_path / "corpus"
    (root / "day=2" / "deep").mkdir(parents=True)
    (root / "part-1.jsonl").write_bytes(jsonl("b1", "b2"))
    (root / "part-0.jsonl.gz").write_bytes(gzip.compress(jsonl("a1")))
    (root / "day=2" / "part-0.json").write_bytes(jsonl("c1", "c2"))
    (root / "day=2" / "deep" / "part-9.ndjson").write_bytes(jsonl("d1"))
    (root / "part-5.jsonl").write_bytes(b"")
    (root / "_SUCCESS").write_bytes(b"")
    (root / "notes.txt").write_text("not data")
    (root / "part-3.csv").write_text("id,text\nx,y\n")
    return root


def ids(records: list[RawRecord]) -> list[tuple[int, str]]:
    return [(r.position, r.id) for r in records]


def test_prefixes_and_globs_name_datasets_and_one_file_stays_one():
    for uri in ("s3://bucket/corpus/", "/data/corpus/", "gs://b/c/*.parquet", "/data/part-?.csv",
                "az://c/p/[ab]*.jsonl", "s3://b/**/x.jsonl", "https://h/c/*.jsonl", "http://h/c/?sig=1"):
        assert is_pattern(uri), uri
    for uri in ("s3://bucket/corpus/in.jsonl", "/data/in.jsonl", "file:///data/in.csv",
                "https://h/in.jsonl?X-Amz-Signature=ab&X-Amz-Expires=60", "HTTP://h/in.csv?x=[1]"):
        assert not is_pattern(uri) and not is_dataset(uri), uri  # a web address's query is no glob
    for uri in ("/data/nothing-here/part-?.csv", "/data/corpus/", "https://127.0.0.1:9/c/*.jsonl"):
        assert is_dataset(uri), uri  # nothing of that exact name (a web server's is not asked)
    assert dataset_root("bucket/corpus", is_prefix=True) == "bucket/corpus"
    assert dataset_root("bucket/corpus/day=*/part-?.jsonl", is_prefix=False) == "bucket/corpus"
    assert dataset_root("bucket/*.jsonl", is_prefix=False) == "bucket"


def test_a_prefix_reads_every_file_of_its_format_at_any_depth_in_lexical_order(corpus):
    snapshot = dataset_snapshot(str(corpus) + "/", "jsonl")
    assert tuple(snapshot.files.keys) == ("day=2/deep/part-9.ndjson", "day=2/part-0.json", "part-0.jsonl.gz",
                                          "part-1.jsonl", "part-5.jsonl")
    records = list(read_dataset(snapshot.files, "jsonl", "id", "text"))
    # positions run on from file to file; the compressed part is decompressed; the empty one adds nothing
    assert ids(records) == [(0, "d1"), (1, "c1"), (2, "c2"), (3, "a1"), (4, "b1"), (5, "b2")]
    assert count_records(str(corpus) + "/", "jsonl") == 6
    assert [f.uri for f in dataset_snapshot(str(corpus) + "/", "csv").files] == [str(corpus / "part-3.csv")]


@pytest.mark.parametrize("pattern, expected", [
    ("part-*.jsonl*", ["part-0.jsonl.gz", "part-1.jsonl", "part-5.jsonl"]),
    ("part-?.jsonl", ["part-1.jsonl", "part-5.jsonl"]),
    ("part-[01].*", ["part-0.jsonl.gz", "part-1.jsonl"]),
    ("**/part-*.*json", ["day=2/deep/part-9.ndjson", "day=2/part-0.json"]),
    ("day=*/part-0.json", ["day=2/part-0.json"]),
])
def test_a_glob_reads_the_files_it_matches_in_lexical_order(corpus, pattern, expected):
    assert list(dataset_snapshot(f"{corpus}/{pattern}", "jsonl").files.keys) == expected


def test_a_web_server_is_no_dataset_store():
    for uri in ("http://127.0.0.1:9/corpus/", "https://example.invalid/corpus/*.jsonl"):
        with pytest.raises(ValueError, match="a web server has no listing to read a prefix or glob from"):
            dataset_files(uri, "jsonl")  # refused before any request


def test_nothing_matched_is_an_error_naming_what_was_looked_for(corpus, tmp_path):
    with pytest.raises(FileNotFoundError, match="no file matches the pattern"):
        list(dataset_files(f"{corpus}/*.parquet", "parquet")[1])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no file under the prefix whose name ends in \.parquet, \.pq"):
        list(dataset_files(f"{tmp_path}/empty/", "parquet")[1])


def test_the_fingerprint_is_the_files_keys_sizes_and_bytes_wherever_they_lie(corpus, tmp_path):
    before = dataset_snapshot(f"{corpus}/", "jsonl")
    moved = shutil.copytree(corpus, tmp_path / "elsewhere" / "corpus")
    assert dataset_snapshot(f"{moved}/", "jsonl").fingerprint == before.fingerprint
    (corpus / "part-1.jsonl").write_bytes(jsonl("b1", "b3"))  # same size, other bytes
    assert dataset_snapshot(f"{corpus}/", "jsonl").fingerprint != before.fingerprint
    (corpus / "part-1.jsonl").write_bytes(jsonl("b1", "b2"))
    (corpus / "part-1.jsonl").rename(corpus / "part-2.jsonl")  # same bytes under another key
    assert dataset_snapshot(f"{corpus}/", "jsonl").fingerprint != before.fingerprint


def test_the_run_row_records_the_dataset_and_names_its_listing(corpus):
    record = dataset_snapshot(f"{corpus}/", "jsonl").record()
    assert describe_input(record).startswith(f"{corpus}/ (5 files, ")
    assert record["listing"] is None  # kept in this process: a driver's is in the database (sink.listings)


def test_a_listing_comes_a_page_at_a_time_in_lexical_order(tmp_path, monkeypatch):
    from embedjob_worker.source import dataset_listing

    monkeypatch.setattr(dataset_listing, "LISTING_PAGE", 2)
    for name in ("a-b.jsonl", "a/x.jsonl", "a/b/y.jsonl", "A.jsonl", "é.jsonl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(jsonl(name))
    pages = list(dataset_files(f"{tmp_path}/", "jsonl")[1])
    assert [len(page) for page in pages] == [2, 2, 1]
    # code point order of the whole key ('-' before '/'), as S3 lists it, not a folder walk's
    assert [name[len(str(tmp_path)) + 1:] for page in pages for name, _ in page] == [
        "A.jsonl", "a-b.jsonl", "a/b/y.jsonl", "a/x.jsonl", "é.jsonl"]


def test_a_file_changed_or_gone_after_the_listing_stops_the_run_naming_it(corpus):
    snapshot = dataset_snapshot(f"{corpus}/", "jsonl")
    (corpus / "part-1.jsonl").write_bytes(jsonl("b1", "b3"))
    records = read_dataset(snapshot.files, "jsonl", "id", "text")
    with pytest.raises(JobFailed) as failure:
        list(records)
    assert failure.value.reason == "InputChanged"
    assert f"spec.source: {corpus}/part-1.jsonl changed after the run listed the dataset's files" in str(failure.value)

    snapshot = dataset_snapshot(f"{corpus}/", "jsonl")
    (corpus / "day=2" / "part-0.json").unlink()
    with pytest.raises(JobFailed, match=r"day=2/part-0.json changed after the run listed .*\(it is gone\)"):
        list(read_dataset(snapshot.files, "jsonl", "id", "text"))


def test_an_unreadable_file_is_named_by_itself_not_by_the_pattern(tmp_path):
    (tmp_path / "a.csv").write_text("id,text\n1,one\n")
    (tmp_path / "b.csv").write_bytes(b"")
    pq.write_table(pa.table({"id": ["x"], "body": ["no text column"]}), tmp_path / "c.parquet")
    pq.write_table(pa.table({"id": ["p"], "text": ["fine"], "extra": [b"\xff" * 10]}), tmp_path / "d.parquet")
    assert ids(list(read_dataset(dataset_snapshot(f"{tmp_path}/*.csv", "csv").files, "csv", "id", "text"))) == \
        [(0, "1")]  # an empty CSV part has no header and no records
    with pytest.raises(JobFailed) as failure:
        list(read_dataset(dataset_snapshot(f"{tmp_path}/", "parquet").files, "parquet", "id", "text"))
    assert failure.value.reason == "SourceUnreadable" and str(failure.value).startswith(f"reading {tmp_path}/c.parquet")


def test_a_file_whose_name_holds_glob_characters_is_that_one_file_and_a_class_globs_around_them(tmp_path):
    names = ["notes [draft].jsonl", "a*b?.jsonl", "run[1]/part-0.jsonl", "run[1]/part-1.jsonl", "run1/part-9.jsonl"]
    for n, name in enumerate(names):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(jsonl(f"r{n}"))
    for n, name in enumerate(names[:2]):
        uri = str(tmp_path / name)
        assert is_pattern(uri) and not is_dataset(uri)
        assert [r.id for r in read_records(uri, "jsonl", "id", "text")] == [f"r{n}"]
        assert input_snapshot(uri).size == len(jsonl(f"r{n}")) and count_records(uri, "jsonl") == 1
    # a folder with such a character inside a glob: the character written as a class of its own
    assert tuple(dataset_snapshot(f"{tmp_path}/run[[]1]/part-*.jsonl", "jsonl").files.keys) == (
        "run[1]/part-0.jsonl", "run[1]/part-1.jsonl")
    assert tuple(dataset_snapshot(f"{tmp_path}/run[1]/part-*.jsonl", "jsonl").files.keys) == ("run1/part-9.jsonl",)


def test_a_relative_prefix_keeps_its_slash():
    assert resolve_uri("data/", Path("/jobs")) == "/jobs/data/" and is_dataset(resolve_uri("data/", Path("/jobs")))


def test_a_stores_files_are_fetched_ahead_yet_a_change_stops_the_read_at_that_file():
    import fsspec

    for n, part in enumerate([("a1", "a2"), ("b1",), ("c1", "c2")]):
        with fsspec.open(f"memory://ahead/part-{n}.jsonl", "wb") as f:
            f.write(jsonl(*part))
    snapshot = dataset_snapshot("memory://ahead/", "jsonl")
    assert ids(list(read_dataset(snapshot.files, "jsonl", "id", "text"))) == [
        (0, "a1"), (1, "a2"), (2, "b1"), (3, "c1"), (4, "c2")]
    read = read_dataset(snapshot.files, "jsonl", "id", "text")
    first = [next(read), next(read)]  # part-1 is fetched meanwhile; part-2 once part-1's turn comes
    with fsspec.open("memory://ahead/part-2.jsonl", "wb") as f:
        f.write(jsonl("c1", "c2", "c3"))
    assert ids([*first, next(read)]) == [(0, "a1"), (1, "a2"), (2, "b1")]
    with pytest.raises(JobFailed, match="memory:///ahead/part-2.jsonl changed after the run listed"):
        next(read)
