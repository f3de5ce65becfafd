"""pytest plugin: a real S3 API server on loopback (moto's server, `moto[server]` from PyPI) that checks credentials.

moto runs from a virtualenv of its own (tests/run installs it and names its interpreter in
EMBEDJOB_TEST_MOTO_PYTHON): its boto3 and the worker's s3fs want different botocore versions. The
tests talk to it with botocore, which s3fs brings.

`s3_server` starts one per session, with IAM authentication on: the first requests (an IAM
user, its access key and a policy that allows it S3) go in without credentials, as moto's
INITIAL_NO_AUTH_ACTION_COUNT allows; every request after them must be signed with that key.
`pod_s3_server` is a second one on the test node's bridge address, for pods (the cluster tier).
`s3_env` puts the standard AWS variables for it into the test's environment (so the driver in
this process and the CLI in a child read them as a user's would) and gives a botocore client for
the test's own uploads. Each test gets a bucket of its own.
"""

from __future__ import annotations

import itertools
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from support.net import free_port
from support.paths import installed_by_tests_run
from support.processes import serving

REGION = "us-east-1"
# The requests that run unauthenticated, in this order: create the user, its key, its policy.
_SETUP_REQUESTS = 3
_ALLOW_S3 = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
_buckets = itertools.count()


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str

    def env(self, access_key: str | None = None, secret_key: str | None = None) -> dict[str, str]:
        """The variables a user of an S3-compatible store sets (AWS_ENDPOINT_URL: not AWS)."""
        return {"AWS_ACCESS_KEY_ID": access_key or self.access_key,
                "AWS_SECRET_ACCESS_KEY": secret_key or self.secret_key,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": REGION}

    def client(self):
        return _client("s3", self.endpoint, self.access_key, self.secret_key)


def _client(service: str, endpoint: str, access_key: str, secret_key: str):
    import botocore.session

    return botocore.session.get_session().create_client(
        service, region_name=REGION, endpoint_url=endpoint,
        aws_access_key_id=access_key, aws_secret_access_key=secret_key)


def moto_python() -> str:
    """The interpreter of moto's own virtualenv (tests/run makes it)."""
    return installed_by_tests_run("EMBEDJOB_TEST_MOTO_PYTHON", "moto's S3 server")


@contextmanager
def _moto(host: str, log: Path) -> Iterator[S3Server]:
    """moto's S3 server on `host`, with IAM authentication on and a user allowed all of S3."""
    port = free_port()
    endpoint = f"http://{host}:{port}"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_REQUESTS), "MOTO_ALLOW_NONEXISTENT_REGION": "1"}
    with serving("moto's S3 server", [moto_python(), "-m", "moto.server", "-H", host, "-p", str(port)],
                 port, log, env=env, host=host):
        iam = _client("iam", endpoint, "setup", "setup")  # among the unauthenticated first requests
        iam.create_user(UserName="embedjob-tests")
        key = iam.create_access_key(UserName="embedjob-tests")["AccessKey"]
        iam.put_user_policy(UserName="embedjob-tests", PolicyName="s3", PolicyDocument=json.dumps(_ALLOW_S3))
        yield S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"])


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    with _moto("127.0.0.1", tmp_path_factory.mktemp("s3") / "moto.log") as server:
        yield server


@pytest.fixture(scope="session")
def pod_s3_server(real_node, tmp_path_factory):
    """moto's S3 server on the test node's bridge address, which its pods reach (their default gateway)."""
    with _moto(real_node.info["gateway"], tmp_path_factory.mktemp("pod-s3") / "moto.log") as server:
        yield server


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The AWS variables of the test server in os.environ, and an empty bucket of the test's own: (server, bucket)."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    bucket = f"embedjob-{os.getpid()}-{next(_buckets)}"
    s3_server.client().create_bucket(Bucket=bucket)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # fsspec keeps filesystems with the credentials they were made with
    yield s3_server, bucket
    s3fs.S3FileSystem.clear_instance_cache()
