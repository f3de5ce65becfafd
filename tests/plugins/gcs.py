"""pytest plugin: a Google Cloud Storage API server on loopback (fake-gcs-server, built from its Go module).

tests/run builds it once per version and names the binary in EMBEDJOB_TEST_FAKE_GCS_SERVER. `gcs_server` starts
one per session, over plain HTTP, objects in memory. `gcs_env` points gcsfs at it the way a user points it at an
emulator, through STORAGE_EMULATOR_HOST, with no Google credentials (GOOGLE_APPLICATION_CREDENTIALS unset: gcsfs
then reads anonymously, as the emulator allows; it checks no credentials). GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false:
gcsfs would otherwise ask Google's storage-control API for each bucket's layout, which the emulator does not serve.
Each test gets a bucket of its own; the test's uploads go through the server's JSON API.
"""

from __future__ import annotations

import itertools
import json
import os
import urllib.parse
import urllib.request
from dataclasses import dataclass

import pytest

from support.net import free_port
from support.paths import installed_by_tests_run
from support.processes import serving

_buckets = itertools.count()


@dataclass(frozen=True)
class GcsServer:
    endpoint: str

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

    def create_bucket(self, bucket: str) -> None:
        self._post("/storage/v1/b", json.dumps({"name": bucket}).encode(), "application/json")

    def put(self, bucket: str, key: str, data: bytes) -> None:
        query = urllib.parse.urlencode({"uploadType": "media", "name": key})
        self._post(f"/upload/storage/v1/b/{bucket}/o?{query}", data, "application/octet-stream")

    def _post(self, path: str, body: bytes, content_type: str) -> None:
        request = urllib.request.Request(self.endpoint + path, data=body, headers={"Content-Type": content_type})
        urllib.request.urlopen(request, timeout=30).close()


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    binary = installed_by_tests_run("EMBEDJOB_TEST_FAKE_GCS_SERVER", "fake-gcs-server")
    port = free_port()
    log = tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log"
    with serving("fake-gcs-server", [binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                                     "-backend", "memory", "-log-level", "warn"], port, log):
        yield GcsServer(f"http://127.0.0.1:{port}")


@pytest.fixture
def gcs_env(gcs_server, monkeypatch):
    """The emulator's variables in os.environ, and an empty bucket of the test's own: (server, bucket)."""
    for name, value in gcs_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    bucket = f"embedjob-{os.getpid()}-{next(_buckets)}"
    gcs_server.create_bucket(bucket)
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()  # fsspec keeps filesystems with the settings they were made with
    yield gcs_server, bucket
    gcsfs.GCSFileSystem.clear_instance_cache()
