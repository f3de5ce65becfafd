"""Inputs and manifests for driver runs in tests: PEP paragraphs as JSONL, and a small job on the packaged model."""

from pathlib import Path

from support.job_models import FAST_START_MODEL


def write_input(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line.rstrip(b"\n") + b"\n" for line in lines))
    return path


def manifest(source: Path, name: str, batch_size: int = 32, max_in_flight: int = 4, model: dict = FAST_START_MODEL,
             **retry) -> dict:
    return {
        "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob",
        "metadata": {"name": name, "namespace": "tests"},
        "spec": {
            "source": {"uri": str(source), "format": "jsonl"},
            "model": dict(model),
            "batching": {"batchSize": batch_size, "maxInFlight": max_in_flight, "sortWindow": 512},
            "workers": {"replicas": 1, "cpusPerActor": 2},
            "sink": {"databaseSecretRef": {"name": "db"}, "table": "embeddings", "collection": name},
            "retry": {"attemptsPerBatch": 3, **retry},
        },
    }
