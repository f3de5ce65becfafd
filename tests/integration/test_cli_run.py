"""`embedjob run` then `embedjob search` as subprocesses: local Ray, the packaged model, real PostgreSQL."""

import json
import os
import re
import shutil

import pytest
import yaml

from embedjob.contract import DATABASE_URL_ENV, ExitCode
from embedjob_worker.source.snapshot import input_snapshot
from support.cli import EMBEDJOB, manifest, run, run_on_ray
from support.corpus import corpus_lines
from support.driver_jobs import write_input
from support.job_models import TORCH_MODEL
from support.manifests import merged
from support.net import free_port
from support.sql import query


@pytest.mark.slow
def test_embedjob_run_then_search(tmp_path, database_url, local_ray):
    write_input(tmp_path / "peps.jsonl", corpus_lines(0, 200))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest("peps.jsonl")))  # relative to the manifest's directory
    # the local Ray's own start: test_the_terminal_shows_... and test_readme_commands.py
    result = run_on_ray(local_ray, [*EMBEDJOB, "run", str(path), "--database-url", database_url])
    assert result.returncode == 0, result.stderr
    assert "records embedded   200" in result.stdout
    assert "batch latency      p50" in result.stdout and "model load" in result.stdout
    assert "batching           fixed batches of 32 records" in result.stdout  # batchSize alone: fixed

    found = run([*EMBEDJOB, "search", str(path), "the purpose of a PEP", "-k", "3", "--database-url", database_url])
    assert found.returncode == 0, found.stderr
    header, *hits = found.stdout.strip().splitlines()
    assert header == "distance  id  chunk  chars  snippet" and len(hits) == 3
    distance, record_id, chunk, chars, _ = hits[0].split(maxsplit=4)
    assert record_id.startswith("pep-0001-") and 0 <= float(distance) < 0.6
    assert chunk == "0" and chars.startswith("0-")  # without spec.chunking: the whole text, chunk 0
    assert "Loading weights" not in found.stderr and "XDG_RUNTIME_DIR" not in found.stderr

    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**manifest("peps.jsonl"), "metadata": {"name": "other"}} | {
        "spec": {**manifest("peps.jsonl")["spec"], "sink": {"databaseSecretRef": {"name": "db"}, "collection": "none"}}}))
    empty = run([*EMBEDJOB, "search", str(other), "anything", "--database-url", database_url])
    assert empty.returncode == 1 and empty.stdout == ""
    assert "no vectors in collection 'none' of table public.embeddings" in empty.stderr


def test_a_missing_source_file_is_a_refused_job_not_a_traceback(tmp_path, database_url, local_ray):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest("does-not-exist.jsonl")))
    result = run_on_ray(local_ray, [*EMBEDJOB, "run", str(path), "--database-url", database_url])
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "SourceUnavailable" in result.stdout and "does-not-exist.jsonl" in result.stdout


@pytest.mark.slow
def test_a_ray_address_nobody_answers_on_ends_ray_unavailable_naming_it(tmp_path, database_url):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest("peps.jsonl")))
    write_input(tmp_path / "peps.jsonl", corpus_lines(0, 5))
    address = f"127.0.0.1:{free_port()}"
    result = run([*EMBEDJOB, "run", str(path), "--database-url", database_url, "--ray-address", address], timeout=120)
    assert result.returncode == ExitCode.RAY_UNREACHABLE, result.stderr
    assert f"embedjob: cannot reach the Ray cluster at {address}" in result.stderr and "Traceback" not in result.stderr
    assert query(database_url, "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'embed%'") == [(0,)]  # nothing


def test_the_terminal_shows_the_commands_own_lines_and_the_libraries_only_with_verbose(tmp_path):
    write_input(tmp_path / "peps.jsonl", corpus_lines(0, 40))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest("peps.jsonl", TORCH_MODEL)))  # transformers' lines come with torch's load
    # a fresh machine's: no XDG_RUNTIME_DIR (platformdirs warns when pgserver asks it for a runtime dir),
    # the embedded PostgreSQL in a fresh data dir, transformers at its own default level
    env = {"XDG_RUNTIME_DIR": None, "XDG_DATA_HOME": str(tmp_path / "data"), DATABASE_URL_ENV: None,
           "TRANSFORMERS_VERBOSITY": None}
    embedded = run([*EMBEDJOB, "run", str(path)], env)
    assert embedded.returncode == 0, embedded.stderr
    first, *bar = [line for line in screen_lines(embedded.stderr) if line.strip()]
    assert first.startswith("embedjob: cli: peps.jsonl -> postgresql://"), embedded.stderr
    assert bar and all(line.startswith("cli: ") for line in bar), embedded.stderr  # the progress bar's
    assert embedded.stdout.startswith("state              succeeded\n"), embedded.stdout

    query = [*EMBEDJOB, "search", str(path), "the purpose of a PEP", "-k", "2"]
    found = run(query, env)
    assert found.returncode == 0 and found.stderr == "", found.stderr
    assert found.stdout.splitlines()[0] == "distance  id  chunk  chars  snippet" and len(found.stdout.splitlines()) == 3

    loud = run([*query, "--verbose"], env)
    assert loud.returncode == 0, loud.stderr
    assert "LOAD REPORT" in loud.stderr and "RuntimeDirWarning" in loud.stderr, loud.stderr
    assert loud.stdout == found.stdout


