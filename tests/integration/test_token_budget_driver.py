"""Token-budget batches (spec.batching.maxTokens) end to end: real Ray, the real model and tokenizer, real PostgreSQL."""

import json
from collections import Counter

import numpy as np
import pytest

from support.driver_crash import kill_driver_after, succeeded_attempts
from support.corpus import corpus_lines
from support.job_models import FAST_START_MODEL, TORCH_MODEL, model_as_jobs_run_it
from support.driver_jobs import manifest, write_input
from support.sql import query
from embedjob.api_batching import DEFAULT_CPU_MAX_TOKENS
from embedjob_worker.plan.batching import make_batches
from embedjob_worker.core.config import JobConfig
from embedjob_worker.encode.model import load_model, resolve_model
from embedjob_worker.core.records import Record
from embedjob_worker.plan.checks import classify_records
from embedjob_worker.run.job import DriverOptions, run_job
from embedjob_worker.source.files import read_records
from embedjob_worker.encode.tokenizer_cache import KeptTokenizer
from embedjob_worker.encode.tokens import TokenCounter, load_tokenizer, token_budget

pytestmark = pytest.mark.slow
MODEL_LIMIT = 256  # the packaged all-MiniLM-L6-v2's max_seq_length


def budget_manifest(source, name: str, max_tokens: int, batch_size: int = 128, max_in_flight: int = 4,
                    model: dict = FAST_START_MODEL) -> dict:
    spec = manifest(source, name, batch_size=batch_size, max_in_flight=max_in_flight, model=model)
    spec["spec"]["batching"]["maxTokens"] = max_tokens
    return spec


def valid_records(path) -> list[Record]:
    return [r for r in classify_records(read_records(str(path), "jsonl", "id", "text")) if isinstance(r, Record)]


def test_budget_batches_follow_the_plan_and_their_vectors_equal_a_direct_encode(ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(0, 400))
    job = JobConfig.from_manifest(budget_manifest(source, "budget", max_tokens=2048))
    summary = run_job(job, database_url)
    assert summary.state == "succeeded", summary.error

    records = valid_records(source)
    resolved = resolve_model(job.spec.model)
    budget = token_budget(2048, resolved, MODEL_LIMIT)
    planned = list(make_batches(iter(records), 128, job.spec.batching.sort_window, "key", budget))
    # The driver cut the batches the pure planner cuts (same sizes), within the real tokenizer's budget.
    written = query(database_url, "SELECT records FROM embedjob_batches WHERE state = 'succeeded'")
    assert Counter(r.records for r in written) == Counter(len(b.records) for b in planned)
    for batch in planned:
        assert len(batch.records) * max(budget.count(batch.texts)) <= 2048 or len(batch.records) == 1
    assert max(len(b.records) for b in planned) > 4 * min(len(b.records) for b in planned)

    rows = query(database_url, "SELECT record_id, text, embedding::text AS embedding FROM embeddings ORDER BY record_id")
    assert [r.record_id for r in rows] == sorted(r.id for r in records)
    reference = model_as_jobs_run_it(job.spec.model).encode([r.text for r in rows], normalize_embeddings=True,
                                                            convert_to_numpy=True)
    np.testing.assert_allclose(np.array([json.loads(r.embedding) for r in rows]), reference, atol=1e-5)


def test_a_spec_without_batch_size_or_max_tokens_gets_the_cpu_budget(ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(0, 300))
    spec = manifest(source, "defaulted")
    del spec["spec"]["batching"]["batchSize"]
    job = JobConfig.from_manifest(spec)
    summary = run_job(job, database_url)
    assert summary.state == "succeeded", summary.error
    assert summary.batching == (f"maxTokens {DEFAULT_CPU_MAX_TOKENS} (default for CPU), at most 512 records a batch "
                                "(default with a budget)")
    # The run row's identity holds what the job ran with; the batches are the planner's under that budget.
    identity = query(database_url, "SELECT identity FROM embedjob_runs")[0].identity
    assert (identity["batching.maxTokens"], identity["batching.batchSize"]) == (DEFAULT_CPU_MAX_TOKENS, 512)
    budget = token_budget(DEFAULT_CPU_MAX_TOKENS, resolve_model(job.spec.model), MODEL_LIMIT)
    planned = make_batches(iter(valid_records(source)), 512, job.spec.batching.sort_window, "key", budget)
    written = query(database_url, "SELECT records FROM embedjob_batches WHERE state = 'succeeded'")
    assert Counter(r.records for r in written) == Counter(len(b.records) for b in planned)


def test_the_driver_counts_tokens_as_the_model_truncates_them_by_the_tokenizer_built_or_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty cache: the first load builds, the second reads
    texts = [json.loads(line)["text"] for line in corpus_lines(0, 200)] + [" padded  " * 400]
    resolved = resolve_model(JobConfig.from_manifest(manifest("x.jsonl", "t", model=TORCH_MODEL)).spec.model)
    built, kept = load_tokenizer(resolved), load_tokenizer(resolved)
    assert not isinstance(built, KeptTokenizer) and isinstance(kept, KeptTokenizer)
    assert kept.model_max_length == built.model_max_length
    model = load_model(resolved, device="cpu")
    features = getattr(model, "preprocess", model.tokenize)(texts)  # what encode pads: `tokenize` before 5.x
    for tokenizer in (built, kept):
        counts = TokenCounter(resolved, MODEL_LIMIT, tokenizer)(texts)
        assert counts == features["attention_mask"].sum(dim=1).tolist()
        assert max(counts) == MODEL_LIMIT


def test_an_out_of_memory_budget_batch_is_split_and_still_succeeds(ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "oom.jsonl", corpus_lines(2100, 64))
    # torch's own out-of-memory error (torch.OutOfMemoryError), split as the other backends' MemoryError is
    job = JobConfig.from_manifest(budget_manifest(source, "budget-oom", max_tokens=100_000, batch_size=64,
                                                  model=TORCH_MODEL))
    summary = run_job(job, database_url, DriverOptions(fault_injection={"oom_above": 8}))
    assert summary.state == "succeeded", summary.error
    assert summary.oom_splits >= 1
    assert query(database_url, "SELECT count(*), count(DISTINCT record_id) FROM embeddings")[0] == (64, 64)


def test_a_crashed_budget_run_resumes_skipping_the_batches_it_wrote(ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "crash.jsonl", corpus_lines(2800, 320))
    spec = budget_manifest(source, "budget-crash", max_tokens=1024, batch_size=64, max_in_flight=2)
    committed, dispatched = kill_driver_after(spec, database_url, ray_address, tmp_path / "driver.log", batches=4,
                                              timeout=300)
    assert committed and committed <= dispatched

    summary = run_job(JobConfig.from_manifest(spec), database_url)
    assert summary.state == "succeeded", summary.error
    # The same input formed the same batch ids: every committed batch was skipped, none redone.
    assert summary.batches_skipped == len(committed)
    attempts = succeeded_attempts(database_url)
    assert set(attempts.values()) == {1} and committed <= attempts.keys()
    valid = len(valid_records(source))
    assert query(database_url, "SELECT count(*), count(DISTINCT record_id) FROM embeddings")[0] == (valid, valid)

