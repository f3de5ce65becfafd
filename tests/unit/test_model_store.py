"""A model from storage (spec.model.uri): fetched once per node into the cache, verified against its revision."""

from concurrent.futures import ThreadPoolExecutor

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from embedjob.api import Model
from embedjob_worker.encode.model_store import MODEL_CACHE_ENV, fetch_model, weights_revision
from support.cli import EMBEDJOB, run

FILES = {"modules.json": b"[]", "config.json": b"{}", "model.safetensors": b"weights " * 1000,
         "1_Pooling/config.json": b"{}"}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(MODEL_CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def upload(uri: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        with fsspec.open(f"{uri.rstrip('/')}/{name}", "wb") as f:
            f.write(data)


def local_revision(tmp_path, files: dict[str, bytes]) -> str:
    folder = tmp_path / "model"
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return weights_revision(folder)


def test_a_stored_model_is_fetched_once_per_node_and_verified(tmp_path, cache, monkeypatch):
    upload("memory://models/minilm/", FILES)
    revision = local_revision(tmp_path, FILES)
    downloads = []
    get = MemoryFileSystem.get
    monkeypatch.setattr(MemoryFileSystem, "get", lambda self, *a, **k: downloads.append(a) or get(self, *a, **k))
    with ThreadPoolExecutor(4) as pool:  # four actors of one node at once
        folders = set(pool.map(lambda _: fetch_model("memory://models/minilm/", revision), range(4)))
    assert len(folders) == 1 and len(downloads) == 1
    folder = folders.pop()
    assert folder.parent == cache and weights_revision(folder) == revision
    assert {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} >= set(FILES)
    assert fetch_model("memory://models/minilm", revision) == folder and len(downloads) == 1  # a later job


def test_files_that_do_not_hash_to_the_revision_are_refused_and_never_cached(tmp_path, cache):
    upload("memory://models/other/", {**FILES, "model.safetensors": b"other weights"})
    revision = local_revision(tmp_path, FILES)
    with pytest.raises(ValueError, match=rf"the weights at memory://models/other/ hash to revision [0-9a-f]{{16}}, "
                                         rf"not spec.model.revision {revision}"):
        fetch_model("memory://models/other/", revision)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []
    with pytest.raises(FileNotFoundError, match="no model directory at memory://models/none/"):
        fetch_model("memory://models/none/", revision)


def test_a_model_on_a_mounted_volume_is_used_where_it_lies_once_verified(tmp_path, cache):
    revision = local_revision(tmp_path, FILES)
    assert fetch_model(str(tmp_path / "model"), revision) == tmp_path / "model"
    assert not cache.exists()
    with pytest.raises(ValueError, match="hash to revision"):
        fetch_model(str(tmp_path / "model"), "0" * 16)


def test_the_spec_takes_a_uri_only_alone_with_its_revision_and_never_relative():
    assert Model(name="m", uri="s3://b/models/m/", revision="7e54b3bcd8c7bda9").uri == "s3://b/models/m/"
    for fields, problem in [({"uri": "models/m", "revision": "a" * 16}, "uri must be a URL"),
                            ({"uri": "s3://b/m/", "path": "/m", "revision": "a" * 16}, "set uri without path"),
                            ({"uri": "s3://b/m/"}, "a uri model needs revision")]:
        with pytest.raises(ValueError, match=problem):
            Model(name="m", **fields)


def test_the_cli_prints_the_revision_to_pin(tmp_path):
    revision = local_revision(tmp_path, FILES)
    printed = run([*EMBEDJOB, "model-revision", str(tmp_path / "model")], timeout=120)
    assert (printed.returncode, printed.stdout.strip()) == (0, revision), printed.stderr
    missing = run([*EMBEDJOB, "model-revision", str(tmp_path / "nothing")], timeout=120)
    assert missing.returncode == 2 and "no weight files" in missing.stderr
