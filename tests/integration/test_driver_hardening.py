"""The driver against hostile input, unforeseen errors, changed configs, hung actors and a second driver."""

import threading

import pytest

from embedjob_worker.plan import feed
from embedjob_worker.core.config import JobConfig
from embedjob_worker.run.job import DriverOptions, run_job
from support.corpus import corpus_lines
from support.driver_jobs import manifest, write_input
from support.hostile import OK, hostile_jsonl_bytes, hostile_jsonl_entries
from support.manifests import merged
from support.polling import wait_until
from support.sql import query

pytestmark = pytest.mark.slow


def test_the_hostile_catalogue_embeds_every_valid_record_once_and_records_every_bad_one(
        ray_address, database_url, tmp_path):
    entries = hostile_jsonl_entries()
    source = tmp_path / "hostile.jsonl"
    source.write_bytes(hostile_jsonl_bytes(entries))
    summary = run_job(JobConfig.from_manifest(manifest(source, "hostile", batch_size=16)), database_url)
    assert summary.state == "succeeded", summary.error
    rows = query(database_url, "SELECT record_id, count(*) FROM embeddings GROUP BY record_id")
    assert all(count == 1 for _, count in rows)
    valid_positions = [i for i, (_, _, expected) in enumerate(entries) if expected == OK]
    assert len(rows) == len(valid_positions)
    errors = query(database_url, "SELECT position, reason FROM embedjob_record_errors WHERE reason <> 'truncated'")
    expected_errors = {i: expected.value for i, (_, _, expected) in enumerate(entries) if expected != OK}
    assert dict(errors) == expected_errors and len(errors) == len(expected_errors)
    truncated = query(database_url, "SELECT position FROM embedjob_record_errors WHERE reason = 'truncated'")
    assert {p for (p,) in truncated} <= set(valid_positions)
    run = query(database_url, "SELECT state, records_embedded, records_failed FROM embedjob_runs")
    assert [tuple(r) for r in run] == [("succeeded", len(valid_positions), len(expected_errors))]


def test_an_unforeseen_exception_ends_the_run_failed_with_its_type(ray_address, database_url, tmp_path,
                                                                     monkeypatch):
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(0, 40))
    real_make_batches = feed.make_batches

    def make_batches_then_fail(*args, **kwargs):
        yield next(real_make_batches(*args, **kwargs))
        raise RecursionError("maximum recursion depth exceeded (injected)")

    monkeypatch.setattr(feed, "make_batches", make_batches_then_fail)
    summary = run_job(JobConfig.from_manifest(manifest(source, "unforeseen", batch_size=16)), database_url)
    assert (summary.state, summary.reason) == ("failed", "InternalError")
    run = query(database_url, "SELECT state, reason, error, finished_at FROM embedjob_runs")
    assert len(run) == 1 and (run[0].state, run[0].reason) == ("failed", "InternalError")
    assert run[0].error.startswith("RecursionError: maximum recursion depth") and run[0].finished_at is not None


def test_a_changed_collection_is_refused_by_name_and_written_whole_with_new_run(ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(100, 40))
    # A uid (a cluster job): locally another collection is another job (JobConfig.job_key), not a changed one.
    first = merged(manifest(source, "moving", batch_size=16), {"metadata": {"uid": "moving-uid"}})
    assert run_job(JobConfig.from_manifest(first), database_url).state == "succeeded"
    written = query(database_url, "SELECT count(*) FROM embeddings WHERE collection = 'moving'")[0][0]
    assert written > 30
    first_run = query(database_url, "SELECT run_id FROM embedjob_runs")[0][0]

    moved = JobConfig.from_manifest(merged(first, {"spec": {"sink": {"collection": "moved"},
                                                            "model": {"normalize": False}}}))
    refused = run_job(moved, database_url)
    assert (refused.state, refused.reason) == ("failed", "InputChanged")
    assert "model.normalize changed from True to False" in refused.error
    assert f"sink.collection changed from 'moving' to 'moved' since run {first_run}" in refused.error
    assert "Delete and re-create the EmbeddingJob" in refused.error and "input changed" not in refused.error
    assert query(database_url, "SELECT count(*) FROM embeddings WHERE collection = 'moved'")[0][0] == 0

    anew = run_job(moved, database_url, DriverOptions(new_run=True))
    assert anew.state == "succeeded" and anew.batches_skipped == 0
    assert query(database_url, "SELECT count(*) FROM embeddings WHERE collection = 'moved'")[0][0] == written
    # Back to the first settings: the first run's identity again, so nothing is embedded twice.
    again = run_job(JobConfig.from_manifest(first), database_url)
    assert again.state == "failed" and "sink.collection changed from 'moved' to 'moving'" in again.error


