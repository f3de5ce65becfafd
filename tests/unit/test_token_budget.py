"""Token-budget batches (spec.batching.maxTokens): the pure planner, its validation, the run identity and the CLI flag."""

import random

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from embedjob.api import SpecError, parse_spec
from embedjob_worker.plan.batching import TokenBudget, batch_key, budget_cuts, make_batches
from embedjob_worker.core.config import JobConfig, config_fingerprint, run_identity
from embedjob_worker.core.records import Record
from support.cli import EMBEDJOB, manifest, run

KEY = batch_key("input-fingerprint", "config-fingerprint")
LIMIT = 256  # the model's token limit the counts are capped at


def word_tokens(texts: list[str]) -> list[int]:
    """A stand-in tokenizer for the pure planner: words + 2 special tokens, capped at LIMIT."""
    return [min(LIMIT, len(t.split()) + 2) for t in texts]


def records(n: int, seed: int = 3) -> list[Record]:
    rng = random.Random(seed)
    return [Record(i, f"r{i}", " ".join(["w"] * rng.choice([1, 2, 5, 20, 80, 400]))) for i in range(n)]


def padded(counts: list[int]) -> int:
    return len(counts) * max(counts)


@settings(max_examples=300, deadline=None)
@given(counts=st.lists(st.integers(1, 600), max_size=200), max_tokens=st.integers(1, 5000),
       batch_size=st.integers(1, 64))
def test_cuts_cover_every_record_once_within_budget_and_size_and_are_greedy(counts, max_tokens, batch_size):
    sizes = budget_cuts(counts, max_tokens, batch_size)
    assert sum(sizes) == len(counts) and all(s >= 1 for s in sizes)
    assert budget_cuts(counts, max_tokens, batch_size) == sizes  # deterministic
    start = 0
    for size in sizes:
        batch = counts[start : start + size]
        assert size <= batch_size
        # Within the budget, except a single record that is over it on its own.
        assert padded(batch) <= max_tokens or size == 1
        # Greedy: the next record would have broken the budget or the size bound.
        if start + size < len(counts):
            grown = counts[start : start + size + 1]
            assert size == batch_size or padded(grown) > max_tokens
        start += size


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 300), seed=st.integers(0, 10**6), max_tokens=st.integers(1, 20_000),
       batch_size=st.integers(2, 128), sort_window=st.integers(128, 512))
def test_token_batches_hold_every_record_once_within_budget_with_stable_ids(n, seed, max_tokens, batch_size,
                                                                            sort_window):
    budget = TokenBudget(max_tokens, word_tokens)
    first = list(make_batches(iter(records(n, seed)), batch_size, sort_window, KEY, budget))
    again = list(make_batches(iter(records(n, seed)), batch_size, sort_window, KEY, budget))
    assert [b.batch_id for b in first] == [b.batch_id for b in again]
    assert [[r.id for r in b.records] for b in first] == [[r.id for r in b.records] for b in again]
    assert sorted(r.position for b in first for r in b.records) == list(range(n))
    assert len({b.batch_id for b in first}) == len(first)
    for batch in first:
        assert len(batch.records) <= batch_size
        assert padded(word_tokens(batch.texts)) <= max_tokens or len(batch.records) == 1


def test_short_texts_go_in_large_batches_and_long_ones_in_small_ones():
    short = [Record(i, f"s{i}", "a b c") for i in range(200)]  # 5 tokens
    long = [Record(200 + i, f"l{i}", " ".join(["w"] * 300)) for i in range(20)]  # capped at 256
    batches = list(make_batches(iter(short + long), 128, 4096, KEY, TokenBudget(1024, word_tokens)))
    sizes = {len(b.records): {r.id[0] for r in b.records} for b in batches}
    assert sizes[4] == {"l"}  # 4 × 256 = 1024
    assert sizes[128] == {"s"}  # the batchSize bound, far below 1024 / 5
    # Longest first, as without a budget: the actor meets its largest shape first.
    assert batches[0].records[0].id.startswith("l")