def screen_lines(stderr: str) -> list[str]:
    """What a terminal shows of stderr: each line as its last carriage return left it."""
    return [line.split("\r")[-1] for line in stderr.split("\n")]


def bar_states(stderr: str) -> list[str]:
    return [state for line in stderr.split("\n") for state in line.split("\r") if "batches=" in state]


@pytest.mark.slow
def test_reruns_are_decided_by_content_and_the_output_is_the_runs(tmp_path, database_url, local_ray):
    long_texts = [json.dumps({"id": f"long-{i}", "text": "embedding " * 400}).encode() for i in range(3)]
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(0, 227) + long_texts)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest(str(source), sortWindow=100)))  # windows 100+100+30: 4+4+1 batches

    first = run_on_ray(local_ray, [*EMBEDJOB, "run", str(job), "--database-url", database_url, "-v"])
    assert first.returncode == 0, first.stderr
    assert "records embedded   230 (3 truncated)" in first.stdout
    assert "9 total" in first.stdout
    # -v: a line per batch written, with its records, worker and latency; above the bar, never in it
    written = [line for line in screen_lines(first.stderr) if "event=batch_written" in line]
    assert len(written) == 9 and all(line.startswith("ts=") for line in written)
    assert all(re.search(r" records=\d+ .*worker=\S+ .*latency_s=[\d.]+", line) for line in written), written[0]
    # the bar counts batches against an estimate until the input is read through
    states = bar_states(first.stderr)
    assert any(re.search(r"batches=\d/~9\b", state) for state in states), states
    assert "batches=9/9" in states[-1]

    recorded = input_snapshot(str(source))  # as the run row keeps it
    os.utime(source, (1_700_000_000, 1_700_000_000))  # touched: the same bytes
    touched = run_on_ray(local_ray, [*EMBEDJOB, "run", str(job), "--database-url", database_url])
    assert touched.returncode == 0, touched.stdout + touched.stderr
    assert "9 succeeded (9 already done)" in touched.stdout
    assert "records embedded   230 (3 truncated)" in touched.stdout  # the run's, not this invocation's

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    copied = elsewhere / "copy.jsonl"
    shutil.copy(source, copied)
    other = elsewhere / "job.yaml"
    other.write_text(yaml.safe_dump(merged(manifest(str(copied), sortWindow=100), {"spec": {"sink": {
        "collection": "other"}}})))
    anew = run_on_ray(local_ray, [*EMBEDJOB, "run", str(other), "--database-url", database_url])
    assert anew.returncode == 0, anew.stdout + anew.stderr
    assert "9 succeeded (0 already done)" in anew.stdout
    assert query(database_url, "SELECT collection, count(*) FROM embeddings GROUP BY collection ORDER BY 1") == \
        [("cli", 230), ("other", 230)]

    changed = tmp_path / "changed.jsonl"
    write_input(changed, corpus_lines(0, 226) + long_texts)
    job.write_text(yaml.safe_dump(manifest(str(changed), sortWindow=100)))
    refused = run_on_ray(local_ray, [*EMBEDJOB, "run", str(job), "--database-url", database_url])
    assert refused.returncode == 1, refused.stdout + refused.stderr
    given = input_snapshot(str(changed))
    assert (f"InputChanged: the input changed from {source} (sha256 {recorded.content[7:19]}, "
            f"{recorded.size} bytes, modified {recorded.modified}) to {changed} (sha256 "
            f"{given.content[7:19]}, {given.size} bytes") in refused.stdout
    assert "--new-run" in refused.stdout
    refusal = [line for line in screen_lines(refused.stderr) if "event=job_refused" in line]
    assert len(refusal) == 1 and refusal[0].startswith("ts="), refused.stderr[-2000:]
