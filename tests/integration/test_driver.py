"""The driver end to end: real Ray in the test process (plugins.ray_heads), the real model, real PostgreSQL."""

import json
import threading
import urllib.request
from pathlib import Path

import pytest
import ray

from support.net import free_port
from support.driver_crash import assert_resumed_exactly, kill_driver_after, succeeded_batches
from support.corpus import corpus_lines
from support.driver_jobs import manifest, write_input
from support.polling import wait_until
from support.sql import query
from embedjob_worker.core.config import JobConfig
from embedjob_worker.core.metrics import DriverMetrics
from embedjob_worker.core.records import Record
from embedjob_worker.plan.checks import classify_records
from embedjob_worker.run.job import DriverOptions, run_job
from embedjob_worker.source.files import read_records
from embedjob_worker.core.actor_names import worker_actor_name

pytestmark = pytest.mark.slow


def valid_ids(path: Path) -> set[str]:
    return {r.id for r in classify_records(read_records(str(path), "jsonl", "id", "text")) if isinstance(r, Record)}


def test_a_job_writes_one_row_per_valid_record_and_a_rerun_changes_nothing(ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(0, 250))
    job = JobConfig.from_manifest(manifest(source, "whole"))
    summary = run_job(job, database_url)
    assert summary.state == "succeeded", summary.error
    expected = valid_ids(source)
    assert len(expected) > 225
    written = query(database_url, "SELECT record_id, updated_at FROM embeddings ORDER BY record_id")
    assert {r.record_id for r in written} == expected and len(written) == len(expected)
    run = query(database_url, "SELECT state, batches_total, batches_succeeded, records_embedded, records_total,"
                " texts_per_second FROM embedjob_runs")
    assert len(run) == 1
    assert run[0].state == "succeeded" and run[0].batches_succeeded == run[0].batches_total
    assert run[0].records_embedded == len(expected) and run[0].records_total == 250
    assert run[0].texts_per_second > 0

    again = run_job(job, database_url)
    assert again.state == "succeeded"
    assert again.batches_skipped == run[0].batches_total  # every batch was already done
    assert query(database_url, "SELECT record_id, updated_at FROM embeddings ORDER BY record_id") == written
    assert query(database_url, "SELECT count(*) FROM embedjob_batch_attempts")[0][0] == run[0].batches_total


def test_bad_records_are_recorded_and_the_rest_of_the_batch_succeeds(ray_address, database_url, tmp_path):
    good = corpus_lines(2000, 30)
    long_text = json.dumps({"id": "too-long", "text": "embedding " * 400}).encode()
    bad = [b'{"text": "no id"}', good[0], b'{"id": "null", "text": null}', b'{"id": "number", "text": 42}',
           b'{"id": "blank", "text": "   "}', b'{"id": "latin1", "text": "caf\xe9"}', b"{not json"]
    source = write_input(tmp_path / "mixed.jsonl", good[:10] + bad + [long_text] + good[10:])
    job = JobConfig.from_manifest(manifest(source, "mixed", batch_size=64))  # everything in one batch
    summary = run_job(job, database_url)
    assert summary.state == "succeeded", summary.error
    errors = dict(query(database_url, "SELECT coalesce(record_id, position::text), reason FROM embedjob_record_errors"))
    assert errors == {
        "10": "missing_id", json.loads(good[0])["id"]: "duplicate_id", "null": "null_text",
        "number": "non_string_text", "blank": "empty_text", "latin1": "invalid_utf8", "16": "malformed_record",
        "too-long": "truncated",
    }
    embedded = {r[0] for r in query(database_url, "SELECT record_id FROM embeddings")}
    assert embedded == {json.loads(line)["id"] for line in good} | {"too-long"}
    run = query(database_url, "SELECT records_embedded, records_failed, batches_succeeded FROM embedjob_runs")[0]
    assert tuple(run) == (31, 7, 1)
    assert summary.records_truncated == 1

    # The input changes: the driver refuses to mix it with the vectors of the old one.
    write_input(source, good)
    refused = run_job(job, database_url)
    assert (refused.state, refused.reason) == ("failed", "InputChanged")
    assert query(database_url, "SELECT count(*) FROM embedjob_runs WHERE reason = 'InputChanged'")[0][0] == 1


