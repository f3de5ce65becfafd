"""Incremental re-runs of a file source: only new and changed records reach the model (real Ray, model, PostgreSQL)."""

import json

import pytest

from support.corpus import corpus_lines
from support.driver_jobs import manifest, write_input
from support.sql import query
from embedjob_worker.core.config import JobConfig
from embedjob_worker.run.job import DriverOptions, run_job

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("writers", [0, 2])  # the driver's writer thread, writer actors
def test_a_changed_file_run_anew_embeds_only_what_changed_and_deletes_what_is_gone(ray_address, database_url,
                                                                                    tmp_path, writers):
    lines = corpus_lines(3500, 200)
    source = write_input(tmp_path / "in.jsonl", lines)
    spec = manifest(source, "filesync")
    spec["spec"]["sync"] = {"deleteMissing": True}
    spec["spec"]["sink"]["writers"] = writers
    first = run_job(JobConfig.from_manifest(spec), database_url)
    assert first.state == "succeeded", first.error
    assert first.counters.records_new == 200
    before = dict(query(database_url, "SELECT record_id, updated_at FROM embeddings"))

    records = [json.loads(line) for line in lines]
    for record in records[:3]:
        record["text"] += " (revised)"
    gone = records.pop()["id"]
    added = [json.loads(line) for line in corpus_lines(3700, 2)]
    write_input(source, [json.dumps(r).encode() for r in records + added])
    refused = run_job(JobConfig.from_manifest(spec), database_url)
    assert refused.reason == "InputChanged"  # a changed file still needs a new run
    second = run_job(JobConfig.from_manifest(spec), database_url, DriverOptions(new_run=True))
    assert second.state == "succeeded", second.error
    c = second.counters
    assert (c.records_new, c.records_changed, c.records_unchanged, c.records_deleted) == (2, 3, 196, 1)
    assert query(database_url, "SELECT coalesce(sum(records), 0) FROM embedjob_batches WHERE run_id = :r",
                 r=second.run_id)[0][0] == 5
    after = dict(query(database_url, "SELECT record_id, updated_at FROM embeddings"))
    assert gone not in after and set(after) == set(before) - {gone} | {r["id"] for r in added}
    assert {k for k in after if after[k] != before.get(k)} == {r["id"] for r in records[:3] + added}
