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
    hits = found.stdout.strip().splitlines()
    assert len(hits) == 3
    distance, record_id, _ = hits[0].split(maxsplit=2)
    assert record_id.startswith("pep-0001-") and 0 <= float(distance) < 0.6
