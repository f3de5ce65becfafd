"""Writer actors (spec.sink.writers) end to end: real Ray, the real model, real PostgreSQL.

The same guarantees as the driver's writer thread (test_driver.py): every record once,
resume after a SIGKILLed driver skipping exactly what was committed, at most maxInFlight
batches recomputed, every attempt recorded; and a writer actor killed mid-run costs nothing.
"""

import json
import os
import threading

import pytest
import ray

from support.driver_crash import kill_driver_after, succeeded_batches
from support.corpus import corpus_lines
from support.driver_jobs import manifest, write_input
from support.manifests import merged
from support.polling import wait_until
from support.sql import query
from embedjob_worker.core.config import JobConfig
from embedjob_worker.run.job import run_job
from embedjob_worker.core.actor_names import worker_actor_name

pytestmark = pytest.mark.slow


def with_writers(spec: dict, writers: int) -> dict:
    return merged(spec, {"spec": {"sink": {"writers": writers}}})


def one_succeeded_attempt_per_batch(url: str, batches: int) -> None:
    per_batch = query(url, "SELECT batch_id, count(*) FILTER (WHERE outcome = 'succeeded') FROM embedjob_batch_attempts"
                           " GROUP BY 1")
    assert len(per_batch) == batches and all(count == 1 for _, count in per_batch)


def test_writer_actors_write_every_record_once_with_the_bad_ones_and_exact_counters(ray_address, database_url,
                                                                                    tmp_path):
    good = corpus_lines(4000, 300)
    bad = [b'{"text": "no id"}', b'{"id": "null", "text": null}', b"{not json", good[5]]  # good[5]: a duplicate id
    source = write_input(tmp_path / "mixed.jsonl", good[:150] + bad + good[150:])
    summary = run_job(JobConfig.from_manifest(with_writers(manifest(source, "writers", batch_size=16), 2)),
                      database_url)
    assert summary.state == "succeeded", summary.error
    ids = {json.loads(line)["id"] for line in good}
    assert query(database_url, "SELECT count(*), count(DISTINCT record_id) FROM embeddings")[0] == (300, 300)
    assert {r[0] for r in query(database_url, "SELECT record_id FROM embeddings")} == ids
    assert sorted(r[0] for r in query(database_url, "SELECT reason FROM embedjob_record_errors")) == [
        "duplicate_id", "malformed_record", "missing_id", "null_text"]
    run = query(database_url, "SELECT state, batches_total, batches_succeeded, records_total, records_embedded,"
                              " records_failed, records_new FROM embedjob_runs")
    assert [tuple(r) for r in run] == [("succeeded", 19, 19, 304, 300, 4, 300)]
    assert summary.counters.batches_succeeded == 19 and summary.counters.records_failed == 4
    one_succeeded_attempt_per_batch(database_url, 19)
    # Both writers wrote, each in its own process (the vectors never came to this one).
    assert len(summary.writers) == 2 and sum(summary.writers.values()) == 19
    assert all(count > 0 and not name.endswith(f"/{os.getpid()}") for name, count in summary.writers.items())

    again = run_job(JobConfig.from_manifest(with_writers(manifest(source, "writers", batch_size=16), 2)),
                    database_url)
    assert again.state == "succeeded" and again.batches_skipped == 19
    assert query(database_url, "SELECT batches_succeeded, records_embedded, records_failed FROM embedjob_runs")[0] \
        == (19, 300, 4)


def test_killing_a_writer_actor_mid_run_retries_its_group_and_loses_and_duplicates_nothing(
        ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "kill-writer.jsonl", corpus_lines(4700, 240))
    # maxInFlight 4: a batch counts until a writer committed it, so at the kill most of the run is still to be
    # written and the killed writer's slot gets a group again (unbounded, the encoders had once run so far ahead
    # that the writer's last group was done before the kill, and nothing was lost)
    job = JobConfig.from_manifest(with_writers(manifest(source, "killwriter", batch_size=16, max_in_flight=4), 2))
    outcome = {}
    driver = threading.Thread(target=lambda: outcome.update(summary=run_job(job, database_url)))
    driver.start()
    wait_until("3 batches to succeed", lambda: succeeded_batches(database_url) >= 3, timeout=180)
    ray.kill(ray.get_actor(worker_actor_name(job.job_key, 0, 0, "writer")))
    driver.join(timeout=300)
    summary = outcome["summary"]
    assert summary.state == "succeeded", summary.error
    assert query(database_url, "SELECT count(*), count(DISTINCT record_id) FROM embeddings")[0] == (240, 240)
    one_succeeded_attempt_per_batch(database_url, 15)
    lost = query(database_url, "SELECT reason FROM embedjob_batch_attempts WHERE outcome = 'retry'")
    assert lost and all(r.reason.startswith("WriterLost: ") for r in lost)
    assert query(database_url, "SELECT batches_succeeded, records_embedded FROM embedjob_runs") == [(15, 240)]


def test_killing_the_driver_with_writer_actors_loses_at_most_the_batches_in_flight(ray_address, database_url,
                                                                                    tmp_path):
    max_in_flight = 4
    source = write_input(tmp_path / "kill-driver.jsonl", corpus_lines(5200, 320))
    spec = with_writers(manifest(source, "killwriters", batch_size=16, max_in_flight=max_in_flight), 2)
    committed, dispatched = kill_driver_after(spec, database_url, ray_address, tmp_path / "driver.log", batches=5)
    assert committed <= dispatched
    assert len(dispatched - committed) <= max_in_flight  # a batch counts until a writer committed it

    summary = run_job(JobConfig.from_manifest(spec), database_url)
    assert summary.state == "succeeded", summary.error
    assert summary.batches_skipped == len(committed)
    assert query(database_url, "SELECT count(*), count(DISTINCT record_id) FROM embeddings")[0] == (320, 320)
    one_succeeded_attempt_per_batch(database_url, 20)
    run = query(database_url, "SELECT state, batches_succeeded, records_embedded, records_new FROM embedjob_runs")
    assert run == [("succeeded", 20, 320, 320)]
