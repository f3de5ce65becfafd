"""pytest plugin: an Azure Blob Storage server on loopback (Azurite's blob service, `azurite` from the npm registry).

tests/run installs it once per version and names its `azurite-blob` in EMBEDJOB_TEST_AZURITE_BLOB. `azure_server`
starts one per session, its data in a temporary folder. It checks every request's Shared Key signature against its
development account, devstoreaccount1, whose key Azurite publishes (it is no secret: every Azurite has it).
`azure_env` gives adlfs that account the way a user gives it theirs, in AZURE_STORAGE_CONNECTION_STRING (with the
BlobEndpoint of the server: not Azure), and a client of the Azure SDK for the test's own uploads. Each test gets a
container of its own.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import pytest

from support.net import free_port
from support.paths import installed_by_tests_run
from support.processes import serving

ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (its README), the only key its development account accepts.
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_containers = itertools.count()


@dataclass(frozen=True)
class AzureServer:
    endpoint: str  # the account's blob endpoint

    def connection_string(self, key: str = DEV_KEY) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};"
                f"BlobEndpoint={self.endpoint};")

    def env(self, key: str = DEV_KEY) -> dict[str, str]:
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string(key)}

    def client(self):
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string())

    def put(self, container: str, name: str, data: bytes) -> None:
        self.client().get_blob_client(container, name).upload_blob(data, overwrite=True)


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory):
    azurite = installed_by_tests_run("EMBEDJOB_TEST_AZURITE_BLOB", "Azurite")
    port = free_port()
    workspace = tmp_path_factory.mktemp("azurite")
    log = workspace / "azurite.log"
    # --skipApiVersionCheck: the SDK may speak a newer API version than this Azurite knows (the blob calls we make
    # are older than both)
    with serving("Azurite", [azurite, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
                             workspace / "data", "--silent", "--skipApiVersionCheck", "--disableTelemetry"], port, log):
        yield AzureServer(f"http://127.0.0.1:{port}/{ACCOUNT}")


@pytest.fixture
def azure_env(azure_server, monkeypatch):
    """The account's connection string in os.environ, and an empty container of the test's own: (server, container)."""
    for name in [n for n in os.environ if n.startswith("AZURE_STORAGE_")]:
        monkeypatch.delenv(name)
    for name, value in azure_server.env().items():
        monkeypatch.setenv(name, value)
    container = f"embedjob-{os.getpid()}-{next(_containers)}"
    azure_server.client().create_container(container)
    import adlfs

    adlfs.AzureBlobFileSystem.clear_instance_cache()  # fsspec keeps filesystems with the credentials they were made with
    yield azure_server, container
    adlfs.AzureBlobFileSystem.clear_instance_cache()
