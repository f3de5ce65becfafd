"""`embedjob run` then `embedjob search` as subprocesses: local Ray, the packaged model, real PostgreSQL."""

import pytest
import yaml

from support.cli import EMBEDJOB, manifest, run
from support.paths import CORPUS


@pytest.mark.slow
def test_embedjob_run_then_search(tmp_path, database_url):
    with CORPUS.open() as f:
        (tmp_path / "peps.jsonl").write_text("".join(line for _, line in zip(range(200), f)))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest("peps.jsonl")))  # relative to the manifest's directory
    result = run([*EMBEDJOB, "run", str(path), "--database-url", database_url])
    assert result.returncode == 0, result.stderr
    assert "records embedded   200" in result.stdout
    assert "batch latency      p50" in result.stdout and "model load" in result.stdout

    found = run([*EMBEDJOB, "search", str(path), "the purpose of a PEP", "-k", "3", "--database-url", database_url])
    assert found.returncode == 0, found.stderr
    header, *hits = found.stdout.strip().splitlines()
    assert header == "distance  id  snippet" and len(hits) == 3
    distance, record_id, _ = hits[0].split(maxsplit=2)
    assert record_id.startswith("pep-0001-") and 0 <= float(distance) < 0.6
    assert "Loading weights" not in found.stderr and "XDG_RUNTIME_DIR" not in found.stderr

    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**manifest("peps.jsonl"), "metadata": {"name": "other"}} | {
        "spec": {**manifest("peps.jsonl")["spec"], "sink": {"databaseSecretRef": {"name": "db"}, "collection": "none"}}}))
    empty = run([*EMBEDJOB, "search", str(other), "anything", "--database-url", database_url])
    assert empty.returncode == 1 and empty.stdout == ""
    assert "no vectors in collection 'none' of table embeddings" in empty.stderr


def test_a_missing_source_file_is_a_refused_job_not_a_traceback(tmp_path, database_url):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest("does-not-exist.jsonl")))
    result = run([*EMBEDJOB, "run", str(path), "--database-url", database_url])
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "SourceUnavailable" in result.stdout and "does-not-exist.jsonl" in result.stdout