def test_a_window_is_sorted_by_tokens_not_characters():
    wide_word = Record(0, "wide", "x" * 500)  # one word: few tokens, many characters
    many_words = Record(1, "many", " ".join(["w"] * 50))
    batches = list(make_batches(iter([wide_word, many_words]), 2, 16, KEY, TokenBudget(60, word_tokens)))
    assert [[r.id for r in b.records] for b in batches] == [["many"], ["wide"]]


def test_the_budget_changes_batch_ids_only_through_the_run_identity():
    spec = parse_spec(manifest("in.jsonl")["spec"])
    budgeted = parse_spec(manifest("in.jsonl", maxTokens=4096)["spec"])
    identity = run_identity(spec, "rev")
    # A run from before maxTokens existed keeps its fingerprint (and so its batch ids).
    assert "batching.maxTokens" not in identity
    assert run_identity(budgeted, "rev")["batching.maxTokens"] == 4096
    assert config_fingerprint(run_identity(budgeted, "rev")) != config_fingerprint(identity)


@pytest.mark.parametrize(("batching", "field", "message"), [
    ({"maxTokens": 0}, "spec.batching.maxTokens", "greater than or equal to 1"),
    ({"maxTokens": 4096 * 8192 + 1}, "spec.batching.maxTokens", "less than or equal to 33554432"),
    ({"maxTokens": "many"}, "spec.batching.maxTokens", "valid integer"),
    ({"maxTokens": 4096, "sortWindow": 0}, "spec.batching", "maxTokens is only meaningful with length sorting"),
    ({"maxTokens": 4096, "batchSize": 1}, "spec.batching", "maxTokens is only meaningful with batchSize above 1"),
])
def test_bad_budgets_are_refused_naming_the_field(batching, field, message):
    with pytest.raises(SpecError) as refused:
        parse_spec(manifest("in.jsonl", **batching)["spec"])
    assert refused.value.problems[0][0] == field and message in refused.value.problems[0][1]


def test_the_crd_carries_the_same_rules():
    from embedjob.api import Batching

    rules = Batching.model_json_schema()["x-kubernetes-validations"]
    assert [r["message"] for r in rules if r.get("fieldPath") == ".maxTokens"] == [
        "maxTokens is only meaningful with length sorting: set sortWindow above 0 or unset maxTokens",
        "maxTokens is only meaningful with batchSize above 1 (batchSize is the most records per batch)"]


def test_the_cli_flag_overrides_the_manifest_and_is_validated(tmp_path):
    config = JobConfig.from_manifest(manifest("in.jsonl", maxTokens=1000))
    assert config.with_max_tokens(8192).spec.batching.max_tokens == 8192
    assert config.with_max_tokens(8192).spec.sink == config.spec.sink
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest("in.jsonl", sortWindow=0)))
    result = run([*EMBEDJOB, "run", str(path), "--max-tokens", "4096"])
    assert result.returncode == 2, result.stderr
    assert "spec.batching: " in result.stderr and "maxTokens is only meaningful with length sorting" in result.stderr


def test_the_driver_reads_the_models_token_limit_without_loading_it(tmp_path):
    # Batches are planned before any actor has loaded the model (an unchanged incremental re-run
    # starts none), so the driver's limit comes from the spec, else the model's own config.
    from embedjob_worker.encode.model import ResolvedModel
    from embedjob_worker.encode.tokens import model_token_limit

    def resolved(location, max_seq_length=None):
        return ResolvedModel("m", "r", str(location), None, True, max_seq_length)

    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 256, "do_lower_case": false}')
    assert model_token_limit(resolved(tmp_path)) == 256
    assert model_token_limit(resolved(tmp_path, 128)) == 128
    for hostile in ('{"max_seq_length": -1}', '{"max_seq_length": "256"}', "[1]", "not json", ""):
        (tmp_path / "sentence_bert_config.json").write_text(hostile)
        assert model_token_limit(resolved(tmp_path)) is None
    assert model_token_limit(resolved(tmp_path / "missing")) is None