def test_a_hung_actor_is_killed_replaced_and_its_batch_retried(ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(200, 48))
    options = DriverOptions(fault_injection={"hang_once_file": str(tmp_path / "hung")}, hung_batch_floor_s=15.0)
    summary = run_job(JobConfig.from_manifest(manifest(source, "hung", batch_size=16, max_in_flight=1)),
                      database_url, options)
    assert summary.state == "succeeded", summary.error
    assert (tmp_path / "hung").exists() and summary.retries == 1
    assert query(database_url, "SELECT count(DISTINCT record_id), count(*) FROM embeddings")[0] == (48, 48)
    timed_out = query(database_url, "SELECT outcome, reason FROM embedjob_batch_attempts WHERE reason LIKE 'Batch%'")
    assert len(timed_out) == 1 and timed_out[0].outcome == "retry"
    assert timed_out[0].reason.startswith("BatchTimeout: no result after 15s: the actor was killed and replaced")


def batches_written(url: str) -> int:
    if query(url, "SELECT to_regclass('embedjob_runs')")[0][0] is None:  # not migrated yet
        return 0
    return query(url, "SELECT coalesce(sum(batches_succeeded), 0) FROM embedjob_runs")[0][0]


def test_a_second_driver_of_a_running_job_refuses_or_waits_and_the_counts_stay_exact(ray_address, database_url,
                                                                                     tmp_path):
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(300, 160))
    job = JobConfig.from_manifest(manifest(source, "twice", batch_size=16, max_in_flight=1))
    first: list = []
    runner = threading.Thread(target=lambda: first.append(run_job(job, database_url)))
    runner.start()
    wait_until("the first driver wrote a batch", lambda: batches_written(database_url), timeout=120)

    refused = run_job(job, database_url, DriverOptions(job_lock_wait_s=1.0))
    assert (refused.state, refused.reason, refused.run_id) == ("failed", "JobAlreadyRunning", None)
    assert "another driver of job local/tests/twice/embeddings/twice holds its lock (run " in refused.error
    assert runner.is_alive() and query(database_url, "SELECT count(*), min(state) FROM embedjob_runs")[0] == \
        (1, "running")

    waited = run_job(job, database_url)  # waits for the first driver, then finds every batch done
    runner.join()
    assert first[0].state == "succeeded" and waited.state == "succeeded"
    assert waited.run_id == first[0].run_id and waited.batches_skipped == first[0].counters.batches_total
    run = query(database_url, "SELECT state, batches_succeeded, batches_total, records_embedded FROM embedjob_runs")
    assert len(run) == 1 and run[0].state == "succeeded" and run[0].batches_succeeded == run[0].batches_total
    assert run[0].records_embedded == first[0].counters.records_embedded
    assert query(database_url, "SELECT count(*) FROM embeddings")[0][0] == run[0].records_embedded
    assert query(database_url, "SELECT count(*) FROM embedjob_batch_attempts")[0][0] == run[0].batches_total


def test_a_percentage_tolerance_is_decided_on_all_batches_and_nothing_embedded_is_never_success(
        ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "all-fail.jsonl", corpus_lines(3000, 64))
    failing = DriverOptions(fault_injection={"oom_above": 0})  # even a single text "runs out of memory"

    tolerated = JobConfig.from_manifest(manifest(source, "tolerated", batch_size=16, attemptsPerBatch=1,
                                                 failedBatchesToleratedPercent=100))
    summary = run_job(tolerated, database_url, failing)
    assert (summary.state, summary.reason) == ("failed", "NothingEmbedded"), summary.error
    assert summary.counters.batches_failed == 4 and summary.counters.records_embedded == 0

    half = JobConfig.from_manifest(manifest(source, "half", batch_size=16, attemptsPerBatch=1,
                                            failedBatchesToleratedPercent=50))
    summary = run_job(half, database_url, failing)
    assert (summary.state, summary.reason) == ("failed", "TooManyFailedBatches"), summary.error
    assert "more than the 2 that" in summary.error and "of 4 batches" in summary.error
    # Every batch was still tried: the percentage is only known once the input is read through.
    assert summary.counters.batches_failed == 4
