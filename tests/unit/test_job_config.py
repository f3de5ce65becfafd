"""The job key: the uid in a cluster; locally the name and where the vectors go."""

from embedjob_worker.core.config import JobConfig
from support.cli import manifest
from support.manifests import merged


def test_a_local_job_is_keyed_by_name_table_and_collection_and_a_cluster_job_by_uid():
    local = JobConfig.from_manifest(manifest("in.jsonl"))
    assert local.job_key == "local/default/cli/embeddings/cli"
    other = JobConfig.from_manifest(merged(manifest("in.jsonl"), {"spec": {"sink": {"collection": "b/c"}}}))
    assert other.job_key == "local/default/cli/embeddings/b/c"
    assert "--new-run" in local.how_to_start_anew

    cluster = JobConfig.from_manifest(merged(manifest("in.jsonl"), {"metadata": {"uid": "1f2e-uid"}}))
    assert cluster.job_key == "1f2e-uid"
    assert "--new-run" not in cluster.how_to_start_anew
    assert cluster.how_to_start_anew.startswith("Delete and re-create the EmbeddingJob")


def test_a_key_too_long_for_its_column_is_hashed():
    long_name = ".".join(["a" * 60] * 4)  # a valid 243-character name
    config = JobConfig.from_manifest(merged(manifest("in.jsonl"), {
        "metadata": {"name": long_name}, "spec": {"sink": {"collection": "c" * 100}}}))
    assert config.job_key.startswith("local/sha256:") and len(config.job_key) <= 300