def test_an_out_of_memory_batch_is_split_and_still_succeeds(ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "oom.jsonl", corpus_lines(2100, 64))
    job = JobConfig.from_manifest(manifest(source, "oom", batch_size=16))
    metrics, port = DriverMetrics(), free_port()
    metrics.serve(port)  # as --metrics-port does
    summary = run_job(job, database_url, DriverOptions(fault_injection={"oom_above": 8}, metrics=metrics))
    assert summary.state == "succeeded", summary.error
    assert summary.oom_splits == 4
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        scraped = response.read().decode()
    assert "embedjob_oom_splits_total 4.0" in scraped
    assert 'embedjob_batches_total{state="succeeded"} 4.0' in scraped
    assert 'embedjob_records_total{outcome="embedded"} 64.0' in scraped
    assert "embedjob_batch_latency_seconds_count" in scraped and "embedjob_model_load_seconds" in scraped
    attempts = query(database_url, "SELECT outcome, count(*) FROM embedjob_batch_attempts GROUP BY 1 ORDER BY 1")
    assert attempts == [("split", 4), ("succeeded", 4)]
    assert query(database_url, "SELECT count(DISTINCT reason) FROM embedjob_batch_attempts"
                 " WHERE outcome = 'split' AND reason LIKE 'OutOfMemory%'")[0][0] == 1
    assert query(database_url, "SELECT count(*) FROM embeddings")[0][0] == 64


def test_a_worker_with_another_model_revision_is_rejected(ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "rev.jsonl", corpus_lines(2200, 16))
    job = JobConfig.from_manifest(manifest(source, "revision"))
    summary = run_job(job, database_url, DriverOptions(fault_injection={"revision": "0000000000000000"}))
    assert (summary.state, summary.reason) == ("failed", "ModelMismatch")
    assert "0000000000000000" in summary.error
    assert query(database_url, "SELECT state, reason FROM embedjob_runs") == [("failed", "ModelMismatch")]
    assert query(database_url, "SELECT count(*) FROM embedjob_batches WHERE state = 'succeeded'")[0][0] == 0


def test_killing_an_actor_mid_job_loses_and_duplicates_nothing(ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "kill-actor.jsonl", corpus_lines(2300, 240))
    job = JobConfig.from_manifest(manifest(source, "killactor", batch_size=16))
    outcome = {}
    driver = threading.Thread(target=lambda: outcome.update(summary=run_job(job, database_url)))
    driver.start()
    wait_until("3 batches to succeed", lambda: succeeded_batches(database_url) >= 3, timeout=180)
    ray.kill(ray.get_actor(worker_actor_name(job.job_key, 0, 0)))
    driver.join(timeout=300)
    summary = outcome["summary"]
    assert summary.state == "succeeded", summary.error
    assert summary.retries >= 1
    assert query(database_url, "SELECT count(*), count(DISTINCT record_id) FROM embeddings")[0] == (240, 240)
    retried = query(database_url, "SELECT batch_id, reason FROM embedjob_batch_attempts WHERE outcome = 'retry'")
    assert retried and all(r.reason.startswith("ActorDied") for r in retried)
    # Each retried batch then succeeded exactly once, on the replacement actor.
    for batch_id, _ in retried:
        assert query(database_url, "SELECT outcome FROM embedjob_batch_attempts WHERE batch_id = :b"
                     " AND outcome = 'succeeded'", b=batch_id) == [("succeeded",)]
    assert query(database_url, "SELECT count(*) FROM embedjob_batches WHERE state = 'succeeded'")[0][0] == 15


def test_killing_the_driver_mid_job_loses_at_most_the_batches_in_flight(ray_address, database_url, tmp_path):
    max_in_flight = 4
    source = write_input(tmp_path / "kill-driver.jsonl", corpus_lines(2800, 320))
    spec = manifest(source, "killdriver", batch_size=16, max_in_flight=max_in_flight)
    committed, dispatched = kill_driver_after(spec, database_url, ray_address, tmp_path / "driver.log", batches=5)
    assert committed <= dispatched
    assert len(dispatched - committed) <= max_in_flight  # the work the crash lost

    # No batch was written twice: one succeeded attempt per batch across both runs.
    assert_resumed_exactly(run_job(JobConfig.from_manifest(spec), database_url), committed, database_url,
                           records=320, batches=20)
    run = query(database_url, "SELECT state, batches_succeeded, records_embedded FROM embedjob_runs")
    assert run == [("succeeded", 20, 320)]
