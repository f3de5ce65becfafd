"""S3 parts fetched by obstore with botocore's credentials (source/s3_objects.py): what it is given, without a store."""

from __future__ import annotations

from datetime import datetime, timezone

import botocore.session
import pytest

from embedjob_worker.source import s3_objects
from embedjob_worker.source.snapshot import InputSnapshot


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """Only the variables a test sets: no shared files, no instance metadata to ask."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    monkeypatch.setattr(s3_objects, "_stores", {})
    return monkeypatch


def test_the_credentials_are_botocores_as_of_each_call(aws_env):
    aws_env.setenv("AWS_ACCESS_KEY_ID", "AKIDFIRST")
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", "secret-1")
    aws_env.setenv("AWS_SESSION_TOKEN", "token-1")
    provided = s3_objects.BotocoreCredentials(botocore.session.get_session())()
    assert (provided["access_key_id"], provided["secret_access_key"], provided["token"]) == (
        "AKIDFIRST", "secret-1", "token-1")
    assert provided["expires_at"] > datetime.now(timezone.utc)  # obstore asks again before botocore's expire


def test_without_credentials_there_is_no_store_and_a_part_is_left_to_fsspec(aws_env):
    with pytest.raises(PermissionError, match="no AWS credentials"):
        s3_objects.BotocoreCredentials(botocore.session.get_session())()
    assert s3_objects.s3_store("bucket") is None
    part = InputSnapshot(uri="s3://bucket/in.jsonl", size=3, modified=None, content='ETag:"abc"')
    assert s3_objects.fetched_object(part) is None


def test_a_store_is_made_at_botocores_endpoint_once_per_bucket_and_environment(aws_env, monkeypatch):
    aws_env.setenv("AWS_ACCESS_KEY_ID", "AKIDFIRST")
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", "secret-1")
    aws_env.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    store = s3_objects.s3_store("bucket")
    assert store.config["endpoint"] == "http://127.0.0.1:9" and store.config["region"] == "eu-west-3"
    assert s3_objects.s3_store("bucket") is store and s3_objects.s3_store("other") is not store
    aws_env.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:10")
    assert s3_objects.s3_store("bucket").config["endpoint"] == "http://127.0.0.1:10"


def test_a_part_not_known_by_an_etag_is_not_fetched(aws_env):
    for content in ("uri:s3://bucket/in.jsonl", "VersionId:3"):
        part = InputSnapshot(uri="s3://bucket/in.jsonl", size=3, modified=None, content=content)
        assert s3_objects.fetched_object(part) is None
